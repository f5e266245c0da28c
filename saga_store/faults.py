"""Fault injection for tests: kill this process at a named point, once.

``SAGA_FAULT=<point>`` names the point, ``SAGA_FAULT_AT=<k>`` the k-th time it
is reached in this process (default 1), and ``SAGA_FAULT_ONCE=<file>`` a file
that must exist for the fault to fire; it is removed first, so a restarted
worker runs on. Forward points: ``after_dequeue``, ``after_started``,
``after_tool`` (the outcome is encoded and hashed, not yet appended),
``after_outcome`` (appended; the next job not yet queued, or the plan's next
step already claimed when this worker runs it too); tools may call
``fault("in_tool")`` after their effect. Compensator points: ``comp_after_dequeue``,
``comp_after_intent``, ``comp_after_tool``, ``comp_after_outcome``,
``comp_before_close``, ``comp_after_close`` (the close appended, its ledger
entry not yet pushed), and ``in_comp_tool`` in compensation tools. Client
points: ``submit_between`` (a plan's opening appended, its ledger entry and
first job not yet pushed), ``after_claim`` (a client-driven call's explicit
idempotency key claimed, its intent not yet appended) and
``before_ledger_close`` (any writer that closes a saga itself: appended, its
ledger entry not yet pushed). Queue point: ``junk_moved`` (a job id RQ cannot
take moved onto the intermediate list by a worker of one queue, not yet
dropped). Archive points (``saga archive``): ``archive_after_segment`` (a segment
renamed into place, the run's manifest not yet written), ``archive_after_manifest``
(the manifest written, no saga removed yet) ``archive_removing`` (after each
batch of removal scripts, earlier runs' unfinished ones included),
``archive_after_ledger_segment`` (the ledger segment renamed into place, the
manifest not yet written), ``archive_cut_recorded`` (a batch of cuts recorded in
the root chain, none of them made yet) and ``archive_cutting`` (after each batch
of ledger cuts, an earlier run's included). Off unless
both variables are set.
"""

from __future__ import annotations

import os
import signal

_seen: dict[str, int] = {}
_POINT = os.environ.get("SAGA_FAULT")  # read once: fault() sits on every step's path


def fault(point: str) -> None:
    if point != _POINT:
        return
    _seen[point] = _seen.get(point, 0) + 1
    if _seen[point] != int(os.environ.get("SAGA_FAULT_AT", "1")):
        return
    flag = os.environ.get("SAGA_FAULT_ONCE")
    if not flag:
        return
    try:
        os.unlink(flag)
    except FileNotFoundError:
        return
    os.kill(os.getpid(), signal.SIGKILL)  # workers do not fork: this is all of the process
