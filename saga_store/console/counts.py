"""How many sagas are in each state, read the way the metrics read it.

:class:`Tally` takes the gauges of ``saga_store.ops.metrics.RedisCollector``
(sagas in flight by their cached state, approvals pending, sagas needing
attention, queue depth and oldest job's age), so the console's numbers are the
dashboards' numbers. One read costs a round trip per index plus one HGET per
saga in flight; it is kept for ``TTL_S`` so that page views do not repeat it.

:class:`NavCounts` is ASGI middleware that puts the tally on each page request
(read in a thread, never on the event loop) for the navigation to show.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import redis
from prometheus_client.core import Metric
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from saga_store import SagaError, SagaStore
from saga_store.ops.metrics import RedisCollector

TTL_S = 2.0
IN_FLIGHT = ("running", "compensating", "stuck", "needs_attention")


@dataclass(frozen=True)
class Counts:
    sagas: dict[str, int]  # in flight (and needing attention), by state
    approvals: int
    queues: dict[str, int] = field(default_factory=dict)
    oldest_job_s: dict[str, float] = field(default_factory=dict)


def _samples(metrics: list[Metric], name: str) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for m in metrics if m.name == name for s in m.samples]


class Tally:
    def __init__(self, store: SagaStore) -> None:
        self.collector = RedisCollector(store.redis, rq_redis=store.queues)
        self._lock = threading.Lock()
        self._last: tuple[float, Counts] | None = None

    def read(self) -> Counts:
        """The gauges now (at most ``TTL_S`` old)."""
        with self._lock:
            if self._last is not None and time.monotonic() - self._last[0] < TTL_S:
                return self._last[1]
        metrics = list(self.collector.collect())
        if not _samples(metrics, "saga_sagas"):
            raise redis.ConnectionError("Redis did not answer the count of sagas")
        sagas = {lab["state"]: int(v) for lab, v in _samples(metrics, "saga_sagas")}
        counts = Counts(
            {s: sagas.get(s, 0) for s in IN_FLIGHT},
            int(sum(v for _, v in _samples(metrics, "saga_approvals_pending"))),
            {lab["queue"]: int(v) for lab, v in _samples(metrics, "saga_queue_depth")},
            {lab["queue"]: v for lab, v in
             _samples(metrics, "saga_queue_oldest_job_age_seconds")})
        with self._lock:
            self._last = (time.monotonic(), counts)
        return counts


class NavCounts:
    """Puts ``counts`` (a :class:`Counts`, or None when Redis did not answer) in
    the request's state of every page (GET, not the static files, the health
    check or the live feeds)."""

    def __init__(self, app: ASGIApp, tally: Tally) -> None:
        self.app, self.tally = app, tally

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if scope["type"] == "http" and scope["method"] == "GET" and not (
                path.startswith(("/static/", "/healthz", "/login"))
                or path.endswith("/live")):
            counts: Any = None
            try:
                counts = await run_in_threadpool(self.tally.read)
            except (redis.RedisError, SagaError):
                counts = None  # the page itself says what is wrong, if it needs Redis
            scope.setdefault("state", {})["counts"] = counts
        await self.app(scope, receive, send)
