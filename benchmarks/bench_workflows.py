"""The peer workload: N concurrent 5-step workflows of 10 ms I/O tools, with and
without 20% failing at step 3, through Saga Store (durable) beside an in-memory
asyncio saga engine (no durability), in the same run.

    python -m benchmarks.bench_workflows [--workers 26] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import redis

from saga_store import Registry, SagaStore, Settings, keys
from saga_store.testing import RedisServer, assert_eventually
from saga_store.testing.workers import WorkerProcess

from .common import bench_redis, machine, percentile

ROOT = str(Path(__file__).resolve().parent.parent)
TOOLS = "benchmarks.bench_tools"
STEPS, IO_MS = 5, 10.0
AGENT = "bench"
# measured with benchmarks.ab_workflows: 26 beat 16 (n=500: 276 vs 234 wf/s, n=50:
# 195 vs 155) and 34 (272); fewer processes leave 10 ms waits unoverlapped, more
# only add scheduling
WORKERS = 26


# the asyncio worker: processes, and steps at once in each (a saga has one step in
# flight at a time, so n=500 wants 500 slots in all)
ASYNC_PROCS, ASYNC_CONCURRENCY = 2, 256


def workflow(fail: bool, tool: str = "io_step") -> list[dict[str, Any]]:
    return [{"tool": tool, "args": {"n": i, "ms": IO_MS, "fail": fail and i == 2}}
            for i in range(STEPS)]


def plans(n: int, fail_ratio: float, rng: random.Random) -> list[bool]:
    return [rng.random() < fail_ratio for _ in range(n)]


# -- the in-memory baseline --------------------------------------------------

async def _memory_workflow(fail: bool) -> float:
    began = time.perf_counter()
    done: list[int] = []
    for i in range(STEPS):
        await asyncio.sleep(IO_MS / 1000)
        if fail and i == 2:
            for _ in reversed(done):  # compensate in reverse, each an I/O wait too
                await asyncio.sleep(IO_MS / 1000)
            break
        done.append(i)
    return time.perf_counter() - began


def memory_run(fails: list[bool]) -> tuple[float, list[float]]:
    async def main() -> tuple[float, list[float]]:
        began = time.perf_counter()
        lat = await asyncio.gather(*(_memory_workflow(f) for f in fails))
        return time.perf_counter() - began, list(lat)
    return asyncio.run(main())


# -- Saga Store ---------------------------------------------------------------

def durable_run(store: SagaStore, fails: list[bool], batch: bool = False,
                tool: str = "io_step") -> tuple[float, list[float]]:
    """Submit every workflow (one ``submit`` after another, the first running while
    the next are submitted; ``batch``: all with one ``submit_many``), then wait for
    all as their agent would: by following its context stream, which says when
    each saga closed. A workflow's latency counts from the call that submitted it."""
    r, ctx = store.redis, keys.agent_ctx(AGENT)
    last = r.xrevrange(ctx, count=1)
    after = last[0][0] if last else b"0-0"
    began = time.perf_counter()
    submitted: dict[str, float] = {}
    if batch:
        ids = store.submit_many([workflow(f, tool) for f in fails], agent_id=AGENT)
        submitted = dict.fromkeys(ids, began)
    else:
        for f in fails:
            called = time.perf_counter()
            submitted[store.submit(workflow(f, tool), agent_id=AGENT)] = called
    latency: list[float] = []
    while len(latency) < len(submitted):
        reply = r.xread({ctx: after}, block=5000)
        if not reply:
            raise TimeoutError(f"{len(submitted) - len(latency)} workflows made no progress "
                               "for 5 s")
        now = time.perf_counter()
        for eid, fields in reply[0][1]:
            after = eid
            if b'"saga_closed"' not in fields[b"e"]:
                continue  # a step's result: only the closes matter here
            ev = orjson.loads(fields[b"e"])
            if ev["kind"] == "saga_closed" and ev["saga_id"] in submitted:
                latency.append(now - submitted[ev["saga_id"]])
    return time.perf_counter() - began, latency


def cpu_s(pids: set[int]) -> float:
    """CPU seconds (user + system) the processes have used so far."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def summarize(elapsed: float, latency: list[float]) -> dict[str, float]:
    ms = [x * 1000 for x in latency]
    return {"workflows_per_s": len(latency) / elapsed, "p50_ms": statistics.median(ms),
            "p95_ms": percentile(ms, 95), "p99_ms": percentile(ms, 99)}


@dataclass
class Durable:
    """Saga Store up for the benchmark: a private Redis and worker processes."""

    store: SagaStore
    srv: RedisServer
    procs: list[WorkerProcess]
    tool: str = "io_step"  # the step's tool: sync for RQ workers, async for asyncio ones

    def measure(self, fails: list[bool], batch: bool = False) -> dict[str, float]:
        """One durable run, summarised, with CPU per workflow by process kind."""
        assert self.srv.proc is not None
        pids = {"workers": set().union(*(p.pids() for p in self.procs)),
                "redis": {self.srv.proc.pid}, "driver": {os.getpid()}}
        before = {k: cpu_s(v) for k, v in pids.items()}
        row = summarize(*durable_run(self.store, fails, batch, self.tool))
        for k, v in pids.items():
            row[f"cpu_ms_{k}"] = (cpu_s(v) - before[k]) * 1000 / len(fails)
        return row


@contextmanager
def durable(workers: int, kind: str = "rq",
            env: dict[str, str] | None = None) -> Iterator[Durable]:
    """Start a private Redis and ``workers`` worker processes (``kind`` "async":
    ASYNC_PROCS asyncio workers of ASYNC_CONCURRENCY slots, running the async step
    tool), warmed up; stop them after."""
    srv = bench_redis()
    procs: list[WorkerProcess] = []
    try:
        r = redis.Redis.from_url(srv.url)
        store = SagaStore(r, Registry.from_modules(TOOLS), Settings())
        env = {**os.environ, **(env or {}), "SAGA_REDIS_URL": srv.url, "PYTHONPATH": ROOT}
        args = ("--async", "--concurrency", str(ASYNC_CONCURRENCY)) if kind == "async" else ()
        count = ASYNC_PROCS if kind == "async" else workers
        procs = [WorkerProcess(env, TOOLS, "--log-level", "WARNING", *args).start()
                 for _ in range(count)]
        from rq.worker import Worker
        assert_eventually(lambda: len(Worker.all(connection=r)) >= count, timeout=60,
                          what="workers to start")
        tool = "aio_step" if kind == "async" else "io_step"
        durable_run(store, [False] * 20, tool=tool)  # warm up
        yield Durable(store, srv, procs, tool)
    finally:
        for p in procs:
            p.kill()
        srv.stop()


def yardstick(jobs: int) -> float:
    """The issue's measure of this machine: plain RQ, 8 SimpleWorkers, jobs of a
    10 ms wait (it quotes 280-360 jobs/s), on a Redis of its own. Shown beside the
    workflows so a figure can be read against the machine's speed at the time."""
    from .bench_steps import bare_throughput
    srv = bench_redis()
    try:
        return bare_throughput(redis.Redis.from_url(srv.url), srv.url, 8, jobs,
                               "benchmarks.bench_tools.bare_io", {"ms": IO_MS})
    finally:
        srv.stop()


def run(workers: int = WORKERS, quick: bool = False, batch: bool = False) -> dict[str, Any]:
    rng = random.Random(7)
    bare = yardstick(400 if quick else 1000)
    with durable(workers) as d:
        out: dict[str, Any] = {"machine": machine(), "workers": workers, "io_ms": IO_MS,
                               "steps": STEPS, "submit": "submit_many" if batch else "one by one",
               "bare_rq_8_workers_10ms_jobs_per_s": bare}
        reps = 1 if quick else 3
        for n in (50, 500):
            for fail_ratio in (0.0, 0.2):
                rows = {"durable": [], "memory": []}  # type: dict[str, list[dict[str, float]]]
                for _ in range(reps):  # side by side, interleaved
                    fails = plans(n, fail_ratio, rng)
                    rows["durable"].append(d.measure(fails, batch))
                    rows["memory"].append(summarize(*memory_run(fails)))
                med = {side: {k: statistics.median(x[k] for x in runs) for k in runs[0]}
                       for side, runs in rows.items()}
                med["ratio"] = {"workflows_per_s": med["durable"]["workflows_per_s"]
                                / med["memory"]["workflows_per_s"]}
                out[f"n={n} fail={int(fail_ratio * 100)}%"] = med
        return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=WORKERS)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--batch", action="store_true",
                    help="submit all plans with one submit_many (measured slower: the "
                         "workers wait while the whole batch is validated and written)")
    a = ap.parse_args()
    print(json.dumps(run(a.workers, a.quick, a.batch), indent=1, default=str))
