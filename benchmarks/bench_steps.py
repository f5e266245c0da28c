"""The step path: round trip, throughput with 1/2/4 workers, flat cost, worker RSS,
each next to bare RQ measured in the same run.

    python -m benchmarks.bench_steps [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis
from rq import Queue
from rq.serializers import JSONSerializer
from rq.suspension import resume, suspend

from saga_store import Registry, SagaStore, Settings
from saga_store.testing import assert_eventually

from .common import bench_redis, machine, percentile

ROOT = str(Path(__file__).resolve().parent.parent)
TOOLS = "benchmarks.bench_tools"


def start_saga_workers(url: str, n: int, *extra: str) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "SAGA_REDIS_URL": url, "PYTHONPATH": ROOT}
    return [subprocess.Popen([sys.executable, "-m", "saga_store.cli.main", "worker", "--tools",
                              TOOLS, *extra,
                              "--log-level", "WARNING"], env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(n)]


def start_rq_workers(url: str, n: int, queue: str) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "PYTHONPATH": ROOT}
    rq_bin = str(Path(sys.executable).with_name("rq"))
    return [subprocess.Popen([rq_bin, "worker", "-u", url, "-w", "rq.worker.SimpleWorker",
                              "--serializer", "rq.serializers.JSONSerializer", "-q", queue],
                             env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, cwd=ROOT)
            for _ in range(n)]


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, 9)
        p.wait()


def wait_registered(r: redis.Redis, n: int) -> None:
    from rq.worker import Worker
    assert_eventually(lambda: len(Worker.all(connection=r)) >= n, timeout=60,
                      what=f"{n} workers to register")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def round_trips(store: SagaStore, n: int, tool: str = "noop") -> list[float]:
    out = []
    with store.saga(agent_id="bench") as saga:
        for i in range(n):
            t = time.perf_counter()
            saga.call(tool, {"n": i})
            out.append((time.perf_counter() - t) * 1000)
    return out


def bare_round_trips(r: redis.Redis, n: int) -> list[float]:
    q = Queue("bare", connection=r, serializer=JSONSerializer)
    out = []
    for i in range(n):
        t = time.perf_counter()
        job = q.enqueue("benchmarks.bench_tools.bare_noop", i)
        res = job.latest_result(timeout=10)
        assert res is not None
        assert res.return_value == {"n": i}
        out.append((time.perf_counter() - t) * 1000)
    return out


def saga_throughput(r: redis.Redis, store: SagaStore, url: str, workers: int,
                    sagas: int, steps: int) -> tuple[float, list[float]]:
    """No-op steps/s: plans queued while workers are suspended, then released;
    measured from the first step_started to the last saga_committed in the log."""
    procs = start_saga_workers(url, workers)
    try:
        wait_registered(r, workers)
        suspend(r)
        ids = [store.submit([{"tool": "noop", "args": {"n": k}} for k in range(steps)],
                            agent_id="bench") for _ in range(sagas)]
        resume(r)
        for sid in ids:
            store.wait(sid, timeout=600)
        first, last = 1e20, 0.0
        for sid in ids:
            evs = store.events.log.events(sid)
            first = min(first, next(e["ts"] for e in evs if e["kind"] == "step_started"))
            last = max(last, evs[-1]["ts"])
        rss = [rss_mb(p.pid) for p in procs]
        return sagas * steps / ((last - first) / 1000), rss
    finally:
        stop(procs)
        from rq.worker import Worker
        for w in Worker.all(connection=r):
            w.register_death()


def bare_throughput(r: redis.Redis, url: str, workers: int, jobs: int,
                    func: str = "benchmarks.bench_tools.bare_noop",
                    kwargs: dict[str, Any] | None = None) -> float:
    """Jobs/s of plain RQ SimpleWorkers running ``func`` (first start to last end)."""
    q = Queue("bare", connection=r, serializer=JSONSerializer)
    procs = start_rq_workers(url, workers, "bare")
    try:
        wait_registered(r, workers)
        suspend(r)
        base = q.finished_job_registry.count
        enqueued = [q.enqueue(func, i, **(kwargs or {})) for i in range(jobs)]
        resume(r)
        assert_eventually(lambda: q.finished_job_registry.count >= base + jobs, timeout=600,
                          what="bare jobs to finish")
        first, last = None, None
        for job in enqueued:
            job.refresh()
            first = job.started_at if first is None else min(first, job.started_at)
            last = job.ended_at if last is None else max(last, job.ended_at)
        assert first is not None
        assert last is not None
        return jobs / (last - first).total_seconds()
    finally:
        stop(procs)
        from rq.worker import Worker
        for w in Worker.all(connection=r):
            w.register_death()
        q.finished_job_registry.cleanup()


def flat_cost(store: SagaStore, steps: int = 1000, samples: int = 300) -> tuple[float, float]:
    """Median ms of one call in a saga's first ten steps and after ``steps`` steps,
    measured interleaved (a long saga and fresh short ones in turn)."""
    short_t, long_t = [], []
    with store.saga(agent_id="bench") as long_saga:
        for i in range(steps):
            long_saga.call("noop", {"n": i})
        short = store.saga(agent_id="bench")
        for i in range(samples):
            if i % 10 == 0:
                short.commit()
                short = store.saga(agent_id="bench")
            t0 = time.perf_counter()
            short.call("noop", {"n": i})
            t1 = time.perf_counter()
            long_saga.call("noop", {"n": steps + i})
            long_t.append(time.perf_counter() - t1)
            short_t.append(t1 - t0)
        short.commit()
    return statistics.median(short_t) * 1000, statistics.median(long_t) * 1000


def run(quick: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"machine": machine()}
    srv = bench_redis()
    url = srv.url
    r = redis.Redis.from_url(url)
    store = SagaStore(r, Registry.from_modules(TOOLS), Settings())
    # the asyncio worker on a Redis of its own (a queue reaches any worker on it)
    srv_async = bench_redis()
    r_async = redis.Redis.from_url(srv_async.url)
    store_async = SagaStore(r_async, Registry.from_modules(TOOLS), Settings())
    try:
        procs = start_saga_workers(url, 1)
        rq_procs = start_rq_workers(url, 1, "bare")
        async_procs = start_saga_workers(srv_async.url, 1, "--async")
        wait_registered(r, 2)
        wait_registered(r_async, 1)
        n = 300 if quick else 2000
        round_trips(store, 50)  # warm up every side
        round_trips(store_async, 50)
        round_trips(store_async, 50, "aio_noop")
        bare_round_trips(r, 50)
        durable, on_async, on_async_aio, bare = [], [], [], []
        for _ in range(4):  # interleaved blocks: all see the same noise
            durable += round_trips(store, n // 4)
            on_async += round_trips(store_async, n // 4)
            on_async_aio += round_trips(store_async, n // 4, "aio_noop")
            bare += bare_round_trips(r, n // 4)
        stop(async_procs)
        out["round_trip_ms"] = {
            "durable": {"p50": statistics.median(durable), "p99": percentile(durable, 99)},
            "durable_async_worker": {"p50": statistics.median(on_async),
                                     "p99": percentile(on_async, 99)},
            "durable_async_worker_async_tool": {"p50": statistics.median(on_async_aio),
                                                "p99": percentile(on_async_aio, 99)},
            "bare_rq_simpleworker": {"p50": statistics.median(bare),
                                     "p99": percentile(bare, 99)}}
        first, last = flat_cost(store, 300 if quick else 1000)
        out["flat_cost_ms"] = {"step_1_to_10": first, "step_1000_plus": last,
                               "ratio": last / first}
        stop(procs + rq_procs)
        from rq.worker import Worker
        for w in Worker.all(connection=r):
            w.register_death()
        out["throughput"] = {}
        sagas, steps = (20, 10) if quick else (100, 20)
        for workers in (1, 2, 4):
            durable_tp, rss = saga_throughput(r, store, url, workers, sagas, steps)
            bare_tp = bare_throughput(r, url, workers, sagas * steps)
            out["throughput"][workers] = {"durable_steps_per_s": durable_tp,
                                          "bare_rq_jobs_per_s": bare_tp,
                                          "ratio": durable_tp / bare_tp,
                                          "worker_rss_mb": rss}
    finally:
        srv.stop()
        srv_async.stop()
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    res = run(ap.parse_args().quick)
    print(json.dumps(res, indent=1, default=str))

