"""Judging a store that moves while it is verified.

A verifier reads the ledger, then every saga's chain, then each saga's cached
projection, each at its own moment, while workers append. A comparison
between two reads taken at different moments would report the store's own
progress as tampering, so every comparison here is of two things read as of
one moment:

- **A saga's projection** (``state``, ``phase`` in its meta hash) is read
  between two reads of the saga's head, in one pipeline: the append script
  writes the meta and moves the head together, so when both reads of the head
  agree, the meta read between them is the one of that head. It is compared
  with the fold of the chain only when that head is the one the chain was
  verified up to; a saga that moved since is verified again (its chain, then
  its ledger entries as read) and looked at again, up to ``ROUNDS`` times, then
  left with a warning: it kept moving, and what moves is not yet a verdict.
- **A saga the ledger never opened** whose chain was read after the ledger: it
  may have been opened in between. Its opening flag (``lo``, read with the
  projection, before) says whether its writer still owes the entry (layouts 1
  and 2 push it after the opening append; a sweeper pays the debt; of layout 3
  it rides on the opening append and is never owed); if not, its bucket's
  ledger chain and pending list are read again, after, and must hold the
  opening now.

The other way round needs nothing: the ledger (pending entries first, then
chains) is read before the sagas, and an entry is written only once its saga
holds the event it names, so a saga read later holds at least what the ledger
said of it. The root chain is read before the ledger chains for the same
reason (:meth:`Verifier.verify`). Every read here is a read: the verifier
never writes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from saga_store.log.ledger import OPEN_FLAG
from saga_store.log.stream import EMPTY, Head, SagaLog, head_of

if TYPE_CHECKING:  # the checker imports this module
    from saga_store.verify.checker import ChainReport

ROUNDS = 5  # looks at a saga that keeps moving before it is left with a warning
BATCH = 1000  # sagas per pipelined look


@dataclass(frozen=True, slots=True)
class Look:
    """A saga's head and cached projection as of one moment (``torn``: the head
    moved between the two reads around the projection, look again)."""

    head: Head
    state: bytes | None
    phase: bytes | None
    opening_owed: bool
    torn: bool


def look(log: SagaLog, ids: list[str]) -> list[Look]:
    """Each saga's head and projection, read between two reads of its head."""
    out: list[Look] = []
    for i in range(0, len(ids), BATCH):
        batch = ids[i:i + BATCH]
        pipe: Any = log.raw.pipeline(transaction=False)
        for sid in batch:
            key = log.keys.log(sid)
            pipe.execute_command("XREVRANGE", key, "+", "-", "COUNT", 1)
            pipe.execute_command("HMGET", log.keys.meta(sid), "state", "phase", OPEN_FLAG)
            pipe.execute_command("XREVRANGE", key, "+", "-", "COUNT", 1)
        replies = pipe.execute()
        for k in range(len(batch)):
            before, (state, phase, lo), after = replies[3 * k:3 * k + 3]
            head = head_of(before[0]) if before else EMPTY
            out.append(Look(head, state, phase, lo == b"0",
                            head != (head_of(after[0]) if after else EMPTY)))
    return out


def projection_verdict(rep: ChainReport, seen: Look) -> None:
    """Fail ``rep`` if the projection ``seen`` (of the head ``rep`` was verified up
    to) is not the fold of its log; warn if there is none."""
    state, phase = seen.state, seen.phase
    if state is None and phase is None:
        rep.warnings.append("no cached state (a chain loaded from an export?); a worker's "
                            "sweeper rebuilds it from the log")
    elif (state, phase) != (str(rep.status).encode(), str(rep.phase).encode()):
        shown = f"{(state or b'-').decode(errors='replace')}/" \
                f"{(phase or b'-').decode(errors='replace')}"
        rep.fail(rep.head_seq, "projection",
                 f"its cached state is {shown}, its log says {rep.status}/{rep.phase} at "
                 f"seq {rep.head_seq}: the meta hash was changed by hand; a worker's sweeper "
                 "rebuilds it from the log")


def settle(log: SagaLog, reports: list[ChainReport],
           again: Callable[[str], ChainReport],
           reread_ledger: Callable[[list[str]], Callable[[ChainReport], None]]) -> None:
    """Judge each verified saga's projection, and each saga the ledger never opened,
    as of one moment (see the module's docstring). ``again`` verifies a saga's
    chain anew and cross-checks it with the ledger as read; ``reread_ledger`` reads
    the ledger chains of the given sagas again and returns the cross-check against
    it. Reports are replaced in place."""
    todo = [i for i, rep in enumerate(reports) if rep.events and (rep.ok or _unopened(rep))]
    seen_at: dict[int, Look] = {}  # the look each saga was judged by
    owed: set[int] = set()  # sagas whose writer owed the opening entry, at the last look
    for _ in range(ROUNDS):
        if not todo:
            break
        moved = []
        for i, seen in zip(todo, look(log, [reports[i].chain_id for i in todo]), strict=True):
            rep = reports[i]
            if seen.opening_owed and not log.keys.bucketed:  # of layout 3 it is never owed
                owed.add(i)
            else:
                owed.discard(i)
            if seen.torn or seen.head != Head(rep.head_seq, rep.head_hash):
                if not seen.torn:
                    reports[i] = again(rep.chain_id)
                moved.append(i)
                continue
            seen_at[i] = seen
            if rep.ok:
                projection_verdict(rep, seen)
        todo = [i for i in moved if reports[i].ok or _unopened(reports[i])]
    for i in todo:
        reports[i].warnings.append(f"kept moving while it was verified ({ROUNDS} looks): its "
                                   "cached state was not compared; verify again")
    _opened_since(reports, seen_at, owed, reread_ledger)


def _unopened(rep: ChainReport) -> bool:
    return rep.reason == "unregistered"


def _opened_since(reports: list[ChainReport], seen_at: dict[int, Look], owed: set[int],
                  reread_ledger: Callable[[list[str]], Callable[[ChainReport], None]]) -> None:
    """Judge again each saga the ledger had not opened when it was read, before the
    saga's chain: owed by its writer (as its look, taken before now, says), or
    opened in the ledger as read now, after."""
    unopened = [i for i, rep in enumerate(reports) if _unopened(rep)]
    if not unopened:
        return
    for i in unopened:  # "unregistered" is only ever the ledger's cross-check verdict
        rep = reports[i]
        rep.ok, rep.first_bad_seq, rep.reason, rep.detail = True, None, None, ""
    for i in (i for i in unopened if i in owed):
        reports[i].warnings.append("not in the ledger yet: its writer owes the opening "
                                   "entry (a worker's sweeper writes it)")
    judge = reread_ledger([reports[i].chain_id for i in unopened if i not in owed])
    for i in unopened:
        if i not in owed:
            judge(reports[i])
        if reports[i].ok and i in seen_at:
            projection_verdict(reports[i], seen_at[i])
