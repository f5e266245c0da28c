"""The log on a Redis Cluster: the URL schemes, the two roles (log and queues),
and the lean pipeline's batches per node, redirects included."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from saga_store.workers.invoke import Invoker, Send, Sends, Work, adrive

from saga_store import Registry, SagaStore
from saga_store.errors import InvalidInput, StoreUnavailable
from saga_store.log.events import EventKind as K
from saga_store.log.layout import names_of
from saga_store.log.pipeline import lean
from saga_store.log.store import EventStore
from saga_store.ops import cluster as clusters
from saga_store.ops.connection import connect, fail_fast, queue_url
from saga_store.testing.cluster import RedisClusterServers
from saga_store.verify.checker import Verifier

pytestmark = [pytest.mark.cluster, pytest.mark.real_redis]


def _saga_on_each_master(client: redis.Redis, n: int = 3) -> list[str]:
    """Saga ids whose logs are served by ``n`` different masters."""
    nodes = client.nodes_manager  # type: ignore[attr-defined]
    names = names_of(client)
    found: dict[str, str] = {}
    i = 0
    while len(found) < n:
        sid = f"a-{i}"
        slot = client.keyslot(names.log(sid))  # type: ignore[attr-defined]
        found.setdefault(nodes.get_node_from_slot(slot).name, sid)
        i += 1
    return list(found.values())


def test_cluster_urls_name_every_node_and_their_credentials() -> None:
    """redis+cluster:// and rediss+cluster:// list nodes; user and password as redis://."""
    got = clusters.parse("rediss+cluster://worker:s%3Acret@10.0.0.1:7000,[::1]:7001")
    assert [(n.host, n.port) for n in got["startup_nodes"]] == [("10.0.0.1", 7000),
                                                                ("::1", 7001)]
    assert (got["username"], got["password"], got["ssl"]) == ("worker", "s:cret", True)
    assert clusters.parse("redis+cluster://h:1")["ssl"] is False


@pytest.mark.parametrize(("url", "says"), [
    ("redis+cluster://", "names no node"),
    ("redis+cluster://host", "is not host:port"),
    ("redis+cluster://h:1/3", "database 0 only"),
])
def test_a_bad_cluster_url_says_how_to_write_it(url: str, says: str) -> None:
    with pytest.raises(InvalidInput, match=says):  # a usage error: exit 2
        clusters.parse(url)


def test_a_cluster_needs_a_queue_url_of_a_standalone_redis() -> None:
    """RQ cannot run on a cluster: the error names SAGA_QUEUE_URL and what to give it."""
    with pytest.raises(InvalidInput, match="set SAGA_QUEUE_URL"):
        queue_url("redis+cluster://h:1", "")
    with pytest.raises(InvalidInput, match="need a standalone Redis"):
        queue_url("redis://h:1/0", "redis+cluster://h:2")
    assert queue_url("redis://h:1/0", "") == "redis://h:1/0"
    assert queue_url("redis+cluster://h:1", "redis://q:2/0") == "redis://q:2/0"


def test_a_store_on_a_cluster_without_queues_is_refused(servers: RedisClusterServers,
                                                        client: redis.Redis) -> None:
    with pytest.raises(StoreUnavailable, match="SAGA_QUEUE_URL"):
        SagaStore(client, Registry())


def test_a_plain_url_to_a_cluster_node_is_refused_before_anything_is_written(
        servers: RedisClusterServers, client: redis.Redis) -> None:
    """redis:// to a node of a cluster would write some keys and get MOVED for the
    rest: refused at connect, for the log and for the queues, saying what to write."""
    node = f"redis://127.0.0.1:{servers.masters()[0].port}/0"
    before = client.dbsize()  # 0, or the layout the test's store is to have (ss:layout)
    with pytest.raises(InvalidInput, match=r"write redis\+cluster://"):
        connect(node)
    with pytest.raises(InvalidInput, match=r"SAGA_QUEUE_URL=.* is a node of a Redis Cluster"):
        connect(node, what="SAGA_QUEUE_URL")
    assert client.dbsize() == before


def test_an_unreachable_cluster_fails_fast() -> None:
    with pytest.raises(StoreUnavailable, match="cannot reach Redis"):
        connect("redis+cluster://127.0.0.1:1", timeout_s=0.2)


def test_from_url_runs_a_saga_whose_keys_live_on_other_nodes(
        servers: RedisClusterServers, client: redis.Redis) -> None:
    """Sagas on every master: opened, appended, committed and verified, no MOVED."""
    store = SagaStore.from_url(servers.url, Registry.from_modules("tests.ledger_tools"),
                               queue_url=servers.queue_url)
    assert store.queues is not store.redis
    for sid in _saga_on_each_master(store.redis):
        with store.saga(agent_id="a", saga_id=sid, executor="inline") as saga:
            saga.call("noop", {"n": 1})
        assert store.state(sid).status == "committed"
        assert Verifier(store.events.log).verify(sid).ok


def test_the_lean_pipeline_sends_each_node_its_commands_in_order(
        servers: RedisClusterServers, client: redis.Redis) -> None:
    """Commands of three masters in one batch: replies in the order queued; a
    keyless WAIT goes with the command before it; errors come back in place."""
    sids = _saga_on_each_master(client)
    names = names_of(client)
    p = lean(client)
    for sid in sids:
        p.set(names.lease(sid), sid)
        p.execute_command("WAIT", 0, 0)
        p.incr(names.lease(sid))  # not an integer
        p.get(names.lease(sid))
    replies = p.execute(raise_on_error=False)
    for n, sid in enumerate(sids):
        ok, waited, err, got = replies[4 * n:4 * n + 4]
        assert (ok, waited, got) == (True, 0, sid.encode())
        assert isinstance(err, redis.ResponseError)
    assert lean(client).execute() == []


def _move_slot(client: redis.Redis, servers: RedisClusterServers, key: str,
               finish: Callable[[Callable[[], None]], None] = lambda done: done()) -> None:
    """Hand ``key``'s slot, keys and all, to another master behind the client's back;
    ``finish`` is handed what ends the migration (the slot's new owner made known)."""
    slot = redis.crc.key_slot(key.encode())
    owner = client.nodes_manager.get_node_from_slot(slot).port  # type: ignore[attr-defined]
    masters = {m.port: redis.Redis(port=m.port) for m in servers.masters()}
    ids = {port: m.execute_command("CLUSTER", "MYID").decode() for port, m in masters.items()}
    dst_port = next(port for port in masters if port != owner)
    src, dst = masters[owner], masters[dst_port]
    dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[owner])
    src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[dst_port])
    for k in src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000):
        src.execute_command("MIGRATE", "127.0.0.1", dst_port, k, 0, 5000)

    def done() -> None:
        for m in masters.values():
            m.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[dst_port])
            m.close()
    finish(done)


def test_an_append_after_a_reshard_follows_the_move(servers: RedisClusterServers,
                                                     client: redis.Redis) -> None:
    """The slot map the client holds goes stale (MOVED): the append is sent again to
    the new owner and lands once; the chain verifies."""
    store = EventStore(client)
    w = store.open("a")
    _move_slot(client, servers, store.keys.log(w.saga_id))
    call = w.prepare([(K.STEP_INTENT, {"step": 0, "tool": "t"})])
    p = lean(client)
    call.send(p)
    p.set(store.keys.lease(w.saga_id), "x")
    w.applied(call, p.execute(raise_on_error=False)[0])
    assert store.log.head(w.saga_id).seq == 1
    assert Verifier(store.log).verify(w.saga_id).ok


def test_an_append_during_its_slots_migration_lands_once_it_is_over(
        servers: RedisClusterServers, client: redis.Redis) -> None:
    """Mid-migration the old owner answers ASK and the new one TRYAGAIN (the saga's
    keys are not all there yet): the append waits it out, then lands once."""
    store = EventStore(client)
    w = store.open("a")
    timer: list[threading.Timer] = []
    _move_slot(client, servers, store.keys.log(w.saga_id),
               finish=lambda done: timer.append(threading.Timer(0.5, done)))
    timer[0].start()
    call = w.prepare([(K.STEP_INTENT, {"step": 0, "tool": "t"})])
    p = lean(client)
    call.send(p)
    w.applied(call, p.execute(raise_on_error=False)[0])
    timer[0].join()
    assert store.log.head(w.saga_id).seq == 1
    assert Verifier(store.log).verify(w.saga_id).ok


def test_an_append_sent_again_recognises_its_own_success(client: redis.Redis,
                                                         servers: RedisClusterServers) -> None:
    """The first send went through but its reply was lost: the second says so, not conflict."""
    store = EventStore(client)
    w = store.open("a")
    call = w.prepare([(K.STEP_INTENT, {"step": 0, "tool": "t"})])
    call.send(client)
    p = lean(client)
    call.send(p)
    head = call.result(p.execute(raise_on_error=False)[0])
    assert head.seq == 1


def test_group_commit_sends_a_cluster_batch_alone_and_fail_fast_answers(
        servers: RedisClusterServers, client: redis.Redis) -> None:
    """Group commit shares one connection, so a cluster's batch (a round trip per
    node) goes alone, with its own replies; fail_fast answers."""
    other = redis.Redis()  # a pool the cluster's batch is not on
    sends = Sends(other.connection_pool)

    def work() -> Work[list[Any]]:
        pipe = lean(client)
        pipe.set("a", "1")
        pipe.set("b", "2")
        pipe.incr("a")
        return (yield Send(pipe))

    async def main() -> list[Any]:
        with ThreadPoolExecutor(1) as pool:
            return await adrive(work(), Invoker(), pool, sends)
    assert asyncio.run(main()) == [True, True, 2]
    assert sends.rounds == 0
    quick = fail_fast(client)
    assert quick.ping()
    quick.close()


def test_the_queue_gauges_read_the_queues_redis(servers: RedisClusterServers,
                                                client: redis.Redis,
                                                queues: redis.Redis) -> None:
    """Queue depth comes from RQ's own Redis, not the cluster (which holds no queue)."""
    from prometheus_client import CollectorRegistry

    from saga_store.execution import jobs
    from saga_store.execution.enqueue import enqueue_step
    from saga_store.ops.metrics import RedisCollector
    enqueue_step(queues, jobs.STEP_QUEUE, "a-1", 0, 1, "k" * 16)
    registry = CollectorRegistry()
    registry.register(RedisCollector(client, rq_redis=queues))
    assert registry.get_sample_value("saga_queue_depth", {"queue": jobs.STEP_QUEUE}) == 1
    assert registry.get_sample_value("saga_redis_up") == 1


def test_doctor_reads_every_master_of_a_cluster(servers: RedisClusterServers,
                                              client: redis.Redis) -> None:
    """Each master's persistence is reported under its name."""
    from saga_store.ops.doctor import examine
    found = examine(client)
    aof = [f for f in found if f.setting.endswith(" appendonly")]
    assert sorted(f.setting.split()[0] for f in aof) == sorted(
        f"127.0.0.1:{n.port}" for n in servers.masters())
    assert all(f.ok for f in found), found
    from saga_store.ops.doctor import persistent
    assert persistent(found)
    node = aof[0].setting.split()[0]
    assert not persistent([f for f in found if not f.setting.startswith(f"{node} appendf")])


def test_the_durability_watch_reads_every_master_of_a_cluster(
        servers: RedisClusterServers, client: redis.Redis) -> None:
    """One master of three turning AOF off makes the log not durable, and the
    finding names that master (the watch read one node only)."""
    from saga_store.ops.durability import DurabilityWatch
    watch = DurabilityWatch(client)
    assert watch.check()
    for victim in servers.masters():
        node = redis.Redis(port=victim.port)
        node.config_set("appendonly", "no")
        try:
            assert not watch.check()
            bad = [f.setting for f in watch.findings if not f.ok]
            assert bad == [f"127.0.0.1:{victim.port} appendonly"]
        finally:
            node.config_set("appendonly", "yes")
            node.close()
        assert watch.check()


def test_a_watched_repair_of_the_cached_state_runs_on_a_cluster(
        servers: RedisClusterServers, client: redis.Redis) -> None:
    """rebuild_meta's WATCH/MULTI keeps to the saga's slot: a cache changed by hand
    is put back to the fold of the log."""
    store = EventStore(client)
    w = store.open("a")
    client.hset(store.keys.meta(w.saga_id), "state", "committed")
    assert store.rebuild_meta(w.saga_id)["state"] == "running"
    assert store.meta(w.saga_id)["state"] == "running"
