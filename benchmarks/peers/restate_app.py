"""The peer workload as a Restate service: five durable steps of a 10 ms wait, the
third failing on request, the steps done so far compensated in reverse, each
compensation a durable step too. Served by the SDK's ASGI app:

    python -m hypercorn benchmarks.peers.restate_app:app --bind 127.0.0.1:9080
"""

from __future__ import annotations

import asyncio
from typing import Any

import restate
from restate import RunOptions, TerminalError

STEPS, IO_MS = 5, 10.0

saga = restate.Service("Saga")


async def io_step(n: int, fail: bool) -> dict[str, Any]:
    await asyncio.sleep(IO_MS / 1000)
    if fail:
        # terminal: journaled as the step's outcome and not retried, as Saga Store
        # records a failed step and compensates instead of retrying it
        raise TerminalError("step failed on purpose")
    return {"ref": f"r{n}"}


async def io_undo(ref: str) -> dict[str, Any]:
    await asyncio.sleep(IO_MS / 1000)
    return {"undone": ref}


@saga.handler()
async def run(ctx: restate.Context, req: dict[str, Any]) -> dict[str, Any]:
    fail = bool(req.get("fail"))
    done: list[dict[str, Any]] = []
    try:
        for i in range(STEPS):
            out = await ctx.run_typed(f"step{i}", io_step, RunOptions(max_attempts=1),
                                      n=i, fail=fail and i == 2)
            done.append(out)
    except TerminalError:
        for out in reversed(done):
            await ctx.run_typed(f"undo-{out['ref']}", io_undo, ref=out["ref"])
        return {"status": "compensated", "undone": len(done)}
    return {"status": "completed"}


app = restate.app(services=[saga])
