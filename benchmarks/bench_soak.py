"""Redis memory under steady load with archiving: is it flat after the retention?

    python -m benchmarks.bench_soak [--minutes 20] [--rate 50] [--json]

A private Redis (AOF, fsync every second), one asyncio worker (``saga worker
--async``), a driver submitting 3-step plans (10 ms async tools) paced at
``--rate`` sagas/s for ``--minutes``, and ``saga archive --closed-before 5m
--to <tmp> --every 30s`` as a process of its own. Every 10 s it samples
``INFO memory`` used_memory, and apart: the root chain, the ledger chains
(entries left in Redis), and the agent's context stream. It prints a table
per minute and the slope of used_memory over the last 10 minutes against the
run's input rate (sagas/s x the bytes a saga takes before it is archived,
measured over the first minutes, before anything is due).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import redis

from saga_store import Registry, SagaStore, Settings, keys
from saga_store.log.layout import ROOT
from saga_store.testing import assert_eventually
from saga_store.testing.workers import WorkerProcess

from .common import bench_redis, machine

TOOLS = "benchmarks.bench_tools"
AGENT = "soak"
SAMPLE_S = 10.0
PLAN = [{"tool": "aio_step", "args": {"n": i, "ms": 10.0}} for i in range(3)]


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (t, y): y per unit of t."""
    n = len(points)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (y - my) for t, y in points) / den if den else 0.0


def archived(folder: Path) -> int:
    """Sagas the folder's manifests list."""
    return sum(len(orjson.loads(p.read_bytes())["sagas"]) for p in folder.glob("manifest-*.json"))


def sample(r: redis.Redis, chains: list[str]) -> dict[str, int]:
    pipe = r.pipeline(transaction=False)
    for c in chains:
        pipe.xlen(keys.ledger_log(c))
    ledger_entries = sum(pipe.execute())
    return {"used_memory": int(r.info("memory")["used_memory"]),
            "root": int(r.memory_usage(keys.ledger_log(ROOT), samples=0) or 0),
            "root_entries": int(r.xlen(keys.ledger_log(ROOT))),
            "ctx": int(r.memory_usage(keys.agent_ctx(AGENT)) or 0),
            "ledger_entries": ledger_entries, "keys": int(r.dbsize())}


def run(minutes: float, rate: float, retention: str, every: str) -> dict[str, Any]:
    srv = bench_redis()
    folder = Path(tempfile.mkdtemp(prefix="saga-soak-"))
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "SAGA_REDIS_URL": srv.url, "PYTHONPATH": root}
    worker = archiver = None
    try:
        r = redis.Redis.from_url(srv.url)
        store = SagaStore(r, Registry.from_modules(TOOLS), Settings())
        worker = WorkerProcess(env, TOOLS, "--log-level", "WARNING", "--async",
                               "--concurrency", "256").start()
        from rq.worker import Worker
        assert_eventually(lambda: len(Worker.all(connection=r)) >= 1, timeout=60,
                          what="the worker to start")
        archiver = subprocess.Popen(
            [sys.executable, "-P", "-m", "saga_store.cli.main", "archive", "--closed-before",
             retention, "--to", str(folder), "--every", every],
            env=env, stdout=subprocess.DEVNULL, stderr=open(folder / "archive.log", "ab"),  # noqa: SIM115
            start_new_session=True)
        store.submit(PLAN, agent_id=AGENT)  # the store's layout is recorded on first write
        chains = store.events.log.layout.chains()
        base = sample(r, chains)
        began = time.monotonic()
        end, due, submitted = began + minutes * 60, began, 0
        samples: list[dict[str, Any]] = [{"t": 0.0, "sagas": 0, "archived": 0, **base}]
        next_sample = began + SAMPLE_S
        while (now := time.monotonic()) < end:
            if now >= next_sample:
                samples.append({"t": now - began, "sagas": submitted,
                                "archived": archived(folder), **sample(r, chains)})
                next_sample += SAMPLE_S
                continue
            if now < due:
                time.sleep(min(due - now, 0.01))
                continue
            store.submit(PLAN, agent_id=AGENT)
            submitted += 1
            due += 1 / rate
        samples.append({"t": time.monotonic() - began, "sagas": submitted,
                        "archived": archived(folder), **sample(r, chains)})
        return summarize(samples, rate, minutes, retention, every)
    finally:
        if archiver is not None:
            archiver.terminate()
            archiver.wait(timeout=120)
        if worker is not None:
            worker.kill()
        srv.stop()


def summarize(samples: list[dict[str, Any]], rate: float, minutes: float, retention: str,
              every: str) -> dict[str, Any]:
    # before anything is due (the first 4 minutes of a 5-minute retention): the
    # bytes a saga takes in Redis before it is archived
    early = [(s["t"], s["used_memory"]) for s in samples if 60 <= s["t"] <= 240]
    per_saga = slope(early) / rate if early else 0.0
    tail = [s for s in samples if s["t"] >= samples[-1]["t"] - 600]
    grow = slope([(s["t"], s["used_memory"]) for s in tail])
    parts = {k: slope([(s["t"], s[k]) for s in tail]) for k in ("root", "ctx")}
    table = []
    for minute in range(int(minutes) + 1):
        at = min(samples, key=lambda s, m=minute: abs(s["t"] - 60 * m))
        table.append({"minute": minute, "sagas": at["sagas"], "archived": at["archived"],
                      "used_memory_mb": round(at["used_memory"] / 2**20, 1),
                      "ledger_entries": at["ledger_entries"], "root_kb": at["root"] // 1024,
                      "ctx_mb": round(at["ctx"] / 2**20, 1)})
    return {"machine": machine(), "rate": rate, "minutes": minutes, "retention": retention,
            "every": every, "bytes_per_saga_before_archive": round(per_saga),
            "input_bytes_per_s": round(per_saga * rate),
            "slope_last_10min_bytes_per_s": round(grow),
            "slope_root_bytes_per_s": round(parts["root"]),
            "slope_ctx_bytes_per_s": round(parts["ctx"]),
            "per_day_mb": {"total": round(grow * 86400 / 2**20),
                           "root": round(parts["root"] * 86400 / 2**20),
                           "ctx": round(parts["ctx"] * 86400 / 2**20)},
            "table": table, "samples": samples}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--rate", type=float, default=50.0, help="sagas submitted per second")
    ap.add_argument("--retention", default="5m")
    ap.add_argument("--every", default="30s")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    out = run(a.minutes, a.rate, a.retention, a.every)
    if a.json:
        print(json.dumps({k: v for k, v in out.items() if k != "samples"}, indent=2))
        return
    print("| minute | sagas so far | used_memory MB | archived | ledger entries in Redis "
          "| root chain KB | context stream MB |")
    print("|---|---|---|---|---|---|---|")
    for row in out["table"]:
        print(f"| {row['minute']} | {row['sagas']:,} | {row['used_memory_mb']} | "
              f"{row['archived']:,} | {row['ledger_entries']:,} | {row['root_kb']:,} | "
              f"{row['ctx_mb']} |")
    print(f"\nbefore archive: {out['bytes_per_saga_before_archive']:,} B a saga; input "
          f"{out['input_bytes_per_s']:,} B/s at {out['rate']:g} sagas/s")
    print(f"used_memory slope, last 10 min: {out['slope_last_10min_bytes_per_s']:,} B/s "
          f"(root chain {out['slope_root_bytes_per_s']:,} B/s, context stream "
          f"{out['slope_ctx_bytes_per_s']:,} B/s); per day: {out['per_day_mb']}")


if __name__ == "__main__":
    main()
