"""Calling one tool: preconditions, timeout, bounded retries, postconditions.

A call that runs past the tool's ``timeout`` is *in doubt*, not failed: it may
have had its effect. Sync tools are interrupted with SIGALRM when they run on
the main thread (as in an RQ worker); off it (the asyncio worker's threads, the
inline executor) they run on the calling thread and cannot be stopped, so the
outcome waits for the call to return, and says in doubt if that was past the
timeout; a watchdog thread renews the lease meanwhile. Async tools run
under ``asyncio.wait_for`` on the invoker's own event loop (one per invoker,
so one per worker thread).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
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

    def __init__(self, watchdog: Watchdog | None = None) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watchdog = watchdog  # made when first needed, unless shared

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
        if self._watchdog is None:
            self._watchdog = Watchdog()
        return _off_main(self._watchdog, spec, kwargs, keepalive)


def _off_main(watchdog: Watchdog, spec: ToolSpec, kwargs: dict[str, Any],
              keepalive: Keepalive | None) -> Any:
    """Call a sync tool here, off the main thread, where nothing can stop it: the
    outcome waits for the call to return and is in doubt if that was past the
    timeout, so the in-doubt outcome (and any probe after it) comes after whatever
    the call did, never before. Meanwhile the watchdog renews the caller's lease
    (``keepalive``), so no one else runs the step while it still runs. (The call
    used to run on a thread made for it, which cost a thread's start and two
    hand-overs per call, about 150 us.)"""
    watch = watchdog.watch(spec, keepalive)
    try:
        result = spec.fn(**kwargs)
    finally:
        late = watch.end()
    if late:
        raise StepTimeout
    return result


class _Watch:
    """One sync call being watched: when it is due to renew its caller's lease, and
    when it runs past its timeout."""

    def __init__(self, watchdog: Watchdog, spec: ToolSpec,
                 keepalive: Keepalive | None) -> None:
        self.watchdog = watchdog
        self.name, self.timeout = spec.name, spec.timeout
        self.renew: Callable[[], None] | None = None
        self.every_s = 0.0
        if keepalive is not None:
            self.renew, self.every_s = keepalive
        now = time.monotonic()
        self.deadline = now + spec.timeout
        self.renew_at = now + self.every_s
        self.warned = False
        self.renewing = False  # a renewal is queued or under way
        self.done = False
        self.lock = threading.Lock()  # a renewal under way finishes before end() returns

    def end(self) -> bool:
        """The call returned: no renewal from now on. Whether it ran past its timeout."""
        with self.lock:
            self.done = True
        self.watchdog.forget(self)
        return time.monotonic() > self.deadline

    def due(self, now: float) -> bool:
        """Whether its lease is due for a renewal (none being under way); says once
        that the call ran past its timeout."""
        if now > self.deadline and not self.warned:
            self.warned = True
            log.warning("tool %s ran past its %g s timeout on a thread, where it cannot be "
                        "stopped; its step is recorded in doubt once the call returns (make "
                        "the tool async def, or run it on RQ workers, to stop it at its "
                        "timeout)", self.name, self.timeout)
        if self.renew is None or self.renewing or now < self.renew_at:
            return False
        self.renewing, self.renew_at = True, now + self.every_s
        return True

    def renew_lease(self) -> None:
        """On a renewal thread. Never after end(): the outcome's append has released
        the lease by then, and a renewal would take it back for a stale token."""
        try:
            with self.lock:
                if not self.done and self.renew is not None:
                    self.renew()
        finally:
            self.renewing = False


class Watchdog:
    """A thread (one per asyncio worker, shared by its step threads) that renews the
    leases of sync calls running off the main thread and says when one runs past
    its timeout, a tick every :data:`TICK_S`. A call registers and leaves without
    waking it. The renewals themselves run on a pool of threads: one stuck on an
    unreachable Redis (a cluster master failing over) holds up no other call's."""

    TICK_S = 0.05
    RENEWERS = 32  # made as needed: one or two while Redis answers at once

    def __init__(self) -> None:
        self._watches: dict[int, _Watch] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def watch(self, spec: ToolSpec, keepalive: Keepalive | None) -> _Watch:
        w = _Watch(self, spec, keepalive)
        with self._lock:
            self._watches[id(w)] = w
            if self._thread is None or not self._thread.is_alive():  # new, or forked
                self._thread = threading.Thread(target=self._run, name="saga-watchdog",
                                                daemon=True)
                self._thread.start()
        return w

    def forget(self, w: _Watch) -> None:
        with self._lock:
            self._watches.pop(id(w), None)

    def _run(self) -> None:
        renewers = ThreadPoolExecutor(self.RENEWERS, thread_name_prefix="saga-renew")
        while True:
            time.sleep(self.TICK_S)
            with self._lock:
                watches = list(self._watches.values())
            now = time.monotonic()
            for w in watches:
                if w.due(now):
                    renewers.submit(w.renew_lease)  # a renewal logs its own errors


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
