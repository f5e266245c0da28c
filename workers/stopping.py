"""A worker's stop request, as every wait of its steps sees it.

SIGTERM (or SIGINT) asks a worker to stop: it takes no more jobs, lets the
tool calls under way finish, and exits. Every wait on its steps' path gives way
to the request within :data:`NAP_S`: a back-off between two tries or two
compensations hands its step back (:class:`~.lease.HandBack`). A wait it cannot
cut short, a Redis call that hangs on an unreachable or stopped server, is cut
by :meth:`Stopping.watch_exit`: once no tool call has run for
:data:`GRACE_S` since the request, the process exits (status 1 with work in
flight, which the sweeper redelivers as after a crash; 0 without). A tool call
under way is never cut: it is what a warm stop waits for.

One per process (signals are the process's): :func:`process_stopping`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator

log = logging.getLogger("saga_store.worker")
NAP_S = 0.1  # how often a wait looks at the stop request
GRACE_S = 1.0  # after the request (and the last tool call), what Redis gets to answer


class Stopping:
    """Whether the process was asked to stop, and how many tool calls run now."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:  # a child has its own signals and calls
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._calls = 0
        self._since = 0.0  # when the request came, or the last call under it ended
        self._watching = False

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def request(self) -> None:
        """Ask to stop (safe in a signal handler: it sets a flag and an event)."""
        if not self._event.is_set():
            self._since = time.monotonic()
            self._event.set()

    def nap(self, seconds: float) -> bool:
        """Wait ``seconds``, or less once a stop is asked for; True if it was."""
        end = time.monotonic() + seconds
        while not self._event.is_set():
            left = end - time.monotonic()
            if left <= 0:
                return False
            self._event.wait(min(NAP_S, left))
        return True

    async def anap(self, seconds: float) -> bool:
        """:meth:`nap` on the running event loop."""
        end = time.monotonic() + seconds
        while not self._event.is_set():
            left = end - time.monotonic()
            if left <= 0:
                return False
            await asyncio.sleep(min(NAP_S, left))
        return True

    @contextlib.contextmanager
    def calling(self) -> Iterator[None]:
        """Around one try of a tool: a stop request waits for it."""
        with self._lock:
            self._calls += 1
        try:
            yield
        finally:
            with self._lock:
                self._calls -= 1
                self._since = time.monotonic()

    def watch_exit(self, in_flight: Callable[[], int]) -> None:
        """Start (once) the thread that ends the process once a stop request is
        :data:`GRACE_S` old and no tool call has run for as long: what is left then
        waits on Redis. ``in_flight``: the jobs the worker has not finished."""
        with self._lock:
            if self._watching:
                return
            self._watching = True
        threading.Thread(target=self._exit_when_stuck, args=(in_flight,),
                         name="saga-stop", daemon=True).start()

    def _exit_when_stuck(self, in_flight: Callable[[], int]) -> None:
        self._event.wait()
        while True:
            time.sleep(NAP_S / 2)
            with self._lock:
                stuck = not self._calls and time.monotonic() - self._since >= GRACE_S
            if stuck:
                n = in_flight()
                log.warning("worker %d: asked to stop %.1f s ago and still waiting on Redis; "
                            "exits now with %d job(s) unfinished (the sweeper redelivers "
                            "them once their leases lapse)", os.getpid(), GRACE_S, n)
                os._exit(1 if n else 0)


_PROCESS: Stopping | None = None
_PROCESS_LOCK = threading.Lock()


def process_stopping() -> Stopping:
    """The stop request of this process, made on first use."""
    global _PROCESS
    with _PROCESS_LOCK:
        if _PROCESS is None:
            _PROCESS = Stopping()
        return _PROCESS
