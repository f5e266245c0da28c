"""The peer workload as a DBOS workflow: five steps of a 10 ms wait, the third
failing on request, the steps done so far compensated in reverse, each
compensation a step too. DBOS runs inside its application's process, so this is
that process, driven by bench_peers over its stdin and stdout:

    python -m benchmarks.peers.dbos_app postgresql://postgres@127.0.0.1:5432/DB [POOL]

POOL (50) is both the system database's connection pool and the event loop's thread
pool: DBOS runs an async step's database calls in threads (asyncio.to_thread), and
asyncio's default pool has min(32, cores + 4) threads, 6 on 2 cores, which would
hold DBOS to 6 database calls at a time.

Each input line is a JSON list of booleans (one workflow each, true: it fails);
each output line is {"elapsed": s, "latency": [s, ...], "compensated": count};
"ready" after launch.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dbos import DBOS, DBOSConfig

STEPS, IO_MS = 5, 10.0


class StepFailed(Exception):
    pass


@DBOS.step()  # no retries (DBOS's default): the failure is recorded and compensated
async def io_step(n: int, fail: bool) -> dict[str, Any]:
    await asyncio.sleep(IO_MS / 1000)
    if fail:
        raise StepFailed("step failed on purpose")
    return {"ref": f"r{n}"}


@DBOS.step()
async def io_undo(ref: str) -> dict[str, Any]:
    await asyncio.sleep(IO_MS / 1000)
    return {"undone": ref}


@DBOS.workflow()
async def saga(fail: bool) -> dict[str, Any]:
    done: list[dict[str, Any]] = []
    try:
        for i in range(STEPS):
            done.append(await io_step(i, fail and i == 2))
    except StepFailed:
        for out in reversed(done):
            await io_undo(out["ref"])
        return {"status": "compensated", "undone": len(done)}
    return {"status": "completed"}


async def one(fail: bool) -> tuple[float, str]:
    began = time.perf_counter()
    out = await saga(fail)
    return time.perf_counter() - began, out["status"]


async def serve(threads: int) -> None:
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(max_workers=threads))
    print("ready", flush=True)
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        fails = json.loads(line)
        began = time.perf_counter()
        done = await asyncio.gather(*(one(f) for f in fails))
        print(json.dumps({"elapsed": time.perf_counter() - began,
                          "latency": [x for x, _ in done],
                          "compensated": sum(s == "compensated" for _, s in done)}),
              flush=True)


def main() -> None:
    pool = int(sys.argv[2]) if len(sys.argv) > 2 else 50
    config: DBOSConfig = {"name": "saga-bench", "system_database_url": sys.argv[1],
                          "log_level": "WARNING", "sys_db_pool_size": pool}
    DBOS(config=config)
    DBOS.launch()
    try:
        asyncio.run(serve(pool))
    finally:
        DBOS.destroy()


if __name__ == "__main__":
    main()
