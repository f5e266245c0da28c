"""Fault injection for tests: kill this process at a named point, once.

``SAGA_FAULT=<point>`` names the point and ``SAGA_FAULT_ONCE=<file>`` a file
that must exist for the fault to fire; it is removed first, so a restarted
worker runs on. Points: ``after_dequeue``, ``after_started``, ``after_tool``
(the outcome is encoded and hashed, not yet appended), ``after_outcome``
(appended, the next job not yet queued), and the same names prefixed with
``comp_`` in the compensator. Off unless both variables are set.
"""

from __future__ import annotations

import os
import signal


def fault(point: str) -> None:
    if os.environ.get("SAGA_FAULT") != point:
        return
    flag = os.environ.get("SAGA_FAULT_ONCE")
    if not flag:
        return
    try:
        os.unlink(flag)
    except FileNotFoundError:
        return
    os.kill(os.getpid(), signal.SIGKILL)  # a step worker does not fork: this is all of it
