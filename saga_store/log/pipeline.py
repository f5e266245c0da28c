"""A lean pipeline for the step path.

redis-py's pipeline does, per ``execute``, more than a worker needs: it checks a
connection out of the pool (a ``poll`` on the socket to catch unread data) and
back, times the call for its observability hooks and prepares hash-field
imports. On this path that was about a third of a worker's CPU. A
:class:`LeanPipeline` queues commands like any redis-py pipeline, but keeps one
connection per process and thread, and on ``execute`` packs, sends and reads.
It still runs under the client's retry policy (a dropped connection is
re-established and the batch resent, as redis-py does), and a connection that
saw any error is dropped, so no unread reply can reach the next batch.

Only non-transactional pipelines of plain commands: no MULTI, no WATCH, no
registered Script objects (the append script goes as EVAL).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import redis
from redis.client import Pipeline
from redis.exceptions import ResponseError


class LeanPipeline(Pipeline):
    def execute(self, raise_on_error: bool = True) -> list[Any]:
        stack = self.command_stack
        if not stack:
            return []
        self.command_stack = []
        conn = _connection(self.connection_pool)

        def run() -> list[Any]:
            return self._send_and_read(conn, stack, raise_on_error)

        def drop(error: Exception, *_: Any) -> None:
            conn.disconnect()

        # no-any-return: the library returns Any
        return conn.retry.call_with_retry(run, drop)  # type: ignore[no-any-return]

    def _send_and_read(self, conn: Any, stack: list[Any], raise_on_error: bool) -> list[Any]:
        try:
            conn.send_packed_command(conn.pack_commands([args for args, _ in stack]))
            out: list[Any] = []
            callbacks: Any = self.response_callbacks
            for args, options in stack:
                try:
                    reply = conn.read_response()
                except ResponseError as exc:
                    out.append(exc)
                    continue
                callback = callbacks.get(args[0])
                if callback is not None:
                    options.pop("keys", None)
                    reply = callback(reply, **options)
                out.append(reply)
        except BaseException:
            conn.disconnect()  # never leave replies unread on a kept connection
            raise
        if raise_on_error:
            # no-untyped-call: the library leaves it untyped
            self.raise_first_error(stack, out)  # type: ignore[no-untyped-call]
        return out


def execute(pipe: Any, *then: Callable[[list[Any]], Any]) -> list[Any]:
    """Execute ``pipe``, hand all its replies to each of ``then`` (each reads its own
    commands' replies, errors included), then raise the first error left."""
    replies: list[Any] = pipe.execute(raise_on_error=False)
    for taker in then:
        taker(replies)
    for got in replies:
        if isinstance(got, Exception):
            raise got
    return replies


def lean(client: redis.Redis) -> LeanPipeline:
    """A :class:`LeanPipeline` on ``client``'s pool and reply callbacks."""
    return LeanPipeline(client.connection_pool, client.response_callbacks, False, None)


_forks = [0]  # bumped in a forked child: connections of the parent are not its own
os.register_at_fork(after_in_child=lambda: _forks.__setitem__(0, _forks[0] + 1))


def _connection(pool: Any) -> Any:
    """This thread's connection from ``pool``, made once and kept on the pool (so it
    goes with the pool, and with the thread: a thread-local's value is dropped,
    and its connection closed, when the thread ends); a forked child makes its
    own."""
    held = getattr(pool, "_saga_lean", None)
    if held is None:
        held = pool._saga_lean = threading.local()
    forks, conn = getattr(held, "conn", (-1, None))
    if forks != _forks[0]:
        conn = pool.make_connection()
        held.conn = (_forks[0], conn)
    return conn
