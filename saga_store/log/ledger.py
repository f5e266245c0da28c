"""The ledger: chains with one entry when a saga opens and one when it closes
(its final seq and head hash). It makes deleting a whole saga, or cutting a
closed saga's tail, detectable. The ledger's own tail is protected by anchors
exported out of Redis.

Of a store of layout 2 (see :mod:`saga_store.log.layout`) each bucket of sagas
has its own ledger chain, pending list and sealer's lease, all under the
bucket's hash tag: sealing spreads over every Redis Cluster master, and
several workers seal different buckets at once. A root chain records the
buckets' heads (:meth:`Ledger.record_root`): an anchor is taken over it, and
through it over every bucket. A store of layout 1 has one chain, ``ledger``.

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
from saga_store.faults import fault
from saga_store.log.canonical import canonical
from saga_store.log.events import EventKind, body_dict
from saga_store.log.layout import LEGACY, ROOT, V1, Layout
from saga_store.log.layout import parse as layout_of
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
ROOT_HEADS = 100  # bucket heads per root entry: about 9 KB, well under a blob's size
_KINDS = (EventKind.LEDGER_OPENED, EventKind.LEDGER_CLOSED, EventKind.LEDGER_ARCHIVED)
OPEN_FIELDS = frozenset({"saga_id", "agent_id", "first"})
CLOSE_FIELDS = frozenset({"saga_id", "state", "seq", "hash"})
# a tombstone (see saga_store.log.archive): the close it ends with, and the digest
# of the archive segment that holds the saga's entries
ARCHIVED_FIELDS = frozenset({"saga_id", "state", "seq", "hash", "segment"})
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
        self._root: tuple[dict[str, list[Any]], Head] = ({}, EMPTY)  # see _root_fold

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
        chain = self.log.layout.ledger_of(saga_id)
        at_push = len(pipe)
        pipe.rpush(keys.ledger_pending(chain), orjson.dumps(
            {"kind": kind, "ts": time.time_ns() // 1_000_000,
             "data": {"saga_id": saga_id, **data}}))
        pipe.hset(self.log.keys.meta(saga_id), flag, 1)  # the debt is paid: after the push
        at_lease = len(pipe)
        if not defer:  # try the sealer's lease in the same round trip
            pipe.set(keys.ledger_lease(chain), token, nx=True, px=SEAL_LEASE_MS)

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
                    return self._seal(chain, token)
            # deferred, or another sealer at work (it looks again before it stops);
            # of a deferred batch, the writer that brings the count to a multiple
            # of SEAL_AT seals (one try per SEAL_AT entries, not one per writer)
            return self.seal(chain) if defer and replies[at_push] % SEAL_AT == 0 else 0
        return then

    # -- layout 3: the entry rides on the saga's own append ---------------------

    def opening_entry(self, saga_id: str, agent_id: str,
                      ) -> Callable[[bytes, int, bytes], SideWrite]:
        """The push of ``saga_id``'s opening entry, as a write of its opening append
        (see :meth:`SagaLog.prepare`'s ``ledger``): of layout 3 the bucket's pending
        list is in the saga's slot, so the saga and its entry land together."""
        return lambda first, _seq, _last: self._entry(
            EventKind.LEDGER_OPENED, saga_id, {"agent_id": agent_id, "first": first.hex()})

    def closing_entry(self, saga_id: str, state: str,
                      ) -> Callable[[bytes, int, bytes], SideWrite]:
        """The push of ``saga_id``'s closing entry, as a write of its closing append."""
        return lambda _first, seq, last: self._entry(
            EventKind.LEDGER_CLOSED, saga_id, {"state": state, "seq": seq, "hash": last.hex()})

    def _entry(self, kind: str, saga_id: str, data: dict[str, Any]) -> SideWrite:
        chain = self.log.layout.ledger_of(saga_id)
        return SideWrite("rpush", keys.ledger_pending(chain), (orjson.dumps(
            {"kind": kind, "ts": time.time_ns() // 1_000_000,
             "data": {"saga_id": saga_id, **data}}),))

    def rode(self, saga_id: str, pushed: int, defer: bool | None = None) -> int:
        """After an append that pushed the saga's entry itself (``pushed``: the
        pending list's length after it): seal as a writer that pushed it apart
        would, at once or, deferred, when its entry makes a multiple of SEAL_AT."""
        defer = self.deferred if defer is None else defer
        chain = self.log.layout.ledger_of(saga_id)
        if defer and pushed % SEAL_AT:
            return 0
        return self.seal(chain)

    def chains(self) -> list[str]:
        """Every ledger chain of this store's layout (not the root)."""
        return self.log.layout.chains()

    def seal(self, chain: str | None = None) -> int:
        """Chain ``chain``'s pending entries now (None: every chain's), unless a
        sealer is at work on it (or this user may not seal: the workers' sweepers
        do); returns how many."""
        if not self.may_seal:
            return 0
        if chain is None:
            return self.seal_many(list(self.backlog()))
        token = os.urandom(8).hex()
        try:
            if not self.log.redis.set(keys.ledger_lease(chain), token, nx=True,
                                      px=SEAL_LEASE_MS):
                return 0
        except redis.exceptions.NoPermissionError:
            self.may_seal = False
            return 0
        return self._seal(chain, token)

    def backlog(self, chains: list[str] | None = None) -> dict[str, int]:
        """The chains (of ``chains``, default all) with entries pending, and how many."""
        chains = self.chains() if chains is None else chains
        pipe = self.log.redis.pipeline(transaction=False)
        for c in chains:
            pipe.llen(keys.ledger_pending(c))
        return {c: n for c, n in zip(chains, pipe.execute(), strict=True) if n}

    def seal_some(self, start: int, count: int) -> tuple[int, int]:
        """Seal the chains ``start .. start+count`` (wrapping round) that have entries
        pending: a sweeper's share of the sealing, a slice at a time, each chain
        under its own lease so several sweepers seal different buckets at once.
        Returns (entries sealed, where the next slice starts)."""
        every = self.chains()
        count = min(count, len(every))
        window = [every[(start + i) % len(every)] for i in range(count)]
        sealed = self.seal_many(list(self.backlog(window)))
        return sealed, (start + count) % len(every)

    def seal_many(self, chains: list[str]) -> int:
        """Seal the pending entries of ``chains`` together, in three round trips for
        all of them (take each chain's lease and read its pending entries and head;
        read the saga events the entries name; append each chain's batch), where
        :meth:`seal` takes four for each chain. A chain whose lease another sealer
        holds is left to it. One with more than a batch pending, an entry to reject
        or a lost race is finished on its own, still under the lease taken here
        (:meth:`_seal`); one that took more entries meanwhile is sealed again."""
        if not self.may_seal or not chains:
            return 0
        token = os.urandom(8).hex()
        pipe: Any = self.log.raw.pipeline(transaction=False)
        for c in chains:  # reads after the SET: valid under the lease when it is taken
            pipe.execute_command("SET", keys.ledger_lease(c), token, "NX", "PX",
                                 SEAL_LEASE_MS)
            pipe.execute_command("LRANGE", keys.ledger_pending(c), 0, SEAL_BATCH - 1)
            pipe.execute_command("XREVRANGE", keys.ledger_log(c), "+", "-", "COUNT", 1)
        replies = pipe.execute(raise_on_error=False)
        held: dict[str, tuple[list[bytes], Head]] = {}
        alone: list[str] = []  # under the lease, sealed one chain at a time
        for i, c in enumerate(chains):
            took, rows, last = replies[3 * i:3 * i + 3]
            if isinstance(took, redis.exceptions.NoPermissionError):
                self.may_seal = False  # an agent user: the workers' sweepers seal
                return 0
            if isinstance(took, Exception):
                raise StoreUnavailable(f"ledger {c}: the sealer's lease: {took}")
            if took is None:
                continue  # another sealer at work on it
            if isinstance(rows, Exception) or isinstance(last, Exception) \
                    or len(rows) >= SEAL_BATCH:
                alone.append(c)
                continue
            held[c] = (rows, head_of(last[0]) if last else EMPTY)
        parsed = {c: [_entry(c, raw) for raw in rows] for c, (rows, _) in held.items()}
        whys = self._underived_many(parsed)
        pipe = self.log.redis.pipeline(transaction=False)
        sent: list[tuple[str, Any, Any, int, int]] = []  # chain, call, its reply, n, LLEN's
        for c, (rows, head) in held.items():
            if not rows:  # sealed meanwhile by a sealer whose lease had just lapsed
                release_lease(pipe, keys.ledger_lease(c), token)
                continue
            if any(whys[c]):
                alone.append(c)  # _drain sets the rejected entries aside
                continue
            call = self.log.prepare(c, [b for b in parsed[c] if b is not None], head,
                                    lease=Lease(token, LeaseMode.RELEASE),
                                    side=[SideWrite("trim", keys.ledger_pending(c))])
            queued = call.queue(pipe)
            sent.append((c, call, queued, len(rows), len(pipe)))
            pipe.llen(keys.ledger_pending(c))
        replies = pipe.execute(raise_on_error=False) if len(pipe) else []
        sealed, again = 0, []
        for c, call, queued, n, left_at in sent:
            try:
                call.result(queued(replies))
            except FencedOff:
                continue  # the lease lapsed: another sealer carries on
            except ConflictError:
                alone.append(c)  # still ours: a refused append writes nothing
                continue
            sealed += n
            if replies[left_at]:
                again.append(c)  # pushed to while it was held
        sealed += sum(self._seal(c, token) for c in alone)
        return sealed + sum(self.seal(c) for c in again)

    def flush(self, timeout_s: float = 2.0) -> int:
        """Seal until nothing is pending (another sealer may be at work: wait for it,
        up to ``timeout_s``); returns how many entries are still pending. A user
        without write rights seals nothing."""
        deadline = time.monotonic() + timeout_s
        left = self.backlog()
        while True:
            with contextlib.suppress(redis.ResponseError):  # e.g. a read-only user
                self.seal_many(list(left))
            left = self.backlog(list(left))
            if not left or time.monotonic() >= deadline:
                return sum(left.values())
            time.sleep(0.01)

    def rejected(self) -> list[tuple[bytes, str]]:
        """Entries the sealer refused to chain, with why, oldest first (by chain)."""
        pipe: Any = self.log.raw.pipeline(transaction=False)
        for chain in self.chains():
            pipe.execute_command("XRANGE", keys.ledger_rejected(chain), "-", "+", "COUNT", 1000)
        out = []
        for rows in pipe.execute():
            for _eid, fields in rows:
                named = dict(zip(fields[::2], fields[1::2], strict=False))
                out.append((named.get(b"entry", b""), named.get(b"why", b"").decode()))
        return out

    def pending(self) -> list[dict[str, Any]]:
        """The bodies of entries written and not yet chained, oldest first (by chain)."""
        return [b for bodies in self.pending_by_chain().values() for b in bodies]

    def pending_by_chain(self, chains: list[str] | None = None,
                         ) -> dict[str, list[dict[str, Any]]]:
        """Of each chain (of ``chains``, default all) with entries pending, their
        bodies, oldest first."""
        chains = self.chains() if chains is None else chains
        pipe: Any = self.log.redis.pipeline(transaction=False)
        for c in chains:
            pipe.execute_command("LRANGE", keys.ledger_pending(c), 0, -1)
        out: dict[str, list[dict[str, Any]]] = {}
        for c, raw in zip(chains, pipe.execute(), strict=True):
            bodies = [b for b in (_entry(c, r) for r in raw) if b is not None]
            if bodies:
                out[c] = bodies
        return out

    def bodies(self) -> list[dict[str, Any]]:
        """Every chained entry of every ledger chain (by chain, in order)."""
        return [b for chain in self.present() for b in self.log.bodies(chain)]

    def present(self, chains: list[str] | None = None) -> list[str]:
        """The ledger chains (of ``chains``, default all) that hold entries (one
        pipelined look at every chain)."""
        chains = self.chains() if chains is None else chains
        pipe = self.log.redis.pipeline(transaction=False)
        for c in chains:
            pipe.exists(keys.ledger_log(c))
        return [c for c, n in zip(chains, pipe.execute(), strict=True) if n]

    def heads(self) -> dict[str, Head]:
        """The head of every ledger chain that holds entries."""
        chains = self.chains()
        pipe: Any = self.log.raw.pipeline(transaction=False)
        for c in chains:
            pipe.execute_command("XREVRANGE", keys.ledger_log(c), "+", "-", "COUNT", 1)
        return {c: head_of(last[0]) for c, last in zip(chains, pipe.execute(), strict=True)
                if last}

    def _seal(self, chain: str, token: str) -> int:
        """Seal holding the lease until nothing is pending. The lease goes with the
        last batch's append; an entry pushed while it was held (its writer found
        the lease taken) is seen by the look that follows, so none is left behind."""
        sealed = 0
        while True:
            n, left = self._drain(chain, token)
            sealed += n
            if not left or not self.log.redis.set(keys.ledger_lease(chain), token, nx=True,
                                                  px=SEAL_LEASE_MS):
                return sealed

    def _drain(self, chain: str, token: str) -> tuple[int, int]:
        """Chain pending entries in batches, however many there are; returns (chained,
        pending after the lease was given up). Only lost races count towards giving
        up: a backlog of any size is sealed."""
        r, sealed, lost = self.log.redis, 0, 0
        pending, lease = keys.ledger_pending(chain), keys.ledger_lease(chain)
        while lost < MAX_CAS_ROUNDS:
            pipe: Any = self.log.raw.pipeline(transaction=False)
            pipe.execute_command("LRANGE", pending, 0, SEAL_BATCH - 1)
            pipe.execute_command("XREVRANGE", keys.ledger_log(chain), "+", "-", "COUNT", 1)
            rows, last = pipe.execute()
            if not rows:
                pipe = r.pipeline(transaction=False)
                release_lease(pipe, lease, token)
                pipe.llen(pending)
                return sealed, pipe.execute()[1]
            head = head_of(last[0]) if last else EMPTY
            parsed = [_entry(chain, raw) for raw in rows]
            why = self._underived(chain, parsed)  # only what the sagas' chains bear out
            good = next((i for i, w in enumerate(why) if w), len(rows))
            bodies = [b for b in parsed[:good] if b is not None]
            if not bodies:  # forged, or written by something else than Saga Store
                self._reject(chain, rows, why)
                continue
            final = len(rows) < SEAL_BATCH and len(bodies) == len(rows)
            # every batch renews the lease (a long backlog outlasts one lease time);
            # the last gives it up
            held = Lease(token, LeaseMode.RELEASE) if final else \
                Lease(token, LeaseMode.ACQUIRE, SEAL_LEASE_MS)
            call = self.log.prepare(chain, bodies, head, lease=held,
                                    side=[SideWrite("trim", pending)])
            pipe = r.pipeline(transaction=False)
            queued = call.queue(pipe)
            pipe.llen(pending)
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

    def _underived(self, chain: str, parsed: list[dict[str, Any] | None]) -> list[str | None]:
        """For each pending entry, why its saga's chain does not bear it out (None: it
        does). One pipelined read of the events the entries name. An entry pushed
        onto another bucket's list than its saga's is not borne out either."""
        return self._underived_many({chain: parsed})[chain]

    def _underived_many(self, batches: dict[str, list[dict[str, Any] | None]],
                        ) -> dict[str, list[str | None]]:
        """:meth:`_underived` of several chains' entries, in one round trip."""
        pipe: Any = self.log.raw.pipeline(transaction=False)
        named = [b for parsed in batches.values() for b in parsed if b is not None]
        for body in named:
            data = body["data"]
            seq = 0 if body["kind"] == EventKind.LEDGER_OPENED else _int(data.get("seq"))
            eid = keys.entry_id(max(seq, 0))
            pipe.execute_command("XRANGE", self.log.keys.log(data["saga_id"]), eid, eid)
        found = iter(pipe.execute() if named else [])
        out: dict[str, list[str | None]] = {}
        for chain, parsed in batches.items():
            why = out[chain] = []
            for entry in parsed:
                if entry is None:
                    why.append("not a ledger entry")
                    continue
                rows = next(found)
                mine = self.log.layout.ledger_of(entry["data"]["saga_id"])
                why.append(f"its saga's ledger chain is {mine}, not {chain}"
                           if chain not in (mine, LEGACY) else
                           underived(entry, rows[0] if rows else None))
        return out

    def _reject(self, chain: str, rows: list[bytes], why: list[str | None]) -> None:
        """Set aside the leading pending entries that may not be chained, in one
        round trip: kept with why in the rejected stream for 'saga verify' to report,
        and trimmed off the list (this sealer holds the lease: they are its head)."""
        bad = next((i for i, w in enumerate(why) if w is None), len(rows))
        log.error("ledger: %d pending entries of %s rejected, never chained; the first (%s): "
                  "%r", bad, chain, why[0], rows[0][:200])
        if self.log.metrics is not None:
            self.log.metrics.verify_failures.inc(bad)
        pipe = self.log.redis.pipeline(transaction=False)
        for raw, reason in zip(rows[:bad], why[:bad], strict=True):
            pipe.xadd(keys.ledger_rejected(chain), {"entry": raw, "why": reason or ""})
        pipe.ltrim(keys.ledger_pending(chain), bad, -1)
        pipe.execute()

    # -- the root chain (layout 2) ------------------------------------------

    def root_heads(self) -> dict[str, tuple[int, str]]:
        """The heads the root chain records, the latest of each ledger chain."""
        known, _ = self._root_fold()
        return {c: (int(seq), str(h)) for c, (seq, h) in known.items()}

    def _root_fold(self) -> tuple[dict[str, list[Any]], Head]:
        """What the root records (each chain's latest head) and the root's head, read
        on from where this process last read it (the root only grows; a root that
        no longer holds the head read last, gone back or rewritten, is read whole)."""
        known, head = self._root
        if head.seq >= 0:
            eid = keys.entry_id(head.seq)
            at = command(self.log.raw, "XRANGE", keys.ledger_log(ROOT), eid, eid)
            if not at or body_and_hash(at[0][1])[1] != head.hash:
                known, head = {}, EMPTY
        known = dict(known)
        for rows in self.log.pages(ROOT, head.seq + 1):
            for eid, fields in rows:
                body, h = body_and_hash(fields)
                known.update((orjson.loads(body).get("data") or {}).get("heads", {}))
                head = Head(keys.seq_of_entry_id(eid), h)
        self._root = (known, head)
        return known, head

    def record_root(self) -> Head:
        """Append to the root chain the heads of the ledger chains that moved since
        it last recorded them (nothing if none did); returns the root's head. Of a
        store of layout 1 there is no root: returns the one chain's head. The heads
        go ROOT_HEADS to an entry, several entries in one append, so no entry is
        large enough to be stored aside as a blob (in another slot)."""
        if self.log.layout.version < 2:
            return self.log.head(LEGACY)
        for _ in range(MAX_CAS_ROUNDS):
            known, root = self._root_fold()
            moved = sorted((c, [h.seq, h.hash.hex()]) for c, h in self.heads().items()
                           if known.get(c) != [h.seq, h.hash.hex()])
            if not moved:
                return root
            entries = [body_dict(ROOT, 0, EventKind.LEDGER_HEADS,
                                 data={"heads": dict(moved[i:i + ROOT_HEADS])})
                       for i in range(0, len(moved), ROOT_HEADS)]
            try:
                return self.log.append(ROOT, entries, root)
            except ConflictError:
                continue  # another recorder: fold again
        raise StoreUnavailable("the root chain kept moving; is something rewriting it?")

    # -- anchors ---------------------------------------------------------

    def anchor(self) -> dict[str, Any]:
        """The ledger's head as a small signed document to keep outside Redis (what
        is pending is chained first, so the anchor covers it). Of layout 2, the
        root's head, after the root records every bucket's: it covers them all."""
        self.flush()
        chain = ROOT if self.log.layout.version >= 2 else LEGACY
        head = self.record_root()
        doc: dict[str, Any] = {
            "v": 1, "chain": chain, "seq": head.seq, "hash": head.hash.hex(),
            "ts": time.time_ns() // 1_000_000, "mode": self.log.chain.mode,
        }
        doc["sig"] = self.log.chain.sign(canonical(doc))
        return doc

    def check_anchor(self, doc: dict[str, Any]) -> list[str]:
        """Raise :class:`AnchorMismatch` if the ledger is behind or forked from
        ``doc``; return warnings (e.g. an unsigned anchor) otherwise. An anchor over
        the root also holds every bucket chain to the head the root recorded."""
        try:
            seq, want = int(doc["seq"]), str(doc["hash"])
            chain = str(doc.get("chain", LEGACY))
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidInput(f"anchor file is not an anchor ({exc}); "
                               "make one with 'saga anchor'") from exc
        if chain not in (LEGACY, ROOT):
            raise InvalidInput(f"anchor file names chain {chain[:40]!r}, not the ledger; make "
                               "one with 'saga anchor'")
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
        self._hold_to(chain, seq, want, "ledger" if chain == LEGACY else "root chain")
        if chain == ROOT:
            heads: dict[str, tuple[int, str]] = {}
            for body in self.log.bodies(ROOT)[:seq + 1]:
                for c, (s, h) in (body.get("data") or {}).get("heads", {}).items():
                    heads[c] = (int(s), str(h))
            for c, (s, h) in sorted(heads.items()):
                self._hold_to(c, s, h, f"ledger chain {c}")
        return warnings

    def _hold_to(self, chain: str, seq: int, want: str, what: str) -> None:
        """Raise :class:`AnchorMismatch` unless ``chain`` holds hash ``want`` at ``seq``
        (or, of a ledger chain whose prefix was archived, it is at or before the
        chain's base: the archive holds it, 'saga verify --archive' checks it)."""
        raw = command(self.log.raw, "GET", keys.ledger_base(chain)) if chain != ROOT else None
        if raw is not None:
            bseq, _, bhash = raw.decode().partition(" ")
            if bseq.isdigit() and seq < int(bseq):
                return
            if bseq.isdigit() and seq == int(bseq):
                if bhash != want:
                    raise AnchorMismatch(f"the {what} forked from the anchor at seq {seq}: its "
                                         "archived prefix ends at another hash")
                return
        eid = keys.entry_id(seq)
        rows = command(self.log.raw, "XRANGE", keys.ledger_log(chain), eid, eid)
        if not rows:
            have = self.log.head(chain).seq
            raise AnchorMismatch(
                f"log behind anchor: the {what} ends at seq {have}, the anchor has seq {seq}; "
                "Redis lost data or was rolled back")
        if body_and_hash(rows[0][1])[1].hex() != want:
            raise AnchorMismatch(f"the {what} forked from the anchor at seq {seq}: history was "
                                 "rewritten after the anchor")


def read_anchor(text: bytes) -> dict[str, Any]:
    """The anchor document in ``text``, each field checked (see
    :mod:`saga_store.verify.anchor`)."""
    from saga_store.verify.anchor import read_anchor as strict
    return strict(text)


def underived(entry: dict[str, Any], row: Any) -> str | None:
    """Why ``entry`` (a ledger entry's body) is not borne out by ``row``, the stored
    event it names in its saga's chain (the first for an opening, the one at its
    seq for a close); None when it is. A close must name a final event."""
    data = entry["data"]
    fields = {EventKind.LEDGER_OPENED: OPEN_FIELDS,
              EventKind.LEDGER_ARCHIVED: ARCHIVED_FIELDS}.get(entry["kind"], CLOSE_FIELDS)
    if set(data) != fields:
        return f"its fields are {sorted(data)}, not {sorted(fields)}"
    if entry["kind"] == EventKind.LEDGER_ARCHIVED:
        # pushed by the script that removes the saga, so its log is gone: the
        # verifier holds it to the saga's ledger close instead
        return None if row is None else "the saga it says was archived is still in Redis"
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


def tombstone(saga_id: str, state: str, seq: int, hash_hex: str, segment: str) -> bytes:
    """The pending entry that records ``saga_id`` archived: written by the script
    that removes the saga (:mod:`saga_store.log.archive`), into its bucket's
    pending list, which of layout 3 shares the saga's slot."""
    return orjson.dumps({"kind": EventKind.LEDGER_ARCHIVED, "ts": time.time_ns() // 1_000_000,
                         "data": {"saga_id": saga_id, "state": state, "seq": seq,
                                  "hash": hash_hex, "segment": segment}})


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


def _entry(chain: str, raw: bytes) -> dict[str, Any] | None:
    """A pending entry of ``chain`` as a ledger event body, or None if it is not one."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or doc.get("kind") not in _KINDS:
        return None
    data = doc.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("saga_id"), str):
        return None
    # the time it was written (not sealed), so lists merged from many buckets, which
    # are sealed in no particular order, show sagas in the order they opened; it
    # orders lists only, and a time that is not one is replaced by the sealing's
    ts = doc.get("ts")
    good = isinstance(ts, int) and not isinstance(ts, bool) and 0 < ts < 1 << 53
    return body_dict(chain, 0, doc["kind"], ts=ts if good else None, data=data)


def migrate(ledger: Ledger, buckets: int, *, dry_run: bool = False) -> dict[str, Any]:
    """Move a store to layout 2 (buckets) without rewriting anything: the one ledger
    chain of layout 1 is sealed and kept as the ``ledger`` chain; the layout is
    recorded; the root's first entry records that chain's head, so an anchor over
    the root covers everything written before too. New entries go to the
    buckets. Processes that still run with layout 1 (started before) push to the
    old chain's pending list, which every sealer keeps draining into it: nothing is
    lost while workers are restarted. Running it again changes nothing."""
    log_ = ledger.log
    raw = log_.redis.get(keys.LAYOUT)
    before = layout_of(raw) or (V1 if log_.redis.exists(keys.LEDGER_LOG)
                                or log_.redis.exists(keys.LEDGER_PENDING) else None)
    out: dict[str, Any] = {"from": before.record() if before else None, "dry_run": dry_run}
    if before is None:  # no store here: nothing to move (a new one records its own)
        return {**out, "to": None, "changed": False}
    if before.version >= 2:
        if before.version == 2 and log_.redis.exists(keys.LEDGER_LOG) \
                and not log_.redis.exists(keys.ledger_log(ROOT)):
            # a migration killed between recording the layout and the root's first entry
            if dry_run:
                return {**out, "to": before.record(), "changed": False, "unfinished": True}
            return {**out, **_root_over_legacy(ledger), "to": before.record(), "changed": True,
                    "finished": True}
        return {**out, "to": before.record(), "changed": False}
    target = Layout(2, buckets)
    if dry_run:
        return {**out, "to": target.record(), "changed": False,
                "legacy_events": log_.redis.xlen(keys.LEDGER_LOG)}
    left = ledger.flush(timeout_s=10)
    if left:
        raise StoreUnavailable(f"{left} ledger entries are still pending after 10 s (a sealer "
                               "holds the lease?); run 'saga migrate' again")
    if not log_.redis.set(keys.LAYOUT, target.record(), nx=True):
        log_.forget_layout()
        return {**out, "to": log_.layout.record(), "changed": False}  # someone else did
    log_.forget_layout()
    fault("migrate_after_layout")
    return {**out, **_root_over_legacy(ledger), "to": target.record(), "changed": True}


def _root_over_legacy(ledger: Ledger) -> dict[str, int]:
    """The root's entry over the old chain's head (a migration's last write)."""
    root = ledger.record_root()
    return {"root_seq": root.seq, "legacy_head": ledger.heads().get(LEGACY, EMPTY).seq}
