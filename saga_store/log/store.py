"""The store: one Redis client, the log, the ledger, and saga-level writes.

:class:`ChainWriter` appends to one saga's chain with a cached head. It keeps
the cached projection in ``ss:{S}:meta`` in step with the log (same script
call) and records the saga's opening and close in the ledger.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self

import redis

from saga_store.errors import ConflictError, IntegrityError, InvalidInput, NoSuchSaga, no_such_saga
from saga_store.faults import fault
from saga_store.ids import agent_of, check_id, check_saga_id, scoped_saga_id
from saga_store.keys import SagaKeys
from saga_store.log.events import TERMINAL_KINDS, body_dict
from saga_store.log.events import EventKind as K
from saga_store.log.ledger import CLOSE_FLAG, OPEN_FLAG, Ledger
from saga_store.log.pipeline import lean
from saga_store.log.stream import (
    EMPTY,
    STATUS_AFTER,
    Head,
    Lease,
    PreparedAppend,
    SagaLog,
    SideWrite,
    command,
    head_of,
)
from saga_store.ops.connection import connect
from saga_store.protocol import build
from saga_store.protocol.state import FINAL, SagaState, Status, fold, paused_gc, phase_of
from saga_store.protocol.vocab import Phase
from saga_store.settings import Settings
from saga_store.tools.secrets import Secrets

_META = STATUS_AFTER  # the cached projection each kind moves a saga to


class EventStore:
    """Entry point for writing and reading sagas.

    >>> store = EventStore.from_url("redis://127.0.0.1:6379/0")  # doctest: +SKIP
    >>> w = store.open("agent-7")                            # doctest: +SKIP
    """

    def __init__(self, client: redis.Redis, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self.redis = client
        self.log = SagaLog(client, self.settings)
        self.ledger = Ledger(self.log)

    @classmethod
    def from_url(cls, url: str, settings: Settings | None = None) -> Self:
        return cls(connect(url), settings)

    @property
    def keys(self) -> SagaKeys:
        """The names of sagas' keys and indexes, by the store's layout."""
        return self.log.keys

    def open(self, agent_id: str, *, saga_id: str | None = None,
             conversation_id: str | None = None, data: Mapping[str, Any] | None = None,
             then: Sequence[tuple[str, Mapping[str, Any]]] = (),
             lease: Lease | None = None, side: Sequence[SideWrite] = ()) -> ChainWriter:
        """Start a saga: ``saga_started`` (and ``then``, in the same append) in its
        chain, then its opening in the ledger. With ``lease``, the writer holds the
        saga's lease from its first event on, and carries it on every append."""
        opening = self.prepare_open(agent_id, saga_id=saga_id,
                                    conversation_id=conversation_id, data=data, then=then,
                                    lease=lease, side=side)
        return opening.applied(opening.call.send(self.redis))

    def prepare_open(self, agent_id: str, *, saga_id: str | None = None,
                     conversation_id: str | None = None,
                     data: Mapping[str, Any] | None = None,
                     then: Sequence[tuple[str, Mapping[str, Any]]] = (),
                     lease: Lease | None = None, side: Sequence[SideWrite] = ()) -> Opening:
        """The opening append of :meth:`open`, encoded, to send in a pipeline;
        ``side``: writes made only if the saga is opened (see :class:`SideWrite`)."""
        check_id(agent_id, "agent_id")
        sid = check_saga_id(saga_id) if saga_id is not None else scoped_saga_id(agent_id)
        owner = agent_of(sid)
        if owner is not None and owner != agent_id:
            raise InvalidInput(f"saga id {sid[:60]!r} is in agent {owner!r}'s namespace, "
                               f"not {agent_id!r}'s; omit it, or start it with "
                               f"'{agent_id}_'", field="saga_id")
        if conversation_id is not None:
            check_id(conversation_id, "conversation_id")
        payload = dict(data or {})
        if conversation_id is not None:
            payload["conversation_id"] = conversation_id
        self.log.check_payload(payload)
        # two opens of one id never look alike, so a resent open (its reply lost with
        # the connection) is told apart from someone else's open of the same id
        payload["open_id"] = os.urandom(8).hex()
        writer = ChainWriter(self, sid, EMPTY, lease)
        rides = self.keys.bucketed  # the ledger's entry goes with the saga (layout 3)
        # the opening events have no context projection: the cursor starts past them
        call = writer.prepare(
            [build.saga_started(agent_id, payload), *then],
            meta={"agent_id": agent_id, "state": Status.RUNNING, "phase": Phase.FORWARD,
                  "ctx_seq": len(then), OPEN_FLAG: int(rides),
                  **({"conversation_id": conversation_id} if conversation_id else {})},
            side=side, ledger=self.ledger.opening_entry(sid, agent_id) if rides else None)
        return Opening(writer, call, agent_id)

    def writer(self, saga_id: str) -> ChainWriter:
        """A writer for an existing saga, positioned at its current head; raises
        :class:`NoSuchSaga` for an id that names no saga."""
        check_saga_id(saga_id)
        head = self.log.head(saga_id)
        if head.empty:
            raise NoSuchSaga(no_such_saga(saga_id))
        return ChainWriter(self, saga_id, head)

    def read_for_write(self, saga_id: str) -> tuple[SagaState, ChainWriter]:
        """The saga's state and a writer at the head that state was folded from, from
        one read: an append decided on the state loses its compare-and-set if anyone
        appended since, so two people deciding at once cannot both act."""
        self.require(saga_id)
        bodies, head = self.log.bodies_and_head(saga_id)
        with paused_gc():
            return fold(saga_id, bodies), ChainWriter(self, saga_id, head)

    def exists(self, saga_id: str) -> bool:
        """Whether ``saga_id`` names a saga (its log exists); checks the id first."""
        check_saga_id(saga_id)
        return bool(command(self.redis, "EXISTS", self.log.keys.log(saga_id)))

    def require(self, saga_id: str) -> None:
        """Raise :class:`NoSuchSaga` unless ``saga_id`` names a saga; writes nothing."""
        if not self.exists(saga_id):
            raise NoSuchSaga(no_such_saga(saga_id))

    def pay_ledger_debts(self, saga_id: str, state: SagaState,
                         trusted: Callable[[], bool] = lambda: True) -> list[str]:
        """Push the ledger entries a killed writer owed this saga (see
        :mod:`saga_store.ledger`), from its log, if ``trusted()`` says its chain
        verifies (a forged saga is never entered); returns which ("open", "close")."""
        meta = command(self.redis, "HMGET", self.log.keys.meta(saga_id), OPEN_FLAG, CLOSE_FLAG)
        owed_open, owed_close = (v == b"0" for v in meta)
        owed_close = owed_close and state.final
        if not (owed_open or owed_close) or not trusted():
            return []
        pipe = self.redis.pipeline(transaction=False)
        thens, paid = [], []
        if owed_open:
            first = command(self.log.raw, "XRANGE", self.log.keys.log(saga_id), "0-1", "0-1")
            if first and state.agent_id:
                thens.append(self.ledger.opened_on(pipe, saga_id, state.agent_id,
                                                   head_of(first[0]).hash))
                paid.append("open")
        if owed_close:
            thens.append(self.ledger.closed_on(pipe, saga_id, str(state.status),
                                               self.log.head(saga_id)))
            paid.append("close")
        replies = pipe.execute(raise_on_error=False)
        for then in thens:
            then(replies)
        return paid

    def state(self, saga_id: str) -> SagaState:
        check_saga_id(saga_id)
        try:
            with paused_gc():
                return fold(saga_id, self.log.bodies(saga_id))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:  # incl. JSON errors
            raise IntegrityError(
                f"saga {saga_id}: its log holds an entry that is not a valid event "
                f"({type(exc).__name__}: {str(exc)[:200]}); run 'saga verify --saga "
                f"{saga_id}' to find it") from None

    def meta(self, saga_id: str) -> dict[str, str]:
        raw: dict[bytes, bytes] = command(self.redis, "HGETALL", self.log.keys.meta(saga_id))
        if isinstance(raw, list):  # RESP2 without redis-py's callback
            raw = dict(zip(raw[::2], raw[1::2], strict=True))
        return {k.decode(): v.decode() for k, v in raw.items()}

    def rebuild_meta(self, saga_id: str) -> dict[str, str]:
        """Recompute the cached projection from the log (repair after tampering or
        loss). Written only if the log did not move meanwhile (WATCH), so a repair
        never puts back a state an append just left."""
        for _ in range(20):
            with self.redis.pipeline() as pipe:
                pipe.watch(self.log.keys.log(saga_id))  # type: ignore[no-untyped-call]
                st = self.state(saga_id)
                meta = {"agent_id": st.agent_id or "", "state": str(st.status),
                        "phase": str(phase_of(st.status)), "seq": str(st.seq)}
                pipe.multi()
                pipe.hset(self.log.keys.meta(saga_id),
                          mapping=meta)  # type: ignore[arg-type]
                try:
                    pipe.execute()
                except redis.WatchError:
                    continue  # appended to meanwhile: fold again
                return meta
        raise ConflictError(f"saga {saga_id} kept changing; try again")

    def saga_ids(self, limit: int | None = None, agent_id: str | None = None) -> list[str]:
        """Saga ids from the ledger's opening entries, newest first (of one agent if
        ``agent_id`` is given); of a ledger in buckets, merged by their time."""
        found: list[tuple[int, str]] = []
        seen: set[str] = set()
        for ev in [*self.ledger.bodies(), *self.ledger.pending()]:
            data = ev.get("data") or {}
            sid = data.get("saga_id")
            if ev["kind"] != K.LEDGER_OPENED or not isinstance(sid, str) or sid in seen:
                continue
            if agent_id is None or data.get("agent_id") == agent_id:
                seen.add(sid)
                found.append((int(ev.get("ts") or 0), sid))
        found.sort(reverse=True)  # of one millisecond, by id (see ids.new_id)
        out = [sid for _, sid in found]
        return out[:limit] if limit else out


@dataclass
class Opening:
    """A saga's opening append, prepared by :meth:`EventStore.prepare_open`."""

    writer: ChainWriter
    call: PreparedAppend
    agent_id: str
    # with a pipe given to applied(): takes that pipeline's replies (see Ledger)
    ledger_written: Callable[[list[Any]], int] = lambda replies: 0

    def refused(self, reply: Any) -> bool:
        """Whether the open's reply says the saga id was already taken (a resent
        open whose first reply was lost is not refused: it is this very open)."""
        if isinstance(reply, Exception) or int(reply[0]) != 0:
            return False
        try:
            self.call.result(reply)
        except ConflictError:
            return True
        return False

    def applied(self, reply: Any, pipe: Any = None,
                defer_ledger: bool | None = None) -> ChainWriter:
        """Take the append's reply, then write the ledger's opening entry; with
        ``pipe`` it is queued there (execute it, then hand its replies to
        ``ledger_written``). ``defer_ledger``: leave the entry for a worker's sweeper
        to chain (default: the ledger's own setting)."""
        w, ledger = self.writer, self.writer.store.ledger
        try:
            w.applied(self.call, reply)
        except ConflictError:
            raise InvalidInput(f"saga {w.saga_id} already exists; choose another id or omit "
                               "it", field="saga_id") from None
        if self.call.rides_ledger:  # pushed with the saga itself: only sealing is left
            pushed = self.call.pushed(reply)
            if pipe is None:
                ledger.rode(w.saga_id, pushed, defer_ledger)
            else:
                self.ledger_written = lambda _replies: ledger.rode(w.saga_id, pushed,
                                                                  defer_ledger)
        elif pipe is None:
            ledger.opened(w.saga_id, self.agent_id, self.call.first_hash)
        else:
            self.ledger_written = ledger.opened_on(pipe, w.saga_id, self.agent_id,
                                                   self.call.first_hash, defer_ledger)
        return w


class ChainWriter:
    """Appends to one saga's chain, keeping its head cached; not shared between threads."""

    def __init__(self, store: EventStore, saga_id: str, head: Head,
                 lease: Lease | None = None) -> None:
        self.store, self.saga_id, self.head = store, saga_id, head
        self.lease = lease  # carried by every append that names no lease of its own
        self._last_kind = ""
        self._rode = False  # the last prepared append pushes its closing entry itself
        self._pushed = 0  # the pending list's length after the last applied append

    def append(self, kind: str, *, lease: Lease | None = None, phase: Phase | None = None,
               meta: Mapping[str, str | int] | None = None, **fields: Any) -> Head:
        return self.append_many([(kind, fields)], lease=lease, phase=phase, meta=meta)

    def append_many(self, items: Sequence[tuple[str, Mapping[str, Any]]], *,
                    lease: Lease | None = None, phase: Phase | None = None,
                    meta: Mapping[str, str | int] | None = None,
                    side: Sequence[SideWrite] = ()) -> Head:
        """Append events in one CAS. On :class:`ConflictError` the cached head is
        refreshed and the error re-raised: the caller re-reads and decides."""
        call = self.prepare(items, lease=lease, phase=phase, meta=meta, side=side)
        return self.applied(call, call.send(self.store.redis))

    def prepare(self, items: Sequence[tuple[str, Mapping[str, Any]]], *,
                lease: Lease | None = None, phase: Phase | None = None,
                meta: Mapping[str, str | int] | None = None,
                side: Sequence[SideWrite] = (),
                ledger: Callable[[bytes, int, bytes], SideWrite] | None = None,
                ) -> PreparedAppend:
        """Encode an append to send later (alone or in a pipeline); see :meth:`applied`.
        A close also retires the saga's secret values, in the same script call, and
        of layout 3 pushes the saga's closing ledger entry (``ledger``: an opening's)."""
        bodies = [body_dict(self.saga_id, 0, kind, **f) for kind, f in items]
        meta = dict(meta or {})
        close_rides = False  # whether this append pushes the saga's closing entry itself
        last = items[-1][0]
        moved = next((kind for kind, _ in reversed(items) if kind in _META), None)
        if moved is not None and "state" not in meta:
            status = _META[moved]
            meta.update(state=status, phase=phase_of(status))
            if status in FINAL and self.store.keys.bucketed:  # the entry goes with it
                meta[CLOSE_FLAG] = 1
                ledger = self.store.ledger.closing_entry(self.saga_id, str(status))
                close_rides = True
            elif status in FINAL:  # its ledger entry is owed until pushed
                meta[CLOSE_FLAG] = 0
        if last in TERMINAL_KINDS:  # nothing of it runs again: its secrets and lease go
            side = [*side, Secrets.retire(self.store.log.keys, self.saga_id),
                    SideWrite("pexpire", self.store.log.keys.driver(self.saga_id), (0,))]
        call = self.store.log.prepare(self.saga_id, bodies, self.head,
                                      lease=lease if lease is not None else self.lease,
                                      phase=phase, meta=meta, side=side, ledger=ledger)
        self._last_kind = last
        self._rode = close_rides  # else a close is pushed after it (applied, close_on)
        return call

    def applied(self, call: PreparedAppend, reply: Any, *, ledger: bool = True) -> Head:
        """Take the reply of a prepared append: move the head, close the saga in the
        ledger if the append ended it (unless ``ledger`` is False: the caller then
        queues the closing entry itself, with :meth:`close_on`)."""
        try:
            self.head = call.result(reply)
        except ConflictError as exc:
            if exc.head is not None:
                self.head = exc.head
            raise
        self._pushed = call.pushed(reply)
        if ledger and self.closed and self._rode:
            self.store.ledger.rode(self.saga_id, self._pushed)
        elif ledger and self.closed:
            fault("before_ledger_close")  # the sweeper pays what a writer killed here owed
            self.store.ledger.closed(self.saga_id, str(_META[self._last_kind]), self.head)
        return self.head

    def appended(self, items: Sequence[tuple[str, Mapping[str, Any]]]) -> list[dict[str, Any]]:
        """``items`` as the events the last append made of them, seqs included (call
        after :meth:`applied`)."""
        first = self.head.seq - len(items) + 1
        return [{"kind": kind, "seq": first + i, **fields}
                for i, (kind, fields) in enumerate(items)]

    def append_riding(self, items: Sequence[tuple[str, Mapping[str, Any]]],
                      riders: Callable[[Any], None] | None = None, *,
                      lease: Lease | None = None, phase: Phase | None = None,
                      ledger: bool = True) -> list[dict[str, Any]]:
        """Append in one round trip on a lean pipeline, after ``riders`` queue their
        commands on it (commands about what is already in the log, such as context
        events: they stand whatever the append's fate). Returns the events as
        appended; raises as :meth:`applied` does, then a rider's error."""
        pipe, done = self.riding(items, riders, lease=lease, phase=phase, ledger=ledger)
        return done(pipe.execute(raise_on_error=False))

    def riding(self, items: Sequence[tuple[str, Mapping[str, Any]]],
               riders: Callable[[Any], None] | None = None, *,
               lease: Lease | None = None, phase: Phase | None = None,
               ledger: bool = True,
               ) -> tuple[Any, Callable[[list[Any]], list[dict[str, Any]]]]:
        """:meth:`append_riding` in two halves, for a caller that sends the round trip
        itself: the lean pipeline with everything queued, and what to hand its
        replies to (it returns the events as appended)."""
        call = self.prepare(items, lease=lease, phase=phase)
        pipe = lean(self.store.redis)
        if riders is not None:
            riders(pipe)
        queued = call.queue(pipe)

        def done(replies: list[Any]) -> list[dict[str, Any]]:
            self.applied(call, queued(replies), ledger=ledger)
            for got in queued.others(replies):
                if isinstance(got, Exception):
                    raise got
            return self.appended(items)
        return pipe, done

    @property
    def closed(self) -> bool:
        """Whether the last prepared append ends the saga."""
        return self._last_kind in (K.SAGA_COMMITTED, K.SAGA_COMPENSATED,
                                   K.SAGA_NEEDS_ATTENTION)

    def close_on(self, pipe: Any) -> Callable[[list[Any]], int]:
        """Queue the saga's closing ledger entry on ``pipe``; see :meth:`Ledger.closed_on`
        (of layout 3 it went with the closing append: only the sealing is left)."""
        if self._rode:
            pushed = self._pushed
            return lambda _replies: self.store.ledger.rode(self.saga_id, pushed)
        return self.store.ledger.closed_on(pipe, self.saga_id, str(_META[self._last_kind]),
                                           self.head)
