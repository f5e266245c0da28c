"""A step's outcome is recorded only behind its own intent. After a failover rolls a
saga's log back behind a running step (its intent gone), the worker that ran the
step must not append the outcome on whatever the log holds now: that would chain a
success for a step that never stood, and the saga would go on to commit on it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import redis

from saga_store import Registry, SagaStore, Settings
from saga_store.log.events import EventKind as K
from saga_store.testing import assert_eventually
from saga_store.testing.workers import workers
from saga_store.verify.checker import Verifier

from ..host_tools import effects, gate

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
TOOLS = "tests.host_tools"


def test_an_outcome_whose_intent_was_rolled_back_is_not_appended(
        client: redis.Redis, queues: redis.Redis, worker_env: dict[str, str],
        ledger: Path, tmp_path: Path, worker_kind: str) -> None:
    saga_store = SagaStore(client, Registry.from_modules(TOOLS), Settings(lease_ms=1000),
                           queues=queues)
    held = gate(socket.gethostname())
    held.touch()
    sid = saga_store.submit([{"tool": "reserve_inventory", "args": {"sku": "L", "qty": 1}},
                             {"tool": "host_hold", "args": {}}], agent_id="agent-l")
    log_file = tmp_path / "worker.log"
    with workers(worker_env, TOOLS, "--log-level", "INFO", log=log_file):
        assert_eventually(lambda: effects("started"), timeout=30,
                          what="step 1's call to start")
        # the log rolled back behind step 1, as a failover with a lagging replica does:
        # its intent and step_started are gone, step 0's outcome is the head again
        key = saga_store.events.keys.log(sid)
        events = saga_store.events.log.events(sid)
        intent = next(e["seq"] for e in events
                      if e["kind"] == K.STEP_INTENT and e["step"] == 1)
        rows = client.xrange(key)
        for eid, _ in rows[intent:]:
            client.xdel(key, eid)
        client.execute_command("XSETID", key, rows[intent - 1][0])
        held.unlink()

        def settled() -> bool:
            step1 = [e for e in saga_store.events.log.events(sid) if e.get("step") == 1]
            return bool(step1) or "no longer in the log" in log_file.read_text()
        assert_eventually(settled, timeout=30, what="the worker to settle the call")
    after = saga_store.events.log.events(sid)
    assert [e["kind"] for e in after if e.get("step") == 1] == [], \
        "an outcome was chained for a step whose intent is gone"
    assert "no longer in the log" in log_file.read_text()
    assert Verifier(saga_store.events.log).verify(sid).ok
    assert len(effects("held")) == 1  # the call ran once: its effect stands in the world


def test_an_eager_step_whose_outcome_append_loses_the_race_still_records_it(
        client: redis.Redis, queues: redis.Redis, worker_env: dict[str, str],
        ledger: Path, tmp_path: Path, worker_kind: str) -> None:
    """The other side: the log moved on behind a running step (a note appended, as a
    duplicate delivery writes) but its intent stands. The worker that ran the step
    eagerly (its intent the one it appended itself) re-reads, finds the same
    intent, and records the outcome: one success, the saga commits."""
    saga_store = SagaStore(client, Registry.from_modules(TOOLS), Settings(lease_ms=1000),
                           queues=queues)
    held = gate(socket.gethostname())
    held.touch()
    sid = saga_store.submit([{"tool": "reserve_inventory", "args": {"sku": "E", "qty": 1}},
                             {"tool": "host_hold", "args": {}}], agent_id="agent-e")
    with workers(worker_env, TOOLS):
        assert_eventually(lambda: effects("started"), timeout=30,
                          what="step 1's call to start")
        saga_store.events.writer(sid).append(K.STEP_DUPLICATE_SUPPRESSED, step=1,
                                             data={"outcome": "in_flight"})
        held.unlink()
        final = saga_store.wait(sid, timeout=30)
    assert str(final.status) == "committed"
    kinds = [e["kind"] for e in saga_store.events.log.events(sid) if e.get("step") == 1]
    assert kinds.count(K.STEP_SUCCEEDED) == 1
    assert len(effects("started")) == 1  # recorded by the worker that ran it: no re-run
    assert Verifier(saga_store.events.log).verify(sid).ok
