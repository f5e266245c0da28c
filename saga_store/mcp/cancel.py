"""A client's ``notifications/cancelled`` for one ``tools/call``.

MCP says the receiver of a cancellation stops the request and sends no answer
for it. Where the call is decides what stopping means: still waiting for its
turn, nothing was logged and it simply ends; waiting for a person, its
approval request is withdrawn at once (a later ``saga approve`` is refused);
running downstream, the server is sent the cancellation of the gateway's own
request and the step is settled as in doubt, since the server may have acted
before it heard. The relay sends nothing for a cancelled request either way.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import anyio

REASON = "cancelled by the client"
# the cancellation of the call whose downstream request is being made in this task
RUNNING: ContextVar[Cancellation | None] = ContextVar("saga_store_mcp_running", default=None)


class Cancellation:
    """Whether the client cancelled one call, and how to stop it where it is."""

    def __init__(self) -> None:
        self.requested = False
        self.downstream_id: str | None = None  # the gateway's request for the call, in flight
        self._scope: anyio.CancelScope | None = None
        self._event: anyio.Event | None = None

    def cancel(self) -> str | None:
        """Mark the call cancelled and stop its downstream request, if one runs;
        returns that request's id, for the relay to tell the server."""
        self.requested = True
        rid = self.downstream_id if self._scope is not None else None
        if self._scope is not None:
            self._scope.cancel()
        if self._event is not None:
            self._event.set()
        return rid

    @contextmanager
    def running(self) -> Iterator[anyio.CancelScope]:
        """Around the call's request downstream: a cancellation ends the wait for
        its answer (``scope.cancelled_caught`` says so afterwards)."""
        with anyio.CancelScope() as scope:
            self._scope = scope
            token = RUNNING.set(self)
            if self.requested:
                scope.cancel()
            try:
                yield scope
            finally:
                RUNNING.reset(token)
                self._scope, self.downstream_id = None, None

    async def wait(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if the call is cancelled meanwhile."""
        if self.requested:
            return
        if self._event is None:
            self._event = anyio.Event()
        with anyio.move_on_after(seconds):
            await self._event.wait()
