"""A step's lease lives as long as its worker works on it: a tool whose tries
(and the back-offs between them) outlast the lease runs on one worker only,
whatever the kind of worker or tool, while a worker killed mid-retry still
has its step redelivered once the lease lapses. Overlaps are read from the
test's own ledger (every try's pid, start and end), never from the log."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
from saga_store.workers.invoke import Call, Send
from saga_store.workers.step import StepRunner

from saga_store import Registry, SagaStore, Settings
from saga_store.log.events import EventKind as K
from saga_store.protocol.state import Status
from saga_store.testing import assert_eventually
from saga_store.testing.workers import WorkerProcess
from saga_store.verify.checker import Verifier

from ..ledger_tools import effects
from ..timing_tools import overlapping, tries

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
TOOLS = "tests.timing_tools"
LEASE_MS = 600
TRY_S = 1.0  # each try outlasts the lease


@pytest.fixture
def store(client: redis.Redis) -> SagaStore:
    return SagaStore(client, Registry.from_modules(TOOLS), Settings(lease_ms=LEASE_MS))


@pytest.fixture
def env(worker_env: dict[str, str]) -> dict[str, str]:
    return {**worker_env, "SAGA_LEASE_MS": str(LEASE_MS)}


def _kinds(store: SagaStore, sid: str) -> list[str]:
    return [ev["kind"] for ev in store.events.log.bodies(sid)]


@pytest.mark.parametrize(("kind", "tool"), [("rq", "slow_retry"), ("rq", "slow_retry_async"),
                                            ("async", "slow_retry"),
                                            ("async", "slow_retry_async")])
@pytest.mark.parametrize("fail", [3, 4], ids=["commits", "fails"])
def test_a_slow_retrying_step_runs_on_one_worker_at_a_time(
        store: SagaStore, env: dict[str, str], ledger: Path, tmp_path: Path, kind: str,
        tool: str, fail: int) -> None:
    """Four tries of 1 s each, with back-offs between them, under a 0.6 s lease
    and two workers: one body runs at a time, all on one worker, one delivery (the
    tool allows one), one effect at most, no lease lost; the saga commits when the
    fourth try succeeds and fails when it asks for a retry too."""
    log = tmp_path / "workers.log"
    sid = store.submit([{"tool": tool, "args": {"seconds": TRY_S, "fail": fail}}],
                       agent_id="agent-slow")
    first = WorkerProcess(env, TOOLS, log=log, kind=kind).start()
    second = None
    try:
        assert_eventually(lambda: K.STEP_STARTED in _kinds(store, sid), timeout=30,
                          what="the first worker to start the step")
        second = WorkerProcess(env, TOOLS, log=log, kind=kind).start()
        state = assert_eventually(lambda: (st := store.state(sid)).final and st, timeout=60,
                                  what="the saga to end")
    finally:
        first.kill()
        if second is not None:
            second.kill()
    rows = tries()
    assert len(rows) == 4, rows
    assert not overlapping(rows), overlapping(rows)
    assert len({r["pid"] for r in rows}) == 1, "the step moved to another worker"
    assert _kinds(store, sid).count(K.STEP_STARTED) == 1
    if fail == 3:
        assert state.status is Status.COMMITTED
        assert len(effects("slow_effect")) == 1
    else:
        assert state.status is Status.COMPENSATED
        assert "try 4" in (state.steps[0].error or "")
        assert not effects("slow_effect")
    text = log.read_text()
    assert "lease lost" not in text, text
    assert Verifier(store.events.log).check(sid).ok


@pytest.mark.parametrize(("kind", "tool"), [("rq", "slow_read"), ("async", "slow_read"),
                                            ("async", "slow_read_async")])
def test_a_worker_killed_mid_retry_has_its_step_redelivered_after_the_lease(
        store: SagaStore, env: dict[str, str], ledger: Path, kind: str, tool: str) -> None:
    """SIGKILL of a worker's whole process group between two tries: its lease is
    renewed no more and lapses; another worker's sweeper redelivers the step, which
    runs again under the same key (after the first worker's last try ended) and
    commits."""
    sid = store.submit([{"tool": tool, "args": {"seconds": TRY_S, "fail": 2}}],
                       agent_id="agent-killed")
    first = WorkerProcess(env, TOOLS, kind=kind).start()
    try:
        assert_eventually(lambda: len(tries()) >= 1, timeout=30,
                          what="the first try to end")
        time.sleep(0.2)  # in the back-off or the second try
        assert first.pids()
        first.kill()
        killed_at = time.time()
        assert store.state(sid).steps[0].status.value == "started"
        with_lease = store.redis.pttl(store.events.keys.lease(sid))
        assert 0 < with_lease <= LEASE_MS + 3000
        second = WorkerProcess(env, TOOLS, kind=kind).start()
        try:
            state = assert_eventually(lambda: (st := store.state(sid)).final and st,
                                      timeout=60, what="the saga to end")
        finally:
            second.kill()
    finally:
        first.kill()
    assert state.status is Status.COMMITTED
    assert _kinds(store, sid).count(K.STEP_STARTED) == 2
    again = [r for r in tries() if r["start"] > killed_at]
    assert again, "the step never ran again"
    assert not overlapping(tries())
    assert len(effects("slow_effect")) == 1


def test_two_deliveries_of_a_step_in_one_process_in_one_millisecond_start_it_once(
        store: SagaStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step's job queued twice (a hand-back and a sweep both queue it), both copies
    taken by one asyncio worker in one turn of its loop: both write the same
    ``step_started`` (one worker name, one attempt, one millisecond) off the same
    head. The second must not pass for the first one sent again: only the delivery
    that took the lease calls the tool; the other writes nothing and acknowledges."""
    sid = store.submit([{"tool": "reserve_inventory", "args": {"sku": "A", "qty": 1}}],
                       agent_id="agent-twin")
    [intent] = [e for e in store.events.log.bodies(sid) if e["kind"] == K.STEP_INTENT]
    now_ns = time.time_ns()
    monkeypatch.setattr(time, "time_ns", lambda: now_ns)  # one millisecond for both
    first = StepRunner(store, "ss.twin").work(sid, 0, intent["seq"])
    second = StepRunner(store, "ss.twin").work(sid, 0, intent["seq"])
    send_first, send_second = next(first), next(second)  # both step_started, one head
    assert isinstance(send_first, Send)
    assert isinstance(send_second, Send)
    replies_first = send_first.trip.execute(raise_on_error=False)
    replies_second = send_second.trip.execute(raise_on_error=False)
    assert isinstance(first.send(replies_first), Call)  # the lease holder calls the tool
    with pytest.raises(StopIteration) as ended:
        second.send(replies_second)
    assert ended.value.value == "busy"
    assert _kinds(store, sid)[-1:] == [K.STEP_STARTED]
    assert _kinds(store, sid).count(K.STEP_STARTED) == 1
