"""Tools the benchmarks run, as a user's tools module would declare them."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from saga_store import Reversibility, tool


@tool(reversibility=Reversibility.READONLY)
def noop(n: int = 0) -> dict[str, Any]:
    return {"n": n}


@tool(reversibility=Reversibility.READONLY)
async def aio_noop(n: int = 0) -> dict[str, Any]:
    return {"n": n}


@tool(reversibility=Reversibility.READONLY)
def io_wait(ms: float = 10.0) -> dict[str, Any]:
    time.sleep(ms / 1000)
    return {}


@tool(reversibility=Reversibility.READONLY)
async def aio_wait(ms: float = 10.0) -> dict[str, Any]:
    await asyncio.sleep(ms / 1000)
    return {}


def bare_noop(n: int = 0) -> dict[str, Any]:
    """The same no-op as a plain RQ job function, for the side-by-side baseline."""
    return {"n": n}


def bare_io(n: int = 0, ms: float = 10.0) -> dict[str, Any]:
    """A 10 ms I/O wait as a plain RQ job function: the machine's yardstick."""
    time.sleep(ms / 1000)
    return {"n": n}


@tool
def undo_noop(ref: str) -> dict[str, Any]:
    return {"undone": ref}


@tool(compensation=undo_noop, mapping={"ref": "$.output.ref"})
def do_noop(n: int = 0) -> dict[str, Any]:
    return {"ref": f"r{n}"}


@tool(reversibility=Reversibility.READONLY)
def fail_now() -> dict[str, Any]:
    raise RuntimeError("the step fails")


@tool(timeout=5)
def io_undo(ref: str, ms: float = 10.0) -> dict[str, Any]:
    time.sleep(ms / 1000)
    return {"undone": ref}


@tool(compensation=io_undo, mapping={"ref": "$.output.ref", "ms": "$.input.ms"}, timeout=5)
def io_step(n: int, ms: float = 10.0, fail: bool = False) -> dict[str, Any]:
    """One step of the peer workload: an I/O wait, failing on request."""
    time.sleep(ms / 1000)
    if fail:
        raise RuntimeError("step failed on purpose")
    return {"ref": f"r{n}"}


@tool(timeout=5)
async def aio_undo(ref: str, ms: float = 10.0) -> dict[str, Any]:
    await asyncio.sleep(ms / 1000)
    return {"undone": ref}


@tool(compensation=aio_undo, mapping={"ref": "$.output.ref", "ms": "$.input.ms"}, timeout=5)
async def aio_step(n: int, ms: float = 10.0, fail: bool = False) -> dict[str, Any]:
    """The peer workload's step as an async tool (the asyncio worker runs it on its
    event loop, as the peers' SDKs run theirs)."""
    await asyncio.sleep(ms / 1000)
    if fail:
        raise RuntimeError("step failed on purpose")
    return {"ref": f"r{n}"}
