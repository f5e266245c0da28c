"""Connecting to Redis, with the embedded in-process store as a fallback for
the zero-setup demo. The main code never knows which one it talks to."""

from __future__ import annotations

import os
import sys
from typing import Any

import redis
from redis.exceptions import RedisClusterException

from saga_store.errors import InvalidInput, StoreUnavailable
from saga_store.ops.backoff import OutageRetry
from saga_store.ops.cluster import ClusterClient, connect_cluster, is_cluster_url
from saga_store.ops.sentinel import connect_sentinel, is_sentinel_url

DEFAULT_URL = "redis://127.0.0.1:6379/0"
DEFAULT_RETRY_S = 30.0
FOREVER = None


def retry_window() -> float | None:
    """How long a client rides out an outage: ``SAGA_REDIS_RETRY_S`` seconds
    (default 30; ``forever`` for no limit)."""
    raw = os.environ.get("SAGA_REDIS_RETRY_S", "").strip().lower()
    if not raw:
        return DEFAULT_RETRY_S
    if raw == "forever":
        return FOREVER
    try:
        value = float(raw)
    except ValueError:
        raise StoreUnavailable(f"SAGA_REDIS_RETRY_S={raw!r} is not a number of seconds "
                               "or 'forever'") from None
    return max(0.0, value)


def connect(url: str, *, check: bool = True, timeout_s: float = 5.0,
            retry_s: float | str | None = "env", what: str = "SAGA_REDIS_URL") -> redis.Redis:
    """A client for ``url`` (``redis://``, ``rediss://`` or ``unix://``, with a
    password or ACL user in the URL if needed; ``redis+cluster://host:port[,...]``
    or ``rediss+cluster://`` for a Redis Cluster, which holds the log only: see
    :func:`queue_url`; ``redis+sentinel://host:port[,...]/<service>`` for the
    primary Sentinel names, see :mod:`saga_store.ops.sentinel`).

    The first ping fails fast (a wrong address is an error now, not in 30 s);
    after that, a lost connection is retried with capped, jittered backoff for
    ``retry_s`` seconds (``None``: for ever; default :func:`retry_window`)."""
    window = retry_window() if retry_s == "env" else retry_s
    try:
        if is_cluster_url(url):  # the slot map is fetched at once: its own first check
            client: Any = connect_cluster(url, timeout_s)
        elif is_sentinel_url(url):
            client = connect_sentinel(url, timeout_s)
        else:
            client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s,
                                          health_check_interval=30, retry=OutageRetry(0))
        if check:
            client.ping()
            if not is_cluster_url(url):
                _refuse_cluster_node(client, url, what)
    except (redis.RedisError, RedisClusterException) as exc:
        raise StoreUnavailable(
            f"cannot reach Redis at {redact(url)}: {exc}; check {what} and the server"
        ) from exc
    set_retry_window(client, window)  # type: ignore[arg-type]  # checked at run time
    return client  # type: ignore[no-any-return]  # a Redis, or a cluster standing in


def _refuse_cluster_node(client: redis.Redis, url: str, what: str) -> None:
    """A plain URL that reaches a node of a Redis Cluster would write some keys and
    get MOVED for the rest; say how to write the URL instead, before anything is
    written (a user who may not read INFO is not checked)."""
    try:
        enabled = client.info("cluster").get("cluster_enabled")
    except redis.exceptions.NoPermissionError:
        return
    if str(enabled) != "1":
        return
    if what == "SAGA_QUEUE_URL":
        raise InvalidInput(f"SAGA_QUEUE_URL={redact(url)} is a node of a Redis Cluster; RQ's "
                           "queues need a standalone Redis (or a Sentinel-managed primary)",
                           field=what)
    raise InvalidInput(f"{what}={redact(url)} is a node of a Redis Cluster: write "
                       "redis+cluster://host:port[,host:port...] (and SAGA_QUEUE_URL for RQ's "
                       "queues on a standalone Redis)", field=what)


def queue_url(log_url: str | None, queue: str | None = None) -> str | None:
    """Where RQ's queues live: ``queue`` (``SAGA_QUEUE_URL``, a standalone or
    Sentinel-managed Redis) if given, else the log's own Redis; a cluster cannot
    hold them (RQ's commands span slots), so with one it must be given."""
    queue = (queue if queue is not None else os.environ.get("SAGA_QUEUE_URL", "")).strip()
    if queue:
        if is_cluster_url(queue):
            raise InvalidInput(
                f"SAGA_QUEUE_URL={redact(queue)} names a Redis Cluster; RQ's queues need a "
                "standalone Redis (or a Sentinel-managed primary): give its redis:// or "
                "redis+sentinel:// URL")
        return queue
    if log_url and is_cluster_url(log_url):
        raise InvalidInput(
            f"SAGA_REDIS_URL={redact(log_url)} is a Redis Cluster, which holds the log only; "
            "set SAGA_QUEUE_URL to a standalone Redis (redis://host:port/0) for RQ's queues")
    return log_url


def connect_queue(log: redis.Redis, log_url: str | None, queue: str | None = None,
                  **options: Any) -> redis.Redis:
    """The client for RQ's queues: ``log`` itself when they share its Redis (one
    round trip for an append and its job, as ever), else one on
    :func:`queue_url`."""
    url = queue_url(log_url, queue)
    if url is None or url == log_url:
        return log
    return connect(url, what="SAGA_QUEUE_URL", **options)


def twin(client: redis.Redis) -> redis.Redis:
    """A second client on the servers of ``client`` (its own response callbacks;
    a standalone one shares the pool). A cluster's is made once and shared: it
    has connections of its own, and every log on it wants the same replies."""
    if isinstance(client, ClusterClient):
        if client.shared_twin is None:
            client.shared_twin = client.twin()
        return client.shared_twin  # a cluster stands in for a Redis
    return redis.Redis(connection_pool=client.connection_pool)


def set_retry_window(client: redis.Redis, seconds: float | None) -> None:
    """Ride out outages of up to ``seconds`` (``None``: for ever) on ``client``
    and on every client later built from its connection settings."""
    client.set_retry(OutageRetry(seconds))


def fail_fast(client: redis.Redis) -> redis.Redis:
    """A client on the same server that never waits out an outage (for metrics
    scrapes and health checks, which must answer now)."""
    if isinstance(client, ClusterClient):
        return client.twin(outage=OutageRetry(0), socket_timeout=2.0)
    pool = client.connection_pool
    kwargs = {**pool.connection_kwargs, "retry": OutageRetry(0), "socket_timeout": 2.0}
    return redis.Redis(connection_pool=redis.ConnectionPool(
        connection_class=pool.connection_class, **kwargs))


def embedded() -> redis.Redis:
    """An in-process store (fakeredis with Lua). For demos and parity tests only:
    it lives and dies with the process and is not shared between processes."""
    try:
        import fakeredis
    except ImportError as exc:
        raise StoreUnavailable(
            "no Redis answered and the embedded store is not installed; "
            "pip install 'saga-store[embedded]' or set SAGA_REDIS_URL") from exc
    server = fakeredis.FakeServer()
    client: Any = fakeredis.FakeRedis(server=server)
    return client  # type: ignore[no-any-return]  # the library returns Any


def connect_or_embedded(url: str | None) -> tuple[redis.Redis, bool]:
    """``url`` if given; else the embedded store, with a one-line notice (never a
    Redis that merely answers on the default address: a demo must not write into
    a deployment nobody named). Returns (client, is_embedded)."""
    if url:
        return connect(url), False
    print("notice: SAGA_REDIS_URL unset; using the embedded in-process store "
          "(give --redis-url or SAGA_REDIS_URL to run on a Redis with workers)",
          file=sys.stderr)
    return embedded(), True


def redact(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    creds, _, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user + ':***' if ':' in creds else user}@{host}"
