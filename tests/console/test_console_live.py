"""The live feed of a quiet saga through a real server: it stays open, sends a
keep-alive comment every 10 s, takes no quiet moment for a Redis outage, and
still delivers the saga's next event."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import uvicorn

from saga_store import SagaStore
from saga_store.console import ConsoleConfig, create_app
from saga_store.log.events import EventKind as K
from saga_store.testing import assert_eventually, free_port

HOLD_S = 40.0


@contextmanager
def quiet_server(app: Any) -> Iterator[str]:
    """The app under uvicorn in a thread, leaving logging as the test set it, so
    every line the server and the app log reaches the test's capture."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None,
                                           log_level="warning", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    assert_eventually(lambda: server.started, timeout=20, what="the console to listen")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)


@pytest.mark.real_redis
@pytest.mark.timeout(120)
def test_an_idle_feed_keeps_alive_for_40_s_with_no_false_outage(
        saga_store: SagaStore, caplog: pytest.LogCaptureFixture) -> None:
    """40 s of a quiet saga: a comment at least every 10 s (+2 s), not one warning
    or error logged (no 'Redis unreachable', no ASGI error), then its commit
    arrives as an update and the stream ends."""
    w = saga_store.events.open("quiet-agent")
    app = create_app(saga_store, ConsoleConfig(operator="olivia"))
    arrivals: list[tuple[float, str]] = []
    with caplog.at_level(logging.WARNING), quiet_server(app) as base, httpx.Client(
            base_url=base, timeout=httpx.Timeout(5.0, read=20.0)) as http:
        began = time.monotonic()
        with http.stream("GET", f"/sagas/{w.saga_id}/live?after={w.head.seq}") as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if not line:
                    continue
                arrivals.append((time.monotonic() - began, line))
                if line.startswith(":") and arrivals[-1][0] >= HOLD_S:
                    w.append(K.SAGA_COMMITTED)  # the saga moves at last
                if line.startswith("event: end"):
                    break
    comments = [at for at, line in arrivals if line == ": keep-alive"]
    assert len(comments) >= HOLD_S // 10, arrivals
    gaps = [b - a for a, b in zip([0.0, *comments], comments, strict=False)]
    assert max(gaps) <= 12.0, gaps
    assert any(line.startswith("event: update") for _, line in arrivals), arrivals
    assert '"state":"committed"' in next(line for _, line in arrivals
                                         if line.startswith("data: {\"seq\""))
    logged = [f"{r.name}: {r.getMessage()}" for r in caplog.records]
    assert logged == [], logged


def test_a_feed_whose_redis_is_gone_ends_with_an_unavailable_event(
        saga_store: SagaStore) -> None:
    """The blocking read fails (its Redis unreachable): the stream says so in an
    event and ends, instead of raising inside a response already started."""
    import redis

    from saga_store.console.live import Follower
    from saga_store.ops.backoff import OutageRetry
    from saga_store.testing import free_port

    from ..console_helpers import console

    w = saga_store.events.open("gone-agent")
    tc = console(saga_store)
    feed = Follower(saga_store, 300)
    feed.client = redis.Redis(port=free_port(), socket_connect_timeout=1,
                              retry=OutageRetry(0))  # nobody listens there
    tc.app.state.follower = feed  # type: ignore[attr-defined]  # Starlette's state is untyped
    with tc.stream("GET", f"/sagas/{w.saga_id}/live?after={w.head.seq}") as resp:
        lines = [line for line in resp.iter_lines() if line]
    assert lines[0].startswith("retry:")
    assert lines[1] == "event: unavailable"
    assert "Redis is unreachable" in lines[2]
