"""The lean pipeline on a Redis Cluster: one packed batch per node.

A round trip of the step path mixes a saga's keys (one hash tag, so one slot)
with keys of other slots (the index of sagas in flight, approvals, an agent's
context). :class:`NodePipeline` groups the queued commands by the node that
serves each one's slot, keeps their order within a node, writes every node's
batch before reading any reply, and hands the replies back in the order the
commands were queued. A keyless command (``WAIT``, say) goes with the command
before it, to the node whose writes it is about, and only there: a ``WAIT``
whose node was lost, or whose write was redirected, is never sent again
elsewhere (another master would answer at once for writes it never took); its
reply is :class:`~saga_store.log.replicas.WaitLost`, so the append is not
confirmed.

Redirects and lost nodes: a ``MOVED``/``ASK`` (a reshard, a failover),
``TRYAGAIN`` or ``CLUSTERDOWN`` reply, and every command of a node whose
connection failed, is sent again alone through the cluster client, which
refreshes its slot map, follows the redirect and rides out the outage under
its retry policy. Sending a command again is safe for the same reasons as on a
standalone Redis (:mod:`saga_store.ops.backoff`): an append that already went
through recognises its own success (:meth:`PreparedAppend.result`).

Like the standalone lean pipeline: no MULTI, no WATCH, no registered Script
objects, nothing that blocks. Each command must keep to one slot.
"""

from __future__ import annotations

from typing import Any

from redis.client import Pipeline
from redis.cluster import RedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    RedisClusterException,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from saga_store.log import pipeline
from saga_store.log.replicas import WaitLost

_SEND_AGAIN = (AskError, TryAgainError, ClusterDownError)  # MovedError is an AskError
_NODE_BOUND = ("WAIT", "WAITAOF")  # about the writes of the connection they are sent on
_LOST = (RedisConnectionError, RedisTimeoutError, OSError)


class NodePipeline(Pipeline):
    """A lean pipeline on ``cluster`` (see the module)."""

    def __init__(self, cluster: RedisCluster) -> None:
        # not ``self.cluster``: that is the CLUSTER command's method
        super().__init__(None, {}, False, None)  # type: ignore[arg-type]  # no pool of its own
        self.cluster_client: Any = cluster

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        stack, self.command_stack = self.command_stack, []
        if not stack:
            return []
        out: list[Any] = [None] * len(stack)
        batches = self._by_node(stack)
        sent, again = [], []
        for client, index in batches.values():  # every node's batch out, then the replies
            conn = _send(client, [stack[i][0] for i in index])
            if conn is None:
                again += index
            else:
                sent.append((client, conn, index))
        for client, conn, index in sent:
            again += self._read(client, conn, stack, index, out)
        lost = set(again)
        for _client, index in batches.values():
            for n, i in enumerate(index):
                if _node_bound(stack[i]) and (i in lost or (n and index[n - 1] in lost)):
                    lost.discard(i)
                    out[i] = WaitLost(f"{stack[i][0][0]} lost with its node")
        for i in sorted(lost):
            out[i] = self._alone(stack[i])
        if raise_on_error:
            self.raise_first_error(stack, out)  # type: ignore[no-untyped-call]
        return out

    def _by_node(self, stack: list[Any]) -> dict[str, tuple[Any, list[int]]]:
        """Command indexes by node name, in queued order, with each node's client."""
        cluster: Any = self.cluster_client
        nodes = cluster.nodes_manager
        batches: dict[str, tuple[Any, list[int]]] = {}
        node = None
        for i, (args, _options) in enumerate(stack):
            slot = slot_of(cluster, args)
            if slot is not None:
                node = nodes.get_node_from_slot(slot)
            elif node is None:
                node = cluster.get_default_node()
            batch = batches.get(node.name)
            if batch is None:
                batch = batches[node.name] = (cluster.get_redis_connection(node), [])
            batch[1].append(i)
        return batches

    def _read(self, client: Any, conn: Any, stack: list[Any], index: list[int],
              out: list[Any]) -> list[int]:
        """Read one node's replies into ``out``; the indexes to send again."""
        callbacks = client.response_callbacks
        again: list[int] = []
        for n, i in enumerate(index):
            args, options = stack[i]
            try:
                reply = conn.read_response()
            except _SEND_AGAIN:
                again.append(i)
                continue
            except ResponseError as exc:
                out[i] = exc
                continue
            except _LOST:
                conn.disconnect()  # never leave replies unread on a kept connection
                return again + index[n:]
            except BaseException:
                conn.disconnect()
                raise
            callback = callbacks.get(args[0])
            if callback is not None:
                options.pop("keys", None)
                reply = callback(reply, **options)
            out[i] = reply
        return again

    def _alone(self, command: tuple[Any, dict[str, Any]]) -> Any:
        """One command through the cluster client: it follows redirects, refreshes
        the slot map and retries a lost node. Its error is its reply."""
        args, options = command
        options.pop("keys", None)
        try:
            return self.cluster_client.execute_command(*args, **options)
        except ResponseError as exc:
            return exc


def _node_bound(command: tuple[Any, dict[str, Any]]) -> bool:
    return str(command[0][0]).upper() in _NODE_BOUND


def _send(client: Any, commands: list[Any]) -> Any:
    """Write ``commands`` on this thread's kept connection to one node; None if
    the node could not be reached (its commands go alone through the cluster)."""
    conn = pipeline._connection(client.connection_pool)
    try:
        conn.send_packed_command(conn.pack_commands(commands))
    except _LOST:
        conn.disconnect()
        return None
    return conn


def slot_of(cluster: Any, args: Any) -> int | None:
    """The slot a command's keys hash to; None for a keyless command. A command
    whose keys span slots cannot run on a cluster: that is refused here."""
    name = str(args[0]).upper()
    if name in ("EVAL", "EVALSHA"):
        keys = list(args[3:3 + int(args[2])])
    elif name in ("WAIT", "PING", "TIME", "INFO", "WAITAOF"):
        return None
    else:
        keys = cluster._get_command_keys(*args) or []
    slots = {cluster.keyslot(k) for k in keys}
    if len(slots) > 1:
        raise RedisClusterException(f"{name} spans {len(slots)} hash slots ({keys!r}); on a "
                                    "cluster each command must keep to one")
    return slots.pop() if slots else None
