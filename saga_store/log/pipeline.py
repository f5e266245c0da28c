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
registered Script objects (the append script goes as EVAL), nothing that blocks.

Group commit, the batches of many steps in one write, each reading its own
replies, is the asyncio worker's (:class:`~saga_store.workers.invoke.Sends`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import redis
from redis.client import Pipeline
from redis.exceptions import ResponseError

_pack_command: Any
try:
    from hiredis import pack_command as _pack_command
except ImportError:  # redis-py packs without it
    _pack_command = None


class LeanPipeline(Pipeline):
    def take(self) -> list[Any]:
        """The commands queued, taken off the pipeline (group commit sends them)."""
        stack, self.command_stack = self.command_stack, []
        return stack

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
            # connect() first, not the lazy connect of a send: a Sentinel-managed
            # connection asks the sentinels for the primary in connect() only, and
            # a lazy one would go to the default address (localhost:6379)
            conn.connect()
            conn.send_packed_command(pack(conn, stack))
            out = self._read(conn, stack)
        except BaseException:
            conn.disconnect()  # never leave replies unread on a kept connection
            raise
        if raise_on_error:
            # no-untyped-call: the library leaves it untyped
            self.raise_first_error(stack, out)  # type: ignore[no-untyped-call]
        return out


    def _read(self, conn: Any, stack: list[Any]) -> list[Any]:
        """The replies to ``stack``, read off ``conn``, through the reply callbacks."""
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
        return out


def pack(conn: Any, stack: list[Any]) -> list[bytes]:
    """The commands of ``stack`` in Redis's protocol, for ``conn``: packed by hiredis
    directly, as redis-py itself would pack them (it calls the same function, after
    a pass over every argument that costs more than the packing); redis-py's
    own packing for anything that pass would change (a command name with a space,
    an argument hiredis refuses, an encoding other than UTF-8)."""
    if _pack_command is None or getattr(conn.encoder, "encoding", None) != "utf-8":
        return conn.pack_commands([args for args, _ in stack])  # type: ignore[no-any-return]
    try:
        out = []
        for args, _ in stack:
            name = args[0]
            if (b" " if isinstance(name, bytes) else " ") in name:
                raise TypeError(name)
            out.append(_pack_command(args))
    except TypeError:  # as redis-py would: split the name, convert memoryviews
        return conn.pack_commands([args for args, _ in stack])  # type: ignore[no-any-return]
    return [b"".join(out)]


def execute(pipe: Any, *then: Callable[[list[Any]], Any]) -> list[Any]:
    """Execute ``pipe``, hand all its replies to each of ``then`` (each reads its own
    commands' replies, errors included), then raise the first error left."""
    return answered(pipe.execute(raise_on_error=False), *then)


def answered(replies: list[Any], *then: Callable[[list[Any]], Any]) -> list[Any]:
    """``replies`` (a round trip's, errors in place) handed to each of ``then``, then
    returned, once none is an error (else the first error, raised)."""
    for taker in then:
        taker(replies)
    for got in replies:
        if isinstance(got, Exception):
            raise got
    return replies


def lean(client: redis.Redis) -> LeanPipeline:
    """A :class:`LeanPipeline` on ``client``'s pool and reply callbacks; on a Redis
    Cluster, a :class:`~saga_store.log.node_pipeline.NodePipeline` (a batch per node)."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        from saga_store.log.node_pipeline import NodePipeline
        return NodePipeline(client)  # type: ignore[return-value,arg-type]  # queues the same
    return LeanPipeline(pool, client.response_callbacks, False, None)


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
