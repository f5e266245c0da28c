"""A saga's lease, held by the worker that works on it for as long as it does.

A step takes the saga's lease with its ``step_started`` (a compensator with its
first write) for the tool's timeout plus ``SAGA_LEASE_MS``. A tool whose tries
and back-offs outlast that keeps it through :class:`Hold`: renewed every third
of ``SAGA_LEASE_MS`` while a call or a back-off runs (by the watchdog's renewer
thread for a call on a thread, by a task on the loop for an async tool or a
pause there), and checked against Redis before every try after the first, so a
worker whose lease went to another never runs another try (fencing). A worker
that dies renews nothing: its lease lapses one ``SAGA_LEASE_MS`` after its last
renewal and the sweeper redelivers the step.

Renewal and check are one script (``fence_lease.lua``): it extends the lease
while the token holds it; a lease that lapsed (an outage or a stall longer than
the lease) is taken back only if nothing but notes was appended to the saga's
log since the holder's last known entry, because whoever else runs the step or
unwinds the saga appends first. So a renewal that lands late (after the outcome
released the lease) takes nothing back either.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from saga_store import keys
from saga_store.log.pipeline import lean
from saga_store.log.scripts import FENCE_LEASE

log = logging.getLogger("saga_store.worker")


class LeaseLost(Exception):
    """Raised at a call's ``yield`` when the saga's lease is no longer its worker's
    (another worker has the step, or the saga moved on while the lease was free):
    no further try runs here, and nothing is appended."""


class HandBack(Exception):
    """Raised at a call's (or a pause's) ``yield`` when the worker is asked to stop
    while the step waits between two tries: no try runs, and the work hands its
    step (or its unwind) back for another worker."""


@dataclass
class Hold:
    """The lease ``token`` holds on ``saga_id``, kept by its worker while a call (or
    a pause) of the step it works on runs. ``after``: the seq of the last entry of
    the saga's log the holder knows (its ``step_started``, its last append)."""

    client: Any  # the log's client
    lease_key: str
    log_key: str
    token: str
    ttl_ms: int  # SAGA_LEASE_MS: a worker cut off loses the step one lease after
    after: int
    lost: bool = field(default=False)

    @classmethod
    def of(cls, store: Any, saga_id: str, token: str, after: int) -> Hold:
        """``store``: a :class:`~saga_store.client.api.SagaStore`."""
        names = store.events.keys
        return cls(store.redis, names.lease(saga_id), names.log(saga_id), token,
                   store.settings.lease_ms, after)

    @property
    def every_s(self) -> float:
        """Seconds between two renewals: a third of the lease."""
        return self.ttl_ms / 3000

    def trip(self, grow_only: bool = False) -> tuple[Any, Callable[[list[Any]], bool]]:
        """A lean pipeline that renews and checks the lease, and what takes its
        replies (True: the lease is still this holder's; raises a reply's error).
        ``grow_only``: a lease held for longer (a try's timeout) is left as it is."""
        pipe = lean(self.client)
        # no-untyped-call: the library leaves it untyped
        pipe.execute_command(  # type: ignore[no-untyped-call]
            "EVAL", FENCE_LEASE, 2, self.lease_key, self.log_key, self.token,
            self.ttl_ms, keys.entry_id(self.after), "gt" if grow_only else "")

        def take(replies: list[Any]) -> bool:
            [got] = replies
            if isinstance(got, Exception):
                raise got
            if got != 1:
                self.lost = True
            return not self.lost
        return pipe, take

    def fence(self) -> bool:
        """Renew and check the lease now (one round trip): whether the next try may run."""
        if self.lost:
            return False
        pipe, take = self.trip()
        return take(pipe.execute(raise_on_error=False))

    def renew(self) -> None:
        """A renewal in the background: never raises (an outage is logged; the next
        check before a try says whether the lease is still held)."""
        if self.lost:
            return
        try:
            if not self.fence():
                log.warning("%s: the lease is held by another worker now; no further try "
                            "runs here", self.lease_key)
        except Exception:
            log.warning("%s: the lease could not be renewed", self.lease_key, exc_info=True)
