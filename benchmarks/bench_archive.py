"""Retention: ``saga archive`` then ``saga verify --archive`` over N closed sagas.

    python -m benchmarks.bench_archive [--sagas 20000]

Seeds N committed sagas of 3 steps (about the size of the sagas measured on
a cluster: a log of ~5.7 KB) in a private Redis (AOF, fsync every second),
archives them all, verifies the archive offline and the store, and reports
rates, Redis memory freed and segment bytes per saga.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from saga_store.log.archive import Archiver
from saga_store.log.chain import Chain
from saga_store.log.events import EventKind as K
from saga_store.log.ledger import Ledger
from saga_store.log.store import EventStore
from saga_store.settings import Settings
from saga_store.verify.archive import verify_archive
from saga_store.verify.checker import Verifier

from .common import bench_redis, machine

ARGS = {"customer": "c-1", "note": "n" * 300, "items": [{"sku": f"sku-{i}"} for i in range(8)]}
RESULT = {"ok": True, "receipt": "r" * 400}


def seed(store: EventStore, n: int) -> float:
    """N committed sagas of 3 steps each; returns seconds taken."""
    items: list[tuple[str, dict[str, Any]]] = []
    for s in range(3):
        items += [(K.STEP_INTENT, {"step": s, "tool": f"tool_{s}", "tool_call_id": f"c-{s}",
                                   "data": {"args": ARGS, "reversibility": "compensable"}}),
                  (K.STEP_STARTED, {"step": s, "attempt": 1}),
                  (K.STEP_SUCCEEDED, {"step": s, "data": {"result": RESULT}})]
    items.append((K.SAGA_COMMITTED, {}))
    t = time.perf_counter()
    for _ in range(n):
        store.open("bench", conversation_id="conv-1").append_many(items)
    Ledger(store.log).flush(timeout_s=60)
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sagas", type=int, default=20_000)
    args = parser.parse_args()
    out: dict[str, Any] = {"machine": machine(), "sagas": args.sagas}
    with bench_redis() as srv, tempfile.TemporaryDirectory() as tmp:
        client = redis.Redis.from_url(srv.url)
        store = EventStore(client, Settings())
        empty = int(client.info("memory")["used_memory"])
        out["seed_s"] = round(seed(store, args.sagas), 1)
        before = int(client.info("memory")["used_memory"])
        folder = Path(tmp) / "archive"
        t = time.perf_counter()
        done = Archiver(store.log, folder).run(time.time_ns() // 1_000_000)
        took = time.perf_counter() - t
        assert done.removed == args.sagas, done.to_dict()
        after = int(client.info("memory")["used_memory"])
        out["archive_s"] = round(took, 2)
        out["archive_sagas_per_s"] = round(args.sagas / took)
        out["segment_bytes_per_saga"] = round(done.bytes / args.sagas)
        out["redis_bytes_per_saga_before"] = round((before - empty) / args.sagas)
        out["redis_freed_bytes_per_saga"] = round((before - after) / args.sagas)
        # what stays: the ledger's opening, close and tombstone of each saga
        out["redis_left_bytes_per_saga"] = round((after - empty) / args.sagas)
        out["events"] = done.events
        t = time.perf_counter()
        result = verify_archive(folder, Chain(None))
        took = time.perf_counter() - t
        assert result.ok, [f.to_dict() for f in result.failures[:3]]
        out["verify_archive_s"] = round(took, 2)
        out["verify_archive_sagas_per_s"] = round(args.sagas / took)
        t = time.perf_counter()
        result = verify_archive(folder, Chain(None), store.log)
        out["verify_archive_with_store_s"] = round(time.perf_counter() - t, 2)
        assert result.ok
        t = time.perf_counter()
        assert Verifier(store.log, jobs=1).verify().ok
        out["verify_store_after_s"] = round(time.perf_counter() - t, 2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
