"""Two checkouts of Saga Store side by side on the peer workload, interleaved.

This machine's speed drifts by tens of percent over minutes, so two versions
measured one after the other cannot be compared. Here each checkout gets its
own Redis and worker processes, started once and kept up; then the runs
alternate A, B, B, A, ... so both see the same machine. Reports medians of
workflows/s, p99 and CPU per workflow (workers, Redis, the submitting driver).

    git worktree add /tmp/before <rev>
    python -m benchmarks.ab_workflows /tmp/before . --reps 4 [--n 500] [--workers 26]

A checkout may carry its own worker count and Python as ``DIR:WORKERS:PYTHON``.
``--kind async`` runs asyncio workers instead (bench_workflows' ASYNC_PROCS
processes; ``--concurrency`` slots each), with the async step tool.
``--fsync always`` sets the private Redis's ``appendfsync always`` (default: its
``everysec``).
To measure a checkout older than this file, copy this file and
``bench_workflows.py`` into its ``benchmarks/``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys

from benchmarks.common import python_of

FAIL_RATIOS = (0.0, 0.2)
# AB_BATCH=1: submit with one submit_many (unset: the checkout's own default,
# one plan after another; checkouts older than submit_many know no other)
BATCH = {"batch": os.environ["AB_BATCH"] != "0"} if "AB_BATCH" in os.environ else {}


def child(n: int, workers: int, kind: str, concurrency: int, fsync: str) -> None:
    """Serve runs for the checkout in the current directory: one line in (the fail
    ratio), one JSON line out."""
    sys.path.insert(0, os.getcwd())
    from benchmarks import bench_workflows as bw
    rng = random.Random(7)
    bw.ASYNC_CONCURRENCY = concurrency
    with bw.durable(workers, kind) as d:
        d.store.redis.config_set("appendfsync", fsync)
        print("ready", flush=True)
        for line in sys.stdin:
            row = d.measure(bw.plans(n, float(line), rng), **BATCH)
            print(json.dumps(row), flush=True)


def spawn(spec: str, n: int, workers: int, kind: str, concurrency: int,
          fsync: str) -> subprocess.Popen[str]:
    path, w, python = ([*spec.split(":"), "", ""])[:3]
    cmd = [python or python_of(path), "-m", "benchmarks.ab_workflows", "--child",
           "--n", str(n), "--workers", w or str(workers), "--kind", kind,
           "--concurrency", str(concurrency), "--fsync", fsync]
    proc = subprocess.Popen(cmd, cwd=path, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError(f"{spec}: the benchmark child did not start")
    return proc


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("checkouts", nargs="*")
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--workers", type=int, default=26)
    ap.add_argument("--kind", choices=["rq", "async"], default="rq")
    ap.add_argument("--concurrency", type=int, default=256,
                    help="slots per asyncio worker (with --kind async)")
    ap.add_argument("--fsync", choices=["everysec", "always"], default="everysec")
    ap.add_argument("--child", action="store_true")
    a = ap.parse_args()
    if a.child:
        child(a.n, a.workers, a.kind, a.concurrency, a.fsync)
        return
    if len(a.checkouts) != 2:
        ap.error("give two checkouts (directories), A and B")
    kids = [spawn(c, a.n, a.workers, a.kind, a.concurrency, a.fsync) for c in a.checkouts]
    rows: dict[tuple[int, float], list[dict[str, float]]] = {
        (i, f): [] for i in range(2) for f in FAIL_RATIOS}
    for rep in range(a.reps):
        for f in FAIL_RATIOS:
            for i in ((0, 1) if rep % 2 == 0 else (1, 0)):
                proc = kids[i]
                assert proc.stdin is not None
                assert proc.stdout is not None
                proc.stdin.write(f"{f}\n")
                proc.stdin.flush()
                rows[(i, f)].append(json.loads(proc.stdout.readline()))
    for proc in kids:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
    for (i, f), runs in rows.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        cpu = med["cpu_ms_workers"] + med["cpu_ms_redis"] + med["cpu_ms_driver"]
        print(f"{'AB'[i]} {a.checkouts[i]} {a.fsync} n={a.n} fail={int(f * 100)}%: "
              f"{med['workflows_per_s']:.0f} wf/s, p99 {med['p99_ms']:.0f} ms, CPU per "
              f"workflow {cpu:.2f} ms (workers {med['cpu_ms_workers']:.2f}, Redis "
              f"{med['cpu_ms_redis']:.2f}, driver {med['cpu_ms_driver']:.2f}); runs "
              f"{[round(r['workflows_per_s']) for r in runs]}")


if __name__ == "__main__":
    main()
