"""One round trip of the step path, with the log and the queues as two roles.

The log (a standalone Redis or a Redis Cluster) and RQ's queues (a standalone
Redis, ``SAGA_QUEUE_URL``) need not be one server, so nothing may queue a job
push or an acknowledgement on the log's pipeline. A :class:`Trip` holds one
pipeline per role: ``log`` for appends and the log's indexes, ``queue`` for
RQ's keys. When both roles are one standalone Redis, they are one pipeline and
the trip one round trip, as before the split. Otherwise the queue's commands
go once the log's replies are in: a job is never pushed before the append it
follows was answered, and an outage that cuts the log's round trip short pushes
no job (the sweeper redelivers from the log).
"""

from __future__ import annotations

from typing import Any

from saga_store.log.pipeline import lean


class Trip:
    """The two pipelines of one round trip (see the module)."""

    __slots__ = ("log", "queue")

    def __init__(self, log: Any, queue: Any) -> None:
        self.log = lean(log)
        self.queue = self.log if queue is log else lean(queue)

    def __len__(self) -> int:
        """How many commands the log's pipeline holds (positions of its replies)."""
        return len(self.log)

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        """The log's replies, in the order queued, then the queue's."""
        replies: list[Any] = self.log.execute(raise_on_error=False)
        if self.queue is not self.log and self.queue.command_stack:
            replies += self.queue.execute(raise_on_error=False)
        if raise_on_error:
            for got in replies:
                if isinstance(got, Exception):
                    raise got
        return replies
