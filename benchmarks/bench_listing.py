"""``saga ls --limit 100`` on a store of 100,000 closed sagas (layout 3, 1,024
buckets, 200,000 ledger entries): does it list exactly the 100 newest, newest
first, and how long does it take?

    python -m benchmarks.bench_listing [--sagas 100000] [--before /path/to/checkout]
                                       [--verify]

The store is written here (pipelined opens and closes, then the ledger sealed);
``saga ls`` runs as a process of this checkout and, with ``--before``, of that
checkout (its own ``.venv``), on the same store. Also timed: the listing query
alone (``console.listing.newest``), in this process; with ``--verify``, ``saga
verify``'s time and largest RSS on the same store.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import redis

from benchmarks.common import bench_redis, machine, python_of
from saga_store.console.listing import Filters, newest
from saga_store.log.events import EventKind as K
from saga_store.log.store import EventStore

BATCH = 1000
CHECKOUT = str(Path(__file__).resolve().parents[1])


def fill(store: EventStore, n: int) -> list[str]:
    """``n`` sagas opened and committed, a thousand per round trip; their ledger
    entries sealed. Returns their ids in the order they were opened."""
    made: list[str] = []
    for start in range(0, n, BATCH):
        ops = [store.prepare_open(f"agent-{k % 7}") for k in range(start, min(n, start + BATCH))]
        pipe = store.redis.pipeline(transaction=False)
        queued = [op.call.queue(pipe) for op in ops]
        replies = pipe.execute()
        pipe = store.redis.pipeline(transaction=False)
        for op, q in zip(ops, queued, strict=True):
            op.applied(q(replies), pipe, defer_ledger=True)
        replies = pipe.execute()
        pipe = store.redis.pipeline(transaction=False)
        closes = []
        for op in ops:
            op.ledger_written(replies)
            call = op.writer.prepare([(K.SAGA_COMMITTED, {})])
            closes.append((op.writer, call, call.queue(pipe)))
        replies = pipe.execute()
        for w, call, q in closes:
            w.applied(call, q(replies), ledger=False)
            if not w.store.keys.bucketed:  # of layout 2 the close is pushed apart
                w.store.ledger.closed(w.saga_id, "committed", w.head)
        made += [op.writer.saga_id for op in ops]
    while store.ledger.flush(timeout_s=60):  # a loaded machine seals slower
        pass
    return made


def ls(url: str, checkout: str, limit: int) -> tuple[float, list[str]]:
    env = {**os.environ, "SAGA_REDIS_URL": url, "SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": ""}
    t = time.perf_counter()
    out = subprocess.run([python_of(checkout), "-m", "saga_store.cli.main", "ls", "--json",
                          "--limit", str(limit)], cwd=checkout, env=env, capture_output=True,
                         check=True)
    took = time.perf_counter() - t
    return took, [r["saga_id"] for r in json.loads(out.stdout)]


def verify_rss(url: str, checkout: str, scratch: Path) -> dict[str, Any]:
    """'saga verify --json' of ``checkout``: exit code, time, and its peak RSS (or its
    forked checkers', whichever is larger), as GNU time reports it: a process
    started from this one would inherit this one's peak in its own count."""
    env = {**os.environ, "SAGA_REDIS_URL": url, "SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": ""}
    report = scratch / "verify.rss"
    t = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", str(report), python_of(checkout),
                           "-m", "saga_store.cli.main", "verify", "--json"], cwd=checkout,
                          env=env, capture_output=True, check=False)
    return {"exit": done.returncode, "s": round(time.perf_counter() - t, 1),
            "max_rss_mb": round(int(report.read_text().split()[-1]) / 1024, 1)}


def judge(listed: list[str], truth: list[str]) -> dict[str, Any]:
    return {"exact": listed == truth, "newest_held": len(set(listed) & set(truth)),
            "listed": len(listed)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sagas", type=int, default=100_000)
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--before", default=None, help="another checkout to run 'saga ls' of")
    ap.add_argument("--verify", action="store_true",
                    help="also run 'saga verify' of each checkout: time, RSS")
    args = ap.parse_args()
    srv = bench_redis()
    try:
        store = EventStore(redis.Redis.from_url(srv.url))
        t = time.perf_counter()
        made = fill(store, args.sagas)
        out: dict[str, Any] = {"machine": machine(), "sagas": args.sagas,
                               "ledger_entries": sum(store.redis.xlen(store.keys.chain_log(c))
                                                     for c in store.ledger.present()),
                               "fill_s": round(time.perf_counter() - t, 1)}
        truth = made[::-1][:args.limit]
        for name, checkout in [("this", CHECKOUT), ("before", args.before)]:
            if checkout is None:
                continue
            runs = [ls(srv.url, checkout, args.limit) for _ in range(args.runs)]
            out[f"ls_{name}"] = {"median_s": round(statistics.median(r[0] for r in runs), 3),
                                 **judge(runs[-1][1], truth)}
            if args.verify:
                out[f"verify_{name}"] = verify_rss(srv.url, checkout, srv.dir)
        times = []
        for _ in range(args.runs):
            t = time.perf_counter()
            got = [o.saga_id for _, o in zip(range(args.limit), newest(store, Filters()),
                                             strict=False)]
            times.append(time.perf_counter() - t)
        out["query_this"] = {"median_ms": round(statistics.median(times) * 1000, 1),
                             **judge(got, truth)}
        print(json.dumps(out, indent=2))
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
