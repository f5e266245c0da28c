"""Calling one tool: preconditions, timeout, bounded retries, postconditions.

A call that runs past the tool's ``timeout`` is *in doubt*, not failed: it may
have had its effect. Sync tools are interrupted with SIGALRM when they run on
the main thread (as in an RQ worker); off it (the asyncio worker's sync-tool
pool, the inline executor) they run on the calling thread and cannot be stopped,
so the outcome waits for the call to return (or raise), and says in doubt if that
was past the timeout; the watchdog (:mod:`.watchdog`) keeps the lease meanwhile.
Async tools run on the asyncio worker's loop under ``asyncio.timeout``, in the
step's own task; elsewhere under ``asyncio.wait_for`` on the invoker's own event
loop.

The step driver and the compensator do not call tools themselves: they are
generators that yield each :class:`Call` (and each :class:`Pause` of a
back-off) to whoever runs them. :func:`drive` runs one on the calling thread
(the RQ worker, the inline executor); the asyncio worker runs many at once on
its event loop with :func:`adrive`, awaiting async tools there and sending
sync ones to a thread pool, so a step waiting on its tool holds no thread.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import logging
import signal
import threading
from collections import deque
from collections.abc import Generator, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import redis
from pydantic import BaseModel

from saga_store.errors import InvalidInput, StepError
from saga_store.log.canonical import MAX_DEPTH, check_json
from saga_store.log.pipeline import pack
from saga_store.log.scripts import APPEND
from saga_store.protocol.outcome import Outcome
from saga_store.protocol.vocab import OutcomeKind
from saga_store.tools.secrets import scrub
from saga_store.tools.spec import StepContext, ToolSpec

from .lease import HandBack, Hold, LeaseLost
from .stopping import Stopping, process_stopping
from .watchdog import Keepalive, Watch, Watchdog, process_watchdog

T = TypeVar("T")
log = logging.getLogger("saga_store.worker")
# Redis names a cached script by this digest (a name, not a safeguard)
APPEND_SHA = hashlib.sha1(APPEND.encode(), usedforsecurity=False).hexdigest()


@dataclass(frozen=True)
class Call:
    """A tool call that a step's work asks its runner to make; the outcome (or what
    the call raised) comes back at the ``yield``."""

    spec: ToolSpec
    args: Mapping[str, Any]
    ctx: StepContext
    secrets: Mapping[str, Any] | None = None
    lease: Hold | None = None  # kept over every try and back-off, checked before each


@dataclass(frozen=True)
class Pause:
    """A wait a step's work asks for (a back-off between compensation tries),
    with the lease to keep meanwhile; a stop request cuts it short
    (:class:`~.lease.HandBack` at the ``yield``)."""

    seconds: float
    lease: Hold | None = None


@dataclass(frozen=True)
class Send:
    """A round trip a step's work asks for: ``trip`` (a lean pipeline or a
    :class:`~saga_store.execution.trip.Trip`) executed, its replies (errors in
    place) coming back at the ``yield``. On the asyncio worker the round trips
    of every step ready in one turn of the loop go out together."""

    trip: Any


# a step's (or an unwind's) work: it yields the calls and pauses it needs, and
# returns what happened
Work = Generator["Call | Pause | Send", Any, T]


@dataclass(frozen=True)
class _Done:
    value: Any


def _resume(work: Work[Any], value: Any, error: BaseException | None) -> Any:
    """The work's next request, given the answer to its last (``error``: raised
    at its ``yield``); :class:`_Done` with what it returned once it ends."""
    try:
        return work.throw(error) if error is not None else work.send(value)
    except StopIteration as stop:
        return _Done(stop.value)


def drive(work: Work[T], invoker: Invoker) -> T:
    """Run ``work`` to its end on this thread: each call through ``invoker``, each
    pause slept (its lease kept). An invoker that ``passes_on`` interruptions
    raises a tool's KeyboardInterrupt or SystemExit once the work has ended (its
    step logged in doubt)."""
    value: Any = None
    error: BaseException | None = None
    while True:
        req = _resume(work, value, error)
        if isinstance(req, _Done):
            if invoker.passes_on and invoker.interrupted is not None:
                exc, invoker.interrupted = invoker.interrupted, None
                raise exc
            return req.value  # type: ignore[no-any-return]
        value = error = None
        try:
            if isinstance(req, Send):
                value = req.trip.execute(raise_on_error=False)
            elif isinstance(req, Pause):
                invoker.pause(req.seconds, req.lease)
            else:
                value = invoker.invoke(req.spec, req.args, req.ctx, req.secrets, lease=req.lease)
        except BaseException as exc:  # raised at the yield, as if the work had called
            error = exc


async def adrive(work: Work[T], invoker: Invoker, pool: Executor,
                 sends: Sends | None = None) -> T:
    """Run ``work`` to its end on the running event loop: async tools awaited here,
    sync tools on ``pool``, pauses awaited, round trips through ``sends`` (or made
    at once). Between two yields the work runs on the loop's thread (its other
    Redis round trips included). What a call raises goes into the work at its
    ``yield``, as :func:`drive` does (a tool's own BaseException never does: the
    invoker makes it an in-doubt outcome); cancellation does not, and closes the
    work (its ``finally`` blocks run now)."""
    value: Any = None
    error: BaseException | None = None
    try:
        while True:
            req = _resume(work, value, error)
            if isinstance(req, _Done):
                return req.value  # type: ignore[no-any-return]
            value = error = None
            try:
                if isinstance(req, Send):
                    value = await sends.send(req.trip) if sends is not None else \
                        req.trip.execute(raise_on_error=False)
                elif isinstance(req, Pause):
                    await invoker.apause(req.seconds, req.lease, sends)
                else:
                    value = await invoker.ainvoke(req, pool, sends)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # raised at the yield, as if the work had called
                error = exc
    finally:
        work.close()


class Sends:
    """The round trips the works on one event loop ask for in one turn of it, sent
    together on a connection of their own (group commit): one write for all, each
    work getting its own replies. The loop does not wait for them: the replies are
    read when the socket says they are there, so the loop runs other steps while
    Redis works (and, under ``appendfsync always``, fsyncs once for the whole
    round), and several rounds may be in flight, answered in order. A batch is
    answered only with its own replies, so nothing counts as done before Redis said
    so. A connection lost with rounds in flight is replaced and every round in
    flight sent again whole, under the client's retry policy, and read on the spot
    (the append script recognises an append that did land). A trip that is not one
    plain lean pipeline on ``pool`` (a split queue Redis, a cluster) goes alone.

    The append script goes as EVALSHA, loaded on each new connection before its
    first round: 7 KB less to send and for Redis to hash per append. Should Redis
    answer NOSCRIPT all the same (``SCRIPT FLUSH`` while the connection lived), only
    the refused appends go again, with the script's body, and the next round loads
    it again first. The connection never sends a health-check PING of its own: its
    replies belong to the rounds in flight."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self._waiting: list[tuple[Any, asyncio.Future[list[Any]]]] = []
        self._flying: deque[list[_Batch]] = deque()
        self._conn: Any = None
        self._loaded_on: Any = None  # the socket the append script was loaded on
        self._reload = False  # NOSCRIPT seen: load the script again in the next round
        self._watched: Any = None  # the socket the loop watches for replies
        self._watched_fd = -1
        self.rounds = self.batches = 0  # for measurement: batches per round
        self.deepest = 0  # for measurement: the most rounds in flight at once

    def send(self, trip: Any) -> asyncio.Future[list[Any]]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[Any]] = loop.create_future()
        pipe = getattr(trip, "log", trip)
        if getattr(pipe, "connection_pool", None) is not self.pool or \
                getattr(trip, "queue", pipe) is not pipe:
            try:
                fut.set_result(trip.execute(raise_on_error=False))
            except Exception as exc:
                fut.set_exception(exc)
            return fut
        if not pipe.command_stack:  # nothing to send, nothing to wait for
            fut.set_result([])
            return fut
        if not self._waiting:
            loop.call_soon(self._round)  # after every work ready in this turn has run
        self._waiting.append((pipe, fut))
        return fut

    def _connection(self) -> Any:
        if self._conn is None:
            self._conn = self.pool.make_connection()
            self._conn.health_check_interval = 0  # a PING would read a round's reply
        return self._conn

    def _round(self) -> None:
        taken, self._waiting = self._waiting, []
        batches: list[_Batch] = [(pipe, pipe.take(), fut) for pipe, fut in taken]
        if self._reload and batches:  # its reply comes first, answered to nobody
            batches.insert(0, (batches[0][0], [(("SCRIPT", "LOAD", APPEND), {})], None))
            self._reload = False
        self.rounds += 1
        self.batches += len(taken)
        self._flying.append(batches)
        self.deepest = max(self.deepest, len(self._flying))
        conn = self._connection()
        try:
            self._connect(conn)
            conn.send_packed_command(self._packed(conn, batches), check_health=False)
            self._watch(conn)
        except Exception:
            self._recover()

    def _connect(self, conn: Any) -> None:
        """Connect (see LeanPipeline._send_and_read) and, on a new socket, load the
        append script (nothing is in flight on a new socket)."""
        conn.connect()
        if conn._sock is not self._loaded_on:
            conn.send_command("SCRIPT", "LOAD", APPEND, check_health=False)
            sha = conn.read_response()
            if (sha.decode() if isinstance(sha, bytes) else sha) != APPEND_SHA:
                raise redis.ResponseError("SCRIPT LOAD answered another SHA1 than the "
                                          "append script's")
            self._loaded_on = conn._sock
            self._reload = False

    @staticmethod
    def _packed(conn: Any, batches: list[_Batch]) -> list[bytes]:
        """The batches' commands in Redis's protocol, the append script by its SHA1."""
        out: list[bytes] = []
        for _, stack, _ in batches:
            out += pack(conn, [(("EVALSHA", APPEND_SHA, *args[2:]), options)
                               if args[0] == "EVAL" and args[1] is APPEND else (args, options)
                               for args, options in stack])
        return out

    def _answer_all(self, batches: list[_Batch], replies: list[list[Any]]) -> None:
        """Hand each batch its replies. An append refused with NOSCRIPT goes again
        with the script's body, alone (the batch's other commands ran once already),
        on the loop thread's own lean connection."""
        for (pipe, stack, fut), got in zip(batches, replies, strict=True):
            if fut is None:
                continue  # the round's SCRIPT LOAD
            refused = [i for i, r in enumerate(got)
                       if isinstance(r, redis.exceptions.NoScriptError)]
            if refused:
                self._reload = True
                pipe.command_stack = [stack[i] for i in refused]
                try:
                    again = pipe.execute(raise_on_error=False)
                except Exception as exc:
                    if not fut.done():
                        fut.set_exception(exc)
                    continue
                got = list(got)
                for i, r in zip(refused, again, strict=True):
                    got[i] = r
            if not fut.done():  # a work cancelled meanwhile wants nothing
                fut.set_result(got)

    def _watch(self, conn: Any) -> None:
        if isinstance(conn, redis.SSLConnection):  # TLS buffers what a poll cannot see
            self._read_all(conn)
            return
        sock = conn._sock
        if sock is not self._watched:  # a new socket may reuse the old one's number
            self._unwatch()
            self._watched_fd = sock.fileno()
            asyncio.get_running_loop().add_reader(self._watched_fd, self._on_readable)
            self._watched = sock

    def _unwatch(self) -> None:
        if self._watched is not None:
            asyncio.get_running_loop().remove_reader(self._watched_fd)
            self._watched = None

    def _on_readable(self) -> None:
        conn = self._conn
        try:
            while self._flying:
                self._answer_all(self._flying[0], [pipe._read(conn, stack)
                                                   for pipe, stack, _ in self._flying[0]])
                self._flying.popleft()
                if not self._flying or not conn.can_read(0):
                    break
        except Exception:
            self._recover()
            return
        if not self._flying:
            self._unwatch()

    def _read_all(self, conn: Any) -> None:
        try:
            while self._flying:
                self._answer_all(self._flying[0], [pipe._read(conn, stack)
                                                   for pipe, stack, _ in self._flying[0]])
                self._flying.popleft()
        except Exception:
            self._recover()

    def _recover(self) -> None:
        """The connection failed with rounds in flight: every one of them sent again,
        whole, on a new connection, and read here (the loop waits, as any work on
        it would for Redis to come back)."""
        self._unwatch()  # before the socket closes: its number may come back
        conn = self._connection()
        conn.disconnect()  # never leave replies unread on a kept connection
        batches = [b for r in self._flying for b in r if b[2] is not None]
        self._flying.clear()

        def run() -> list[list[Any]]:
            try:
                self._connect(conn)
                conn.send_packed_command(self._packed(conn, batches), check_health=False)
                return [pipe._read(conn, stack) for pipe, stack, _ in batches]
            except BaseException:
                conn.disconnect()
                raise

        try:
            replies = conn.retry.call_with_retry(run, lambda *_: conn.disconnect())
        except Exception as exc:
            for _, _, fut in batches:
                if fut is not None and not fut.done():
                    fut.set_exception(exc)
            return
        self._answer_all(batches, replies)


# a batch of a round: its pipeline, its commands, and who waits for its replies
_Batch = tuple[Any, list[Any], "asyncio.Future[list[Any]] | None"]


class StepTimeout(BaseException):
    """Raised inside a tool that ran past its timeout (BaseException: a tool's
    ``except Exception`` must not swallow it)."""


class Invoker:
    """Runs tools for one worker thread; async tools on an event loop of its own.

    Whatever a try raises that only a process's end should (SystemExit,
    KeyboardInterrupt, GeneratorExit, another BaseException) leaves the step in
    doubt after that one try, on every driver: the worker goes on, and nothing
    runs the tool again blind. ``interrupted`` keeps the last KeyboardInterrupt or
    SystemExit, for a caller (the inline executor) that is the user's own process
    and passes it on once the outcome is logged (``passes_on``)."""

    def __init__(self, watchdog: Watchdog | None = None,
                 stopping: Stopping | None = None, *, passes_on: bool = False) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watchdog = watchdog or process_watchdog()
        self.stopping = stopping or process_stopping()
        self.interrupted: BaseException | None = None
        self.passes_on = passes_on  # see drive()

    def invoke(self, spec: ToolSpec, args: Mapping[str, Any], ctx: StepContext,
               secrets: Mapping[str, Any] | None = None,
               keepalive: Keepalive | None = None, *, lease: Hold | None = None) -> Outcome:
        """One call of ``spec`` (with its retries). ``lease``: the caller's lease,
        renewed by the watchdog over every try and back-off and checked before each
        try after the first (:class:`~.lease.LeaseLost` if gone); ``keepalive``: a
        bare renewal instead, (renew, every_s). A stop request during a back-off
        raises :class:`~.lease.HandBack`."""
        kwargs = spec.kwargs(args)
        for pre in spec.preconditions:
            if not _holds(pre, args):
                return Outcome.failed(f"precondition {_name(pre)} does not hold")
        if lease is not None:
            keepalive = (lease.renew, lease.every_s)
        main = threading.current_thread() is threading.main_thread()
        # off the main thread a watch also says when a try ran past its timeout
        watch = self._watchdog.watch(spec.name, keepalive) \
            if keepalive is not None or not main else None
        try:
            return self._tries(spec, args, kwargs, ctx, secrets, watch, main, lease)
        finally:
            if watch is not None:
                watch.end()  # before the outcome is appended: no renewal after it

    def _tries(self, spec: ToolSpec, args: Mapping[str, Any], kwargs: dict[str, Any],
               ctx: StepContext, secrets: Mapping[str, Any] | None,
               watch: Watch | None, main: bool, lease: Hold | None) -> Outcome:
        tries = 0
        while True:
            tries += 1
            if tries > 1 and lease is not None and not lease.fence():
                raise LeaseLost(f"{spec.name}: the lease went to another before try {tries}")
            try:
                with self.stopping.calling():
                    raw = self._call(spec, kwargs, ctx, watch if not main else None)
            except StepTimeout:
                return _timed_out(spec, tries)
            except Exception as exc:  # any exception fails the step (contract)
                failed = _raised(spec, exc, secrets, tries)
                if failed is None:
                    if self.stopping.nap(spec.retry.backoff(tries)):
                        raise HandBack(f"{spec.name}: asked to stop before try "
                                       f"{tries + 1}") from None
                    continue
                return failed
            except BaseException as exc:  # a tool's, not this process's
                return self._interrupted(spec, exc, secrets, tries)
            return _returned(spec, args, raw, tries)

    def pause(self, seconds: float, lease: Hold | None) -> None:
        """A back-off on this thread, its lease kept by the watchdog meanwhile;
        :class:`~.lease.HandBack` if a stop is asked for."""
        watch = self._watchdog.watch("pause", (lease.renew, lease.every_s)) \
            if lease is not None else None
        try:
            if self.stopping.nap(seconds):
                raise HandBack("asked to stop during a back-off")
        finally:
            if watch is not None:
                watch.end()

    async def apause(self, seconds: float, lease: Hold | None, sends: Sends | None) -> None:
        """:meth:`pause` on the running event loop, the lease renewed by a task."""
        keeper = _keep(lease, sends)
        try:
            if await self.stopping.anap(seconds):
                raise HandBack("asked to stop during a back-off")
        finally:
            if keeper is not None:
                keeper.cancel()

    async def ainvoke(self, call: Call, pool: Executor, sends: Sends | None = None) -> Outcome:
        """:meth:`invoke` for the running event loop: an async tool is awaited on it
        (its back-offs too, its lease renewed by a task on the loop and checked
        through ``sends`` before each try after the first); a sync one runs on
        ``pool``, watched as off the main thread. A tool that raises what only a
        process's end should leaves its step in doubt; the worker goes on."""
        spec, args = call.spec, call.args
        try:
            if not spec.is_async:  # on a pool thread, in the step's context (its span)
                return await asyncio.get_running_loop().run_in_executor(
                    pool, contextvars.copy_context().run, partial(
                        self.invoke, spec, args, call.ctx, call.secrets, lease=call.lease))
            return await self._atries(spec, args, call, sends)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise  # the step's own task is cancelled: not the tool's doing
            return self._interrupted(spec, exc, call.secrets, 1)
        except Exception:
            raise
        except BaseException as exc:  # a tool's, not this process's
            return self._interrupted(spec, exc, call.secrets, 1)

    async def _atries(self, spec: ToolSpec, args: Mapping[str, Any], call: Call,
                      sends: Sends | None) -> Outcome:
        kwargs = spec.kwargs(args)
        for pre in spec.preconditions:
            if not _holds(pre, args):
                return Outcome.failed(f"precondition {_name(pre)} does not hold")
        if spec.takes_ctx:
            kwargs = {**kwargs, "ctx": call.ctx}
        lease = call.lease
        keeper = _keep(lease, sends)
        tries = 0
        try:
            while True:
                tries += 1
                if tries > 1 and lease is not None and not await _fence(lease, sends):
                    raise LeaseLost(f"{spec.name}: the lease went to another before try "
                                    f"{tries}")
                try:
                    # in this task, not one of its own (as wait_for would make): a
                    # SystemExit from the tool then reaches the step, not the loop
                    with self.stopping.calling():
                        async with asyncio.timeout(spec.timeout):
                            raw = await spec.fn(**kwargs)
                except TimeoutError:
                    return _timed_out(spec, tries)
                except Exception as exc:  # any exception fails the step (contract)
                    failed = _raised(spec, exc, call.secrets, tries)
                    if failed is None:
                        if await self.stopping.anap(spec.retry.backoff(tries)):
                            raise HandBack(f"{spec.name}: asked to stop before try "
                                           f"{tries + 1}") from None
                        continue
                    return failed
                return _returned(spec, args, raw, tries)
        finally:
            if keeper is not None:
                keeper.cancel()

    def _interrupted(self, spec: ToolSpec, exc: BaseException,
                     secrets: Mapping[str, Any] | None, tries: int) -> Outcome:
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            self.interrupted = exc
        return _interrupted(spec, exc, secrets, tries)

    def _call(self, spec: ToolSpec, kwargs: dict[str, Any], ctx: StepContext,
              watch: Watch | None) -> Any:
        """One try: on the main thread under SIGALRM (``watch`` None), else on this
        thread where nothing stops it (``watch`` says when it ran past its timeout)."""
        if spec.takes_ctx:
            kwargs = {**kwargs, "ctx": ctx}
        if spec.is_async:
            loop = self._loop or asyncio.new_event_loop()
            self._loop = loop
            try:
                return loop.run_until_complete(asyncio.wait_for(spec.fn(**kwargs), spec.timeout))
            except TimeoutError:
                raise StepTimeout from None
            except Exception:
                raise
            except BaseException:
                # the loop stops inside the task that raised it; its waiter would
                # raise it again in the next call's run: the next call gets a new loop
                self._loop = None
                raise
        if watch is None:
            return _with_alarm(spec, kwargs)
        return _unstoppable(spec, kwargs, watch)


async def _fence(lease: Hold, sends: Sends | None, grow_only: bool = False) -> bool:
    """:meth:`Hold.fence` through the loop's group commit (or at once without one)."""
    if lease.lost:
        return False
    pipe, take = lease.trip(grow_only)
    replies = await sends.send(pipe) if sends is not None else pipe.execute(
        raise_on_error=False)
    return take(replies)


class _Keeper:
    """Renews ``lease`` on the running loop every third of ``SAGA_LEASE_MS`` until
    cancelled: a timer first (a call that ends before its first renewal is due,
    nearly every call, costs no task), then a task. A renewal sent before the
    outcome's append reaches Redis before it (one connection, or at once); one that
    lands after it finds the lease released and the log moved on, and takes
    nothing back."""

    def __init__(self, lease: Hold, sends: Sends | None) -> None:
        self.lease, self.sends = lease, sends
        self.task: asyncio.Task[None] | None = None
        self.timer = asyncio.get_running_loop().call_later(lease.every_s, self._start)

    def _start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._renew())

    async def _renew(self) -> None:
        while True:
            try:
                # on the loop: a stall under load must not cut the try's own lease
                # short, so a renewal here only ever makes it last longer
                if not await _fence(self.lease, self.sends, grow_only=True):
                    return
            except Exception:  # an outage: the check before the next try decides
                log.warning("%s: the lease could not be renewed", self.lease.lease_key,
                            exc_info=True)
            await asyncio.sleep(self.lease.every_s)

    def cancel(self) -> None:
        self.timer.cancel()
        if self.task is not None:
            self.task.cancel()


def _keep(lease: Hold | None, sends: Sends | None) -> _Keeper | None:
    """A :class:`_Keeper` of ``lease`` (None: no lease to keep)."""
    return _Keeper(lease, sends) if lease is not None else None


def _timed_out(spec: ToolSpec, tries: int) -> Outcome:
    return Outcome(OutcomeKind.IN_DOUBT, error=f"timed out after {spec.timeout:g} s; the call "
                   "may or may not have taken effect", tries=tries)


def _interrupted(spec: ToolSpec, exc: BaseException,
                 secrets: Mapping[str, Any] | None, tries: int = 1) -> Outcome:
    """The outcome of a call that raised what only a process's end should."""
    what = scrub(f"{type(exc).__name__}({str(exc)[:200]})", secrets)
    return Outcome(OutcomeKind.IN_DOUBT, error=f"{spec.name} raised {what}, which ends a "
                   "process, not a call; whether it took effect is not known", tries=tries)


def _raised(spec: ToolSpec, exc: Exception, secrets: Mapping[str, Any] | None,
            tries: int) -> Outcome | None:
    """The outcome of a try that raised ``exc``, or None: try again after the back-off."""
    retryable = isinstance(exc, StepError) and exc.retryable
    if retryable and tries < spec.retry.max_attempts:
        return None
    error = scrub(f"{type(exc).__name__}: {exc}", secrets)[:2000]
    return Outcome.failed(error, retryable=retryable, tries=tries)


def _returned(spec: ToolSpec, args: Mapping[str, Any], raw: Any, tries: int) -> Outcome:
    """The outcome of a try that returned ``raw``."""
    try:
        result = as_result(raw)
    except InvalidInput as exc:  # it returned: whatever it does has been done
        return Outcome(OutcomeKind.IN_DOUBT, error=f"the tool returned, but not a result that "
                       f"can be logged ({exc}); its effect is assumed to stand", tries=tries)
    for post in spec.postconditions:
        if not _holds(post, args, result):
            return Outcome.succeeded(result, tries=tries, postcondition_failed=_name(post))
    return Outcome.succeeded(result, tries=tries)


def _unstoppable(spec: ToolSpec, kwargs: dict[str, Any], watch: Watch) -> Any:
    """A try of a sync tool off the main thread, on this thread, where nothing can
    stop it: past its timeout it is in doubt once it returns or raises, so the
    in-doubt outcome (and any probe after it) comes after whatever the call did.
    (It used to run on a thread made for each call: a thread's start and two
    hand-overs, about a fifth of a no-op step's round trip.)"""
    watch.begin_try(spec.timeout)
    try:
        result = spec.fn(**kwargs)
    except BaseException:
        if watch.past_deadline():  # what it raised came too late to say it failed
            raise StepTimeout from None
        raise
    if watch.past_deadline():
        raise StepTimeout
    return result


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
