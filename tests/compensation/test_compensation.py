"""Compensation: LIFO unwinding, exactly once, through kills; honest outcomes;
context sync and the rebuilt history."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import redis

from saga_store import keys
from saga_store.client.api import SagaStore
from saga_store.client.context import Subscriber, rebuild_history
from saga_store.execution import jobs
from saga_store.execution.enqueue import enqueue_step
from saga_store.log.events import EventKind as K
from saga_store.protocol.state import Status
from saga_store.testing import assert_eventually
from saga_store.testing.workers import kill_at, workers
from saga_store.verify.checker import Verifier

from ..ledger_tools import effects

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
TOOLS = "tests.ledger_tools"
ROOT = Path(__file__).resolve().parents[2]
CARD = "4111111111111111"
SEED = [
    {"tool": "reserve_inventory", "args": {"sku": "LAPTOP-15", "qty": 1}, "tool_call_id": "call_1"},
    {"tool": "charge_payment", "args": {"amount_cents": 1_200_000, "card_number": CARD},
     "tool_call_id": "call_2"},
    {"tool": "update_crm_record", "args": {"customer": "cus_42", "note": "slow"},
     "tool_call_id": "call_3"},
    {"tool": "send_notification", "args": {"to": "ana@example.com"}, "tool_call_id": "call_4"},
    {"tool": "emit_webhook", "args": {"event": "order.placed"}, "tool_call_id": "call_5"},
]
THREE_THEN_FAIL = [{"tool": "reserve_inventory", "args": {"sku": f"S{i}", "qty": 1}}
                   for i in range(3)] + [{"tool": "fail_always", "args": {}}]


def comp_order(store: SagaStore, sid: str) -> list[int]:
    return [e["step"] for e in store.events.log.events(sid)
            if e["kind"] == K.COMPENSATION_SUCCEEDED]


@pytest.mark.cluster
def test_seed_order_crm_timeout_is_unwound_and_the_agent_told(
        saga_store: SagaStore, client: redis.Redis, worker_env: dict[str, str],
        ledger: Path) -> None:
    """CRM times out (the probe says it never happened): refund, then release; the
    rebuilt history shows both calls rolled back and no 'payment confirmed' left."""
    sub = Subscriber(client, "agent-order", last_id="0", block_ms=100)
    sid = saga_store.submit(SEED, agent_id="agent-order", conversation_id="conv-7")
    events: list[dict[str, object]] = []
    with workers(worker_env, TOOLS):
        state = saga_store.wait(sid, timeout=60)
        assert_eventually(lambda: events.extend(sub.poll()) or (events[-1:] and
                          events[-1]["kind"] == "saga_closed"), timeout=10, what="saga_closed")
    assert state.status is Status.COMPENSATED
    assert state.steps[2].status == "failed"  # settled by the probe: it never happened
    assert [e[0] for e in effects()] == ["reserve", "charge", "refund", "release"]
    assert comp_order(saga_store, sid) == [1, 0]
    assert 3 not in state.steps  # nothing ran after the failure
    for fmt in ("openai", "anthropic"):
        history = rebuild_history([state], fmt)
        text = orjson.dumps(history).decode()
        assert "payment confirmed" not in text
        assert text.count("rolled back") == 2
        assert CARD not in text
        assert history == rebuild_history([saga_store.state(sid)], fmt)  # deterministic
    openai = rebuild_history([state], "openai")
    calls = [m["tool_calls"][0]["id"] for m in openai if m["role"] == "assistant"]
    results = [m["tool_call_id"] for m in openai if m["role"] == "tool"]
    assert calls == results == ["call_1", "call_2", "call_3"]  # every call has its result
    assert "compensated" in openai[-1]["content"]
    anthropic = rebuild_history([state], "anthropic")
    assert anthropic[-1]["content"][-1]["type"] == "text"
    assert [e["kind"] for e in events] == ["observed", "observed", "retracted", "retracted",
                                           "saga_closed"]
    assert {e["conversation_id"] for e in events} == {"conv-7"}
    assert events[2]["tool_call_id"] == "call_2"
    assert Verifier(saga_store.events.log).verify().ok


POINTS = ["comp_after_dequeue", "comp_after_intent", "in_comp_tool", "comp_after_tool",
          "comp_after_outcome"]


@pytest.mark.parametrize("at", [1, 2, 3], ids=["last-step", "middle-step", "first-step"])
@pytest.mark.parametrize("point", POINTS)
def test_compensator_killed_resumes_exactly_once_in_reverse(
        saga_store: SagaStore, worker_env: dict[str, str], ledger: Path, tmp_path: Path,
        point: str, at: int) -> None:
    """kill -9 at each compensator fault point, at each step of the unwind: a new
    worker finishes it; every step compensated exactly once, strictly LIFO."""
    if point == "comp_after_dequeue" and at > 1:
        pytest.skip("the compensator is dequeued once per unwind")
    sid = saga_store.submit(THREE_THEN_FAIL, agent_id="agent-c")
    kill_at(worker_env, TOOLS, point, tmp_path, at)
    with workers(worker_env, TOOLS):
        state = saga_store.wait(sid, timeout=60)
    assert state.status is Status.COMPENSATED
    assert comp_order(saga_store, sid) == [2, 1, 0]
    assert len(effects("release")) == 3  # one per reservation, whatever was retried
    reserved = {e[2] for e in effects("reserve")}
    assert len(reserved) == 3
    assert Verifier(saga_store.events.log).verify().ok


@pytest.mark.cluster
def test_compensator_killed_twice(saga_store: SagaStore, worker_env: dict[str, str],
                                  ledger: Path, tmp_path: Path, worker_kind: str) -> None:
    """A second kill during recovery: the third worker still finishes exactly once."""
    sid = saga_store.submit(THREE_THEN_FAIL, agent_id="agent-c")
    kill_at(worker_env, TOOLS, "comp_after_tool", tmp_path, at=2)
    kill_at(worker_env, TOOLS, "comp_after_intent", tmp_path, at=1)  # during the recovery
    with workers(worker_env, TOOLS):
        state = saga_store.wait(sid, timeout=60)
    assert state.status is Status.COMPENSATED
    assert comp_order(saga_store, sid) == [2, 1, 0]
    assert len(effects("release")) == 3
    assert Verifier(saga_store.events.log).verify().ok


def test_a_failing_compensation_gets_stuck_then_resumes(
        saga_store: SagaStore, worker_env: dict[str, str], ledger: Path,
        redis_url: str) -> None:
    broken = Path(str(ledger) + ".release-fails")
    broken.touch()
    sid = saga_store.submit(THREE_THEN_FAIL[2:], agent_id="agent-s")
    with workers(worker_env, TOOLS):
        state = saga_store.wait(sid, timeout=60)
        assert state.status is Status.STUCK
        assert "unavailable" in str(state.reason)
        broken.unlink()
        out = subprocess.run([sys.executable, "-m", "saga_store.cli.main", "resume", sid],
                             env=worker_env,
                             capture_output=True, timeout=60, check=False)
        assert out.returncode == 0, out.stderr
        state = saga_store.wait(sid, timeout=60)
    assert state.status is Status.COMPENSATED
    fails = [e for e in saga_store.events.log.events(sid) if e["kind"] == K.COMPENSATION_FAILED]
    assert len(fails) == 3  # the policy's bounded retries, with backoff, before 'stuck'
    assert Verifier(saga_store.events.log).verify().ok


def test_the_agent_hears_of_a_retraction_before_the_unwind_gets_stuck(
        saga_store: SagaStore, client: redis.Redis, worker_env: dict[str, str],
        ledger: Path) -> None:
    """The refund succeeds, the release keeps failing: by the time the saga is stuck
    the agent's stream already says the payment was retracted (it must not wait for
    a close that may be days away)."""
    Path(str(ledger) + ".release-fails").touch()
    sub = Subscriber(client, "agent-stuck", last_id="0", block_ms=100)
    sid = saga_store.submit(SEED, agent_id="agent-stuck")
    with workers(worker_env, TOOLS):
        state = saga_store.wait(sid, timeout=60)
    assert state.status is Status.STUCK
    events = sub.poll()  # once: no waiting for anything later
    assert [e["kind"] for e in events] == ["observed", "observed", "retracted"]
    assert (events[2]["tool"], events[2]["undone_by"]) == ("charge_payment", "refund_payment")
    assert Verifier(saga_store.events.log).verify().ok


def test_an_irreversible_step_leaves_the_saga_needing_attention(
        saga_store: SagaStore, client: redis.Redis, worker_env: dict[str, str],
        ledger: Path, redis_url: str) -> None:
    sid = saga_store.submit([THREE_THEN_FAIL[0],
                             {"tool": "send_email", "args": {"to": "x@example.com"}},
                             {"tool": "fail_always", "args": {}}], agent_id="agent-i")
    with workers(worker_env, TOOLS):
        state = saga_store.wait(sid, timeout=60)
    assert state.status is Status.NEEDS_ATTENTION
    assert state.steps[1].compensation == "not_compensable"
    assert state.steps[0].compensation == "succeeded"
    out = subprocess.run([sys.executable, "-m", "saga_store.cli.main", "ls", "--state",
                          "needs_attention",
                          "--json"], env={**sys_env(), "SAGA_REDIS_URL": redis_url},
                         capture_output=True, timeout=60, check=False)
    assert [r["saga_id"] for r in orjson.loads(out.stdout)] == [sid]


def test_a_forward_step_delivered_after_unwinding_began_is_refused(
        saga_store: SagaStore, client: redis.Redis, worker_env: dict[str, str],
        ledger: Path) -> None:
    """The job of a step that never started, arriving after an abort, does nothing."""
    saga = saga_store.saga(agent_id="agent-f")
    spec = saga_store.registry.get("reserve_inventory")
    from saga_store.execution.enqueue import intent
    item = intent(saga.saga_id, 0, spec, {"sku": "Z", "qty": 1}, "c0")
    saga.writer.append_many([item])
    intent_seq = saga.writer.head.seq
    saga.abort("the user cancelled")
    enqueue_step(client, jobs.STEP_QUEUE, saga.saga_id, 0, intent_seq, item[1]["idem_key"])
    with workers(worker_env, TOOLS):
        state = saga_store.wait(saga.saga_id, timeout=60)
    assert state.status is Status.COMPENSATED
    assert effects("reserve") == []
    assert state.steps[0].status == "failed"
    assert Verifier(saga_store.events.log).verify().ok


def test_context_cli_formats(saga_store: SagaStore, worker_env: dict[str, str], ledger: Path,
                             redis_url: str) -> None:
    sid = saga_store.submit(THREE_THEN_FAIL[2:], agent_id="agent-x")
    with workers(worker_env, TOOLS):
        saga_store.wait(sid, timeout=60)
    env = {**sys_env(), "SAGA_REDIS_URL": redis_url}
    for args in (["--saga", sid, "--format", "anthropic"], ["--agent", "agent-x"]):
        out = subprocess.run([sys.executable, "-m", "saga_store.cli.main", "context", *args],
                             env=env,
                             capture_output=True, timeout=60, check=False)
        assert out.returncode == 0, out.stderr
        assert b"rolled back" in out.stdout
    plain = subprocess.run([sys.executable, "-m", "saga_store.cli.main", "context", "--saga", sid,
                            "--format", "plain"], env=env, capture_output=True, timeout=60,
                           check=False)
    assert b"retracted" in plain.stdout


def sys_env() -> dict[str, str]:
    import os
    return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}


def test_a_forged_log_drives_no_compensation(client: redis.Redis,
                                             worker_env: dict[str, str],
                                             ledger: Path) -> None:
    """Someone who can write Redis but lacks the workers' HMAC key writes a 'failed'
    saga whose reservation is a victim's, and queues its unwind: the compensator
    finds the chain does not verify and undoes nothing."""
    from saga_store import Registry, Settings
    from saga_store.execution.enqueue import enqueue_compensation
    from saga_store.protocol import build
    from saga_store.protocol.vocab import OutcomeKind
    forger = SagaStore(client, Registry.from_modules(TOOLS),
                       Settings(hmac_key=b"not-the-workers-key-0123456789ab"))
    w = forger.events.open("agent-f")
    w.append_many([
        build.step_intent(0, "reserve_inventory", {"sku": "S", "qty": 1}, "compensable",
                          None, "k0"),
        build.step_started(0, 1),
        build.step_outcome(0, OutcomeKind.SUCCEEDED,
                           result={"reservation_id": "VICTIMS-RESERVATION"}),
        build.saga_failed("forged")])
    enqueue_compensation(client, w.saga_id)
    env = {**worker_env, "SAGA_HMAC_KEY": "the-workers-own-key-0123456789abc"}
    with workers(env, TOOLS):
        job = jobs.job_key(jobs.compensation_job_id(w.saga_id))
        # acknowledged: the compensator ran and returned (the ack shortens the job's TTL)
        assert_eventually(lambda: 0 < client.ttl(job) <= jobs.ACKED_JOB_TTL_S, timeout=30,
                          what="the compensation job to be run and acknowledged")
    assert effects("release") == []
    assert forger.state(w.saga_id).status is Status.COMPENSATING  # nothing was appended


def test_a_projection_set_by_hand_does_not_stop_the_unwind(
        saga_store: SagaStore, client: redis.Redis, worker_env: dict[str, str],
        ledger: Path, tmp_path: Path) -> None:
    """Someone sets the saga's cached phase to closed (and its state to committed)
    between two compensations: the append script decides by the log's own phase,
    so the unwind still finishes, every step undone once, LIFO; the sweeper puts
    the cache back, and verify passes once it has."""
    sid = saga_store.submit(THREE_THEN_FAIL, agent_id="agent-c")
    kill_at(worker_env, TOOLS, "comp_after_outcome", tmp_path, at=1)
    client.hset(saga_store.events.keys.meta(sid),
                mapping={"phase": "closed", "state": "committed", "agent_id": "victim"})
    with workers(worker_env, TOOLS):
        state = saga_store.wait(sid, timeout=30)
    assert state.status is Status.COMPENSATED
    # whose context hears of the unwind comes from the log, not from the cache
    assert client.xlen(keys.agent_ctx("victim")) == 0
    assert client.xlen(keys.agent_ctx("agent-c")) > 0
    assert comp_order(saga_store, sid) == [2, 1, 0]
    assert len(effects("release")) == 3
    assert Verifier(saga_store.events.log).verify().ok


def test_verify_reports_a_projection_or_a_phase_stamp_changed_by_hand(
        saga_store: SagaStore, client: redis.Redis, worker_env: dict[str, str],
        ledger: Path) -> None:
    """The cache disagreeing with the log, and an entry's phase stamp rewritten (the
    chain's bytes untouched), are each reported; the sweeper rebuilds the cache."""
    from saga_store.workers.sweeper import Sweeper
    sid = saga_store.submit(THREE_THEN_FAIL, agent_id="agent-c")
    with workers(worker_env, TOOLS):
        saga_store.wait(sid, timeout=60)
    meta = saga_store.events.keys.meta(sid)
    client.hset(meta, "state", "running")
    bad = Verifier(saga_store.events.log).verify(sid)
    assert [(f.chain_id, f.reason) for f in bad.failures] == [(sid, "projection")]
    client.zadd(saga_store.events.keys.active(sid), {sid: 0})
    sweeper = Sweeper(saga_store, "test")
    # a pass looks at the buckets whose sweep lease it takes: the workers' lapse soon
    assert_eventually(lambda: sweeper.sweep() >= 0 and client.hget(meta, "state")
                      == b"compensated", timeout=10, what="a sweep to rebuild the cache")
    assert Verifier(saga_store.events.log).verify(sid).ok
    # the last entry put back with another phase stamp: same body, same hash
    log_key = saga_store.events.keys.log(sid)
    (eid, fields), (before, _) = client.xrevrange(log_key, count=2)
    assert fields[b"p"] == b"closed"
    client.xdel(log_key, eid)
    client.execute_command("XSETID", log_key, before)
    client.xadd(log_key, {b"b": fields[b"b"], b"h": fields[b"h"], b"p": b"forward"}, id=eid)
    bad = Verifier(saga_store.events.log).verify(sid)
    assert [(f.chain_id, f.reason) for f in bad.failures] == [(sid, "phase_mismatch")]


ABANDONING_CLIENT = """
import sys, time
from saga_store import Registry, SagaStore, Settings
store = SagaStore.from_url(sys.argv[1], Registry.from_modules("tests.ledger_tools"))
saga = store.saga(agent_id="agent-gone")
saga.call("reserve_inventory", {"sku": "GONE", "qty": 1})
print(saga.saga_id, flush=True)
time.sleep(600)  # killed here: the saga is neither committed nor aborted
"""


def test_a_client_driven_saga_whose_caller_died_is_aborted_and_unwound(
        saga_store: SagaStore, client: redis.Redis, redis_url: str,
        worker_env: dict[str, str], ledger: Path) -> None:
    """kill -9 of the caller inside ``with store.saga()``, after one call: once its
    client lease lapses the sweeper aborts the saga and the reservation is
    released, once."""
    env = {**worker_env, "SAGA_CLIENT_LEASE_S": "1"}
    with workers(env, TOOLS):
        proc = subprocess.Popen([sys.executable, "-c", ABANDONING_CLIENT, redis_url],
                                env=env, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            assert proc.stdout is not None
            sid = proc.stdout.readline().strip()
            assert sid, "the client did not get its call done"
        finally:
            proc.kill()
            proc.wait()
        state = saga_store.wait(sid, timeout=30)
    assert state.status is Status.COMPENSATED
    assert "abandoned" in str(state.reason)
    assert [e[0] for e in effects()] == ["reserve", "release"]
    assert Verifier(saga_store.events.log).verify().ok


def test_a_caller_that_waits_or_keeps_alive_is_not_taken_for_gone(
        client: redis.Redis, worker_env: dict[str, str], ledger: Path) -> None:
    """A 1 s client lease: a step that takes 2.5 s, then 2.5 s of thinking with a
    keepalive in the middle; the sweeper leaves the saga alone and it commits."""
    import time

    from saga_store import Registry, Settings
    store = SagaStore(client, Registry.from_modules(TOOLS), Settings(client_lease_s=1.0))
    with workers({**worker_env, "SAGA_CLIENT_LEASE_S": "1"}, TOOLS), \
            store.saga(agent_id="agent-slow") as saga:
        saga.call("slow_noop", {"seconds": 2.5})
        for _ in range(5):
            time.sleep(0.5)
            saga.keepalive()
        saga.call("noop", {"n": 1})
    assert store.state(saga.saga_id).status is Status.COMMITTED
