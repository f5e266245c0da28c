"""Submitting is idempotent under a saga id the caller chose: a plan sent again after
a "not confirmed" error, a lost reply or a crash attaches to the saga that stands,
and never runs twice; another plan under that id is refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import redis

from saga_store import Registry, SagaStore
from saga_store.errors import InvalidInput, StoreUnavailable
from saga_store.protocol.state import Status
from saga_store.settings import Settings
from saga_store.testing import assert_eventually
from saga_store.testing.workers import workers

from ..ledger_tools import effects
from ..log.test_wait_replicas import _linked, master_and_replica, stopped

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
TOOLS = "tests.ledger_tools"
PLAN = [{"tool": "reserve_inventory", "args": {"sku": "R1", "qty": 1}},
        {"tool": "bill", "args": {"amount_cents": 500}}]
CARD_PLAN = [{"tool": "charge_payment",
              "args": {"amount_cents": 700, "card_number": "4111111111111111"}}]


def _contents(client: redis.Redis) -> dict[bytes, bytes | None]:
    return {k: client.dump(k) for k in client.scan_iter(count=1000)}


def test_the_same_plan_submitted_again_attaches_and_runs_once(
        saga_store: SagaStore, client: redis.Redis, worker_env: dict[str, str],
        ledger: Path) -> None:
    """The second submit of one plan under one id returns that id and writes
    nothing; the plan runs once. Another plan, another agent or another
    conversation under the id is refused."""
    sid = saga_store.submit(PLAN, agent_id="agent-r", saga_id="ORDER-R1")
    before = _contents(client)
    assert saga_store.submit(PLAN, agent_id="agent-r", saga_id="ORDER-R1") == sid
    assert _contents(client) == before
    other = [PLAN[0], {"tool": "bill", "args": {"amount_cents": 900}}]
    for plan, agent, conv in ((other, "agent-r", None), (PLAN, "agent-s", None),
                              (PLAN, "agent-r", "conv-2")):
        with pytest.raises(InvalidInput, match="another plan"):
            saga_store.submit(plan, agent_id=agent, conversation_id=conv, saga_id="ORDER-R1")
    assert _contents(client) == before
    with workers(worker_env, TOOLS):
        assert saga_store.wait(sid, timeout=30).status is Status.COMMITTED
    assert saga_store.submit(PLAN, agent_id="agent-r", saga_id="ORDER-R1") == sid
    assert len(effects("bill")) == 1


def test_a_secret_argument_is_compared_while_the_saga_keeps_it(
        saga_store: SagaStore, client: redis.Redis) -> None:
    """Another card under the same id is another plan while the saga is open (its
    salt still kept), not the same one."""
    sid = saga_store.submit(CARD_PLAN, agent_id="agent-r", saga_id="ORDER-R2")
    assert saga_store.submit(CARD_PLAN, agent_id="agent-r", saga_id="ORDER-R2") == sid
    other_card = [{"tool": "charge_payment",
                   "args": {"amount_cents": 700, "card_number": "4999999999999999"}}]
    with pytest.raises(InvalidInput, match="another plan"):
        saga_store.submit(other_card, agent_id="agent-r", saga_id="ORDER-R2")


def test_a_submit_not_confirmed_is_resubmitted_safely(ledger: Path) -> None:
    """SAGA_WAIT_REPLICAS=1 with the replica cut off: the submit is not confirmed
    and says to submit again under its saga id; once the replica is back, doing so
    attaches to the saga, which runs once (before, the resubmit was refused as
    "already exists", and the documented retry under a new id ran it twice)."""
    with master_and_replica() as (master, replica):
        env = {**os.environ, "SAGA_REDIS_URL": master.url, "SAGA_TEST_LEDGER": str(ledger),
               "SAGA_LEASE_MS": "1000", "SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": "",
               "SAGA_WAIT_REPLICAS": "1", "SAGA_WAIT_TIMEOUT_MS": "300",
               "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        client = redis.Redis.from_url(master.url)
        store = SagaStore(client, Registry.from_modules(TOOLS), Settings.from_env(env))
        m = redis.Redis(port=master.port)
        with stopped(replica):
            m.execute_command("CLIENT", "KILL", "TYPE", "replica")
            with pytest.raises(StoreUnavailable, match="not confirmed") as told:
                store.submit(PLAN, agent_id="agent-r", saga_id="PAY-1")
        assert "saga_id=PAY-1" in str(told.value)
        r = redis.Redis(port=replica.port)
        assert_eventually(lambda: _linked(m, r), timeout=30, what="the replica to relink")
        assert store.submit(PLAN, agent_id="agent-r", saga_id="PAY-1") == "PAY-1"
        with workers(env, TOOLS):
            assert store.wait("PAY-1", timeout=60).status is Status.COMMITTED
        assert len(effects("bill")) == 1
        for c in (m, r, client):
            c.close()


def test_a_submit_sent_again_is_not_confirmed_while_no_replica_holds_the_saga() -> None:
    """SAGA_WAIT_REPLICAS=1, the replica stopped and cut off: the submit is not
    confirmed, and neither is the same plan sent again, which finds the saga on the
    master only; the master is then SIGKILLed and the replica promoted, and the saga
    is not there. Before, the second submit attached and returned the saga id (its
    WAIT's shortfall ignored for an open that wrote nothing): a saga the client was
    told stands was lost in the failover (found by the cluster chaos soak's
    replica-lag failovers)."""
    with master_and_replica() as (master, replica):
        client = redis.Redis.from_url(master.url)
        store = SagaStore(client, Registry.from_modules(TOOLS),
                          Settings(wait_replicas=1, wait_timeout_ms=300))
        m = redis.Redis(port=master.port)
        told: list[object] = []  # what the client was told, submit by submit
        with stopped(replica):
            m.execute_command("CLIENT", "KILL", "TYPE", "replica")
            for _ in range(2):
                try:
                    told.append(store.submit(PLAN, agent_id="agent-r", saga_id="PAY-2"))
                except StoreUnavailable as exc:
                    told.append(exc)
            master.kill()
        r = redis.Redis(port=replica.port)
        r.execute_command("REPLICAOF", "NO", "ONE")  # promoted, as a failover would
        promoted = SagaStore(r, Registry.from_modules(TOOLS), Settings())
        assert promoted.events.log.head("PAY-2").empty  # the opening was on the master only
        assert all(isinstance(t, StoreUnavailable) and "not confirmed" in str(t)
                   and "saga_id=PAY-2" in str(t) for t in told), told
        for c in (m, r, client):
            c.close()


def test_a_submit_sent_again_on_a_new_connection_is_not_confirmed_while_the_replica_lags(
        ) -> None:
    """The replica stopped but still connected (lagging): the submit is not confirmed,
    and the same plan sent again from another client (a new connection, as after a
    reply lost with its connection) is not either. A WAIT covers what its own
    connection wrote; a refused open writes nothing, so on a new connection the WAIT
    answered at once with the replicas connected, however far behind, and the
    client was told a saga on the master only stands."""
    with master_and_replica() as (master, replica):
        settings = Settings(wait_replicas=1, wait_timeout_ms=300)
        told: list[object] = []
        clients = []
        with stopped(replica):
            for _ in range(2):  # each send from a client of its own
                client = redis.Redis.from_url(master.url)
                clients.append(client)
                store = SagaStore(client, Registry.from_modules(TOOLS), settings)
                try:
                    told.append(store.submit(PLAN, agent_id="agent-r", saga_id="PAY-3"))
                except StoreUnavailable as exc:
                    told.append(exc)
        assert all(isinstance(t, StoreUnavailable) and "not confirmed" in str(t)
                   for t in told), told
        for c in clients:
            c.close()
