"""A Redis whose primary Sentinel names: ``redis+sentinel://`` and
``rediss+sentinel://`` URLs, for the log or for RQ's queues (``SAGA_QUEUE_URL``).

    redis+sentinel://[user[:password]@]host:port[,host:port...]/<service>[/<db>]

The hosts are the sentinels; ``service`` is the name they monitor the primary
by (``sentinel monitor <service> ...``); user and password are the Redis's, not
the sentinels'. Every new connection asks a sentinel where the primary is, and
one that finds it was demoted (a failover) is dropped and opened again, so after
a failover every command goes to the new primary once the outage policy's retry
reconnects.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import redis
from redis.connection import SSLConnection
from redis.sentinel import Sentinel, SentinelManagedConnection

from saga_store.errors import InvalidInput
from saga_store.ops.backoff import OutageRetry

SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}  # scheme -> TLS to Redis
USAGE = "write redis+sentinel://host:port[,host:port...]/<service>[/<db>]"


def is_sentinel_url(url: str) -> bool:
    return url.partition("://")[0].lower() in SCHEMES


def parse(url: str) -> dict[str, Any]:
    """The sentinels, the service, and the Redis's db, user, password and TLS."""
    from saga_store.ops.connection import redact
    scheme, _, rest = url.partition("://")
    creds, _, where = rest.rpartition("@")
    hosts, _, path = where.partition("/")
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if not parts:
        raise InvalidInput(f"{redact(url)} names no service (the name the sentinels "
                               f"monitor the primary by); {USAGE}")
    if len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
        raise InvalidInput(f"{redact(url)}: after the service only a database number "
                               f"may follow; {USAGE}")
    sentinels = []
    for hostport in (h.strip() for h in hosts.split(",") if h.strip()):
        host, _, port = hostport.rpartition(":")
        if not host or not port.isdigit():
            raise InvalidInput(f"{redact(url)}: {hostport!r} is not host:port; {USAGE}")
        sentinels.append((host.strip("[]"), int(port)))
    if not sentinels:
        raise InvalidInput(f"{redact(url)} names no sentinel; {USAGE}")
    user, _, password = creds.partition(":")
    return {"sentinels": sentinels, "service": unquote(parts[0]),
            "db": int(parts[1]) if len(parts) == 2 else 0,
            "username": unquote(user) or None, "password": unquote(password) or None,
            "ssl": SCHEMES[scheme.lower()]}


class PrimaryConnection(SentinelManagedConnection):
    """A connection that asks the sentinels where the primary is each time it
    opens a socket, however it comes to open one. redis-py asks them only when a
    connection is taken from the pool; a command that lost its socket and is
    retried (the outage policy) reopens it from inside the send, at the address it
    had: after a failover, the dead primary's, for the whole retry window."""

    # no-untyped-call below: the library leaves these untyped
    def _connect(self) -> Any:  # every socket, however it comes to be opened
        if self.connection_pool.is_master:
            self.host, self.port = self.connection_pool.get_master_address()
        return super()._connect()  # type: ignore[no-untyped-call]

    def _connect_retry(self) -> None:
        if not self._sock:  # the address is asked for once, by _connect
            self.connect_to((self.host, self.port))  # type: ignore[no-untyped-call]


class PrimarySSLConnection(PrimaryConnection, SSLConnection):
    pass


def connect_sentinel(url: str, timeout_s: float) -> redis.Redis:
    """A client on the primary the sentinels of ``url`` name (see the module)."""
    p = parse(url)
    # only the sentinels get a socket timeout: the primary's connections have none,
    # as a redis:// client's, so RQ's blocking pops wait as long as they ask
    sentinel = Sentinel(p["sentinels"],
                        sentinel_kwargs={"socket_timeout": timeout_s,
                                         "socket_connect_timeout": timeout_s})
    # the primary now, as every connection's fallback address: one that connects
    # without asking the sentinels goes there, never to redis-py's default
    # (localhost:6379, somebody else's Redis)
    host, port = sentinel.discover_master(p["service"])
    client: redis.Redis = sentinel.master_for(
        p["service"], host=host, port=port, db=p["db"], username=p["username"],
        password=p["password"],
        connection_class=PrimarySSLConnection if p["ssl"] else PrimaryConnection,
        socket_connect_timeout=timeout_s, health_check_interval=30,
        retry=OutageRetry(0))
    return client
