"""The asyncio worker (``saga worker --async``): many steps at once in one process,
async tools on its loop, a warm stop that finishes what is in flight, a SIGKILL
that another worker of either kind recovers from, and RQ's refusal rules."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from click.testing import CliRunner
from rq.queue import Queue
from saga_store.cli.main import cli

from saga_store import Registry, SagaStore, Settings
from saga_store.execution import jobs
from saga_store.protocol.state import Status
from saga_store.testing import RedisServer, assert_eventually
from saga_store.testing.workers import WorkerProcess, workers
from saga_store.verify.checker import Verifier

from ..ledger_tools import effects
from ..timing_tools import calls

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
TOOLS = "tests.timing_tools"
ASYNC = ("--async", "--concurrency")


@pytest.fixture
def store(client: redis.Redis) -> SagaStore:
    return SagaStore(client, Registry.from_modules(TOOLS), Settings(lease_ms=1000))


def submit(store: SagaStore, n: int, plan: list[dict[str, object]]) -> list[str]:
    return [store.submit(plan, agent_id=f"agent-{i}") for i in range(n)]


def sleep_step(tool: str, seconds: float) -> dict[str, object]:
    return {"tool": tool, "args": {"seconds": seconds}}


def overlapped(rows: list[dict[str, float]]) -> bool:
    """Whether every call was running at one same moment."""
    return max(r["start"] for r in rows) < min(r["end"] for r in rows)


@pytest.mark.parametrize("tool", ["timed_sleep", "timed_async_sleep"])
def test_one_process_runs_n_slow_steps_at_once(store: SagaStore, worker_env: dict[str, str],
                                               ledger: Path, tool: str) -> None:
    """Six sagas of one 1 s step under --concurrency 6 all run at the same moment in
    one process: the async tool's six calls on the one event loop (the main
    thread: no thread per step), the sync tool's each on a pool thread of its own."""
    ids = submit(store, 6, [sleep_step(tool, 1.0)])
    with workers(worker_env, TOOLS, *ASYNC, "6", "--burst") as [w]:
        assert w.proc is not None
        assert w.proc.wait(60) == 0
    assert all(store.state(sid).status is Status.COMMITTED for sid in ids)
    rows = calls()
    assert len(rows) == 6
    assert len(calls("call")) == 6
    assert {r["pid"] for r in rows} == {w.proc.pid}
    assert overlapped(rows), rows
    threads = {r["thread"] for r in rows}
    if tool == "timed_async_sleep":
        assert threads == {"MainThread"}
    else:
        assert len(threads) == 6
        assert "MainThread" not in threads


def test_a_hundred_async_steps_wait_at_once_in_one_process(
        store: SagaStore, worker_env: dict[str, str], ledger: Path) -> None:
    """--concurrency 100 and a hundred 2 s async steps: all in flight together, none
    refused a Redis connection (redis-py's pool stops at 100 unless told more)."""
    ids = submit(store, 100, [sleep_step("timed_async_sleep", 2.0)])
    with workers(worker_env, TOOLS, *ASYNC, "100", "--burst") as [w]:
        assert w.proc is not None
        assert w.proc.wait(60) == 0
    ended = {sid: store.state(sid).status for sid in ids}
    assert sorted(ended.values()) == [Status.COMMITTED] * 100, \
        {sid: str(status) for sid, status in ended.items() if status is not Status.COMMITTED}
    rows = calls()
    assert len(calls("call")) == 100  # each step ran once
    assert overlapped(rows), "not all hundred were in flight at one moment"


def test_no_more_than_concurrency_steps_run_at_once(store: SagaStore,
                                                    worker_env: dict[str, str],
                                                    ledger: Path) -> None:
    """Six 0.5 s steps under --concurrency 3 run three at a time: never all six at once."""
    ids = submit(store, 6, [sleep_step("timed_async_sleep", 0.5)])
    with workers(worker_env, TOOLS, *ASYNC, "3", "--burst") as [w]:
        assert w.proc is not None
        assert w.proc.wait(60) == 0
    assert all(store.state(sid).status is Status.COMMITTED for sid in ids)
    rows = calls()
    most = max(sum(1 for o in rows if o["start"] <= r["start"] < o["end"]) for r in rows)
    assert most == 3, rows


def test_sigterm_finishes_the_steps_in_flight_then_exits_0(
        store: SagaStore, client: redis.Redis, worker_env: dict[str, str],
        ledger: Path, worker_kind: str) -> None:
    """SIGTERM with four slow steps in flight: each finishes once, the worker takes
    no new step (the plans' next ones stay queued) and exits 0; another worker of
    either kind then finishes every saga with each effect exactly once."""
    plan = [sleep_step("timed_sleep", 1.5), {"tool": "reserve_inventory",
                                             "args": {"sku": "A", "qty": 1}}]
    ids = submit(store, 4, plan)
    w = WorkerProcess(worker_env, TOOLS, *ASYNC, "4", kind="async").start()
    try:
        assert_eventually(lambda: len(effects("started")) == 4, timeout=30,
                          what="four steps in flight")
        assert w.terminate(timeout=30) == 0
    finally:
        w.kill()
    assert len(calls()) == 4, "a step in flight did not finish"
    assert effects("reserve") == [], "the worker took a new step after SIGTERM"
    assert all(store.state(sid).status is Status.RUNNING for sid in ids)
    with workers(worker_env, TOOLS):  # of the kind under test
        states = [store.wait(sid, timeout=60) for sid in ids]
    assert all(st.status is Status.COMMITTED for st in states)
    assert len(calls("call")) == 4  # never run again
    assert len(effects("reserve")) == 4
    assert Verifier(store.events.log).verify().ok


def test_a_second_sigterm_exits_at_once_and_the_sweeper_redelivers(
        store: SagaStore, worker_env: dict[str, str], ledger: Path) -> None:
    """SIGTERM, then another a second and a half later, with a 3.5 s step in flight:
    the worker exits 1 without waiting for it; a new worker runs the step again
    under the same key and the saga commits with its reservation made once."""
    [sid] = submit(store, 1, [sleep_step("timed_sleep", 3.5),
                              {"tool": "reserve_inventory", "args": {"sku": "A", "qty": 1}}])
    w = WorkerProcess(worker_env, TOOLS, *ASYNC, "4", kind="async").start()
    try:
        assert_eventually(lambda: effects("started"), timeout=30, what="the step in flight")
        assert w.proc is not None
        w.proc.send_signal(signal.SIGTERM)
        time.sleep(1.5)  # a second signal within a second is taken for the same request
        t0 = time.monotonic()
        assert w.terminate(timeout=10) == 1
        assert time.monotonic() - t0 < 1.5, "the worker waited for the step"
    finally:
        w.kill()
    assert calls() == []
    with workers(worker_env, TOOLS, *ASYNC, "4"):
        state = store.wait(sid, timeout=60)
    assert state.status is Status.COMMITTED
    assert len(effects("started")) == 2  # attempt 1 cut short, attempt 2 finished
    assert len(effects("reserve")) == 1


def test_a_tool_calling_sys_exit_does_not_end_the_worker(
        store: SagaStore, worker_env: dict[str, str], ledger: Path) -> None:
    """An async tool raising SystemExit: its step is recorded in doubt (the call ran
    once, and raised what ends a process, not a call), its saga ends, and the
    worker stays up and runs the sagas queued beside it."""
    [bad] = submit(store, 1, [{"tool": "exits_async", "args": {}}])
    with workers(worker_env, TOOLS, *ASYNC, "2") as [w]:
        assert store.wait(bad, timeout=30).final
        ids = submit(store, 3, [{"tool": "reserve_inventory",
                                 "args": {"sku": "A", "qty": 1}}])
        for sid in ids:
            assert store.wait(sid, timeout=30).status is Status.COMMITTED
        assert w.alive
    assert len(effects("exit")) == 1
    assert len(effects("reserve")) == 3
    outcome = [e for e in store.events.log.bodies(bad) if e["kind"] == "step_in_doubt"]
    assert "SystemExit" in str(outcome[0]), outcome


def test_a_second_sigterm_exits_at_once_while_redis_is_unreachable(
        worker_env: dict[str, str], ledger: Path) -> None:
    """Redis goes away while a step is inside its tool; the step's outcome then waits
    for Redis on the loop. SIGTERM, then another: the worker still exits at once
    (status 1), the signals not waiting for the loop."""
    with RedisServer() as srv:
        own = SagaStore(redis.Redis.from_url(srv.url), Registry.from_modules(TOOLS),
                        Settings(lease_ms=1000))
        own.submit([sleep_step("timed_async_sleep", 1.0)], agent_id="agent-1")
        env = {**worker_env, "SAGA_REDIS_URL": srv.url}
        w = WorkerProcess(env, TOOLS, *ASYNC, "4", kind="async").start()
        try:
            assert_eventually(lambda: effects("started"), timeout=30,
                              what="the step in flight")
            srv.kill()
            time.sleep(2.0)  # the tool is done: its outcome waits for Redis
            assert w.alive
            assert w.proc is not None
            w.proc.send_signal(signal.SIGTERM)
            time.sleep(1.5)  # a second signal within a second is taken for the same one
            t0 = time.monotonic()
            assert w.terminate(timeout=10) == 1
            assert time.monotonic() - t0 < 2.0
        finally:
            w.kill()


def test_a_job_whose_hash_is_not_a_hash_does_not_stop_the_worker(
        store: SagaStore, client: redis.Redis, worker_env: dict[str, str],
        ledger: Path, tmp_path: Path) -> None:
    """A queued id whose job key holds a string (the fetch fails with WRONGTYPE) is
    logged and dropped; the same process then runs the saga queued behind it."""
    client.set(jobs.job_key("not-a-hash"), "x")
    client.rpush(jobs.queue_key(jobs.STEP_QUEUE), "not-a-hash")
    log = tmp_path / "worker.log"
    with workers(worker_env, TOOLS, *ASYNC, "2", log=log) as [w]:
        assert_eventually(lambda: "dequeue failed; going on" in log.read_text(), timeout=30,
                          what="the bad job to be logged")
        [sid] = submit(store, 1, [{"tool": "reserve_inventory",
                                   "args": {"sku": "A", "qty": 1}}])
        assert store.wait(sid, timeout=30).status is Status.COMMITTED
        assert w.alive


@pytest.mark.parametrize("queues", [(), ("--queues", jobs.STEP_QUEUE)])
def test_a_burst_of_queued_sagas_is_taken_in_batches_each_run_once(
        store: SagaStore, client: redis.Redis, worker_env: dict[str, str], ledger: Path,
        tmp_path: Path, queues: tuple[str, ...]) -> None:
    """Twenty sagas queued before the worker starts, a bad job among them: the worker
    takes them several at a time (popped as RQ pops them: LPOP over the queues in
    order, or LMOVE onto the intermediate list when it serves one queue), drops the
    bad one, and runs every saga's effect once."""
    ids = submit(store, 10, [{"tool": "reserve_inventory", "args": {"sku": "A", "qty": 1}}])
    client.set(jobs.job_key("not-a-hash"), "x")
    client.rpush(jobs.queue_key(jobs.STEP_QUEUE), "not-a-hash")
    ids += submit(store, 10, [{"tool": "reserve_inventory", "args": {"sku": "A", "qty": 1}}])
    log = tmp_path / "worker.log"
    with workers(worker_env, TOOLS, *ASYNC, "32", *queues, log=log) as [w]:
        for sid in ids:
            assert store.wait(sid, timeout=30).status is Status.COMMITTED
        assert w.alive
    text = log.read_text()
    assert "job not-a-hash could not be read" in text, text  # the batch's path took it
    assert len(effects("reserve")) == 20
    step_queue = Queue(jobs.STEP_QUEUE, connection=client)
    # every saga's job acknowledged; the unreadable one left where RQ's own dequeue
    # leaves it, for RQ's clean-up of the intermediate list
    assert client.lrange(step_queue.intermediate_queue_key, 0, -1) == \
        ([b"not-a-hash"] if queues else [])
    assert client.llen(step_queue.key) == 0


def test_a_sigkill_mid_step_is_recovered_by_another_worker(
        store: SagaStore, worker_env: dict[str, str], ledger: Path,
        worker_kind: str) -> None:
    """An async worker SIGKILLed with four steps inside their tool: a worker of either
    kind runs them again under the same keys and every saga commits, each charge
    and reservation made exactly once."""
    plan = [{"tool": "reserve_inventory", "args": {"sku": "A", "qty": 1}},
            sleep_step("timed_sleep", 1.0),
            {"tool": "charge_payment", "args": {"amount_cents": 5,
                                                "card_number": "4111111111111111"}}]
    ids = submit(store, 4, plan)
    w = WorkerProcess(worker_env, TOOLS, *ASYNC, "4", kind="async").start()
    try:
        assert_eventually(lambda: len(effects("started")) == 4, timeout=30,
                          what="four steps inside their tool")
    finally:
        w.kill()
    assert calls() == [], "a step finished before the kill"
    with workers(worker_env, TOOLS):  # of the kind under test
        states = [store.wait(sid, timeout=60) for sid in ids]
    assert all(st.status is Status.COMMITTED for st in states)
    assert {r["pid"] for r in calls()}.isdisjoint({w.proc.pid if w.proc else 0})
    assert len(calls()) == 4
    assert len(effects("started")) == 8
    assert len(effects("reserve")) == 4
    assert len(effects("charge")) == 4
    assert Verifier(store.events.log).verify().ok


def test_a_sync_tool_hanging_past_its_lease_is_not_run_twice(
        store: SagaStore, worker_env: dict[str, str], ledger: Path, tmp_path: Path) -> None:
    """A sync tool (timeout 0.3 s) that hangs 3 s on an async worker's thread, three
    leases long: the step keeps its lease, so the sweeper never hands the call to a
    second slot; it is recorded in doubt once it returns, and the overrun is logged."""
    [sid] = submit(store, 1, [{"tool": "hang", "args": {"seconds": 3.0}}])
    log = tmp_path / "worker.log"
    with workers(worker_env, TOOLS, *ASYNC, "4", log=log):
        state = store.wait(sid, timeout=60)
    assert len(calls("call")) == 1, calls("call")
    assert state.steps[0].status == "in_doubt"
    assert "ran past its 0.3 s timeout on a thread" in log.read_text()


def test_saga_workers_and_rq_see_one_async_worker_busy_with_several_steps(
        store: SagaStore, redis_url: str, worker_env: dict[str, str], ledger: Path) -> None:
    """With three slow steps in flight the async worker is one live, busy worker,
    registered with RQ on both queues, whose current job names one step and counts
    the rest; RQ's own Worker.all lists it with its pid."""
    from rq.worker import Worker
    ids = submit(store, 3, [sleep_step("timed_sleep", 2.0)])
    with workers(worker_env, TOOLS, *ASYNC, "4") as [w]:
        assert_eventually(lambda: len(effects("started")) == 3, timeout=30,
                          what="three steps in flight")

        def busy() -> dict[str, Any] | None:
            res = CliRunner().invoke(cli, ["workers", "--json"], env={
                "SAGA_REDIS_URL": redis_url, "SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": ""})
            out = orjson.loads(res.output)
            return out if out["workers"] and out["workers"][0]["state"] == "busy" else None
        [info] = assert_eventually(busy, timeout=15, what="the worker busy")["workers"]
        assert w.proc is not None
        assert info["pid"] == w.proc.pid
        assert info["live"] is True
        assert info["current_job"].endswith("(+2 more)"), info
        assert set(info["queues"]) == {"saga-steps", "saga-compensations"}
        [rq_worker] = Worker.all(connection=store.redis)
        assert rq_worker.pid == info["pid"]
        for sid in ids:
            store.wait(sid, timeout=30)


@pytest.mark.parametrize("value", ["0", "-3"])
def test_concurrency_below_one_is_a_usage_error(redis_url: str, value: str) -> None:
    """--concurrency 0 or negative: exit 2 with a message naming the option."""
    result = CliRunner().invoke(cli, ["worker", "--tools", TOOLS, "--async", "--concurrency",
                                      value], env={"SAGA_REDIS_URL": redis_url})
    assert result.exit_code == 2
    assert "--concurrency" in result.output
    assert "1<=x" in result.output


def test_concurrency_without_async_is_a_usage_error(redis_url: str) -> None:
    """--concurrency names a setting of the asyncio worker only: exit 2, saying so."""
    result = CliRunner().invoke(cli, ["worker", "--tools", TOOLS, "--concurrency", "4"],
                                env={"SAGA_REDIS_URL": redis_url})
    assert result.exit_code == 2
    assert "--async" in result.output
