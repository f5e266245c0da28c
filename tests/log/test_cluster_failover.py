"""Failover on a Redis Cluster under ``SAGA_WAIT_REPLICAS``: an append the old master
took but no replica holds is never reported done, whatever the cluster client
does with the WAIT that was cut off (a private six-node cluster: a master is
killed)."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
import redis

from saga_store import Registry, SagaStore, keys
from saga_store.errors import StoreUnavailable
from saga_store.execution.enqueue import in_flight
from saga_store.log.events import EventKind as K
from saga_store.log.layout import names_of
from saga_store.log.store import EventStore
from saga_store.ops.connection import connect
from saga_store.protocol.state import Status, fold
from saga_store.settings import Settings
from saga_store.testing import RedisServer, assert_eventually
from saga_store.testing.cluster import RedisClusterServers
from saga_store.testing.workers import workers

from ..ledger_tools import effects

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(180)]
TOOLS = "tests.ledger_tools"


def _node_of(servers: RedisClusterServers, client: Any, key: str) -> RedisServer:
    node = client.nodes_manager.get_node_from_slot(client.keyslot(key))
    return next(n for n in servers.live() if n.port == node.port)


def _replica_of(servers: RedisClusterServers, master: RedisServer) -> RedisServer:
    for node in servers.live():
        c = redis.Redis(port=node.port)
        try:
            role = c.execute_command("ROLE")
        finally:
            c.close()
        if role[0] == b"slave" and int(role[2]) == master.port:
            return node
    raise AssertionError(f"no replica of {master.port}")


def _waiting(master: RedisServer) -> bool:
    c = redis.Redis(port=master.port)
    try:
        return any(cl.get("cmd") == "wait" for cl in c.client_list())
    finally:
        c.close()


def test_a_wait_cut_off_by_a_failover_is_not_confirmed() -> None:
    """The replica's link is cut (SIGSTOP, then CLIENT KILL TYPE replica), an append
    lands on the master and its WAIT blocks; the master is SIGKILLed and the replica
    promoted. The append must not be reported done (before the fix the WAIT was
    sent again through the cluster client, answered at once by another master, and
    the append counted as confirmed while the promoted replica never had it)."""
    with RedisClusterServers() as servers:
        client = connect(servers.url)
        store = EventStore(client, Settings(wait_replicas=1, wait_timeout_ms=30_000))
        w = store.open("agent-f")
        w.append(K.STEP_INTENT, step=0, tool="charge")  # confirmed: the replica is linked
        master = _node_of(servers, client, names_of(client).log(w.saga_id))
        replica = _replica_of(servers, master)
        assert replica.proc is not None
        told: list[Any] = []  # the test's own ledger of what the client was told
        os.kill(replica.proc.pid, signal.SIGSTOP)
        try:
            m = redis.Redis(port=master.port)
            m.execute_command("CLIENT", "KILL", "TYPE", "replica")
            m.close()

            def append() -> None:
                try:
                    told.append(w.append(K.STEP_STARTED, step=0, attempt=1).seq)
                except Exception as exc:  # what it was told, whatever it is
                    told.append(exc)
            t = threading.Thread(target=append)
            t.start()
            assert_eventually(lambda: _waiting(master), timeout=20,
                              what="the append's WAIT to block on the master")
            master.kill()
        finally:
            os.kill(replica.proc.pid, signal.SIGCONT)
        t.join(90)
        assert not t.is_alive()
        servers.wait_ok(60)
        assert len(told) == 1
        assert isinstance(told[0], StoreUnavailable), f"the client was told {told[0]!r}"
        assert "not confirmed" in str(told[0])
        seqs = assert_eventually(
            lambda: [e["seq"] for e in EventStore(connect(servers.url)).log.bodies(w.saga_id)],
            timeout=30, what="the promoted replica to serve the saga",
            swallow=(redis.ConnectionError, redis.exceptions.ClusterDownError))
        # every append the client was told is done stands: 0 and 1 (confirmed before);
        # the cut-off one may stand or not (a resend may have put it on the new master)
        assert seqs[:2] == [0, 1]
        client.close()


def _on_other_masters(client: Any, agent: str) -> str:
    """A saga id of ``agent`` whose log is on another master than the agent's index
    of before (``ss:{<agent>_}:active``), as most of an agent's sagas are."""
    nodes = client.nodes_manager
    names = names_of(client)
    index_node = nodes.get_node_from_slot(client.keyslot(keys.agent_active(agent))).name
    for i in range(1000):
        sid = f"{agent}_order-{i}"
        if nodes.get_node_from_slot(client.keyslot(names.log(sid))).name != index_node:
            return sid
    raise AssertionError("every saga id landed on one master")


def test_a_close_lost_in_a_failover_leaves_no_saga_stranded(ledger: Path) -> None:
    """A client-driven saga commits while its master's replica is cut off; the
    master is SIGKILLed, the replica promoted: the close is lost, and the saga is
    back to running. It must still be in an index a sweeper reads, so that a worker
    finds it (its caller is gone) and unwinds it. Before, the agent's index lived on
    another master, kept the close's ZREM, and the saga was stranded for good."""
    with RedisClusterServers() as servers:
        client = connect(servers.url)
        store = SagaStore(client, Registry.from_modules(TOOLS),
                          Settings(client_lease_s=1.0, lease_ms=1000),
                          queues=connect(servers.queue_url))
        sid = _on_other_masters(client, "agent-s")
        master = _node_of(servers, client, names_of(client).log(sid))
        replica = _replica_of(servers, master)
        assert replica.proc is not None
        with store.saga(agent_id="agent-s", saga_id=sid, executor="inline") as saga:
            saga.call("reserve_inventory", {"sku": "S1", "qty": 1})
            os.kill(replica.proc.pid, signal.SIGSTOP)
            m = redis.Redis(port=master.port)
            m.execute_command("CLIENT", "KILL", "TYPE", "replica")
            m.close()
        assert store.state(sid).status is Status.COMMITTED  # on the master, not replicated
        master.kill()
        os.kill(replica.proc.pid, signal.SIGCONT)
        servers.wait_ok(60)
        fresh = connect(servers.url)
        back = assert_eventually(
            lambda: fold(sid, EventStore(fresh).log.bodies(sid)), timeout=30,
            what="the promoted replica to serve the saga",
            swallow=(redis.ConnectionError, redis.exceptions.ClusterDownError))
        assert back.status is Status.RUNNING  # the close was lost with the master
        assert sid in in_flight(fresh)  # a sweeper reads it (before: in no index)
        env = {**os.environ, "SAGA_REDIS_URL": servers.url, "SAGA_QUEUE_URL": servers.queue_url,
               "SAGA_TEST_LEDGER": str(ledger), "SAGA_LEASE_MS": "1000",
               "SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": "",
               "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        with workers(env, TOOLS):
            final = assert_eventually(
                lambda: (st := fold(sid, EventStore(fresh).log.bodies(sid))).final and st,
                timeout=60, what="a worker's sweeper to find the saga and unwind it")
        assert final.status is Status.COMPENSATED
        assert len(effects("reserve")) == 1
        assert len(effects("release")) == 1
        client.close()
        fresh.close()
