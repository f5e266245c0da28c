"""Tools for the asyncio worker's tests: each call writes to the test's own ledger
where and when it ran (process, thread, start and end), so a test tells from
its ledger, not from the log, which calls overlapped and which ran twice.

``call`` rows are one per call (keyed by idempotency key, attempt and process);
``slept`` rows one per idempotency key, written when the call is done. The
ledger tools come along, for plans with real effects after a slow step."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

import orjson

from saga_store import Reversibility, StepContext, tool

from .ledger_tools import (  # noqa: F401  # registered with this module's tools
    charge_payment,
    effect,
    effects,
    refund_payment,
    release_inventory,
    reserve_inventory,
)


def _record(ctx: StepContext, started: float) -> None:
    detail = orjson.dumps({"pid": os.getpid(), "thread": threading.current_thread().name,
                           "start": started, "end": time.time()}).decode()
    effect("call", f"{ctx.idempotency_key}:{ctx.attempt}:{os.getpid()}", detail)
    effect("slept", ctx.idempotency_key, detail)


@tool(reversibility=Reversibility.READONLY, timeout=4)
def timed_sleep(seconds: float, ctx: StepContext) -> dict[str, Any]:
    started = time.time()
    effect("started", f"{ctx.idempotency_key}:{ctx.attempt}")
    time.sleep(seconds)
    _record(ctx, started)
    return {"slept": seconds}


# a hundred of these start at once in one test: the first write to the test's own
# ledger can then wait up to 2 s on the others (SQLite takes one writer at a time),
# so a 4 s timeout put a 2 s sleep in doubt on a loaded machine
@tool(reversibility=Reversibility.READONLY, timeout=30)
async def timed_async_sleep(seconds: float, ctx: StepContext) -> dict[str, Any]:
    started = time.time()
    effect("started", f"{ctx.idempotency_key}:{ctx.attempt}")
    await asyncio.sleep(seconds)
    _record(ctx, started)
    return {"slept": seconds}


def calls(kind: str = "slept") -> list[dict[str, Any]]:
    """The ledger's rows of ``kind`` (``call`` or ``slept``), their details parsed."""
    return [orjson.loads(detail) for _, _, detail in effects(kind)]


@tool(reversibility=Reversibility.READONLY, timeout=120)
def park(seconds: float, ctx: StepContext) -> dict[str, Any]:
    """Sleep (a stand-in for a call that waits), noting only that it started."""
    effect("parked", ctx.idempotency_key)
    time.sleep(seconds)
    return {}


@tool(reversibility=Reversibility.READONLY, timeout=120)
async def park_async(seconds: float, ctx: StepContext) -> dict[str, Any]:
    """:func:`park` as a coroutine."""
    effect("parked", ctx.idempotency_key)
    await asyncio.sleep(seconds)
    return {}


@tool(reversibility=Reversibility.READONLY, timeout=0.3)
def hang(seconds: float, ctx: StepContext) -> dict[str, Any]:
    """A sync call that hangs far past its timeout and its lease, then returns."""
    started = time.time()
    time.sleep(seconds)
    _record(ctx, started)
    return {}


@tool(reversibility=Reversibility.READONLY, timeout=4)
async def exits_async(ctx: StepContext) -> dict[str, Any]:
    """A tool that calls sys.exit(): the worker must take it as the step's failure
    to finish, never as its own end."""
    effect("exit", ctx.idempotency_key)
    raise SystemExit(3)


@tool(reversibility=Reversibility.READONLY)
def current_trace() -> dict[str, Any]:
    """The trace id current where the tool runs (0: none)."""
    from opentelemetry import trace
    return {"trace_id": format(trace.get_current_span().get_span_context().trace_id, "032x")}
