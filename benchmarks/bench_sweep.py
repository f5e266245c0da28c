"""A sweeper's CPU per pass over an idle store, layout 2 (one shared index of
sagas in flight, one of approvals) against layout 3 (one of each per bucket),
interleaved: each pass takes every sweep lease (they are dropped before it), as
the one sweeper of a fleet does once an interval.

    python -m benchmarks.bench_sweep [--buckets 1024] [--passes 50] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import redis

from saga_store import Registry, SagaStore, keys
from saga_store.settings import Settings
from saga_store.testing import RedisServer
from workers.sweeper import Sweeper


def passes(client: redis.Redis, layout: str, n: int) -> float:
    """CPU ms per sweep pass of this process."""
    client.flushdb()
    client.set(keys.LAYOUT, layout)
    sweeper = Sweeper(SagaStore(client, Registry(), Settings()), "bench", 0.0)
    sweeper.sweep()
    spent = 0.0
    for _ in range(n):
        held = client.keys(f"{keys.PREFIX}:sweep:*")
        if held:
            client.delete(*held)
        t0 = time.process_time()
        sweeper.sweep()
        spent += time.process_time() - t0
    return spent * 1000 / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--buckets", type=int, default=1024)
    ap.add_argument("--passes", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    got: dict[str, list[float]] = {"2": [], "3": []}
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        for r in range(args.rounds):
            for version in ("2", "3") if r % 2 == 0 else ("3", "2"):
                got[version].append(passes(client, f"{version} {args.buckets}", args.passes))
    print(json.dumps({f"layout {v}: cpu ms per pass": {"median": statistics.median(runs),
                                                        "runs": runs}
                      for v, runs in got.items()}, indent=2))


if __name__ == "__main__":
    main()
