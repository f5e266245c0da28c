"""``saga verify``'s peak RSS and time on one store, whole and a group of buckets
at a time.

    python -m benchmarks.bench_verify_memory --sagas 100000

Fills a private Redis with N committed sagas (as ``bench_listing`` does), then
runs ``saga verify --json`` in a process of its own under GNU time, once with
each ``Verifier.GROUP_ENTRIES`` given (``0``: the whole store at once, as before
groups), and prints the exit code, seconds and peak RSS of each run. The
verifier forks a process per core for a large group; GNU time reports the
largest RSS of the processes it waited for.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import redis

from benchmarks.bench_listing import fill
from benchmarks.common import bench_redis, machine
from saga_store.log.store import EventStore

RUN = r'''
import sys
from saga_store.verify.checker import Verifier
if int(sys.argv[1]):
    Verifier.GROUP_ENTRIES = int(sys.argv[1])
else:
    Verifier.GROUP_ENTRIES = 10**12
from saga_store.cli.main import cli
cli(["verify", "--json"])
'''


def verify_run(url: str, group_entries: int) -> dict[str, object]:
    env = {**os.environ, "SAGA_REDIS_URL": url, "SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": ""}
    t = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-f", "%M", sys.executable, "-c", RUN,
                           str(group_entries)], env=env, capture_output=True, text=True,
                          check=False)
    took = time.perf_counter() - t
    out = json.loads(done.stdout) if done.stdout.startswith("{") else {}
    return {"group_entries": group_entries or "whole", "exit": done.returncode,
            "s": round(took, 1), "max_rss_mb": round(int(done.stderr.split()[-1]) / 1024, 1),
            "chains": out.get("chains"), "events": out.get("events")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sagas", type=int, default=100_000)
    ap.add_argument("--groups", default="0,15000",
                    help="GROUP_ENTRIES values to run with, comma-separated (0: whole)")
    args = ap.parse_args()
    srv = bench_redis()
    try:
        store = EventStore(redis.Redis.from_url(srv.url))
        t = time.perf_counter()
        fill(store, args.sagas)
        out: dict[str, object] = {"machine": machine(), "sagas": args.sagas,
                                  "fill_s": round(time.perf_counter() - t, 1),
                                  "runs": [verify_run(srv.url, int(g))
                                           for g in args.groups.split(",")]}
        print(json.dumps(out, indent=2))
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
