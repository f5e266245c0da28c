"""Two checkouts' sweeper sealing pass, side by side: the ledger entries of N
committed sagas pending over 1,024 buckets (as a sweeper finds them at a few
hundred workflows a second), then one pass over every bucket
(``Ledger.seal_some``), timed by wall clock, by the sealer's own CPU and by
Redis's CPU (``INFO cpu``). Rounds alternate A, B, B, A, ...; reports medians
and the ratios B/A.

    git worktree add /tmp/before <rev>
    python -m benchmarks.ab_sweep_seal /tmp/before . --rounds 6 --sagas 1000
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r'''
import json, sys, time
sys.path.insert(0, ".")
import redis
from saga_store.log.store import EventStore
from saga_store.settings import Settings
from saga_store.testing import RedisServer
from tests.helpers import committed_saga

def redis_cpu(c):
    info = c.info("cpu")
    return info["used_cpu_user"] + info["used_cpu_sys"]

sagas = int(sys.argv[1])
with RedisServer(appendfsync="everysec") as srv:
    c = redis.Redis.from_url(srv.url)
    store = EventStore(c, Settings(buckets=1024))
    store.ledger.may_seal = False  # every entry left pending, as a worker's are
    for _ in range(sagas):
        committed_saga(store, steps=1)
    store.ledger.may_seal = True
    pending = sum(store.ledger.backlog().values())
    r0, p0, t0 = redis_cpu(c), time.process_time(), time.perf_counter()
    sealed, _ = store.ledger.seal_some(0, len(store.ledger.chains()))
    wall, cpu, rcpu = time.perf_counter() - t0, time.process_time() - p0, redis_cpu(c) - r0
    assert sealed == pending == 2 * sagas, (sealed, pending)
    print(json.dumps({"wall_ms": wall * 1000, "sealer_cpu_ms": cpu * 1000,
                      "redis_cpu_ms": rcpu * 1000, "entries": sealed}))
'''
FIELDS = ("wall_ms", "sealer_cpu_ms", "redis_cpu_ms")


def one(checkout: str, sagas: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(sagas)], cwd=checkout,
                         capture_output=True, text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("checkouts", nargs=2)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--sagas", type=int, default=1000)
    a = ap.parse_args()
    got: list[list[dict[str, float]]] = [[], []]
    for r in range(a.rounds):
        for i in ((0, 1) if r % 2 == 0 else (1, 0)):
            got[i].append(one(a.checkouts[i], a.sagas))
    med = [{f: statistics.median(g[f] for g in got[i]) for f in FIELDS} for i in (0, 1)]
    print(f"one pass over 1,024 buckets, {2 * a.sagas} entries pending; medians of "
          f"{a.rounds} rounds")
    for i in (0, 1):
        print(f"{'AB'[i]} {a.checkouts[i]}: " + ", ".join(
            f"{f} {med[i][f]:.1f}" for f in FIELDS))
    print("B/A: " + ", ".join(f"{f} {med[1][f] / med[0][f]:.2f}x" for f in FIELDS))


if __name__ == "__main__":
    main()
