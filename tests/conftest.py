"""Fixtures: a private redis-server for the whole run (never the machine's own
Redis), flushed before each test; or, with SAGA_TEST_BACKEND=fakeredis, a
fresh embedded store per test for the parity run of the log tests; or, with
SAGA_TEST_BACKEND=cluster, a private six-node Redis Cluster holding the log and
a standalone Redis holding RQ's queues, for the tests marked ``cluster``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from saga_store import Registry, SagaStore, keys
from saga_store.log.store import EventStore
from saga_store.ops.connection import connect, embedded
from saga_store.settings import Settings
from saga_store.testing import RedisServer, slots
from saga_store.testing.cluster import RedisClusterServers
from saga_store.testing.workers import KIND_VAR, KINDS

FAKE = os.environ.get("SAGA_TEST_BACKEND") == "fakeredis"
CLUSTER = os.environ.get("SAGA_TEST_BACKEND") == "cluster"
# the layout every test's store is created with ("<version> <buckets>"; unset: the
# default a new store gets), so the same tests run on each layout
LAYOUT = os.environ.get("SAGA_TEST_LAYOUT") or None


SLOT_LOG = slots.install_from_env()  # SAGA_TEST_SLOT_LOG: no script or MULTI across slots


@pytest.fixture(autouse=True)
def _one_slot_each() -> Iterator[None]:
    """With ``SAGA_TEST_SLOT_LOG`` set: fail a test that ran a script or a
    transaction (here or in its workers) whose keys span hash slots."""
    if SLOT_LOG is None:
        yield
        return
    before = len(SLOT_LOG.violations())
    yield
    found = SLOT_LOG.violations()[before:]
    assert not found, "keys of one script or transaction span slots:\n" + "\n".join(found)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if FAKE:
        skip = pytest.mark.skip(reason="needs a real redis-server")
        for item in items:
            if "real_redis" in item.keywords:
                item.add_marker(skip)
    if CLUSTER:
        skip = pytest.mark.skip(reason="runs on a standalone Redis only (not marked cluster)")
        for item in items:
            if "cluster" not in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer | RedisClusterServers | None]:
    if FAKE:
        yield None
        return
    with (RedisClusterServers() if CLUSTER else RedisServer()) as srv:
        yield srv


@pytest.fixture
def servers(redis_server: object) -> RedisClusterServers:
    """The private cluster of the cluster run (other runs skip the test)."""
    if not isinstance(redis_server, RedisClusterServers):
        pytest.skip("needs the cluster backend (SAGA_TEST_BACKEND=cluster)")
    return redis_server


@pytest.fixture
def redis_url(redis_server: RedisServer | RedisClusterServers | None) -> str:
    if redis_server is None:
        pytest.skip("needs a real redis-server")
    return redis_server.url


def layout_record(node: pytest.Item) -> str | None:
    """The layout record the ``client`` fixture writes for the test ``node`` (None:
    none; the test's own settings create the store, or it starts from nothing).

    SAGA_TEST_LAYOUT, unless the test is marked ``layout``:

    - ``@pytest.mark.layout(1)``: a test of a store of layout 1 (migrated, or read
      as it is): no record is written whatever SAGA_TEST_LAYOUT says; the test makes
      the store itself;
    - ``@pytest.mark.layout(2)``, ``layout(2, buckets=n)``: a test of layout 2 (a
      crash window only layout 2 has): "2 <n>" is written (n: SAGA_TEST_LAYOUT's
      buckets, else 1,024);
    - ``@pytest.mark.layout(None)``: a test that starts from an empty Redis;
    - ``@pytest.mark.layout(buckets=n)``: a test of any layout that needs n buckets
      (one chain, or hundreds): SAGA_TEST_LAYOUT's version with n buckets (unset:
      nothing written; the test's ``Settings(buckets=n)`` create the store).
    """
    mark = node.get_closest_marker("layout")
    if mark is None:
        return LAYOUT
    if mark.args == (2,):
        buckets = mark.kwargs.get("buckets") or (LAYOUT.split()[1] if LAYOUT else 1024)
        return f"2 {int(buckets)}"
    if "buckets" in mark.kwargs:
        assert not mark.args, "layout(buckets=n) keeps the run's version: name no version"
        return f"{LAYOUT.split()[0]} {int(mark.kwargs['buckets'])}" if LAYOUT else None
    usage = "layout(1), layout(2), layout(None) or layout(buckets=n)"
    assert len(mark.args) == 1, usage
    assert mark.args[0] in (None, 1), usage
    return None


@pytest.fixture
def store_layout(request: pytest.FixtureRequest) -> str | None:
    """The layout record the test's store is to have (None: none written): for a
    test that starts a Redis of its own, to write there as ``client`` does."""
    return layout_record(request.node)


@pytest.fixture
def client(redis_server: RedisServer | RedisClusterServers | None,
           store_layout: str | None) -> Iterator[redis.Redis]:
    """The log's client: on a cluster, every master (and the queues) flushed first;
    then the layout the test's store is to have recorded (see :func:`layout_record`)."""
    if redis_server is None:
        c = embedded()
    elif isinstance(redis_server, RedisClusterServers):
        redis_server.flush()
        c = connect(redis_server.url)
    else:
        c = redis.Redis.from_url(redis_server.url)
        c.flushdb()
    if store_layout:  # SAGA_TEST_LAYOUT, e.g. "3 16": the store is created with that layout
        c.set(keys.LAYOUT, store_layout)
    yield c
    c.close()


@pytest.fixture
def queues(redis_server: RedisServer | RedisClusterServers | None,
           client: redis.Redis) -> Iterator[redis.Redis]:
    """The client of RQ's queues: the log's own, but on a cluster its own Redis."""
    if not isinstance(redis_server, RedisClusterServers):
        yield client
        return
    c = redis.Redis.from_url(redis_server.queue_url)
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
def worker_env(redis_url: str, ledger: Path,
               redis_server: RedisServer | RedisClusterServers | None) -> dict[str, str]:
    """Environment for worker processes: this test's Redis and ledger, short leases."""
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "SAGA_REDIS_URL": redis_url, "SAGA_TEST_LEDGER": str(ledger),
           "SAGA_LEASE_MS": "1000", "PYTHONPATH": root, "SAGA_HMAC_KEY": "",
           "SAGA_HMAC_KEY_FILE": ""}
    env.pop("SAGA_QUEUE_URL", None)
    if SLOT_LOG is not None:  # the workers check their scripts and transactions too
        env["PYTHONPATH"] = f"{Path(__file__).resolve().parent / 'slotcheck'}:{root}"
    if isinstance(redis_server, RedisClusterServers):
        env["SAGA_QUEUE_URL"] = redis_server.queue_url
    return env


@pytest.fixture
def saga_store(client: redis.Redis, queues: redis.Redis) -> SagaStore:
    return SagaStore(client, Registry.from_modules("tests.ledger_tools"),
                     Settings(lease_ms=1000), queues=queues)


@pytest.fixture(params=KINDS)
def worker_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs the test once with RQ workers and once with asyncio workers (the kind
    every helper of :mod:`saga_store.testing.workers` then starts)."""
    kind = str(request.param)
    monkeypatch.setenv(KIND_VAR, kind)
    return kind
