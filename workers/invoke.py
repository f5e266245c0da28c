"""Calling one tool: preconditions, timeout, bounded retries, postconditions.

A call that runs past the tool's ``timeout`` is *in doubt*, not failed: it may
have had its effect. Sync tools are interrupted with SIGALRM when they run on
the main thread (as in an RQ worker); off it (the asyncio worker's threads, the
inline executor) they cannot be stopped, so the outcome waits for the call to
return, and says in doubt if that was past the timeout. Async tools run
under ``asyncio.wait_for`` on the invoker's own event loop (one per invoker,
so one per worker thread).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel

from saga_store.errors import InvalidInput, StepError
from saga_store.log.canonical import MAX_DEPTH, check_json
from saga_store.protocol.outcome import Outcome
from saga_store.protocol.vocab import OutcomeKind
from saga_store.tools.secrets import scrub
from saga_store.tools.spec import StepContext, ToolSpec

log = logging.getLogger("saga_store.worker")


Keepalive = tuple[Callable[[], None], float]


class StepTimeout(BaseException):
    """Raised inside a tool that ran past its timeout (BaseException: a tool's
    ``except Exception`` must not swallow it)."""


class Invoker:
    """Runs tools for one worker thread; async tools on an event loop of its own."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    def invoke(self, spec: ToolSpec, args: Mapping[str, Any], ctx: StepContext,
               secrets: Mapping[str, Any] | None = None,
               keepalive: Keepalive | None = None) -> Outcome:
        """One call of ``spec`` (with its retries). ``keepalive``: (renew, every_s),
        the caller's lease renewal while a sync tool runs on a thread."""
        kwargs = spec.kwargs(args)
        for pre in spec.preconditions:
            if not _holds(pre, args):
                return Outcome.failed(f"precondition {_name(pre)} does not hold")
        tries = 0
        while True:
            tries += 1
            try:
                raw = self._call(spec, kwargs, ctx, keepalive)
            except StepTimeout:
                return Outcome(OutcomeKind.IN_DOUBT, error=f"timed out after {spec.timeout:g} "
                               "s; the call may or may not have taken effect", tries=tries)
            except Exception as exc:  # any exception fails the step (contract)
                retryable = isinstance(exc, StepError) and exc.retryable
                if retryable and tries < spec.retry.max_attempts:
                    time.sleep(spec.retry.backoff(tries))
                    continue
                error = scrub(f"{type(exc).__name__}: {exc}", secrets)[:2000]
                return Outcome.failed(error, retryable=retryable, tries=tries)
            try:
                result = as_result(raw)
            except InvalidInput as exc:  # it returned: whatever it does has been done
                return Outcome(OutcomeKind.IN_DOUBT, error=f"the tool returned, but not a "
                               f"result that can be logged ({exc}); its effect is assumed to "
                               "stand", tries=tries)
            for post in spec.postconditions:
                if not _holds(post, args, result):
                    return Outcome.succeeded(result, tries=tries,
                                             postcondition_failed=_name(post))
            return Outcome.succeeded(result, tries=tries)

    def _call(self, spec: ToolSpec, kwargs: dict[str, Any], ctx: StepContext,
              keepalive: Keepalive | None) -> Any:
        if spec.takes_ctx:
            kwargs = {**kwargs, "ctx": ctx}
        if spec.is_async:
            loop = self._loop or asyncio.new_event_loop()
            self._loop = loop
            try:
                return loop.run_until_complete(asyncio.wait_for(spec.fn(**kwargs), spec.timeout))
            except TimeoutError:
                raise StepTimeout from None
        if threading.current_thread() is threading.main_thread():
            return _with_alarm(spec, kwargs)
        return _on_thread(spec, kwargs, keepalive)


def _on_thread(spec: ToolSpec, kwargs: dict[str, Any], keepalive: Keepalive | None) -> Any:
    """Call a sync tool on a thread of its own, waiting at most its timeout for it.
    A thread cannot be stopped: past the timeout this still waits for the call to
    return before raising StepTimeout, so the in-doubt outcome (and any probe after
    it) comes after whatever the call did, never before. Meanwhile ``keepalive``
    renews the caller's lease, so no one else runs the step while it still runs."""
    renew, every_s = keepalive if keepalive is not None else (None, spec.timeout)
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        fut = pool.submit(spec.fn, **kwargs)
        deadline = time.monotonic() + spec.timeout
        while (left := deadline - time.monotonic()) > 0:
            if concurrent.futures.wait([fut], timeout=min(left, every_s)).done:
                return fut.result()
            if renew is not None:
                renew()
        log.warning("tool %s ran past its %g s timeout on a thread, where it cannot be "
                    "stopped; its step is recorded in doubt once the call returns (make "
                    "the tool async def, or run it on RQ workers, to stop it at its "
                    "timeout)", spec.name, spec.timeout)
        while not concurrent.futures.wait([fut], timeout=every_s).done:
            if renew is not None:
                renew()
        raise StepTimeout
    finally:
        pool.shutdown(wait=False)


_alarm = {"armed": False}


def _on_alarm(signum: int, frame: Any) -> None:
    if _alarm["armed"]:
        raise StepTimeout


def _with_alarm(spec: ToolSpec, kwargs: dict[str, Any]) -> Any:
    # the handler is set once, and again only if something else replaced it (setting
    # it per call cost more than a no-op step's own work; looking is cheap); a stray
    # alarm while no tool runs is ignored
    if signal.getsignal(signal.SIGALRM) is not _on_alarm:
        signal.signal(signal.SIGALRM, _on_alarm)
    _alarm["armed"] = True
    signal.setitimer(signal.ITIMER_REAL, spec.timeout)
    try:
        return spec.fn(**kwargs)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        _alarm["armed"] = False


def as_result(raw: Any) -> dict[str, Any]:
    """A tool's return value as a JSON object (contract), or InvalidInput."""
    if raw is None:
        return {}
    if isinstance(raw, BaseModel):
        try:
            raw = raw.model_dump(mode="json")
        except ValueError as exc:  # nested too deep for pydantic to write
            raise InvalidInput(f"result: {exc}; return plain JSON data, nested at most "
                               f"{MAX_DEPTH} levels") from None
    if not isinstance(raw, dict):
        raise InvalidInput(f"tool returned {type(raw).__name__}, not a JSON object (dict); "
                           "return a dict")
    check_json(raw, "result")
    return raw


def _holds(cond: Any, *args: Any) -> bool:
    try:
        return cond(*args) is not False
    except Exception:
        return False


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", repr(fn))
