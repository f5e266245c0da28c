"""The live feed that keeps a running saga's page current (Server-Sent Events).

Each open page holds one blocking read (XREAD BLOCK) on its saga's stream, in
a thread of its own pool. The read runs on a client of its own whose socket
timeout outlasts the block: on the store's client (redis-py's default socket
timeout is 5 s) a quiet saga's read would time out, be taken for an outage,
retried with backoff and logged as "Redis unreachable" while Redis was fine.

A quiet feed sends a comment every ``keepalive_s`` seconds so that proxies
and browsers keep the connection open. A read that fails (Redis really gone)
ends the stream with an ``unavailable`` event instead of raising: the response
has started, so an error handler could no longer answer, and the browser's
EventSource reconnects by itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.to_thread
import orjson
import redis
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from saga_store import SagaError, SagaStore, keys
from saga_store.ops.cluster import ClusterClient

from .render import fragment
from .sagas import live_context, saga_id_of, with_format

LIVE_THREADS = 32
SOCKET_MARGIN_S = 10.0  # a blocking read's socket waits this much longer than its block
log = logging.getLogger("saga_store.console")


def blocking_client(client: redis.Redis, block_ms: int) -> redis.Redis:
    """A client on ``client``'s server whose reads outlast a ``block_ms`` block."""
    timeout = block_ms / 1000 + SOCKET_MARGIN_S
    if isinstance(client, ClusterClient):
        return client.twin(socket_timeout=timeout)  # a cluster stands in for a Redis
    pool = client.connection_pool
    kwargs = {**pool.connection_kwargs, "socket_timeout": timeout}
    return redis.Redis(connection_pool=redis.ConnectionPool(
        connection_class=pool.connection_class, **kwargs))


class Follower:
    """Blocking reads of sagas' streams for the live pages, on their own client
    and their own threads: many open live pages delay each other's updates, never
    the other pages."""

    def __init__(self, store: SagaStore, block_ms: int) -> None:
        self.store = store
        self.block_ms = block_ms
        self.client = blocking_client(store.redis, block_ms)
        self.limiter = anyio.CapacityLimiter(LIVE_THREADS)

    def _read(self, saga_id: str, after_seq: int, block_ms: int) -> bool:
        key = self.store.events.log.keys.chain_log(saga_id)
        after = keys.entry_id(after_seq) if after_seq >= 0 else "0-0"
        # COUNT 1: whether anything landed is all it needs; the page is read afresh
        reply: Any = self.client.execute_command(  # type: ignore[no-untyped-call]
            "XREAD", "COUNT", 1, "BLOCK", block_ms, "STREAMS", key, after)
        return bool(reply)

    async def landed(self, saga_id: str, after_seq: int, block_ms: int) -> bool:
        """Whether events after ``after_seq`` exist, waiting up to ``block_ms``."""
        return await anyio.to_thread.run_sync(self._read, saga_id, after_seq, block_ms,
                                              limiter=self.limiter)


def follower(request: Request) -> Follower:
    app_state = request.app.state
    found: Follower | None = getattr(app_state, "follower", None)
    if found is None:
        config = app_state.config
        found = app_state.follower = Follower(app_state.saga_store,
                                              min(config.live_block_ms,
                                                  int(config.keepalive_s * 1000)))
    return found


def _update(ctx: dict[str, Any], html: str) -> str:
    data = orjson.dumps({"seq": ctx["seq"], "state": str(ctx["saga"].status),
                         "final": not ctx["live"], "html": html}).decode()
    return f"event: update\nid: {ctx['seq']}\ndata: {data}\n\n"


async def saga_live(request: Request) -> Response:
    """The saga page's live part, re-rendered whenever events land."""
    sid, fmt = saga_id_of(request), with_format(request)
    after_text = request.query_params.get("after", "-1")
    after = int(after_text) if after_text.lstrip("-").isdigit() else -1
    store: SagaStore = request.app.state.saga_store
    keepalive_s: float = request.app.state.config.keepalive_s
    feed = follower(request)
    read_only: bool = request.state.read_only

    async def events() -> AsyncIterator[str]:
        seq = after
        yield "retry: 2000\n\n"
        quiet_since = time.monotonic()
        while True:
            try:
                got = await feed.landed(sid, seq, feed.block_ms)
                if await request.is_disconnected():
                    return
                if not got:
                    if time.monotonic() - quiet_since >= keepalive_s:
                        yield ": keep-alive\n\n"  # a comment: proxies keep the stream open
                        quiet_since = time.monotonic()
                    continue
                ctx = await run_in_threadpool(live_context, store, sid, fmt, read_only)
            except HTTPException as exc:  # the saga's log is gone meanwhile
                message = orjson.dumps({"error": str(exc.detail)}).decode()
                yield f"event: unavailable\ndata: {message}\n\n"
                return
            except (SagaError, redis.RedisError) as exc:
                log.warning("console: live feed of saga %s stopped: %s", sid, exc)
                message = orjson.dumps({"error": f"Redis is unreachable: {exc}"}).decode()
                yield f"event: unavailable\ndata: {message}\n\n"
                return
            seq = ctx["seq"]
            yield _update(ctx, fragment(request, "_live.html", ctx))
            quiet_since = time.monotonic()
            if not ctx["live"]:
                yield "event: end\ndata: {}\n\n"
                return

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"x-accel-buffering": "no", "cache-control": "no-store"})
