"""Keeping a saga's lease while a sync tool runs where nothing can stop it.

Off the main thread (the asyncio worker's sync-tool pool, the inline executor) a
sync tool runs on the calling thread: no signal reaches it there, so the step
waits for it to return, and records it in doubt if that was past its timeout.
Meanwhile the saga's lease must not lapse, or the sweeper would hand the step
to another worker while the call still runs.

One thread per process, the watchdog, looks at the calls in progress every
:data:`TICK_S`. A call registers and leaves without waking it, so a call that
returns before its first renewal is due (nearly every call) costs a dict
insert and a pop. A call still running then gets a renewer thread of its own,
which renews the lease every interval until the call's invoke ends, over all
its tries and the back-offs between them: a renewal stuck on an unreachable
Redis (a cluster master failing over) holds up no other call's. The watchdog
also says, once, when a try runs past its timeout.

A renewal under way when the invoke ends finishes before :meth:`Watch.end`
returns, and none starts after it, so no renewal lands after the outcome's
append released the lease (it would take the lease back for a stale token).
A forked child forgets its parent's calls.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable

log = logging.getLogger("saga_store.worker")
TICK_S = 0.05

Keepalive = tuple[Callable[[], None], float]  # (renew the lease, seconds between renewals)


class Watch:
    """One invoke of a sync tool off the main thread (see the module)."""

    def __init__(self, watchdog: Watchdog, name: str, keepalive: Keepalive | None) -> None:
        self._watchdog, self.name = watchdog, name
        self._renew: Callable[[], None] | None = None
        self._every_s = 0.0
        if keepalive is not None:
            self._renew, self._every_s = keepalive
        self._renew_at = time.monotonic() + self._every_s
        self._renewing = False  # a renewer thread has been started
        self._timeout, self._deadline, self._warned = 0.0, math.inf, True
        self._ended = threading.Event()
        self._lock = threading.Lock()  # held by a renewal under way

    def begin_try(self, timeout: float) -> None:
        """A try of the call starts now, with ``timeout`` seconds."""
        self._timeout, self._deadline = timeout, time.monotonic() + timeout
        self._warned = False

    def past_deadline(self) -> bool:
        return time.monotonic() > self._deadline

    def end(self) -> None:
        """The invoke is over: no renewal after this returns."""
        with self._lock:
            self._ended.set()
        self._watchdog.forget(self)

    def look(self, now: float) -> bool:
        """On the watchdog's thread: whether the lease wants a renewer now (one is
        started at most once); says once that a try ran past its timeout."""
        if now > self._deadline and not self._warned:
            self._warned = True
            log.warning("tool %s ran past its %g s timeout on a thread, where it cannot be "
                        "stopped; its step is recorded in doubt once the call returns (make "
                        "the tool async def, or run it on RQ workers, to stop it at its "
                        "timeout)", self.name, self._timeout)
        if self._renew is None or self._renewing or now < self._renew_at:
            return False
        self._renewing = True
        return True

    def renewer_failed(self) -> None:
        self._renewing = False  # the watchdog tries again at its next tick

    def keep_renewing(self) -> None:
        """The renewer thread: a renewal now, then one every interval, until end()."""
        renew = self._renew
        assert renew is not None  # look() starts no renewer without one
        while True:
            with self._lock:
                if self._ended.is_set():
                    return
                try:
                    renew()
                except Exception:
                    log.exception("tool %s: its lease could not be renewed", self.name)
            if self._ended.wait(self._every_s):
                return


class Watchdog:
    """The thread that watches sync calls off the main thread (see the module);
    started by the first call, one per process unless a test makes its own."""

    def __init__(self) -> None:
        self._forget_after_fork()
        os.register_at_fork(after_in_child=self._forget_after_fork)

    def _forget_after_fork(self) -> None:
        # a child has no thread of the parent's, and its calls are the parent's
        self._watches: dict[int, Watch] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def watch(self, name: str, keepalive: Keepalive | None) -> Watch:
        w = Watch(self, name, keepalive)
        with self._lock:
            if self._thread is None:  # kept only once started: a refusal is tried again,
                thread = threading.Thread(target=self._run, name="saga-watchdog", daemon=True)
                thread.start()  # and the call, refused with it, is never watched
                self._thread = thread
            self._watches[id(w)] = w
        return w

    def forget(self, w: Watch) -> None:
        with self._lock:
            self._watches.pop(id(w), None)

    def _run(self) -> None:
        while True:
            time.sleep(TICK_S)
            try:
                with self._lock:
                    watches = list(self._watches.values())
                now = time.monotonic()
                for w in watches:
                    if w.look(now):
                        self._start_renewer(w)
            except Exception:  # never the end of the watchdog
                log.exception("watchdog: a look at the calls in progress failed; going on")

    @staticmethod
    def _start_renewer(w: Watch) -> None:
        try:
            threading.Thread(target=w.keep_renewing, name="saga-renew", daemon=True).start()
        except RuntimeError:  # no thread to be had now
            w.renewer_failed()
            log.exception("tool %s: no thread to renew its lease; trying again", w.name)


_PROCESS: Watchdog | None = None
_PROCESS_LOCK = threading.Lock()


def process_watchdog() -> Watchdog:
    """The watchdog of this process, made on first use."""
    global _PROCESS
    with _PROCESS_LOCK:
        if _PROCESS is None:
            _PROCESS = Watchdog()
        return _PROCESS
