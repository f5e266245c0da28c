"""The log on Redis Cluster: ``redis+cluster://`` and ``rediss+cluster://`` URLs.

A saga's keys share one hash tag, so every per-saga script (append, claim,
leases) runs on one node; the lean pipeline sends each node its own commands
(:mod:`saga_store.log.pipeline`). RQ cannot run on a cluster (its LMOVE and
BLPOP span slots), so the queues live on a standalone Redis of their own,
``SAGA_QUEUE_URL``.

:class:`ClusterClient` is redis-py's ``RedisCluster`` with this project's outage
policy: redis-py retries a command a few times, refreshing the slot map after
each failure (that is how a failover is followed); :class:`OutageRetry` wraps
that, so an outage longer than a failover is ridden out as on a standalone
Redis.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import (
    ClusterDownError,
    ClusterError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.retry import Retry

from saga_store.errors import InvalidInput
from saga_store.ops.backoff import OutageRetry

SCHEMES = {"redis+cluster": False, "rediss+cluster": True}  # scheme -> TLS
FAILOVER_TRIES = 5  # redis-py's own tries per command, each after a slot map refresh
# ridden out like a lost connection: a failover not over yet (CLUSTERDOWN, a slot
# with no owner), and a migration not over yet (TRYAGAIN; redirects until redis-py's
# own count runs out, "TTL exhausted")
_OUTAGE_ERRORS = (ClusterDownError, SlotNotCoveredError, TryAgainError, ClusterError)


def is_cluster_url(url: str) -> bool:
    return url.partition("://")[0].lower() in SCHEMES


def is_cluster(client: Any) -> bool:
    return isinstance(client, RedisCluster)


def parse(url: str) -> dict[str, Any]:
    """The constructor arguments of a cluster URL:
    ``redis+cluster://[user[:password]@]host:port[,host:port...]``."""
    scheme, _, rest = url.partition("://")
    creds, _, where = rest.rpartition("@")
    hosts = where.split("/", 1)[0].split("?", 1)[0]
    db = where.split("/", 1)[1].split("?", 1)[0] if "/" in where else ""
    if db not in ("", "0"):
        raise InvalidInput(f"{redact(url)}: Redis Cluster has database 0 only; drop "
                               f"the /{db} from SAGA_REDIS_URL")
    nodes = [_node(url, h) for h in hosts.split(",") if h.strip()]
    if not nodes:
        raise InvalidInput(f"{redact(url)} names no node; write "
                               "redis+cluster://host:port[,host:port...]")
    kwargs: dict[str, Any] = {"startup_nodes": nodes, "ssl": SCHEMES[scheme.lower()]}
    if creds:
        user, _, password = creds.partition(":")
        kwargs["username"] = unquote(user) or None
        kwargs["password"] = unquote(password) or None
    return kwargs


def _node(url: str, hostport: str) -> ClusterNode:
    host, _, port = hostport.strip().rpartition(":")
    if not host or not port.isdigit():
        raise InvalidInput(f"{redact(url)}: {hostport.strip()!r} is not host:port; "
                               "write redis+cluster://host:port[,host:port...]")
    return ClusterNode(host.strip("[]"), int(port))  # type: ignore[no-untyped-call]


def redact(url: str) -> str:
    from saga_store.ops.connection import redact as plain
    return plain(url)


class ClusterClient(RedisCluster):
    """``RedisCluster`` under an :class:`OutageRetry` (see the module). Response
    callbacks set here apply where each node's reply is parsed, as they do on a
    standalone client."""

    def __init__(self, *, outage: OutageRetry | None = None, **kwargs: Any) -> None:
        self.saga_kwargs = dict(kwargs)
        self.outage = outage or OutageRetry(0)
        self.outage.update_supported_errors(list(_OUTAGE_ERRORS))
        self.node_callbacks: dict[str, Any] = {}
        self.shared_twin: ClusterClient | None = None  # see connection.twin
        retry = Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), FAILOVER_TRIES)
        super().__init__(retry=retry, **kwargs)

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        run = super()._internal_execute_command  # what RedisCluster.execute_command calls
        return self.outage.call_with_retry(lambda: run(*args, **kwargs), lambda *_: None)  # type: ignore[no-untyped-call]

    def pipeline(self, transaction: Any = True, shard_hint: Any = None) -> Any:
        """As on a standalone client, a transaction unless ``transaction=False``:
        then the lean pipeline, a batch per node (see
        :mod:`saga_store.log.node_pipeline`): scripts in it go as EVAL, and it
        follows redirects command by command. A transaction (MULTI, WATCH) is
        redis-py's own, on one slot only."""
        if transaction is not False:
            return super().pipeline(True, shard_hint)  # type: ignore[no-untyped-call]
        from saga_store.log.node_pipeline import NodePipeline
        return NodePipeline(self)

    def set_retry(self, retry: Retry) -> None:
        """An :class:`OutageRetry` sets how long outages are ridden out; any other
        retry is redis-py's own per-command policy."""
        if isinstance(retry, OutageRetry):
            retry.update_supported_errors(list(_OUTAGE_ERRORS))
            self.outage = retry
        else:
            super().set_retry(retry)

    def set_response_callback(self, command: str, callback: Any) -> None:
        self.node_callbacks[command] = callback
        for node in self.get_nodes():  # type: ignore[no-untyped-call]
            if node.redis_connection is not None:
                node.redis_connection.set_response_callback(command, callback)

    def get_redis_connection(self, node: ClusterNode) -> Any:
        client = super().get_redis_connection(node)
        if self.node_callbacks and getattr(client, "_saga_callbacks", None) is not self:
            for command, callback in self.node_callbacks.items():
                client.set_response_callback(command, callback)
            client._saga_callbacks = self  # type: ignore[attr-defined]  # a mark of ours
        return client

    def twin(self, *, outage: OutageRetry | None = None, **overrides: Any) -> ClusterClient:
        """A second client on the same cluster, found from the nodes known now."""
        kwargs = {**self.saga_kwargs, **overrides}
        known = self.get_nodes()  # type: ignore[no-untyped-call]
        kwargs["startup_nodes"] = [ClusterNode(n.host, n.port)  # type: ignore[no-untyped-call]
                                   for n in known] or kwargs["startup_nodes"]
        return ClusterClient(outage=outage or self.outage, **kwargs)


def connect_cluster(url: str, timeout_s: float) -> ClusterClient:
    """A cluster client for ``url``; asking for the slot map is its first check."""
    return ClusterClient(socket_connect_timeout=timeout_s, health_check_interval=30,
                         **parse(url))
