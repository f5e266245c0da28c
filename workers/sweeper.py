"""The sweeper: redelivers work whose worker died, without waiting for RQ.

Sagas with work in flight sit in ``ss:active`` scored by the time (ms) after
which someone should look at them. The sweeper takes the due ones, folds each
saga's log and, if no live lease covers it, re-queues its unfinished step or
its unwind. A duplicate job is harmless (the log dedupes), so several
sweepers may run at once. Times come from Redis's clock.

Of layout 3 the shared index is one per bucket. The buckets are swept in
groups of SWEEP_GROUP, each under a lease (``ss:sweep:<group>``) a sweeper
takes for most of its interval: the fleet looks at every bucket about once an
interval, however many workers it has, instead of each worker at each.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from typing import Any

import redis
from rq.exceptions import StopRequested

from saga_store import keys
from saga_store.approval import requests as approvals
from saga_store.client.api import SagaStore
from saga_store.client.context import project
from saga_store.errors import ConflictError, FencedOff
from saga_store.execution.enqueue import (
    belongs,
    enqueue_compensation,
    enqueue_step,
    indexes,
    server_ms,
)
from saga_store.ids import SCOPED_AGENT
from saga_store.log.pipeline import lean
from saga_store.log.stream import SideWrite
from saga_store.protocol import build
from saga_store.protocol.state import fold, phase_of
from saga_store.protocol.sweep import Sweep, client_driven, on_sweep
from saga_store.protocol.vocab import Phase
from saga_store.verify.checker import Verifier

log = logging.getLogger("saga_store.sweeper")
BATCH = 200
SEAL_SLICE = 256  # ledger buckets a pass looks at: all 1,024 within 4 passes
SWEEP_GROUP = 64  # buckets under one sweep lease (layout 3)
ROOT_EVERY_S = 30.0  # how often the root chain records the buckets' heads
LOOK_AFTER_MS = 100  # after a lease expires, before the sweeper looks again


class Sweeper:
    """``here``: an inline runner that runs what is owed in this process instead of
    queueing it, for the sagas of ``agent`` only (the inline executor's recovery:
    it touches no one else's saga and needs no more rights than its agent user)."""

    def __init__(self, store: SagaStore, name: str, interval_s: float = 1.0, *,
                 here: Any = None, agent: str | None = None) -> None:
        self.store, self.name, self.interval_s = store, name, interval_s
        self.here, self.agent = here, agent
        self._next = 0.0
        self.redelivered = 0
        # where this sweeper's next slice of ledger buckets starts: anywhere, so
        # sweepers of several workers start apart
        self._seal_from = random.randrange(1 << 16)
        self._sweep_from = random.randrange(1 << 16)  # the same for the sweep leases
        self._root_due = time.monotonic() + ROOT_EVERY_S * random.random()

    def due(self) -> bool:
        return time.monotonic() >= self._next

    def sweep(self) -> int:
        """One pass over the due sagas; returns how many jobs it queued."""
        self._next = time.monotonic() + self.interval_s
        r = self.store.redis
        now_ms = server_ms(r)  # the hosts' own clocks need not agree
        # the shared index, and each agent's own (agents write no index but theirs)
        mine = self._buckets(r) if self.here is None else None
        looked = indexes(r, self.store.events.keys, mine) if self.here is None \
            else self._own_indexes()
        pipe = lean(r)  # of layout 3, a command per bucket: pack them lean
        for index, _ in looked:
            # no-untyped-call: the library leaves it untyped
            pipe.execute_command(  # type: ignore[no-untyped-call]
                "ZRANGEBYSCORE", index, "-inf", now_ms, "LIMIT", 0, BATCH)
        queued = 0
        for (index, agent), due in zip(looked, pipe.execute(raise_on_error=False),
                                       strict=True):
            if isinstance(due, Exception):  # not an index (an agent wrote that key)
                log.error("sweeper: %s is not an index of sagas (%s); skipped", index, due)
                continue
            for raw in due:
                queued += self._look_from(index, agent, raw, now_ms)
        self.redelivered += queued
        if self.here is not None:  # sealing and deadlines are the workers' business
            return queued
        with contextlib.suppress(redis.RedisError):  # a note for operators, never in the way
            r.hset(keys.SWEEPER_LAST, mapping={"at_ms": now_ms, "by": self.name,
                                               "indexes": len(looked), "queued": queued})
        try:  # ledger entries a sealer that died left pending: a slice of buckets a pass
            ledger = self.store.events.ledger
            _, self._seal_from = ledger.seal_some(self._seal_from, SEAL_SLICE)
            if time.monotonic() >= self._root_due:
                self._root_due = time.monotonic() + ROOT_EVERY_S
                ledger.record_root()
        except StopRequested:
            raise  # a warm shutdown's SIGTERM landed here: the worker stops, not the sweep
        except Exception:
            log.exception("sweeper: pending ledger entries could not be chained")
        try:
            expired = approvals.expire_due(self.store, now_ms=now_ms, buckets=mine)
        except StopRequested:
            raise
        except Exception:
            log.exception("sweeper: approval deadlines could not be checked")
        else:
            if expired:
                log.warning("sweeper %s: %d approval(s) timed out and were denied", self.name,
                            expired)
        return queued

    def _look_from(self, index: str, agent: str | None, raw: bytes, now_ms: int) -> int:
        """Look at one due entry of ``index``; whatever it holds, never raise. An
        entry that does not belong there (another agent's saga listed in an agent's
        index, or no saga id at all) is dropped from it, never looked at, so an
        agent cannot make the sweeper touch someone else's saga."""
        sid = raw.decode("utf-8", "replace")
        try:
            if not belongs(sid, agent):
                log.warning("sweeper: %r does not belong in %s; dropped from it", sid[:80],
                            index)
                self.store.redis.zrem(index, raw)
                return 0
            queued = self._look_at(sid, now_ms)
            # written there before agents had indexes of their own
            if index != self.store.events.keys.active(sid):
                self.store.redis.zrem(index, raw)
            return queued
        except StopRequested:
            raise
        except Exception:
            log.exception("sweeper: saga %r could not be examined", sid[:80])
            return 0

    def _own_indexes(self) -> list[tuple[str, str | None]]:
        """The index the sagas of ``self.agent`` are in (the shared ones for an agent
        without a namespace of its own)."""
        names = self.store.events.keys
        if self.agent is not None and SCOPED_AGENT.fullmatch(self.agent):
            own = {b: [self.agent] for b in names.all_buckets()} if names.bucketed else {}
            return [x for x in names.all_active([self.agent], in_buckets=own) if x[1]]
        return names.all_active([])

    def _buckets(self, r: Any) -> list[int] | None:
        """Of layout 3, the buckets whose shared index this pass looks at: those of
        every group whose sweep lease it takes (one round trip); None: all (of
        layouts 1 and 2 there is one shared index)."""
        names = self.store.events.keys
        if not names.bucketed:
            return None
        groups = -(-names.buckets // SWEEP_GROUP)
        order = [(self._sweep_from + i) % groups for i in range(groups)]
        self._sweep_from += 1
        ttl_ms = max(50, int(self.interval_s * 900))  # free again before the next pass
        pipe = r.pipeline(transaction=False)
        for g in order:
            pipe.set(keys.sweep_lease(g), self.name, nx=True, px=ttl_ms)
        won = [g for g, took in zip(order, pipe.execute(raise_on_error=False), strict=True)
               if took is True]
        return [b for g in won
                for b in range(g * SWEEP_GROUP, min((g + 1) * SWEEP_GROUP, names.buckets))]

    def _look_at(self, sid: str, now_ms: int) -> int:
        r, lease_ms = self.store.redis, self.store.settings.lease_ms
        state = fold(sid, self.store.events.log.bodies(sid))
        if self.here is not None and state.agent_id != self.agent:
            return 0  # another agent's saga in the shared index: the workers' to sweep
        verdict: list[bool] = []
        if state.seq >= 0:  # ledger entries a writer killed mid-way owed, from the log
            paid = self.store.events.pay_ledger_debts(sid, state, lambda: self._verifies(sid,
                                                                                  verdict))
            if paid:
                log.warning("sweeper %s: saga %s: wrote the ledger entries its writer owed "
                            "(%s)", self.name, sid, ", ".join(paid))
        if state.seq >= 0:
            self._repair_projection(sid, state)
        live = state.seq >= 0 and not state.final
        left_ms = r.pttl(self.store.events.keys.lease(sid)) if live else 0
        driven = live and client_driven(state)
        driver_ms = r.pttl(self.store.events.keys.driver(sid)) if driven else None
        swept = on_sweep(state, left_ms, driver_ms)
        if swept.what is Sweep.ABANDON:
            return self._abandon(sid, now_ms)
        if swept.what is Sweep.RETIRE:
            project(self.store.events, sid)  # a closer that died may not have
            if state.final and not self._verifies(sid, verdict):
                log.error("saga %s: its chain does not verify; run 'saga verify --saga %s'",
                          sid, sid)
                if self.store.metrics is not None:
                    self.store.metrics.verify_failures.inc()
            r.zrem(self.store.events.keys.active(sid), sid)
            return 0
        trip = self.store.trip()
        pipe: Any = trip.log
        index = self.store.events.keys.active(sid)
        if swept.what is Sweep.WAIT:  # someone is working on it: look when the lease ends
            pipe.zadd(index, {sid: now_ms + left_ms + LOOK_AFTER_MS})
        elif swept.what is Sweep.IDLE and driver_ms is not None:  # when its caller's lease ends
            pipe.zadd(index, {sid: now_ms + max(driver_ms, 0) + LOOK_AFTER_MS})
        elif swept.what is Sweep.IDLE:  # waiting on its agent or a person: much later
            pipe.zadd(index, {sid: now_ms + 60 * lease_ms})
        else:
            pipe.zadd(index, {sid: now_ms + lease_ms})
        if self.here is None:
            if swept.what is Sweep.UNWIND:
                enqueue_compensation(trip.queue, sid)
            for step, intent_seq, key in swept.steps:
                enqueue_step(trip.queue, self.store.queue, sid, step, intent_seq, key)
        trip.execute()
        if self.here is not None:  # run here what would have been queued
            for step, intent_seq, _ in swept.steps:
                self.here.steps.run(sid, step, intent_seq)
            if swept.what is Sweep.UNWIND:
                self.here.unwinds.run(sid)
        queued = len(swept.steps) + (swept.what is Sweep.UNWIND)
        if queued:
            log.info("sweeper %s: redelivered %d job(s) of saga %s", self.name, queued, sid)
        return queued

    def _abandon(self, sid: str, now_ms: int) -> int:
        """Abort a client-driven saga whose caller is gone (its lease lapsed with no
        call and no keepalive) and queue its unwind. Decided again on a fresh read,
        by compare-and-set: a caller that came back and called first wins."""
        state, writer = self.store.events.read_for_write(sid)
        lapsed = self.store.redis.pttl(self.store.events.keys.driver(sid)) <= 0
        if not (lapsed and on_sweep(state, 0, 0).what is Sweep.ABANDON):
            self.store.redis.zadd(self.store.events.keys.active(sid), {sid: now_ms + LOOK_AFTER_MS})
            return 0
        lease_s = (state.client_lease_ms or 0) / 1000
        try:  # refused if the caller's lease came back since it was read (a keepalive)
            writer.append_many([build.saga_failed(
                f"abandoned: its caller made no call and no keepalive for {lease_s:g} s "
                "(SAGA_CLIENT_LEASE_S)")], phase=Phase.FORWARD,
                side=[SideWrite("absent", self.store.events.keys.driver(sid))])
        except (ConflictError, FencedOff):
            self.store.redis.zadd(self.store.events.keys.active(sid), {sid: now_ms + LOOK_AFTER_MS})
            return 0  # its caller (or someone) wrote meanwhile: look again
        trip = self.store.trip()
        look_at = now_ms + self.store.settings.lease_ms
        trip.log.zadd(self.store.events.keys.active(sid), {sid: look_at})
        if self.here is None:
            enqueue_compensation(trip.queue, sid)
        trip.execute()
        if self.here is not None:
            self.here.unwinds.run(sid)
        log.warning("sweeper %s: saga %s: its caller is gone (no call for %g s); aborted, "
                    "unwinding", self.name, sid, lease_s)
        return 1

    def _repair_projection(self, sid: str, state: Any) -> None:
        """Put the cached state back to the fold of the log if someone changed it (no
        decision rests on it, but 'saga ls', the console and the metrics show it)."""
        meta = self.store.events.keys.meta(sid)
        cached: list[Any] = self.store.redis.hmget(meta, "state", "phase")
        if cached != [str(state.status).encode(), str(phase_of(state.status)).encode()]:
            self.store.events.rebuild_meta(sid)
            shown = "/".join((c or b"-").decode(errors="replace") for c in cached)
            log.warning("sweeper %s: saga %s: its cached state (%s) was not its log's (%s); "
                        "rebuilt from the log", self.name, sid, shown, state.status)

    def _verifies(self, sid: str, verdict: list[bool]) -> bool:
        """Whether the saga's chain verifies, checked once per look (``verdict``)."""
        if not verdict:
            verdict.append(Verifier(self.store.events.log, jobs=1).check(sid).ok)
        return verdict[0]
