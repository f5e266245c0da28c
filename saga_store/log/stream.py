"""Appending to and reading hash-chained streams.

:class:`SagaLog` knows nothing about sagas beyond the chain: it turns event
bodies into canonical bytes, links them, and appends them by compare-and-set
(see :mod:`saga_store.scripts`). A writer that loses the race gets
:class:`~saga_store.errors.ConflictError` carrying the new head; it re-reads
and decides again, it never blindly re-appends.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
import redis
from redis.client import Pipeline

from saga_store import keys
from saga_store.errors import (
    ConflictError,
    FencedOff,
    InvalidInput,
    NoSuchSaga,
    StoreUnavailable,
    no_such_saga,
)
from saga_store.log import layout
from saga_store.log.canonical import canonical, check_json
from saga_store.log.chain import Chain
from saga_store.log.events import EventKind
from saga_store.log.layout import Layout
from saga_store.log.pipeline import lean
from saga_store.log.replicas import queue_wait, shortfall
from saga_store.log.scripts import APPEND, RELEASE_LEASE, Scripts
from saga_store.ops.connection import twin
from saga_store.protocol.vocab import Fence, LeaseMode, Phase, Status, phase_of
from saga_store.settings import Settings

if TYPE_CHECKING:  # importing prometheus_client early would fix its process mode
    from saga_store.ops.metrics import Metrics

PAGE = 10_000


@dataclass(frozen=True, slots=True)
class Head:
    """The last event of a chain; ``seq == -1`` and empty hash for an empty chain."""

    seq: int
    hash: bytes

    @property
    def empty(self) -> bool:
        return self.seq < 0


EMPTY = Head(-1, b"")

# The state a saga is in after an event of each kind, and so its phase (other
# kinds leave both as they were). The append script stamps the phase on every
# entry and reads it back from the last; the meta hash caches both for readers.
STATUS_AFTER: dict[str, Status] = {
    EventKind.SAGA_STARTED: Status.RUNNING,
    EventKind.SAGA_FAILED: Status.COMPENSATING,
    EventKind.COMPENSATION_INTENT: Status.COMPENSATING,
    EventKind.STEP_NOT_COMPENSABLE: Status.COMPENSATING,
    EventKind.SAGA_RESUMED: Status.COMPENSATING,
    EventKind.SAGA_STUCK: Status.STUCK,
    EventKind.SAGA_COMMITTED: Status.COMMITTED,
    EventKind.SAGA_COMPENSATED: Status.COMPENSATED,
    EventKind.SAGA_NEEDS_ATTENTION: Status.NEEDS_ATTENTION,
}
PHASE_AFTER: dict[str, Phase] = {
    **{kind: phase_of(status) for kind, status in STATUS_AFTER.items()},
    EventKind.LEDGER_OPENED: Phase.FORWARD,
}


@dataclass(frozen=True, slots=True)
class SideWrite:
    """A write the append script makes only if the append succeeds, to a key of
    the chain's own hash tag: ``op`` is 'hset' (field/value pairs), 'set' (a
    value), 'pexpire' (ms) or 'trim' (drop the first n items of a list, n being
    the number of events: the pending entries they came from), or 'absent' (no
    write: a guard; the append is refused, :class:`FencedOff`, if the key exists)."""

    op: str
    key: str
    args: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class Lease:
    """A lease argument for :meth:`SagaLog.append`: the fencing token, what to do
    with the lease ('hold', 'acquire' or 'release'), and its time to live."""

    token: str
    mode: LeaseMode = LeaseMode.HOLD
    ttl_ms: int = 0

    def __iter__(self) -> Iterator[Any]:
        return iter((self.token, self.mode, self.ttl_ms))


@dataclass(frozen=True, slots=True)
class RawEntry:
    """One stream entry: entry id, canonical body, hash, and the hash before it."""

    entry_id: bytes
    body: bytes
    hash: bytes
    prev: bytes

    def event(self) -> dict[str, Any]:
        """The full envelope: body plus prev/hash in hex."""
        ev: dict[str, Any] = orjson.loads(self.body)
        ev["prev"] = self.prev.hex()
        ev["hash"] = self.hash.hex()
        return ev


def _identity(response: Any, **_: Any) -> Any:
    return response


def command(client: redis.Redis, *args: Any) -> Any:
    """``execute_command`` with its reply typed as Any (redis-py leaves it untyped)."""
    # no-untyped-call: the library leaves it untyped
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


def body_and_hash(fields: Sequence[bytes] | Mapping[bytes, bytes]) -> tuple[bytes, bytes]:
    """The b and h fields of a stored entry (b"" for one that is missing)."""
    if isinstance(fields, Mapping):
        return fields.get(b"b", b""), fields.get(b"h", b"")
    if len(fields) >= 4 and fields[0] == b"b" and fields[2] == b"h":
        return fields[1], fields[3]
    named = {fields[i]: fields[i + 1] for i in range(0, len(fields) - 1, 2)}
    return named.get(b"b", b""), named.get(b"h", b"")


def stamp_of(fields: Sequence[bytes] | Mapping[bytes, bytes]) -> bytes | None:
    """The p field (the phase after the entry) of a stored entry, None if missing."""
    if isinstance(fields, Mapping):
        return fields.get(b"p")
    for i in range(0, len(fields) - 1, 2):
        if fields[i] == b"p":
            return fields[i + 1]
    return None


@dataclass(frozen=True)
class PreparedAppend:
    """An encoded append: :meth:`send` it (or :meth:`queue` it on a pipeline), then
    read the reply with :meth:`result`.

    With ``SAGA_WAIT_REPLICAS=N`` a ``WAIT N timeout`` goes right after the append on
    the same connection (WAIT counts the replicas that hold that connection's last
    write). An append the master took but fewer replicas confirmed in time is not
    done: its reply becomes :class:`StoreUnavailable`, as if it had been lost, and
    whoever sends it again finds it in the chain (code 0 with its own head)."""

    log: SagaLog
    chain_id: str
    keys: list[str]
    argv: list[Any]
    first_hash: bytes
    last_hash: bytes
    phase: Phase
    events: int
    rides_ledger: bool = False  # the saga's ledger entry is pushed by the script itself

    @staticmethod
    def pushed(reply: Any) -> int:
        """How many entries the ledger's pending list held after an append that
        pushed one (0 if unknown: the reply of a resend)."""
        return int(reply[3]) if isinstance(reply, list | tuple) and len(reply) > 3 else 0

    def send(self, client: Any) -> Any:
        """Send the append and return its reply; on a pipeline, queue it and return
        its :class:`Queued` (hand that the pipeline's replies for the append's)."""
        if isinstance(client, Pipeline):
            return self.queue(client)
        if not self.log.settings.wait_replicas:
            return self.log.scripts.call_append(client, self.keys, self.argv)
        return self._send_and_wait(client)

    def queue(self, pipe: Pipeline) -> Queued:
        """Queue the append (and its WAIT) on ``pipe``; the returned :class:`Queued`
        picks the append's reply out of the pipeline's, wherever it stands."""
        at = len(pipe)
        # EVAL, not a registered Script: redis-py checks a pipeline's scripts with
        # SCRIPT EXISTS, an extra round trip per execute (measured: 17% of a
        # worker's time); Redis caches the compiled body by its SHA1 either way
        # no-untyped-call: the library leaves it untyped
        pipe.execute_command(  # type: ignore[no-untyped-call]
            "EVAL", APPEND, len(self.keys), *self.keys, *self.argv)
        waits = queue_wait(pipe, self.log.settings)
        return Queued(self, at, waits)

    def _send_and_wait(self, client: Any) -> Any:
        """The append by SHA and its WAIT in one round trip on one connection (two
        calls on the client could take two connections of its pool, and a WAIT
        on another connection than the write's waits for nothing)."""
        scripts = self.log.scripts
        for _ in range(2):
            pipe = lean(client)
            # no-untyped-call: the library leaves it untyped
            pipe.execute_command(  # type: ignore[no-untyped-call]
                "EVALSHA", scripts.append.sha, len(self.keys), *self.keys, *self.argv)
            queue_wait(pipe, self.log.settings)
            reply, acked = pipe.execute(raise_on_error=False)
            if not isinstance(reply, redis.exceptions.NoScriptError):
                return self.confirmed(reply, acked)
            scripts.append.sha = client.script_load(APPEND)  # Redis lost it: load, resend
        return reply

    def confirmed(self, reply: Any, acked: Any) -> Any:
        """The append's ``reply``, or, when it landed (now or by an earlier send) and
        its WAIT's reply ``acked`` counts fewer replicas than asked for, the
        :class:`StoreUnavailable` it amounts to (``acked`` None: no WAIT)."""
        if acked is None or isinstance(reply, Exception) or not self._landed(reply):
            return reply
        return shortfall(self.chain_id, acked, self.log.settings) or reply

    def _landed(self, reply: Any) -> bool:
        """Whether ``reply`` says the chain holds this append: appended now, or found
        at the head, sent before (its reply lost, or too few replicas confirmed it)."""
        code, seq, extra = reply[:3]
        return bool(code == 1 or (code == 0 and extra == self.last_hash
                                  and int(seq) == self.argv[0] + self.events))

    def result(self, reply: Any) -> Head:
        if isinstance(reply, redis.exceptions.NoPermissionError):
            raise reply  # this user may not write that saga: not an outage
        if isinstance(reply, StoreUnavailable):
            raise reply  # not confirmed by enough replicas (see confirmed)
        if isinstance(reply, Exception):
            raise StoreUnavailable(f"append failed: {reply}")
        code, seq, extra = reply[:3]
        metrics = self.log.metrics
        if code == 1:
            if metrics is not None:
                metrics.appends.inc(self.events)
            return Head(int(seq), self.last_hash)
        if self._landed(reply):
            # the head is this very append: an earlier send of it succeeded and its
            # reply was lost with the connection, then the client sent it again
            return Head(int(seq), self.last_hash)
        if metrics is not None and code == 0:
            metrics.cas_conflicts.inc()
        if code == 0:
            raise ConflictError(f"chain {self.chain_id} moved to seq {seq}; re-read and decide "
                                "again", Head(int(seq), extra or b""))
        if code == -1:
            raise FencedOff(f"saga {self.chain_id}: lease is held by "
                            f"{extra.decode() or 'nobody'}, not by this writer; stop working on it",
                            Fence.LEASE)
        if code == -3:
            raise NoSuchSaga(no_such_saga(self.chain_id))
        if code == -4:
            raise FencedOff(f"saga {self.chain_id}: {extra.decode()} exists, so this append "
                            "does not hold any more; re-read and decide again", Fence.GUARD)
        raise FencedOff(f"saga {self.chain_id} is in phase {extra.decode()!r}, "
                        f"not {self.phase!r}", Fence.PHASE)


@dataclass(frozen=True, slots=True)
class Queued:
    """A prepared append queued on a pipeline: its EVAL's reply is at ``at`` in the
    pipeline's replies, its WAIT's (if ``waits``) right after. Call it with the
    replies for the append's, folded with its WAIT (see :meth:`PreparedAppend.confirmed`)."""

    call: PreparedAppend
    at: int
    waits: bool

    def __call__(self, replies: list[Any]) -> Any:
        return self.call.confirmed(replies[self.at],
                                   replies[self.at + 1] if self.waits else None)

    def others(self, replies: list[Any]) -> list[Any]:
        """The replies of the pipeline's other commands, in order."""
        end = self.at + 1 + self.waits
        return [*replies[:self.at], *replies[end:]]


def head_of(row: Any) -> Head:
    """The head a stored row ``[entry_id, fields]`` makes when it is a chain's last."""
    return Head(keys.seq_of_entry_id(row[0]), body_and_hash(row[1])[1])


def release_lease(client: Any, key: str, token: str) -> None:
    """Expire a lease now if ``token`` still holds it (compare-and-expire)."""
    client.eval(RELEASE_LEASE, 1, key, token)


class SagaLog:
    """Chain-level access to Redis. Thread-safe as redis-py's client is."""

    def __init__(self, client: redis.Redis, settings: Settings | None = None,
                 chain: Chain | None = None) -> None:
        self.settings = settings or Settings()
        self.chain = chain or Chain(self.settings.hmac_key)
        self.redis = client
        # A second client on the same pool (or cluster) returns stream replies
        # untouched: redis-py's per-entry dict building would cost more than the hashing.
        self.raw = twin(client)
        for cmd in ("XRANGE", "XREVRANGE", "XREAD"):
            self.raw.set_response_callback(cmd, _identity)
        self.scripts = Scripts(client)
        self.metrics: Metrics | None = None  # set by whoever exports metrics
        self._layout: Layout | None = None
        self._keys: keys.SagaKeys | None = None

    @property
    def layout(self) -> Layout:
        """The store's layout (read, or recorded for a new store, on first use)."""
        if self._layout is None:
            self._layout = layout.load(self.redis, self.settings.buckets,
                                       version=self.settings.layout)
        return self._layout

    @property
    def keys(self) -> keys.SagaKeys:
        """The names of sagas' keys and indexes, by the store's layout."""
        if self._keys is None:
            self._keys = self.layout.keys()
        return self._keys

    def forget_layout(self) -> None:
        """Read the layout again on next use (after ``saga migrate``)."""
        self._layout = None
        self._keys = None

    # -- writing ---------------------------------------------------------

    def encode(self, chain_id: str, bodies: Sequence[dict[str, Any]], expect: Head,
               blobs: list[SideWrite]) -> list[tuple[bytes, bytes, bytes]]:
        """Number, size-check and link ``bodies`` after ``expect``. Writes nothing:
        large payloads become content-addressed blobs, added to ``blobs`` for the
        append to write with itself."""
        prev = expect.hash if not expect.empty else self.chain.genesis(chain_id)
        seq = expect.seq
        out = []
        for body in bodies:
            seq += 1
            body["seq"] = seq
            raw = canonical(body)
            if len(raw) > self.settings.blob_threshold and "data" in body:
                body["data"] = self._blob(chain_id, body["data"], blobs)
                raw = canonical(body)
            if len(raw) > self.settings.max_event_bytes:
                raise InvalidInput(
                    f"event of {len(raw)} bytes exceeds the {self.settings.max_event_bytes}-byte "
                    "limit; move large fields into the payload or raise SAGA_MAX_EVENT_BYTES")
            h = self.chain.link(prev, raw)
            out.append((raw, prev, h))
            prev = h
        return out

    def append(self, chain_id: str, bodies: Sequence[dict[str, Any]], expect: Head, *,
               lease: Lease | None = None, phase: Phase | None = None,
               meta: Mapping[str, str | int] | None = None) -> Head:
        """Append ``bodies`` (each gets its ``seq``) if the head is still ``expect``.

        Raises :class:`ConflictError` (with ``.head``) when another writer moved
        the head, :class:`FencedOff` when the lease or phase check fails.
        """
        call = self.prepare(chain_id, bodies, expect, lease=lease, phase=phase, meta=meta)
        try:
            reply = call.send(self.redis)
        except redis.ConnectionError as exc:
            raise StoreUnavailable(f"Redis unreachable during append: {exc}") from exc
        return call.result(reply)

    def prepare(self, chain_id: str, bodies: Sequence[dict[str, Any]], expect: Head, *,
                lease: Lease | None = None, phase: Phase | None = None,
                meta: Mapping[str, str | int] | None = None,
                side: Sequence[SideWrite] = (),
                ledger: Callable[[bytes, int, bytes], SideWrite] | None = None,
                ) -> PreparedAppend:
        """Encode an append without sending it, so it can go in a pipeline.
        ``side``: writes to keys of the same slot made in the same script call,
        only if the append succeeds (a refused append writes nothing); ``ledger``:
        makes one more from the append's first hash, last seq and last hash (the
        saga's ledger entry, of layout 3, where it is in the saga's slot). Only a
        saga's opening (``saga_started`` first) or the ledger's first append
        creates a chain: any other append to a chain that does not exist raises
        :class:`NoSuchSaga` and writes nothing."""
        blobs: list[SideWrite] = []
        linked = self.encode(chain_id, bodies, expect, blobs)
        token, mode, ttl = lease if lease is not None else ("", LeaseMode.HOLD, 0)
        if expect.empty and (keys.is_ledger(chain_id)
                             or bodies[0]["kind"] == EventKind.SAGA_STARTED):
            phase = Phase.OPEN
        phase = phase or Phase.ANY
        argv: list[Any] = [expect.seq, expect.hash, token, mode, ttl, phase, len(linked)]
        for body, (raw, _prev, h) in zip(bodies, linked, strict=True):
            argv += (raw, h, PHASE_AFTER.get(body["kind"], ""))
        argv.append(len(meta or ()))
        for kv in (meta or {}).items():
            argv += kv
        k = self.keys.chain_log(chain_id)
        chain_keys = [k, k[:-4] + ":meta", k[:-4] + ":lease"]
        side = [*blobs, *side]
        if ledger is not None:
            side.append(ledger(linked[0][2], expect.seq + len(linked), linked[-1][2]))
        argv.append(len(side))
        for w in side:
            if w.key not in chain_keys:
                chain_keys.append(w.key)
            argv += (w.op, chain_keys.index(w.key) + 1, len(w.args), *w.args)
        return PreparedAppend(self, chain_id, chain_keys, argv,
                              linked[0][2], linked[-1][2], phase, len(linked),
                              rides_ledger=ledger is not None)

    def _blob(self, chain_id: str, data: Any, blobs: list[SideWrite]) -> dict[str, Any]:
        raw = canonical(data)
        if len(raw) > self.settings.max_event_bytes:
            raise InvalidInput(
                f"payload of {len(raw)} bytes exceeds the {self.settings.max_event_bytes}-byte "
                "limit; store it elsewhere and pass a reference, or raise SAGA_MAX_EVENT_BYTES")
        digest = hashlib.sha256(raw).hexdigest()
        blobs.append(SideWrite("set", self.keys.blob(chain_id, digest), (raw,)))
        return {"$blob": f"sha256:{digest}", "bytes": len(raw)}

    def load_blob(self, chain_id: str, ref: Mapping[str, Any]) -> Any:
        digest = str(ref["$blob"]).removeprefix("sha256:")
        raw = command(self.redis, "GET", self.keys.blob(chain_id, digest))
        if raw is None or hashlib.sha256(raw).hexdigest() != digest:
            return None
        return orjson.loads(raw)

    def check_payload(self, data: Any, what: str = "data") -> Any:
        return check_json(data, what, self.settings.max_depth)

    # -- reading ---------------------------------------------------------

    def head(self, chain_id: str) -> Head:
        try:
            last = command(
                self.raw, "XREVRANGE", self.keys.chain_log(chain_id), "+", "-", "COUNT", 1)
        except redis.ConnectionError as exc:
            raise StoreUnavailable(f"Redis unreachable: {exc}") from exc
        return head_of(last[0]) if last else EMPTY

    def pages(self, chain_id: str, start_seq: int = 0, page: int = PAGE,
              ) -> Iterator[list[Any]]:
        """Stored rows ``[entry_id, [field, value, ...]]`` from ``start_seq`` on, a page
        at a time, untouched (the verifier's fast path)."""
        key = self.keys.chain_log(chain_id)
        start: str | bytes = keys.entry_id(start_seq) if start_seq > 0 else "-"
        while True:
            rows = command(self.raw, "XRANGE", key, start, "+", "COUNT", page)
            if rows:
                yield rows
            if len(rows) < page:
                return
            start = b"(" + rows[-1][0]

    def entries(self, chain_id: str, start_seq: int = 0) -> Iterator[RawEntry]:
        """Every stored entry from ``start_seq`` on (unverified)."""
        prev = self.chain.genesis(chain_id)
        if start_seq > 0:
            before = command(self.raw, "XRANGE", self.keys.chain_log(chain_id),
                             keys.entry_id(start_seq - 1), keys.entry_id(start_seq - 1))
            prev = body_and_hash(before[0][1])[1] if before else b""
        for rows in self.pages(chain_id, start_seq):
            for eid, fields in rows:
                body, h = body_and_hash(fields)
                yield RawEntry(eid, body, h, prev)
                prev = h

    def bodies(self, chain_id: str, start_seq: int = 0) -> list[dict[str, Any]]:
        """Event bodies from ``start_seq`` on, without prev/hash (enough for a fold)."""
        return [orjson.loads(body_and_hash(fields)[0])
                for rows in self.pages(chain_id, start_seq) for _, fields in rows]

    def bodies_and_head(self, chain_id: str) -> tuple[list[dict[str, Any]], Head]:
        """Every event body and the head, from one read: the head is the last event
        read, so a writer that appends at it decides on everything before it."""
        bodies: list[dict[str, Any]] = []
        last = None
        for rows in self.pages(chain_id):
            bodies.extend(orjson.loads(body_and_hash(fields)[0]) for _, fields in rows)
            last = rows[-1]
        return bodies, head_of(last) if last is not None else EMPTY

    def events(self, chain_id: str, start_seq: int = 0) -> list[dict[str, Any]]:
        return [e.event() for e in self.entries(chain_id, start_seq)]

    def wait(self, chain_id: str, after_seq: int, block_ms: int) -> list[RawEntry]:
        """Block until entries after ``after_seq`` exist (XREAD BLOCK), or time out."""
        key = self.keys.chain_log(chain_id)
        after = keys.entry_id(after_seq) if after_seq >= 0 else "0-0"
        reply = command(self.raw, "XREAD", "BLOCK", block_ms, "STREAMS", key, after)
        if not reply:
            return []
        stream = reply[0] if isinstance(reply, list) else next(iter(reply.items()))
        out = []
        for eid, fields in stream[1]:
            body, h = body_and_hash(fields)
            out.append(RawEntry(eid, body, h, b""))  # prev unknown to a follower
        return out

    def chain_ids(self) -> Iterator[str]:
        """Saga ids that have a log in Redis (SCAN; for verification and repair)."""
        names = self.keys
        for k in self.redis.scan_iter(match=names.log_pattern(), count=1000):
            sid = names.saga_of_log(k.decode() if isinstance(k, bytes) else k)
            if sid is not None:
                yield sid
