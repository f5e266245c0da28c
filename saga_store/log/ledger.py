"""The ledger: a global chain with one entry when a saga opens and one when it
closes (its final seq and head hash). It makes deleting a whole saga, or
cutting a closed saga's tail, detectable. The ledger's own tail is protected
by anchors exported out of Redis.

Writers do not chain ledger entries themselves: every saga in the system would
race for the one head, and the losers would re-read and re-send. A writer
pushes its entry onto the pending list, in a round trip it makes anyway. The
entries are chained in batches (group commit) by whoever holds the sealer's
lease: every worker's sweeper, once a sweep (about every second), and the
deferred writer whose entry brings the count to a multiple of ``SEAL_AT``.
One append per batch trims what it chained in the same script call, so no
entry is chained twice or lost, and a sealer that dies leaves the rest
pending for the next. Readers of the ledger (verify, saga lists) read the
pending entries too; anchors and exports seal first.

The entry cannot go in the script that appends the saga's opening or closing
event: the ledger lives in another Cluster slot. So the append records in the
saga's meta that its entry is owed (``lo`` for the opening, ``lc`` for the
close, ``"0"``), and the pipeline that pushes the entry marks it paid
(``"1"``), after the push. A process killed in between leaves the debt on
record; the sweeper (and a gateway recovering a saga) pays it from the log
(:func:`owed`). A debt paid twice pushes the same entry twice, which the
verifier reads as one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import orjson
import redis

from saga_store import keys
from saga_store.errors import (
    AnchorMismatch,
    ConflictError,
    FencedOff,
    InvalidInput,
    StoreUnavailable,
)
from saga_store.log.canonical import canonical
from saga_store.log.events import EventKind, body_dict
from saga_store.log.stream import (
    EMPTY,
    Head,
    Lease,
    SagaLog,
    SideWrite,
    body_and_hash,
    command,
    head_of,
    release_lease,
)
from saga_store.protocol.vocab import LeaseMode

log = logging.getLogger("saga_store.ledger")
MAX_CAS_ROUNDS = 200  # lost races in a row before a sealer gives up
OPEN_FLAG, CLOSE_FLAG = "lo", "lc"  # in a saga's meta: "0" while its entry is owed
SEAL_BATCH = 500
SEAL_AT = 64  # a deferred writer whose entry makes 64, 128, ... pending seals them
SEAL_LEASE_MS = 5000
_KINDS = (EventKind.LEDGER_OPENED, EventKind.LEDGER_CLOSED)
OPEN_FIELDS = frozenset({"saga_id", "agent_id", "first"})
CLOSE_FIELDS = frozenset({"saga_id", "state", "seq", "hash"})
# the final events, by the state a ledger close records for them
CLOSING_KINDS: dict[Any, str] = {EventKind.SAGA_COMMITTED: "committed",
                                 EventKind.SAGA_COMPENSATED: "compensated",
                                 EventKind.SAGA_NEEDS_ATTENTION: "needs_attention"}
Then = Callable[[list[Any]], int]  # takes the pipeline's replies; returns entries sealed


class Ledger:
    """Writes ledger entries. ``deferred``: leave them pending for a sweeper (in
    worker processes, whose sweepers seal); else seal at once (whoever else may
    be writing, nobody is bound to come back)."""

    def __init__(self, log: SagaLog, deferred: bool = False) -> None:
        self.log = log
        self.deferred = deferred
        self.may_seal = True  # False once Redis said this user may not (an agent user)

    # -- writing: push an entry, seal unless deferred ---------------------------

    def opened(self, saga_id: str, agent_id: str, first_hash: bytes) -> int:
        pipe = self.log.redis.pipeline(transaction=False)
        then = self.opened_on(pipe, saga_id, agent_id, first_hash)
        return then(pipe.execute(raise_on_error=False))

    def closed(self, saga_id: str, state: str, head: Head) -> int:
        pipe = self.log.redis.pipeline(transaction=False)
        then = self.closed_on(pipe, saga_id, state, head)
        return then(pipe.execute(raise_on_error=False))

    def opened_on(self, pipe: Any, saga_id: str, agent_id: str, first_hash: bytes,
                  defer: bool | None = None) -> Then:
        """Queue the opening entry on ``pipe``; call what it returns with the replies."""
        return self._push(pipe, EventKind.LEDGER_OPENED, saga_id,
                          {"agent_id": agent_id, "first": first_hash.hex()}, defer, OPEN_FLAG)

    def closed_on(self, pipe: Any, saga_id: str, state: str, head: Head) -> Then:
        """Queue the closing entry on ``pipe``; call what it returns with the replies."""
        return self._push(pipe, EventKind.LEDGER_CLOSED, saga_id,
                          {"state": state, "seq": head.seq, "hash": head.hash.hex()}, None,
                          CLOSE_FLAG)

    def _push(self, pipe: Any, kind: str, saga_id: str, data: dict[str, Any],
              defer: bool | None, flag: str) -> Then:
        defer = self.deferred if defer is None else defer
        defer = defer or not self.may_seal
        token = os.urandom(8).hex()
        at_push = len(pipe)
        pipe.rpush(keys.LEDGER_PENDING, orjson.dumps(
            {"kind": kind, "data": {"saga_id": saga_id, **data}}))
        pipe.hset(keys.saga_meta(saga_id), flag, 1)  # the debt is paid: after the push
        at_lease = len(pipe)
        if not defer:  # try the sealer's lease in the same round trip
            pipe.set(keys.LEDGER_LEASE, token, nx=True, px=SEAL_LEASE_MS)

        def then(replies: list[Any]) -> int:
            for got in replies[at_push:at_lease]:
                if isinstance(got, Exception):
                    raise StoreUnavailable(f"ledger entry for saga {saga_id} not written: {got}")
            if not defer:
                took = replies[at_lease]
                if isinstance(took, redis.exceptions.NoPermissionError):
                    self.may_seal = False  # an agent user: the workers' sweepers seal
                    return 0
                if isinstance(took, Exception):
                    raise StoreUnavailable(f"ledger entry for saga {saga_id}: {took}")
                if took:
                    return self._seal(token)
            # deferred, or another sealer at work (it looks again before it stops);
            # of a deferred batch, the writer that brings the count to a multiple
            # of SEAL_AT seals (one try per SEAL_AT entries, not one per writer)
            return self.seal() if defer and replies[at_push] % SEAL_AT == 0 else 0
        return then

    def seal(self) -> int:
        """Chain the pending entries now, unless a sealer is at work (or this user may
        not seal: the workers' sweepers do); returns how many."""
        if not self.may_seal:
            return 0
        token = os.urandom(8).hex()
        try:
            if not self.log.redis.set(keys.LEDGER_LEASE, token, nx=True, px=SEAL_LEASE_MS):
                return 0
        except redis.exceptions.NoPermissionError:
            self.may_seal = False
            return 0
        return self._seal(token)

    def flush(self, timeout_s: float = 2.0) -> int:
        """Seal until nothing is pending (another sealer may be at work: wait for it,
        up to ``timeout_s``); returns how many entries are still pending. A user
        without write rights seals nothing."""
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(redis.ResponseError):  # e.g. a read-only user
                self.seal()
            left: int = self.log.redis.llen(keys.LEDGER_PENDING)
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.01)

    def rejected(self) -> list[tuple[bytes, str]]:
        """Entries the sealer refused to chain, with why, oldest first."""
        rows = command(self.log.raw, "XRANGE", keys.LEDGER_REJECTED, "-", "+", "COUNT", 1000)
        out = []
        for _eid, fields in rows:
            named = dict(zip(fields[::2], fields[1::2], strict=False))
            out.append((named.get(b"entry", b""), named.get(b"why", b"").decode()))
        return out

    def pending(self) -> list[dict[str, Any]]:
        """The bodies of entries written and not yet chained, oldest first."""
        raw = command(self.log.redis, "LRANGE", keys.LEDGER_PENDING, 0, -1)
        return [b for b in map(_entry, raw) if b is not None]

    def _seal(self, token: str) -> int:
        """Seal holding the lease until nothing is pending. The lease goes with the
        last batch's append; an entry pushed while it was held (its writer found
        the lease taken) is seen by the look that follows, so none is left behind."""
        sealed = 0
        while True:
            n, left = self._drain(token)
            sealed += n
            if not left or not self.log.redis.set(keys.LEDGER_LEASE, token, nx=True,
                                                  px=SEAL_LEASE_MS):
                return sealed

    def _drain(self, token: str) -> tuple[int, int]:
        """Chain pending entries in batches, however many there are; returns (chained,
        pending after the lease was given up). Only lost races count towards giving
        up: a backlog of any size is sealed."""
        r, sealed, lost = self.log.redis, 0, 0
        while lost < MAX_CAS_ROUNDS:
            pipe: Any = self.log.raw.pipeline(transaction=False)
            pipe.execute_command("LRANGE", keys.LEDGER_PENDING, 0, SEAL_BATCH - 1)
            pipe.execute_command("XREVRANGE", keys.LEDGER_LOG, "+", "-", "COUNT", 1)
            rows, last = pipe.execute()
            if not rows:
                pipe = r.pipeline(transaction=False)
                release_lease(pipe, keys.LEDGER_LEASE, token)
                pipe.llen(keys.LEDGER_PENDING)
                return sealed, pipe.execute()[1]
            head = head_of(last[0]) if last else EMPTY
            parsed = [_entry(raw) for raw in rows]
            why = self._underived(parsed)  # only what the sagas' chains bear out is chained
            good = next((i for i, w in enumerate(why) if w), len(rows))
            bodies = [b for b in parsed[:good] if b is not None]
            if not bodies:  # forged, or written by something else than Saga Store
                self._reject(rows, why)
                continue
            final = len(rows) < SEAL_BATCH and len(bodies) == len(rows)
            # every batch renews the lease (a long backlog outlasts one lease time);
            # the last gives it up
            lease = Lease(token, LeaseMode.RELEASE) if final else \
                Lease(token, LeaseMode.ACQUIRE, SEAL_LEASE_MS)
            call = self.log.prepare(keys.LEDGER_ID, bodies, head, lease=lease,
                                    side=[SideWrite("trim", keys.LEDGER_PENDING)])
            pipe = r.pipeline(transaction=False)
            queued = call.queue(pipe)
            pipe.llen(keys.LEDGER_PENDING)
            replies = pipe.execute(raise_on_error=False)
            left = replies[-1]
            try:
                call.result(queued(replies))
            except FencedOff:
                return sealed, 0  # the lease lapsed: another sealer carries on
            except ConflictError:
                lost += 1
                continue
            sealed += len(bodies)
            if final:
                return sealed, left
        raise StoreUnavailable("ledger seal kept losing the race; is something rewriting it?")

    def _underived(self, parsed: list[dict[str, Any] | None]) -> list[str | None]:
        """For each pending entry, why its saga's chain does not bear it out (None: it
        does). One pipelined read of the events the entries name."""
        pipe: Any = self.log.raw.pipeline(transaction=False)
        named = [b for b in parsed if b is not None]
        for body in named:
            data = body["data"]
            seq = 0 if body["kind"] == EventKind.LEDGER_OPENED else _int(data.get("seq"))
            eid = keys.entry_id(max(seq, 0))
            pipe.execute_command("XRANGE", keys.saga_log(data["saga_id"]), eid, eid)
        found = iter(pipe.execute() if named else [])
        out: list[str | None] = []
        for entry in parsed:
            if entry is None:
                out.append("not a ledger entry")
            else:
                rows = next(found)
                out.append(underived(entry, rows[0] if rows else None))
        return out

    def _reject(self, rows: list[bytes], why: list[str | None]) -> None:
        """Set aside the leading pending entries that may not be chained, in one
        round trip: kept with why in the rejected stream for 'saga verify' to report,
        and trimmed off the list (this sealer holds the lease: they are its head)."""
        bad = next((i for i, w in enumerate(why) if w is None), len(rows))
        log.error("ledger: %d pending entries rejected, never chained; the first (%s): %r",
                  bad, why[0], rows[0][:200])
        if self.log.metrics is not None:
            self.log.metrics.verify_failures.inc(bad)
        pipe = self.log.redis.pipeline(transaction=False)
        for raw, reason in zip(rows[:bad], why[:bad], strict=True):
            pipe.xadd(keys.LEDGER_REJECTED, {"entry": raw, "why": reason or ""})
        pipe.ltrim(keys.LEDGER_PENDING, bad, -1)
        pipe.execute()

    # -- anchors ---------------------------------------------------------

    def anchor(self) -> dict[str, Any]:
        """The ledger head as a small signed document to keep outside Redis (what is
        pending is chained first, so the anchor covers it)."""
        self.flush()
        head = self.log.head(keys.LEDGER_ID)
        doc: dict[str, Any] = {
            "v": 1, "chain": keys.LEDGER_ID, "seq": head.seq, "hash": head.hash.hex(),
            "ts": time.time_ns() // 1_000_000, "mode": self.log.chain.mode,
        }
        doc["sig"] = self.log.chain.sign(canonical(doc))
        return doc

    def check_anchor(self, doc: dict[str, Any]) -> list[str]:
        """Raise :class:`AnchorMismatch` if the ledger is behind or forked from
        ``doc``; return warnings (e.g. an unsigned anchor) otherwise."""
        try:
            seq, want = int(doc["seq"]), str(doc["hash"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidInput(f"anchor file is not an anchor ({exc}); "
                               "make one with 'saga anchor'") from exc
        warnings = []
        sig = doc.get("sig")
        unsigned = {k: v for k, v in doc.items() if k != "sig"}
        if sig and self.log.chain.key is None:
            warnings.append("anchor is signed but no HMAC key is configured: signature not checked")
        elif sig and not self.log.chain.check_signature(canonical(unsigned), str(sig)):
            raise AnchorMismatch("anchor signature does not match the configured key: "
                                 "the anchor file was altered or the key is wrong")
        elif not sig and self.log.chain.key is not None:
            warnings.append("anchor is unsigned: anyone could have written it")
        if seq < 0:
            return warnings
        rows = command(
            self.log.raw, "XRANGE", keys.LEDGER_LOG, keys.entry_id(seq), keys.entry_id(seq))
        if not rows:
            have = self.log.head(keys.LEDGER_ID).seq
            raise AnchorMismatch(
                f"log behind anchor: ledger ends at seq {have}, anchor has seq {seq}; "
                "Redis lost data or was rolled back")
        if body_and_hash(rows[0][1])[1].hex() != want:
            raise AnchorMismatch(
                f"ledger forked from anchor at seq {seq}: history was rewritten after the anchor")
        return warnings


def read_anchor(text: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"anchor file is not JSON ({exc}); make one with 'saga anchor'") from exc
    if not isinstance(doc, dict):
        raise InvalidInput("anchor file must hold a JSON object; make one with 'saga anchor'")
    return doc


def underived(entry: dict[str, Any], row: Any) -> str | None:
    """Why ``entry`` (a ledger entry's body) is not borne out by ``row``, the stored
    event it names in its saga's chain (the first for an opening, the one at its
    seq for a close); None when it is. A close must name a final event."""
    data = entry["data"]
    fields = OPEN_FIELDS if entry["kind"] == EventKind.LEDGER_OPENED else CLOSE_FIELDS
    if set(data) != fields:
        return f"its fields are {sorted(data)}, not {sorted(fields)}"
    if row is None:
        return "the saga has no such event"
    body, h = body_and_hash(row[1])
    try:
        ev = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "the event it names is not an event"
    if entry["kind"] == EventKind.LEDGER_OPENED:
        if ev.get("kind") != EventKind.SAGA_STARTED or data.get("first") != h.hex():
            return "its first hash is not the saga's first event"
        if data.get("agent_id") != ev.get("agent_id"):
            return "its agent is not the saga's"
        return None
    if data.get("hash") != h.hex():
        return f"its hash is not that of the saga's event {data.get('seq')}"
    if CLOSING_KINDS.get(ev.get("kind")) != data.get("state"):
        return f"the saga's event {data.get('seq')} is not a close as {data.get('state')}"
    return None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


def _entry(raw: bytes) -> dict[str, Any] | None:
    """A pending entry as a ledger event body, or None if it is not one."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or doc.get("kind") not in _KINDS:
        return None
    data = doc.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("saga_id"), str):
        return None
    return body_dict(keys.LEDGER_ID, 0, doc["kind"], data=data)
