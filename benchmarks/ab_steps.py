"""Two checkouts' step path side by side: no-op step round trip and steps/s,
runs interleaved A, B, B, A, ... so both see the same machine.

    git worktree add /tmp/before <rev>
    python -m benchmarks.ab_steps /tmp/before . --reps 4

Each run is ``python -m benchmarks.bench_steps --quick`` in the checkout's own
folder (its own Redis and workers), with the checkout's own ``.venv`` if it has
one (``common.python_of``: give the other checkout one, ``python3 -m venv .venv
&& .venv/bin/pip install -e .``). Reports medians and the ratio B/A.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from typing import Any

from .common import python_of


def one(checkout: str) -> dict[str, Any]:
    out = subprocess.run([python_of(checkout), "-m", "benchmarks.bench_steps", "--quick"],
                         cwd=checkout, capture_output=True, text=True, check=True,
                         timeout=900)
    res: dict[str, Any] = json.loads(out.stdout[out.stdout.index("{"):])
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("checkouts", nargs=2)
    ap.add_argument("--reps", type=int, default=4)
    a = ap.parse_args()
    rows: list[list[dict[str, Any]]] = [[], []]
    for rep in range(a.reps):
        order = (0, 1) if rep % 2 == 0 else (1, 0)
        for i in order:
            rows[i].append(one(a.checkouts[i]))
    summary = []
    for i, runs in enumerate(rows):
        rt = statistics.median(r["round_trip_ms"]["durable"]["p50"] for r in runs)
        if all("durable_async_worker" in r["round_trip_ms"] for r in runs):
            on_async = statistics.median(r["round_trip_ms"]["durable_async_worker"]["p50"]
                                         for r in runs)
            print(f"{'AB'[i]} {a.checkouts[i]}: no-op step round trip p50, asyncio worker "
                  f"{on_async:.3f} ms (runs " + ", ".join(
                      f"{r['round_trip_ms']['durable_async_worker']['p50']:.3f}"
                      for r in runs) + ")")
        if all("durable_async_worker_async_tool" in r["round_trip_ms"] for r in runs):
            aio = statistics.median(r["round_trip_ms"]["durable_async_worker_async_tool"]["p50"]
                                    for r in runs)
            print(f"{'AB'[i]} {a.checkouts[i]}: no-op async tool's round trip p50, asyncio "
                  f"worker {aio:.3f} ms")
        tp = {w: statistics.median(r["throughput"][w]["durable_steps_per_s"] for r in runs)
              for w in runs[0]["throughput"]}
        summary.append((rt, tp))
        print(f"{'AB'[i]} {a.checkouts[i]}: no-op step round trip p50 {rt:.3f} ms; steps/s "
              + ", ".join(f"{w} workers {v:.0f}" for w, v in tp.items()))
    (rt_a, tp_a), (rt_b, tp_b) = summary
    print(f"B/A: round trip {rt_b / rt_a:.3f}x; steps/s "
          + ", ".join(f"{w} workers {tp_b[w] / tp_a[w]:.3f}x" for w in tp_a))


if __name__ == "__main__":
    main()
