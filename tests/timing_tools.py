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

from saga_store import RetryableError, RetryPolicy, Reversibility, StepContext, tool

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


# -- slow retrying tools: each try longer than a short lease ----------------------
# Every try of these writes a ``try`` row (idempotency key, try number, pid, start,
# end) to the test's own ledger when it ends, so a test tells from its ledger
# alone whether two bodies of one step ever ran at the same time. The first
# ``fail`` tries ask for a retry; the try after them has the effect (once per key).

SLOW_RETRY = RetryPolicy(max_attempts=4, backoff_s=0.4, max_backoff_s=0.8, max_deliveries=1)


def _try(ctx: StepContext, started: float, n: int) -> None:
    detail = orjson.dumps({"pid": os.getpid(), "key": ctx.idempotency_key, "n": n,
                           "start": started, "end": time.time()}).decode()
    effect("try", f"{ctx.idempotency_key}:{n}:{os.getpid()}:{started}", detail)


def _tries_so_far(ctx: StepContext) -> int:
    return sum(1 for _, key, _ in effects("try") if key.startswith(ctx.idempotency_key + ":"))


@tool(reversibility=Reversibility.IRREVERSIBLE, timeout=3, retry=SLOW_RETRY)
def slow_retry(seconds: float, fail: int, ctx: StepContext) -> dict[str, Any]:
    """A sync tool whose tries take ``seconds`` each; the first ``fail`` ask for a
    retry (irreversible: a second delivery of it would be in doubt)."""
    n = _tries_so_far(ctx) + 1
    started = time.time()
    time.sleep(seconds)
    _try(ctx, started, n)
    if n <= fail:
        raise RetryableError(f"try {n}: busy, try again")
    effect("slow_effect", ctx.idempotency_key)
    return {"tries": n}


@tool(reversibility=Reversibility.IRREVERSIBLE, timeout=3, retry=SLOW_RETRY)
async def slow_retry_async(seconds: float, fail: int, ctx: StepContext) -> dict[str, Any]:
    """:func:`slow_retry` as a coroutine."""
    n = _tries_so_far(ctx) + 1
    started = time.time()
    await asyncio.sleep(seconds)
    _try(ctx, started, n)
    if n <= fail:
        raise RetryableError(f"try {n}: busy, try again")
    effect("slow_effect", ctx.idempotency_key)
    return {"tries": n}


def tries() -> list[dict[str, Any]]:
    """Every try the slow retrying tools made, in the order they ended."""
    return [orjson.loads(detail) for _, _, detail in effects("try")]


def overlapping(rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Pairs of tries of one idempotency key whose bodies ran at the same time."""
    out = []
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            if a["key"] == b["key"] and a["start"] < b["end"] and b["start"] < a["end"]:
                out.append((a, b))
    return out


SLOW_READ_RETRY = RetryPolicy(max_attempts=4, backoff_s=0.4, max_backoff_s=0.8)


@tool(reversibility=Reversibility.READONLY, timeout=3, retry=SLOW_READ_RETRY)
def slow_read(seconds: float, fail: int, ctx: StepContext) -> dict[str, Any]:
    """:func:`slow_retry` as a read: a delivery whose worker died runs it again."""
    return slow_retry(seconds, fail, ctx)  # type: ignore[no-any-return]


@tool(reversibility=Reversibility.READONLY, timeout=3, retry=SLOW_READ_RETRY)
async def slow_read_async(seconds: float, fail: int, ctx: StepContext) -> dict[str, Any]:
    """:func:`slow_retry_async` as a read."""
    return await slow_retry_async(seconds, fail, ctx)  # type: ignore[no-any-return]


# -- tools raising what only a process's end should ---------------------------------
# One ``ran`` row per execution (never deduplicated), so a test counts from its own
# ledger how often each body ran.


class Custom(BaseException):
    """A BaseException of the tool's own."""


def _raise(what: str) -> None:
    made: dict[str, BaseException] = {"SystemExit": SystemExit(3),
                                      "KeyboardInterrupt": KeyboardInterrupt(),
                                      "GeneratorExit": GeneratorExit(), "Custom": Custom("mine")}
    raise made[what]


def _ran(what: str, ctx: StepContext) -> None:
    effect("ran", f"{what}:{ctx.idempotency_key}:{time.time()}:{os.getpid()}", what)


@tool(reversibility=Reversibility.READONLY, timeout=4)
def raises(what: str, ctx: StepContext) -> dict[str, Any]:
    """Runs, then raises the BaseException named ``what``."""
    _ran(what, ctx)
    _raise(what)
    return {}


@tool(reversibility=Reversibility.READONLY, timeout=4)
async def raises_async(what: str, ctx: StepContext) -> dict[str, Any]:
    """:func:`raises` as a coroutine."""
    _ran(what, ctx)
    _raise(what)
    return {}


@tool(retry=RetryPolicy(max_attempts=1))
def undo_raises(what: str, ctx: StepContext) -> dict[str, Any]:
    """A compensation that runs, then raises the BaseException named ``what``."""
    _ran(what, ctx)
    _raise(what)
    return {}


@tool(compensation=undo_raises, mapping={"what": "$.input.what"}, timeout=4)
def undone_by_raising(what: str) -> dict[str, Any]:
    return {"what": what}


@tool(reversibility=Reversibility.READONLY)
def fails_now() -> dict[str, Any]:
    raise RuntimeError("this step fails, so the saga unwinds")


def runs(what: str | None = None) -> int:
    """How many times a raising tool's body ran (of ``what``, or of any)."""
    return sum(1 for _, _, w in effects("ran") if what is None or w == what)
