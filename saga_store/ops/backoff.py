"""Riding out a Redis outage: capped exponential backoff with jitter, one log
line when Redis goes away and one when it is back.

:class:`OutageRetry` plugs into redis-py's retry hook, so every command and
pipeline retries a lost connection the same way. Repeating a command whose
reply was lost is safe here: appends are compare-and-set and recognise their
own earlier success (see :meth:`saga_store.log.PreparedAppend.result`), job
pushes are deduplicated by the log, and the rest are idempotent writes.
Authentication errors are never retried: a wrong password does not heal.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, AuthorizationError
from redis.retry import Retry

log = logging.getLogger("saga_store.redis")
T = TypeVar("T")

BASE_S = 0.05
CAP_S = 2.0


def delay(failures: int, base: float = BASE_S, cap: float = CAP_S) -> float:
    """The wait after ``failures`` consecutive failures: the capped exponential
    ``min(cap, base * 2**failures)``, half of it fixed and half random ("equal
    jitter"), so a fleet of workers does not reconnect in lockstep."""
    ceiling: float = min(cap, base * 2.0 ** min(failures, 32))
    return ceiling / 2 + random.uniform(0, ceiling / 2)


class Outage:
    """Whether this process can reach Redis, and since when not. Logs once at
    each change, not at every retry."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.since: float | None = None

    def failed(self, error: BaseException) -> None:
        with self._lock:
            if self.since is not None:
                return
            self.since = time.monotonic()
        log.error("Redis unreachable (%s); retrying with backoff (capped at %.0f s, jittered) "
                  "until it answers", type(error).__name__, CAP_S)

    def recovered(self) -> None:
        with self._lock:
            if self.since is None:
                return
            lasted, self.since = time.monotonic() - self.since, None
        log.warning("Redis reachable again after %.1f s", lasted)


OUTAGE = Outage()  # one per process: every client of the process shares the state


class OutageRetry(Retry):
    """Retries connection errors until ``deadline_s`` has passed since the first
    failure (``None``: for ever), waiting :func:`delay` between attempts. Each
    connection gets a deep copy; the outage state is process-wide."""

    def __init__(self, deadline_s: float | None, base: float = BASE_S,
                 cap: float = CAP_S) -> None:
        super().__init__(NoBackoff(), retries=-1)
        self.deadline_s, self.base, self.cap = deadline_s, base, cap

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, OutageRetry) and other.deadline_s == self.deadline_s
                and other.base == self.base and other.cap == self.cap)

    __hash__ = Retry.__hash__

    def call_with_retry(self, do: Callable[[], T], fail: Callable[..., Any],
                        is_retryable: Callable[[Exception], bool] | None = None,
                        with_failure_count: bool = False) -> T:
        failures = 0
        started = 0.0
        while True:
            try:
                result = do()
            except self._supported_errors as error:
                if isinstance(error, AuthenticationError | AuthorizationError) or (
                        is_retryable is not None and not is_retryable(error)):
                    raise
                failures += 1
                if with_failure_count:
                    fail(error, failures)
                else:
                    fail(error)
                now = time.monotonic()
                started = started or now
                if self.deadline_s is not None and now - started >= self.deadline_s:
                    raise
                if failures == 1:
                    # most often a connection that went stale while it sat in the
                    # pool (Redis restarted meanwhile): the retry reconnects at once,
                    # and only a second failure in a row is an outage worth a line
                    continue
                OUTAGE.failed(error)
                wait = delay(failures - 1, self.base, self.cap)
                if self.deadline_s is not None:
                    wait = min(wait, max(0.0, started + self.deadline_s - now))
                time.sleep(wait)
            else:
                if failures:
                    OUTAGE.recovered()
                return result
