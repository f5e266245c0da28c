"""The log: append throughput, memory per event, flat append cost, verification speed.

    python -m benchmarks.bench_log [--events 1000000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

import redis

from saga_store.log.canonical import canonical
from saga_store.log.chain import Chain
from saga_store.log.events import EventKind as K
from saga_store.log.store import EventStore
from saga_store.verify.checker import Verifier
from saga_store.verify.export import export, verify_file

from .common import PAYLOAD_300, bench_redis, machine, median_of

assert len(canonical(PAYLOAD_300)) == 300


def append_one_at_a_time(store: EventStore, n: int) -> float:
    w = store.open("bench")
    t = time.perf_counter()
    for i in range(n):
        w.append(K.STEP_INTENT, step=i, data=PAYLOAD_300)
    return n / (time.perf_counter() - t)


def append_batched(store: EventStore, n: int, batch: int = 100) -> float:
    w = store.open("bench")
    items = [(K.STEP_SUCCEEDED, {"step": i, "data": PAYLOAD_300}) for i in range(batch)]
    t = time.perf_counter()
    for _ in range(n // batch):
        w.append_many(items)
    return n / (time.perf_counter() - t)


def append_cost_short_vs_long(store: EventStore, long_seq: int = 100_000, samples: int = 3000,
                              ) -> tuple[float, float]:
    """Median microseconds of one append at seq ~10 and at seq ~``long_seq``, measured
    interleaved so both see the same machine noise."""
    long_w = store.open("bench")
    items = [(K.STEP_INTENT, {"step": 0, "data": PAYLOAD_300})] * 500
    while long_w.head.seq + 500 < long_seq:
        long_w.append_many(items)
    shorts = []
    for _ in range(samples // 10):
        w = store.open("bench")
        w.append_many(items[:9])
        shorts.append(w)
    short_t, long_t = [], []
    for i in range(samples):
        w = shorts[i % len(shorts)]  # each short chain goes from seq 10 to 20
        t0 = time.perf_counter()
        w.append(K.STEP_INTENT, step=i, data=PAYLOAD_300)
        t1 = time.perf_counter()
        long_w.append(K.STEP_INTENT, step=i, data=PAYLOAD_300)
        t2 = time.perf_counter()
        short_t.append(t1 - t0)
        long_t.append(t2 - t1)
    return statistics.median(short_t) * 1e6, statistics.median(long_t) * 1e6


def memory_per_event(client: redis.Redis, store: EventStore, sagas: int = 100, per: int = 1000,
                     ) -> float:
    client.flushdb()
    before = int(client.info("memory")["used_memory"])
    items = [(K.STEP_SUCCEEDED, {"step": 1, "agent_id": "agent-1", "tool": "charge_payment",
                                  "tool_call_id": "call_0123456789", "attempt": 1,
                                  "data": PAYLOAD_300})] * 100
    for _ in range(sagas):
        w = store.open("agent-1")
        for _ in range(per // 100):
            w.append_many(items)
    after = int(client.info("memory")["used_memory"])
    return (after - before) / (sagas * (per + 1))


def fill(store: EventStore, events: int, per_saga: int = 1000) -> None:
    """Sagas of intent/outcome pairs (valid for the invariants), events of ~300 bytes."""
    for _ in range(events // per_saga):
        w = store.open("agent-1")
        step = 0
        while w.head.seq + 1 < per_saga:
            items: list[tuple[str, dict[str, Any]]] = []
            for _ in range(min(50, (per_saga - w.head.seq - 1) // 2)):
                items.append((K.STEP_INTENT, {"step": step, "tool": "charge_payment",
                                              "tool_call_id": f"call-{step}",
                                              "data": {"args": {"text": "x" * 100}}}))
                items.append((K.STEP_SUCCEEDED, {"step": step,
                                                 "data": {"result": {"text": "y" * 140}}}))
                step += 1
            if not items:
                break
            w.append_many(items)


def run(events: int = 1_000_000, runs: int = 3) -> dict[str, Any]:
    out: dict[str, Any] = {"machine": machine()}
    srv = bench_redis()
    try:
        client = redis.Redis.from_url(srv.url)
        store = EventStore(client)
        out["append_one_per_s"], out["append_one_runs"] = median_of(
            runs, lambda: append_one_at_a_time(store, 10_000))
        out["append_batched_per_s"], out["append_batched_runs"] = median_of(
            runs, lambda: append_batched(store, 100_000))
        short, long = append_cost_short_vs_long(store)
        out["append_us_at_seq_10"], out["append_us_at_seq_100000"] = short, long
        out["append_cost_ratio"] = long / short
        out["memory_bytes_per_event"] = memory_per_event(client, store)
        client.flushdb()
        t = time.perf_counter()
        fill(store, events)
        out["fill_s"] = time.perf_counter() - t
        sample = store.log.events(next(iter(store.log.chain_ids())))[5]
        out["event_bytes"] = len(canonical({k: v for k, v in sample.items()
                                            if k not in ("prev", "hash")}))
        verifier = Verifier(store.log)

        def verify_redis() -> float:
            t = time.perf_counter()
            res = verifier.verify()
            assert res.ok
            return res.events / (time.perf_counter() - t)
        out["verify_redis_per_s"], out["verify_redis_runs"] = median_of(runs, verify_redis)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "export.jsonl")
            with open(path, "wb") as fh:
                out["exported_events"] = export(store.log, fh)

            def verify_export() -> float:
                t = time.perf_counter()
                res = verify_file(path, Chain(None))
                assert res.ok
                return res.events / (time.perf_counter() - t)
            out["verify_file_per_s"], out["verify_file_runs"] = median_of(runs, verify_export)
    finally:
        srv.stop()
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    import json
    print(json.dumps(run(a.events, a.runs), indent=1))
