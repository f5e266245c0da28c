"""RQ's queues (or the log) on a Redis that Sentinel manages: a
redis+sentinel:// URL names the sentinels and the service, every process finds
the primary through them, and a failover (the primary SIGKILLed, its replica
promoted by a real redis-sentinel) costs an outage, never a job or an effect."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from saga_store import Registry, SagaStore, Settings
from saga_store.errors import InvalidInput, StoreUnavailable
from saga_store.ops.connection import connect, connect_queue, queue_url
from saga_store.ops.sentinel import parse
from saga_store.protocol.state import Status
from saga_store.testing import RedisServer, assert_eventually, free_port
from saga_store.testing.workers import workers

from ..ledger_tools import effects

pytestmark = pytest.mark.real_redis
SERVICE = "queues"
TOOLS = "tests.ledger_tools"


@contextmanager
def sentinel_for(primary: RedisServer, replica: RedisServer) -> Iterator[int]:
    """A real sentinel (quorum 1, a primary judged down after 500 ms) watching
    ``primary``; yields its port once it knows the replica too."""
    binary = shutil.which("redis-server")
    assert binary is not None
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="saga-sentinel-"))
    conf = work / "sentinel.conf"
    conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {work}\n"
                    f"sentinel monitor {SERVICE} 127.0.0.1 {primary.port} 1\n"
                    f"sentinel down-after-milliseconds {SERVICE} 500\n"
                    f"sentinel failover-timeout {SERVICE} 3000\n")
    proc = subprocess.Popen([binary, str(conf), "--sentinel"],  # our argv
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        s = redis.Redis(port=port, socket_connect_timeout=0.5, decode_responses=True)
        assert_eventually(lambda: s.sentinel_slaves(SERVICE), timeout=30, interval=0.1,
                          what="the sentinel to see the replica",
                          swallow=(redis.RedisError,))
        yield port
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def managed() -> Iterator[tuple[RedisServer, RedisServer, int]]:
    with RedisServer() as primary, \
            RedisServer("--replicaof", "127.0.0.1", str(primary.port)) as replica, \
            sentinel_for(primary, replica) as port:
        yield primary, replica, port


def test_sentinel_urls_name_the_sentinels_the_service_and_the_redis_login() -> None:
    got = parse("rediss+sentinel://worker:s%3Acret@10.0.0.1:26379,[::1]:26380/queues/2")
    assert got == {"sentinels": [("10.0.0.1", 26379), ("::1", 26380)], "service": "queues",
                   "db": 2, "username": "worker", "password": "s:cret", "ssl": True}
    assert parse("redis+sentinel://h:1/svc")["db"] == 0
    for bad, says in (("redis+sentinel://h:1", "names no service"),
                      ("redis+sentinel:///svc", "names no sentinel"),
                      ("redis+sentinel://h/svc", "is not host:port"),
                      ("redis+sentinel://h:1/svc/x", "only a database number")):
        with pytest.raises(InvalidInput, match=says):  # a usage error: exit 2
            parse(bad)
    # a sentinel-managed Redis may hold the queues
    assert queue_url("redis://log:6379/0", "redis+sentinel://h:1/svc") == \
        "redis+sentinel://h:1/svc"


def test_no_sentinel_answering_is_a_clear_error_at_once() -> None:
    with pytest.raises(StoreUnavailable, match="SAGA_QUEUE_URL"):
        connect(f"redis+sentinel://127.0.0.1:{free_port()}/nobody", timeout_s=0.5,
                what="SAGA_QUEUE_URL")


def test_a_command_waiting_when_the_primary_dies_goes_on_at_the_new_one(
        managed: tuple[RedisServer, RedisServer, int]) -> None:
    """A worker waits in a blocking pop most of its life. Killed under it, the
    primary takes the pop's socket along; the pop's retry must ask the sentinels
    again and wait on the promoted replica, not knock at the dead address for the
    whole retry window (what redis-py's reconnect from inside a send did)."""
    primary, replica, port = managed
    client = connect(f"redis+sentinel://127.0.0.1:{port}/{SERVICE}", retry_s=60)
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(client.blpop(["jobs"], 0)),
                              daemon=True)
    waiter.start()
    assert_eventually(lambda: redis.Redis(port=primary.port).info("clients")[
        "blocked_clients"] == 1, what="the pop to wait on the primary")
    primary.kill()
    s = redis.Redis(port=port, decode_responses=True)
    assert_eventually(lambda: int(s.sentinel_get_master_addr_by_name(SERVICE)[1])
                      == replica.port, timeout=30, interval=0.1,
                      what="the sentinel to promote the replica")
    new = redis.Redis(port=replica.port)
    assert_eventually(lambda: new.info("clients")["blocked_clients"] == 1, timeout=20,
                      what="the pop to wait again, on the new primary")
    new.rpush("jobs", b"j1")
    waiter.join(timeout=10)
    assert got == [(b"jobs", b"j1")]


def test_the_queues_ride_out_a_sentinel_failover(
        managed: tuple[RedisServer, RedisServer, int], redis_url: str,
        worker_env: dict[str, str], ledger: Path, worker_kind: str) -> None:
    """The log on its own Redis, the queues on a Sentinel-managed primary: a saga
    runs, the primary is SIGKILLed, the sentinel promotes the replica, and the next
    saga runs through the new primary, each step's effect once."""
    primary, replica, port = managed
    url = f"redis+sentinel://127.0.0.1:{port}/{SERVICE}"
    log = connect(redis_url)
    queues = connect_queue(log, redis_url, url)
    store = SagaStore(log, Registry.from_modules(TOOLS), Settings(lease_ms=1000),
                      queues=queues)
    plan = [{"tool": "reserve_inventory", "args": {"sku": "A", "qty": 1}}]
    env = {**worker_env, "SAGA_QUEUE_URL": url, "SAGA_REDIS_RETRY_S": "60"}
    with workers(env, TOOLS, log=ledger.parent / "worker.log"):
        first = store.submit(plan, agent_id="agent-1")
        assert store.wait(first, timeout=60).status is Status.COMMITTED
        primary.kill()  # SIGKILL: the sentinel promotes the replica
        s = redis.Redis(port=port, decode_responses=True)
        assert_eventually(lambda: int(s.sentinel_get_master_addr_by_name(SERVICE)[1])
                          == replica.port, timeout=30, interval=0.1,
                          what="the sentinel to promote the replica")
        second = store.submit(plan, agent_id="agent-1")
        assert store.wait(second, timeout=60).status is Status.COMMITTED
    assert redis.Redis(port=replica.port).info("replication")["role"] == "master"
    assert len(effects("reserve")) == 2  # one per saga, in the test's own ledger


def test_the_log_on_a_sentinel_managed_redis(
        managed: tuple[RedisServer, RedisServer, int]) -> None:
    """SAGA_REDIS_URL may name the primary through Sentinel too: sagas land on it,
    the replica follows, and the chains verify."""
    from saga_store.log.store import EventStore
    from saga_store.verify.checker import Verifier

    from ..helpers import committed_saga
    primary, replica, port = managed
    store = EventStore(connect(f"redis+sentinel://127.0.0.1:{port}/{SERVICE}"))
    w = committed_saga(store)
    assert redis.Redis(port=primary.port).exists(store.keys.log(w.saga_id))
    assert Verifier(store.log).verify().ok
    assert_eventually(lambda: redis.Redis(port=replica.port).exists(store.keys.log(w.saga_id)),
                      what="the replica to hold the saga")
