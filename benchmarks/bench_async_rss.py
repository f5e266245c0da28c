"""Memory of the asyncio worker: one process's RSS with 100 steps in flight
(async tools, then sync tools), beside one RQ worker process's after a step.

    python -m benchmarks.bench_async_rss

The issue's target: at most 1.5x one RQ worker process (49 MB when it was set)
per 100 concurrent in-flight steps.
"""

from __future__ import annotations

import json
import time

import redis

from saga_store import Registry, SagaStore, Settings
from saga_store.testing import assert_eventually

from .bench_steps import TOOLS, rss_mb, start_saga_workers, stop, wait_registered
from .common import bench_redis

IN_FLIGHT = 100
HOLD_MS = 4000.0  # long enough to read the RSS with every step inside its tool


def started(store: SagaStore, ids: list[str]) -> int:
    """How many of the sagas' steps are inside their tool (started, no outcome)."""
    return sum(1 for sid in ids if any(e["kind"] == "step_started"
                                       for e in store.events.log.bodies(sid)))


def in_flight_rss(tool: str) -> float:
    srv = bench_redis()
    procs = []
    try:
        r = redis.Redis.from_url(srv.url)
        store = SagaStore(r, Registry.from_modules(TOOLS), Settings())
        procs = start_saga_workers(srv.url, 1, "--async", "--concurrency", str(IN_FLIGHT))
        wait_registered(r, 1)
        ids = [store.submit([{"tool": tool, "args": {"n": i, "ms": HOLD_MS}}], agent_id="rss")
               for i in range(IN_FLIGHT)]
        assert_eventually(lambda: started(store, ids) == IN_FLIGHT, timeout=30,
                          what=f"{IN_FLIGHT} steps in flight")
        rss = rss_mb(procs[0].pid)
        if started(store, ids) != IN_FLIGHT:
            raise RuntimeError("a step finished before the RSS was read")
        return rss
    finally:
        stop(procs)
        srv.stop()


def rq_worker_rss() -> float:
    srv = bench_redis()
    procs = []
    try:
        r = redis.Redis.from_url(srv.url)
        store = SagaStore(r, Registry.from_modules(TOOLS), Settings())
        procs = start_saga_workers(srv.url, 1)
        wait_registered(r, 1)
        sid = store.submit([{"tool": "io_step", "args": {"n": 0, "ms": 10.0}}], agent_id="rss")
        store.wait(sid, timeout=30)
        time.sleep(0.5)
        return rss_mb(procs[0].pid)
    finally:
        stop(procs)
        srv.stop()


def main() -> None:
    rq = rq_worker_rss()
    out = {"rq_worker_mb": rq}
    for tool in ("aio_step", "io_step"):
        mb = in_flight_rss(tool)
        out[f"async_worker_{IN_FLIGHT}_in_flight_{tool}_mb"] = mb
        out[f"ratio_{tool}"] = mb / rq
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
