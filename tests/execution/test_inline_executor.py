"""The inline executor: ``store.saga(..., executor="inline")`` runs a saga's steps
and its unwind in the caller's process, with no worker running, through the
workers' own drivers; a process killed mid-step or mid-unwind is finished from
the log by a worker's sweeper, or by the next process's ``recover()``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from saga_store import Registry, SagaStore, Settings
from saga_store.errors import InvalidInput, StepError
from saga_store.execution import jobs
from saga_store.protocol.state import Status
from saga_store.testing import assert_eventually
from saga_store.testing.workers import workers
from saga_store.verify.checker import Verifier

from ..ledger_tools import effects

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
TOOLS = "tests.ledger_tools"
ROOT = str(Path(__file__).resolve().parents[2])


def _store(client: redis.Redis) -> SagaStore:
    return SagaStore(client, Registry.from_modules(TOOLS),
                     Settings(lease_ms=1000, client_lease_s=1.0))


def test_an_inline_saga_runs_and_unwinds_with_no_worker(client: redis.Redis,
                                                         ledger: Path) -> None:
    """No worker anywhere: a committed saga, a failed one unwound LIFO before the
    error reaches the caller, an aborted one; nothing is left queued; verify passes."""
    store = _store(client)
    with store.saga(agent_id="agent-i", executor="inline") as ok:
        got = ok.call("reserve_inventory", {"sku": "I1", "qty": 1})
        assert got["reservation_id"]
    bad = store.saga(agent_id="agent-i", executor="inline")
    bad.call("reserve_inventory", {"sku": "I2", "qty": 1})
    bad.call("reserve_inventory", {"sku": "I3", "qty": 1})
    with pytest.raises(StepError, match="boom"):
        bad.call("fail_always", {})
    with store.saga(agent_id="agent-i", executor="inline") as dropped:
        dropped.call("reserve_inventory", {"sku": "I4", "qty": 1})
        dropped.abort("changed my mind")
    assert store.state(ok.saga_id).status is Status.COMMITTED
    assert store.state(bad.saga_id).status is Status.COMPENSATED
    assert store.state(dropped.saga_id).status is Status.COMPENSATED
    assert [e[0] for e in effects()] == ["reserve"] * 3 + ["release"] * 2 + \
        ["reserve", "release"]
    assert [e[2] for e in effects("reserve")][:3] == ["I1x1", "I2x1", "I3x1"]
    for q in (jobs.STEP_QUEUE, jobs.COMPENSATION_QUEUE):
        assert client.llen(jobs.queue_key(q)) == 0
    assert Verifier(store.events.log).verify().ok


def test_an_unknown_executor_is_refused(client: redis.Redis) -> None:
    with pytest.raises(InvalidInput, match="executor"):
        _store(client).saga(agent_id="agent-i", executor="threads")


INLINE_CLIENT = """
import sys
from saga_store import Registry, SagaStore, Settings
store = SagaStore.from_url(sys.argv[1], Registry.from_modules("tests.ledger_tools"),
                           Settings(lease_ms=1000, client_lease_s=1.0))
with store.saga(agent_id="agent-i", executor="inline") as saga:
    print(saga.saga_id, flush=True)
    saga.call("reserve_inventory", {"sku": "K1", "qty": 1})
    saga.call("reserve_inventory", {"sku": "K2", "qty": 1})
    saga.call("fail_always", {})
"""


def _killed_at(point: str, at: int, redis_url: str, env: dict[str, str],
               tmp_path: Path) -> str:
    """Run the inline client until it kills itself at ``point``; its saga's id."""
    flag = tmp_path / f"flag-{point}"
    flag.touch()
    proc = subprocess.run([sys.executable, "-c", INLINE_CLIENT, redis_url],
                          env={**env, "SAGA_FAULT": point, "SAGA_FAULT_AT": str(at),
                               "SAGA_FAULT_ONCE": str(flag), "PYTHONPATH": ROOT},
                          capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not flag.exists()
    return proc.stdout.split()[0]


@pytest.mark.parametrize(("point", "at", "finisher"), [
    ("after_started", 2, "worker"),  # mid-step: the second reservation started, not run
    ("after_tool", 2, "recover"),  # the second reservation made, its outcome not logged
    ("comp_after_intent", 1, "worker"),  # mid-unwind: the first compensation begun
    ("comp_after_outcome", 1, "recover"),  # mid-unwind: one compensation done
])
def test_an_inline_process_killed_is_finished_from_the_log(
        client: redis.Redis, redis_url: str, worker_env: dict[str, str], ledger: Path,
        tmp_path: Path, point: str, at: int, finisher: str) -> None:
    """kill -9 of the inline process mid-step or mid-unwind: a worker's sweeper, or the
    next process's recover(), finishes the saga: every reservation made is released
    exactly once, last first."""
    env = {**worker_env, "SAGA_CLIENT_LEASE_S": "1"}
    sid = _killed_at(point, at, redis_url, env, tmp_path)
    store = _store(client)
    if finisher == "worker":
        with workers(env, TOOLS):
            state = store.wait(sid, timeout=60)
    else:
        assert_eventually(lambda: store.recover("agent-i") >= 0 and store.state(sid).final,
                          timeout=60, what="recover() to finish the saga")
        state = store.state(sid)
    assert state.status is Status.COMPENSATED
    reserved = [e[2] for e in effects("reserve")]
    released = [e[2] for e in effects("release")]
    assert len(released) == len(reserved) == len(set(released))
    assert [e[0] for e in effects()][-len(released):] == ["release"] * len(released)
    assert Verifier(store.events.log).verify().ok
    assert os.environ.get("SAGA_FAULT") is None  # the fault stayed in the child


def test_an_inline_step_waits_for_its_approval_then_runs_here(
        client: redis.Redis, ledger: Path, tmp_path: Path) -> None:
    """A gated call of an inline saga waits for a person; once approved (by another
    process, as 'saga approve' does), the caller runs it, once; nothing is queued
    for a worker that is not there."""
    import threading

    from saga_store.approval import requests as approvals
    from saga_store.approval.policy import Policy
    policy_file = tmp_path / "policy.toml"
    policy_file.write_text("")  # the safe defaults: an irreversible call needs a person
    store = SagaStore(client, Registry.from_modules(TOOLS),
                      Settings(lease_ms=1000, client_lease_s=30.0),
                      policy=Policy.load(str(policy_file)))
    saga = store.saga(agent_id="agent-i", executor="inline")
    got: list[object] = []
    caller = threading.Thread(target=lambda: got.append(
        saga.call("send_email", {"to": "ceo@example.com"})))
    caller.start()
    assert_eventually(lambda: approvals.pending(store), timeout=30, what="the approval")
    assert not effects("email")
    approvals.decide(store, saga.saga_id, 0, grant=True, by="alice")
    caller.join(30)
    assert got
    assert not caller.is_alive()
    saga.commit()
    assert len(effects("email")) == 1
    assert client.llen(jobs.queue_key(jobs.STEP_QUEUE)) == 0
    assert store.state(saga.saga_id).status is Status.COMMITTED
