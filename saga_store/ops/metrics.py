"""Prometheus metrics. The registry is injected: one per process (or per test),
never a global. Names use the ``saga_`` prefix, base units, ``_total`` counters,
and labels with bounded values only (tool, outcome, state, queue, kind): never
saga ids, keys or free text.

Worker processes run in prometheus_client's multiprocess mode (the parent of a
pool serves one endpoint for all of them); :class:`RedisCollector` adds gauges
read from Redis at scrape time.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from redis.exceptions import RedisError

from saga_store.execution import jobs
from saga_store.execution.enqueue import in_flight
from saga_store.log.events import EventKind
from saga_store.log.layout import names_of
from saga_store.ops.durability import DurabilityWatch
from saga_store.protocol.vocab import OutcomeKind
from saga_store.tools.spec import ToolSpec

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0, 10.0, 30.0)


# every value a bounded label takes, so each series exists (at 0) from a worker's
# first scrape: a dashboard panel or an alert on rate() has data before any saga
OUTCOMES = tuple(k.value for k in OutcomeKind)
DEDUPE_KINDS = ("duplicate_delivery", "in_flight", "repeated_call")
FINISHED_STATES = ("committed", "compensated", "needs_attention")


class Metrics:
    """Every counter and histogram Saga Store records, on one registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.steps = Counter("saga_steps_total", "Step outcomes.", ["tool", "outcome"],
                             registry=r)
        self.step_seconds = Histogram("saga_step_duration_seconds",
                                      "Time a tool call took on the worker.", ["tool"],
                                      buckets=LATENCY_BUCKETS, registry=r)
        self.dedupe_hits = Counter("saga_dedupe_hits_total",
                                   "Deliveries or calls answered without running the tool.",
                                   ["kind"], registry=r)
        self.compensations = Counter("saga_compensations_total", "Compensation outcomes.",
                                     ["tool", "outcome"], registry=r)
        self.compensation_lag = Histogram(
            "saga_compensation_lag_seconds",
            "From the failure that started an unwind to the saga fully compensated.",
            buckets=LATENCY_BUCKETS, registry=r)
        self.sagas_finished = Counter("saga_sagas_finished_total", "Sagas by final state.",
                                      ["state"], registry=r)
        self.appends = Counter("saga_chain_appends_total", "Events appended to chains.",
                               registry=r)
        self.cas_conflicts = Counter("saga_chain_cas_conflicts_total",
                                     "Appends that lost the compare-and-set.", registry=r)
        self.verify_failures = Counter(
            "saga_verification_failures_total",
            "Sagas whose chain failed verification when a worker retired them.", registry=r)
        self.refused_jobs = Counter("saga_refused_jobs_total",
                                    "Jobs refused because they named a function not ours.",
                                    registry=r)
        self.redeliveries = Counter("saga_redeliveries_total",
                                    "Jobs re-queued by the sweeper after a lease lapsed.",
                                    registry=r)
        self.notifications_dropped = Counter(
            "saga_notifications_dropped_total",
            "Notifications (SAGA_NOTIFY_URL) dropped, oldest first, because the sender's "
            "queue was full: the receiver is down or slow.", registry=r)

    def count_uncalled_compensations(self, items: Iterable[tuple[str, dict[str, Any]]],
                                     ) -> None:
        """Count the compensations ``items`` (appended to a log) record as failed
        without a call: one that cannot be called as declared (its mapping finds no
        value) goes stuck at once, and a count of calls alone would never show it."""
        tool = None
        for kind, body in items:
            if kind == EventKind.COMPENSATION_INTENT:
                tool = body.get("tool")
            elif kind == EventKind.COMPENSATION_FAILED and isinstance(tool, str):
                self.compensations.labels(tool, OutcomeKind.FAILED.value).inc()

    def prime(self, tools: Iterable[ToolSpec]) -> None:
        """Create every labelled series at 0: each tool's step outcomes and duration,
        each compensation tool's outcomes, each dedupe kind and final state."""
        specs = list(tools)
        for spec in specs:
            self.step_seconds.labels(spec.name)
            for outcome in OUTCOMES:
                self.steps.labels(spec.name, outcome)
        for comp in sorted({s.compensation for s in specs if s.compensation}):
            for outcome in OUTCOMES:
                self.compensations.labels(comp, outcome)
        for kind in DEDUPE_KINDS:
            self.dedupe_hits.labels(kind)
        for state in FINISHED_STATES:
            self.sagas_finished.labels(state)


class WorkerFilesCollector:
    """The worker processes' counters, from prometheus_client's multiprocess files
    in ``path``, as ``MultiProcessCollector`` reads them, leaving out a file too
    short to hold its header: a worker SIGKILLed right after it created its file
    leaves it empty, and one such file made every scrape fail (struct.error)."""

    HEADER = 8  # the bytes a file's used-size header takes

    def __init__(self, path: str) -> None:
        self.path = path

    def collect(self) -> Iterable[Metric]:
        from prometheus_client.multiprocess import MultiProcessCollector
        files = []
        for name in glob.glob(os.path.join(self.path, "*.db")):
            try:
                if os.path.getsize(name) >= self.HEADER:
                    files.append(name)
            except OSError:  # removed since the glob
                continue
        # no-untyped-call: the library leaves it untyped
        return MultiProcessCollector.merge(files, accumulate=True)  # type: ignore[no-untyped-call,no-any-return]


class RedisCollector:
    """Gauges read from Redis when scraped: sagas in flight by state, sagas that
    need a person, calls waiting for a person's approval (from workers and MCP
    gateways alike), queue depth and oldest job age per queue, and whether Redis
    persists every write (re-read once per ``durability``'s period, not per scrape)."""

    def __init__(self, client: Any, queues: tuple[str, ...] = (jobs.STEP_QUEUE,
                                                                 jobs.COMPENSATION_QUEUE),
                 durability: DurabilityWatch | None = None,
                 rq_redis: Any = None) -> None:
        """``client`` holds the log; ``rq_redis`` RQ's queues (default: ``client``)."""
        self.redis, self.queues = client, queues
        self.rq_redis = client if rq_redis is None else rq_redis
        self.durability = durability or DurabilityWatch(client)

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("saga_redis_up",
                               "1 if Redis answered this scrape, 0 while it is unreachable.")
        try:
            replies, active = self._read()
        except RedisError:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from self._families(replies, active)
        yield from self._durable()

    def _durable(self) -> Iterator[Metric]:
        try:
            durable = self.durability.poll()
        except RedisError:  # gone since the read above: the last answer stands
            durable = self.durability.durable
        if durable is None:
            return
        gauge = GaugeMetricFamily(
            "saga_redis_durable", "1 if Redis persists every write (AOF on, fsync everysec "
            "or always, or unknown to a user without CONFIG), 0 if not.")
        gauge.add_metric([], 1 if durable else 0)
        yield gauge

    def _read(self) -> tuple[list[Any], list[bytes]]:
        r = self.redis
        names = names_of(r)  # one read a scrape: a migration shows at once
        active = [sid.encode() for sid in in_flight(r, names)]
        pipe = r.pipeline(transaction=False)
        for sid in active:
            pipe.hget(names.meta(sid.decode()), "state")
        queued = pipe if self.rq_redis is r else self.rq_redis.pipeline(transaction=False)
        for q in self.queues:
            queued.llen(jobs.queue_key(q))
            queued.lindex(jobs.queue_key(q), 0)
        approvals, attention = names.all_approvals(), names.all_needs_attention()
        for key in approvals:
            pipe.zcard(key)
        for key in attention:
            pipe.scard(key)
        replies = pipe.execute()
        if queued is not pipe:  # laid out as if one pipeline: states, queues, the counts
            replies[len(active):len(active)] = queued.execute()
        counts = replies[len(replies) - len(approvals) - len(attention):]
        del replies[len(replies) - len(counts):]
        replies += [sum(counts[:len(approvals)]), sum(counts[len(approvals):])]  # [-2], [-1]
        return replies, active

    def _families(self, replies: list[Any], active: list[bytes]) -> Iterator[Metric]:
        by_state = {"running": 0, "compensating": 0, "stuck": 0}
        for state in replies[:len(active)]:
            name = state.decode() if state else "running"
            if name in by_state:
                by_state[name] += 1
        sagas = GaugeMetricFamily("saga_sagas", "Sagas not yet final, by state.",
                                  labels=["state"])
        for name, n in by_state.items():
            sagas.add_metric([name], n)
        sagas.add_metric(["needs_attention"], replies[-1])
        yield sagas
        waiting = GaugeMetricFamily("saga_approvals_pending",
                                    "Calls waiting for a person to approve or deny them.")
        waiting.add_metric([], replies[-2])
        yield waiting
        depth = GaugeMetricFamily("saga_queue_depth", "Jobs waiting per queue.",
                                  labels=["queue"])
        age = GaugeMetricFamily("saga_queue_oldest_job_age_seconds",
                                "Age of the oldest waiting job per queue.", labels=["queue"])
        rest = replies[len(active):-2]
        for i, q in enumerate(self.queues):
            n, head = rest[2 * i], rest[2 * i + 1]
            depth.add_metric([q], n)
            age.add_metric([q], self._age(head))
        yield depth
        yield age

    def _age(self, job_id: bytes | None) -> float:
        if not job_id:
            return 0.0
        try:
            raw = self.rq_redis.hget(jobs.job_key(job_id.decode()), "enqueued_at")
        except RedisError:
            return 0.0
        if not raw:
            return 0.0
        from datetime import UTC, datetime
        enqueued = datetime.strptime(raw.decode(), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
        return max(0.0, time.time() - enqueued.timestamp())


def exported_names() -> set[str]:
    """Every metric name the code exports (for checking dashboards against it)."""
    reg = CollectorRegistry()
    Metrics(reg)
    names = set()
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
                "gauge": ("",)}
    for family in reg.collect():
        names |= {family.name + s for s in suffixes.get(family.type, ("",))}
    names |= {"saga_sagas", "saga_queue_depth", "saga_queue_oldest_job_age_seconds",
              "saga_redis_up", "saga_approvals_pending", "saga_redis_durable"}
    return names
