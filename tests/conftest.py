"""Fixtures: a private redis-server for the whole run (never the machine's own
Redis), flushed before each test; or, with SAGA_TEST_BACKEND=fakeredis, a
fresh embedded store per test for the parity run of the log tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from saga_store import Registry, SagaStore
from saga_store.log.store import EventStore
from saga_store.ops.connection import embedded
from saga_store.settings import Settings
from saga_store.testing import RedisServer
from saga_store.testing.workers import KIND_VAR, KINDS

FAKE = os.environ.get("SAGA_TEST_BACKEND") == "fakeredis"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if FAKE:
        skip = pytest.mark.skip(reason="needs a real redis-server")
        for item in items:
            if "real_redis" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer | None]:
    if FAKE:
        yield None
        return
    with RedisServer() as srv:
        yield srv


@pytest.fixture
def redis_url(redis_server: RedisServer | None) -> str:
    if redis_server is None:
        pytest.skip("needs a real redis-server")
    return redis_server.url


@pytest.fixture
def client(redis_server: RedisServer | None) -> Iterator[redis.Redis]:
    if redis_server is None:
        c = embedded()
    else:
        c = redis.Redis.from_url(redis_server.url)
        c.flushdb()
    yield c
    c.close()


@pytest.fixture
def settings() -> Settings:
    return Settings()


@pytest.fixture
def store(client: redis.Redis, settings: Settings) -> EventStore:
    return EventStore(client, settings)


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's own side-effect ledger, shared with the worker processes."""
    path = tmp_path / "ledger.db"
    monkeypatch.setenv("SAGA_TEST_LEDGER", str(path))
    return path


@pytest.fixture
def worker_env(redis_url: str, ledger: Path) -> dict[str, str]:
    """Environment for worker processes: this test's Redis and ledger, short leases."""
    root = str(Path(__file__).resolve().parent.parent)
    return {**os.environ, "SAGA_REDIS_URL": redis_url, "SAGA_TEST_LEDGER": str(ledger),
            "SAGA_LEASE_MS": "1000", "PYTHONPATH": root, "SAGA_HMAC_KEY": "",
            "SAGA_HMAC_KEY_FILE": ""}


@pytest.fixture
def saga_store(client: redis.Redis) -> SagaStore:
    return SagaStore(client, Registry.from_modules("tests.ledger_tools"),
                     Settings(lease_ms=1000))


@pytest.fixture(params=KINDS)
def worker_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs the test once with RQ workers and once with asyncio workers (the kind
    every helper of :mod:`saga_store.testing.workers` then starts)."""
    kind = str(request.param)
    monkeypatch.setenv(KIND_VAR, kind)
    return kind
