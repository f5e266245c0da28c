"""``saga demo`` against a real Redis (worker processes, a rollback, a commit,
verify), timed from start to exit: the median of ``--runs``, against the 10 s
target a newcomer's first run is held to. (The suite checks what the demo says;
its speed is measured here, where the machine's load is stated beside it.)

    python -m benchmarks.bench_demo --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import bench_redis, machine

ROOT = str(Path(__file__).resolve().parents[1])
TARGET_S = 10.0


def one(url: str) -> float:
    env = {**os.environ, "SAGA_REDIS_URL": url, "PYTHONPATH": ROOT}
    began = time.monotonic()
    subprocess.run([sys.executable, "-m", "saga_store.cli.main", "demo"], env=env,
                   capture_output=True, timeout=120, check=True)
    return time.monotonic() - began


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    srv = bench_redis()
    try:
        took = [one(srv.url) for _ in range(args.runs)]
    finally:
        srv.stop()
    print(json.dumps({"machine": machine(), "load_avg": os.getloadavg()[0],
                      "runs_s": [round(t, 2) for t in took],
                      "median_s": round(statistics.median(took), 2), "target_s": TARGET_S},
                     indent=2))


if __name__ == "__main__":
    main()
