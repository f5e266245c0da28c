"""Connecting to Redis, with the embedded in-process store as a fallback for
the zero-setup demo. The main code never knows which one it talks to."""

from __future__ import annotations

import sys
from typing import Any

import redis

from .errors import StoreUnavailable

DEFAULT_URL = "redis://127.0.0.1:6379/0"


def connect(url: str, *, check: bool = True, timeout_s: float = 5.0) -> redis.Redis:
    """A client for ``url`` (``redis://``, ``rediss://`` or ``unix://``); pings it."""
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s,
                                      health_check_interval=30)
        if check:
            client.ping()
    except redis.RedisError as exc:
        raise StoreUnavailable(
            f"cannot reach Redis at {redact(url)}: {exc}; check SAGA_REDIS_URL and the server"
        ) from exc
    return client


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
    return client  # type: ignore[no-any-return]


def connect_or_embedded(url: str | None) -> tuple[redis.Redis, bool]:
    """``url`` if given; else the default address if Redis answers there; else
    the embedded store, with a one-line notice. Returns (client, is_embedded)."""
    if url:
        return connect(url), False
    try:
        return connect(DEFAULT_URL, timeout_s=0.5), False
    except StoreUnavailable:
        print("notice: no Redis at 127.0.0.1:6379 and SAGA_REDIS_URL unset; "
              "using the embedded in-process store", file=sys.stderr)
        return embedded(), True


def redact(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    creds, _, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user + ':***' if ':' in creds else user}@{host}"
