"""Removing archived sagas from Redis (see :mod:`saga_store.log.archive`): each
saga with ``lua/archive.lua``, which pushes its tombstone onto its bucket's
ledger pending list and UNLINKs its keys and index entries in one script, if
its head is still the close it was archived at."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from saga_store import keys
from saga_store.errors import InvalidInput, StoreUnavailable
from saga_store.faults import fault
from saga_store.log.ledger import tombstone
from saga_store.log.scripts import source
from saga_store.log.stream import SagaLog

ARCHIVE = source("archive")


@dataclass
class Close:
    """What the ledger recorded of a saga's end, and where it is archived to."""

    saga_id: str
    state: str
    seq: int
    hash: str
    ts: int = 0
    segment: str = ""  # the segment's file name, then (for the tombstone) its digest
    events: int = 0
    deletes: list[str] = field(default_factory=list)
    approvals: list[str] = field(default_factory=list)


class Remover:
    """Removes archived sagas, ``batch`` scripts a round trip; counts what it
    removed and notes in ``skipped`` what it left, with why."""

    def __init__(self, log: SagaLog, batch: int, skipped: dict[str, str],
                 tick: Callable[[], None] = lambda: None) -> None:
        self.log, self.batch, self.skipped, self.tick = log, batch, skipped, tick
        self.removed = self.resumed = 0

    def plan_keys(self, c: Close, steps: list[int], blobs: set[str] | None = None) -> None:
        k, sid = self.log.keys, c.saga_id
        if blobs is None:  # a resumed removal: its blobs are found by name
            pattern = k.blob(sid, "*")
            blobs = {key.decode().rsplit(":", 1)[1]
                     for key in self.log.redis.scan_iter(match=pattern, count=1000)}
        c.deletes = [k.meta(sid), k.lease(sid), k.driver(sid), k.secrets(sid),
                     *(k.blob(sid, d) for d in sorted(blobs))]
        c.approvals = [f"{sid}:{s}" for s in steps]

    def probe(self) -> None:
        """Refuse a user who may not remove keys before anything is written: the
        script on a saga that does not exist checks the rights and writes nothing."""
        self.remove([Close("archive-probe", "committed", 0, "00" * 32)], probe=True)

    def remove(self, todo: list[Close], *, resumed: bool = False, probe: bool = False,
                ) -> None:
        """Remove ``todo`` from Redis, each with its tombstone in one script."""
        if not todo:
            return
        k = self.log.keys
        try:
            sha = self.log.raw.script_load(ARCHIVE)
        except redis.exceptions.NoPermissionError as exc:
            raise _refused(str(exc)) from exc
        for i in range(0, len(todo), self.batch):
            if not probe:
                self.tick()  # the caller's lease, renewed before each batch
            batch = todo[i:i + self.batch]
            pipe: Any = self.log.raw.pipeline(transaction=False)
            for c in batch:
                sid = c.saga_id
                bucket = k.bucket_of(sid)
                script_keys = [k.log(sid), keys.ledger_pending(self.log.layout.ledger_of(sid)),
                               k.needs_attention(sid), k.approvals(sid), k.active(sid),
                               k.shared_active(bucket), *c.deletes]
                argv = [keys.entry_id(c.seq), bytes.fromhex(c.hash),
                        tombstone(sid, c.state, c.seq, c.hash, c.segment), sid, *c.approvals]
                pipe.execute_command("EVALSHA", sha, len(script_keys), *script_keys, *argv)
            for c, reply in zip(batch, pipe.execute(raise_on_error=False), strict=True):
                self._removed(c, reply, resumed, probe)
            if not probe:
                fault("archive_removing")

    def _removed(self, c: Close, reply: Any, resumed: bool, probe: bool) -> None:
        if isinstance(reply, redis.exceptions.NoPermissionError):
            raise _refused(str(reply))
        if isinstance(reply, Exception):
            raise StoreUnavailable(f"removing saga {c.saga_id}: {reply}; its segment is "
                                   "written: run 'saga archive' again to finish")
        status, what = int(reply[0]), reply[1]
        text = what.decode() if isinstance(what, bytes) else str(what)
        if probe and not text.startswith("noperm"):
            return
        if status == 1:
            self.removed += 1
            self.resumed += resumed
        elif text.startswith("noperm"):
            raise _refused(text)
        else:
            self.skipped[c.saga_id] = (
                "its log is gone, and the ledger has no tombstone of it: run 'saga verify'"
                if status == 0 else f"left in Redis: {text}")


def _refused(why: str) -> InvalidInput:
    return InvalidInput(
        f"this Redis user may not remove keys ({why.replace('noperm', 'NOPERM on')}): "
        "'saga archive' deletes "
        "archived sagas from Redis, which the worker and agent ACL users may not do on "
        "purpose; run it with an admin user's SAGA_REDIS_URL. Segments already written "
        "stay valid; the next run finishes the removals")
