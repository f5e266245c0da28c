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

Group commit (:func:`group_commit`, used by the asyncio worker): the lean
pipelines of all threads of a process go out together. The first thread to
execute becomes the leader: it takes every batch waiting, writes them in one
send on the group's connection and reads their replies in order, handing each
batch its own; threads that came meanwhile wait for the next round. Every
batch still waits for its own replies before it returns, so nothing counts as
done before Redis said so; Redis reads the batches in one go, and under
``appendfsync always`` their writes share its fsync.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import redis
from redis.client import Pipeline
from redis.exceptions import ResponseError

from saga_store.errors import StoreUnavailable

_pack_command: Any
try:
    from hiredis import pack_command as _pack_command
except ImportError:  # redis-py packs without it
    _pack_command = None


class LeanPipeline(Pipeline):
    def execute(self, raise_on_error: bool = True) -> list[Any]:
        stack = self.command_stack
        if not stack:
            return []
        self.command_stack = []
        group: GroupCommit | None = getattr(self.connection_pool, "_saga_group", None)
        conn = _connection(self.connection_pool)
        if group is not None:  # the same retry policy: a dropped round is sent again
            out: list[Any] = conn.retry.call_with_retry(lambda: group.run(self, stack, conn),
                                                        lambda *_: None)
            if raise_on_error:
                self.raise_first_error(stack, out)  # type: ignore[no-untyped-call]
            return out

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


class _Batch:
    __slots__ = ("done", "error", "packed", "pipe", "replies", "stack")

    def __init__(self, pipe: LeanPipeline, stack: list[Any], packed: list[bytes]) -> None:
        self.pipe, self.stack, self.packed = pipe, stack, packed
        self.done = threading.Event()
        self.replies: list[Any] = []
        self.error: BaseException | None = None


class GroupCommit:
    """The lean pipelines of one pool's threads, sent together (see the module)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self._lock = threading.Lock()
        self._waiting: list[_Batch] = []
        self._leading = False
        self.rounds = self.batches = 0  # for measurement: batches per round

    def run(self, pipe: LeanPipeline, stack: list[Any], packer: Any) -> list[Any]:
        """Send ``stack`` in the next round (``packer``: a connection to pack it
        with; the group writes on its own) and return its replies."""
        batch = _Batch(pipe, stack, pack(packer, stack))
        with self._lock:
            self._waiting.append(batch)
            lead = not self._leading
            if lead:
                self._leading = True
        if lead:
            self._lead()
        batch.done.wait()
        if batch.error is not None:
            raise batch.error
        return batch.replies

    def _lead(self) -> None:
        """Send rounds until no batch waits; then the next thread to come leads."""
        while True:
            with self._lock:
                taken, self._waiting = self._waiting, []
                if not taken:
                    self._leading = False
                    return
            self.rounds += 1
            self.batches += len(taken)
            self._round(taken)

    def _round(self, taken: list[_Batch]) -> None:
        conn = _group_connection(self.pool)
        try:
            conn.connect()  # see LeanPipeline._send_and_read
            conn.send_packed_command([chunk for b in taken for chunk in b.packed])
            for i, b in enumerate(taken):
                try:
                    b.replies = b.pipe._read(conn, b.stack)
                except BaseException as exc:
                    conn.disconnect()  # never leave replies unread on a kept connection
                    for rest in taken[i:]:
                        rest.error = exc
                    raise
        except BaseException as exc:
            conn.disconnect()
            for b in taken:
                if not b.replies and b.error is None:
                    b.error = exc
        finally:
            for b in taken:
                b.done.set()


def group_commit(client: redis.Redis) -> GroupCommit:
    """Send the lean pipelines of all threads on ``client``'s pool together (a
    standalone Redis only: on a cluster each node has its own round trip)."""
    pool: Any = getattr(client, "connection_pool", None)
    if pool is None:
        raise StoreUnavailable("group commit (SAGA_GROUP_COMMIT=1) needs a standalone "
                               "Redis for the log; unset it on a Redis Cluster")
    group: GroupCommit | None = getattr(pool, "_saga_group", None)
    if group is None:
        group = pool._saga_group = GroupCommit(pool)
    return group


def _group_connection(pool: Any) -> Any:
    """The group's own connection, made once per process (a fork makes its own)."""
    forks, conn = getattr(pool, "_saga_group_conn", (-1, None))
    if forks != _forks[0] or conn is None:
        conn = pool.make_connection()
        pool._saga_group_conn = (_forks[0], conn)
    return conn


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
