"""The cost of SAGA_WAIT_REPLICAS=1 per append, against 0, on a real master and
replica on loopback: rounds alternate between the two (and which goes first),
so both see the same machine. Each append is timed alone, on both send paths:
the single call (``ChainWriter.append``) and a lean pipeline with a rider
(``ChainWriter.append_riding``, as the workers send theirs).

    python -m benchmarks.bench_wait [--rounds 20] [--appends 250]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import redis

from saga_store.log.events import EventKind as K
from saga_store.log.store import ChainWriter, EventStore
from saga_store.settings import Settings
from saga_store.testing import RedisServer, assert_eventually

from .common import PAYLOAD_300, machine, percentile

MODES = (0, 1)  # SAGA_WAIT_REPLICAS


@contextmanager
def master_and_replica() -> Iterator[RedisServer]:
    """A master (AOF everysec, the documented setting) and its replica, in sync."""
    with RedisServer("--repl-diskless-sync", "no", appendfsync="everysec") as master, \
            RedisServer("--replicaof", "127.0.0.1", str(master.port),
                        appendfsync="everysec") as replica:
        m = redis.Redis(port=master.port)
        assert_eventually(lambda: m.info("replication").get("slave0", {}).get("state")
                          == "online", timeout=20, what="the replica to link")
        m.close()
        try:
            yield master
        finally:
            replica.kill()  # it refuses SIGTERM while it writes its first AOF


def _single(w: ChainWriter, i: int) -> None:
    w.append(K.STEP_INTENT, step=i, data=PAYLOAD_300)


def _riding(w: ChainWriter, i: int) -> None:
    def rider(pipe: Any) -> None:
        pipe.hset(w.store.keys.meta(w.saga_id), "ctx_seq", i)
    w.append_riding([(K.STEP_INTENT, {"step": i, "data": PAYLOAD_300})], rider)


PATHS: dict[str, Callable[[ChainWriter, int], None]] = {"single": _single,
                                                        "pipeline": _riding}


def _timed(w: ChainWriter, send: Callable[[ChainWriter, int], None], n: int,
           into: list[float]) -> None:
    for i in range(n):
        t = time.perf_counter()
        send(w, i)
        into.append((time.perf_counter() - t) * 1e6)


def run(rounds: int, appends: int) -> dict[str, Any]:
    with master_and_replica() as master:
        client = redis.Redis.from_url(master.url)
        stores = {n: EventStore(client, Settings(wait_replicas=n)) for n in MODES}
        writers = {n: stores[n].open("bench-wait") for n in MODES}
        us: dict[str, dict[int, list[float]]] = {p: {n: [] for n in MODES} for p in PATHS}
        for n in MODES:  # warm both up: connections made, script cached
            _timed(writers[n], _single, 50, [])
            _timed(writers[n], _riding, 50, [])
        for r in range(rounds):
            order = MODES if r % 2 == 0 else MODES[::-1]
            for path, send in PATHS.items():
                for n in order:
                    _timed(writers[n], send, appends, us[path][n])
        client.close()
    out: dict[str, Any] = {"machine": machine(), "rounds": rounds, "appends_per_round": appends}
    for path in PATHS:
        row = {}
        for n in MODES:
            v = us[path][n]
            row[f"wait_{n}"] = {"p50_us": percentile(v, 50), "p99_us": percentile(v, 99),
                                "appends": len(v)}
        row["added_p50_us"] = row["wait_1"]["p50_us"] - row["wait_0"]["p50_us"]
        row["added_p99_us"] = row["wait_1"]["p99_us"] - row["wait_0"]["p99_us"]
        out[path] = row
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--appends", type=int, default=250, help="appends per mode and round")
    a = ap.parse_args()
    print(json.dumps(run(a.rounds, a.appends), indent=1))
