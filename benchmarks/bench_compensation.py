"""Compensation lag, recovery after a killed compensator, history rebuild time.

    python -m benchmarks.bench_compensation [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from saga_store import Registry, SagaStore, Settings
from saga_store.client.context import rebuild_history
from saga_store.log.events import EventKind as K
from saga_store.testing.workers import WorkerProcess, kill_at

from .common import bench_redis, machine, percentile

ROOT = str(Path(__file__).resolve().parent.parent)
TOOLS = "benchmarks.bench_tools"
PLAN = [{"tool": "do_noop", "args": {"n": i}} for i in range(3)] + [
    {"tool": "fail_now", "args": {}}]


def lag_ms(store: SagaStore, sid: str) -> float:
    evs = store.events.log.events(sid)
    failed = next(e["ts"] for e in evs if e["kind"] == K.STEP_FAILED)
    done = next(e["ts"] for e in evs if e["kind"] == K.SAGA_COMPENSATED)
    return float(done - failed)


def compensation_lag(store: SagaStore, env: dict[str, str], n: int) -> list[float]:
    w = WorkerProcess(env, TOOLS, "--log-level", "WARNING").start()
    try:
        out = []
        for _ in range(n):
            sid = store.submit(PLAN, agent_id="bench")
            store.wait(sid, timeout=60)
            out.append(lag_ms(store, sid))
        return out
    finally:
        w.kill()


def recovery_s(store: SagaStore, env: dict[str, str]) -> float:
    """Seconds from a compensator's death (kill -9 after a compensation intent) to
    the saga fully compensated by a fresh worker; default lease."""
    sid = store.submit(PLAN, agent_id="bench")
    kill_at(env, TOOLS, "comp_after_intent", Path(tempfile.mkdtemp()), at=2, timeout=60)
    died = time.monotonic()
    fresh = WorkerProcess(env, TOOLS, "--log-level", "WARNING").start()
    try:
        store.wait(sid, timeout=120)
        return time.monotonic() - died
    finally:
        fresh.kill()


def rebuild_ms(store: SagaStore, steps: int = 1000, runs: int = 20) -> list[float]:
    w = store.events.open("bench-history", conversation_id="c")
    batch = []
    for n in range(steps):
        batch += [(K.STEP_INTENT, {"step": n, "tool": "noop", "tool_call_id": f"call_{n}",
                                   "data": {"args": {"n": n}, "reversibility": "readonly"}}),
                  (K.STEP_STARTED, {"step": n, "attempt": 1}),
                  (K.STEP_SUCCEEDED, {"step": n, "tool": "noop", "tool_call_id": f"call_{n}",
                                      "data": {"result": {"n": n, "text": "x" * 80}}})]
        if len(batch) >= 300:
            w.append_many(batch)
            batch = []
    w.append_many([*batch, (K.SAGA_COMMITTED, {})])
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        state = store.state(w.saga_id)  # what 'saga context' does: read, fold
        msgs = rebuild_history([state], "openai")
        times.append((time.perf_counter() - t) * 1000)
        assert len(msgs) == 2 * steps
    return times


def run(quick: bool = False) -> dict[str, Any]:
    srv = bench_redis()
    try:
        r = redis.Redis.from_url(srv.url)
        store = SagaStore(r, Registry.from_modules(TOOLS), Settings())
        env = {**os.environ, "SAGA_REDIS_URL": srv.url, "PYTHONPATH": ROOT}
        lags = compensation_lag(store, env, 30 if quick else 200)
        recoveries = [recovery_s(store, env) for _ in range(1 if quick else 3)]
        rebuild = rebuild_ms(store)
        return {"machine": machine(),
                "compensation_lag_ms": {"p50": statistics.median(lags),
                                        "p99": percentile(lags, 99), "n": len(lags)},
                "recovery_s": {"runs": recoveries, "max": max(recoveries),
                               "lease_s": Settings().lease_ms / 1000},
                "rebuild_1000_steps_ms": {"p50": statistics.median(rebuild),
                                          "max": max(rebuild)}}
    finally:
        srv.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    print(json.dumps(run(ap.parse_args().quick), indent=1, default=str))
