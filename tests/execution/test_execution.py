"""Tool calls through real worker processes: exactly-once effects, recovery
after kill -9 at every forward fault point, refusal of foreign jobs."""

from __future__ import annotations

import threading
from pathlib import Path

import orjson
import pytest
import redis
from rq.queue import Queue
from rq.serializers import JSONSerializer

from saga_store.client.api import SagaStore
from saga_store.errors import InvalidInput
from saga_store.execution import jobs
from saga_store.execution.enqueue import enqueue_step, intent
from saga_store.log.events import EventKind as K
from saga_store.protocol.state import Status
from saga_store.testing import assert_eventually
from saga_store.testing.workers import WorkerProcess, kill_at, workers
from saga_store.verify.checker import Verifier

from ..ledger_tools import effects

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
TOOLS = "tests.ledger_tools"
CARD = "4111111111111111"
# job ids RQ cannot take (an agent's user may push them onto the queues)
JUNK_IDS = [b"\xff\xfe", b"saga-step-\xc3(", b"\x80" * 300, b"x y", b"x.y", b"x\x00y",
            b"x\ny", "\u00e9t\u00e9".encode(), b"x:\xff"]
ORDER = [
    {"tool": "reserve_inventory", "args": {"sku": "LAPTOP", "qty": 1}, "tool_call_id": "c0"},
    {"tool": "charge_payment", "args": {"amount_cents": 1200, "card_number": CARD},
     "tool_call_id": "c1"},
    {"tool": "noop", "args": {"n": 1}, "tool_call_id": "c2"},
]


def kinds(store: SagaStore, sid: str, step: int | None = None) -> list[str]:
    return [e["kind"] for e in store.events.log.events(sid)
            if step is None or e.get("step") == step]


@pytest.mark.cluster
def test_calls_run_on_a_worker_and_commit(saga_store: SagaStore, worker_env: dict[str, str],
                                          ledger: Path) -> None:
    """A caller-driven saga: each call returns the tool's result; exit commits."""
    with workers(worker_env, TOOLS), saga_store.saga(agent_id="agent-1") as saga:
        r = saga.call("reserve_inventory", {"sku": "A", "qty": 2}, tool_call_id="call_1")
        c = saga.call("charge_payment", {"amount_cents": 500, "card_number": CARD})
        assert saga.call("async_echo", {"x": 7}) == {"x": 7}
    assert r["reservation_id"].startswith("r-")
    assert c["amount_cents"] == 500
    assert saga_store.state(saga.saga_id).status is Status.COMMITTED
    assert [e[0] for e in effects()] == ["reserve", "charge"]
    assert Verifier(saga_store.events.log).verify().ok


def test_a_repeated_call_in_a_saga_returns_the_stored_result(
        saga_store: SagaStore, worker_env: dict[str, str], ledger: Path) -> None:
    """Same tool and arguments in the same saga: one effect, the same answer."""
    with workers(worker_env, TOOLS), saga_store.saga(agent_id="a") as saga:
        first = saga.call("reserve_inventory", {"sku": "A", "qty": 1})
        again = saga.call("reserve_inventory", {"sku": "A", "qty": 1})
    assert first == again
    assert len(effects("reserve")) == 1


@pytest.mark.cluster
def test_duplicate_delivery_gives_exactly_one_effect_per_step(
        saga_store: SagaStore, queues: redis.Redis, worker_env: dict[str, str],
        ledger: Path) -> None:
    """100 steps x 10 copies of each job, pushed concurrently, 3 workers: 100 effects."""
    spec = saga_store.registry.get("reserve_inventory")
    planned = []
    for i in range(100):
        w = saga_store.events.open("agent-dup")
        args = {"sku": f"S{i}", "qty": 1}
        item = intent(w.saga_id, 0, spec, args, f"c{i}")
        w.append_many([item])
        planned.append((w.saga_id, w.head.seq, item[1]["idem_key"]))

    def push_copies() -> None:
        pipe = queues.pipeline(transaction=False)
        for sid, seq, key in planned:
            enqueue_step(pipe, jobs.STEP_QUEUE, sid, 0, seq, key)
        pipe.execute()
    threads = [threading.Thread(target=push_copies) for _ in range(10)]
    with workers(worker_env, TOOLS, count=3):
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert_eventually(lambda: all(
            saga_store.state(sid).steps[0].status == "succeeded" for sid, _, _ in planned),
            timeout=60, what="all 100 steps to succeed")
        assert_eventually(lambda: queues.llen(jobs.queue_key(jobs.STEP_QUEUE)) == 0,
                          timeout=60, what="the queue to drain")
    assert len(effects("reserve")) == 100
    suppressed = sum(kinds(saga_store, sid).count(K.STEP_DUPLICATE_SUPPRESSED)
                     for sid, _, _ in planned)
    assert suppressed > 0, "duplicates that arrived after the outcome are recorded"
    for sid, _, _ in planned:
        assert kinds(saga_store, sid, 0).count(K.STEP_SUCCEEDED) == 1
    assert Verifier(saga_store.events.log).verify().ok


@pytest.mark.cluster
@pytest.mark.parametrize("point", ["after_dequeue", "after_started", "in_tool", "after_tool",
                                   "after_outcome"])
def test_kill_at_each_fault_point_then_restart(saga_store: SagaStore, worker_env: dict[str, str],
                                                ledger: Path, tmp_path: Path,
                                                point: str) -> None:
    """kill -9 of the worker at a forward fault point: a new worker finishes the saga,
    effects are never doubled (the tools honour their key), the log shows the retry."""
    sid = saga_store.submit(ORDER, agent_id="agent-k")
    kill_at(worker_env, TOOLS, point, tmp_path)
    with workers(worker_env, TOOLS):
        state = saga_store.wait(sid, timeout=60)
    assert state.status is Status.COMMITTED
    assert len(effects("reserve")) == 1
    assert len(effects("charge")) == 1
    if point in ("after_started", "in_tool", "after_tool"):
        started = [e for e in saga_store.events.log.events(sid) if e["kind"] == "step_started"
                   and e["step"] == 0]
        assert len(started) == 2
        assert started[1]["data"]["after_unfinished_attempts"] == 1
    assert Verifier(saga_store.events.log).verify().ok


def test_a_step_that_keeps_killing_its_worker_is_dead_lettered(
        saga_store: SagaStore, worker_env: dict[str, str], ledger: Path) -> None:
    """After 3 deliveries that never finished, the step fails and the saga compensates."""
    sid = saga_store.submit([ORDER[0], {"tool": "kill_my_worker", "args": {}}],
                            agent_id="agent-dl")
    with workers(worker_env, TOOLS, "-n", "2"):  # the pool respawns killed workers
        state = saga_store.wait(sid, timeout=90)
    assert state.status is Status.COMPENSATED
    assert "dead-lettered" in state.steps[1].error["error"] if isinstance(
        state.steps[1].error, dict) else "dead-lettered" in str(state.steps[1].error)
    assert kinds(saga_store, sid, 1).count(K.STEP_STARTED) == 3
    assert len(effects("release")) == 1


def test_a_dead_lettered_step_whose_attempts_took_effect_is_undone(
        saga_store: SagaStore, worker_env: dict[str, str], ledger: Path) -> None:
    """Each delivery books, then kills its worker: after 3 the step is dead-lettered
    in doubt, and the unwind cancels the booking (dead-lettered as failed, it stood:
    a failed step is never undone)."""
    sid = saga_store.submit([ORDER[0], {"tool": "book_then_kill_my_worker",
                                        "args": {"slot": "s-1"}}], agent_id="agent-dl")
    with workers(worker_env, TOOLS, "-n", "2"):  # the pool respawns killed workers
        state = saga_store.wait(sid, timeout=90)
    assert state.status is Status.COMPENSATED
    assert kinds(saga_store, sid, 1).count(K.STEP_STARTED) == 3
    assert kinds(saga_store, sid, 1)[-1] == K.COMPENSATION_SUCCEEDED
    assert [d for _, _, d in effects("book")] == ["s-1"]
    assert [d for _, _, d in effects("unbook")] == ["s-1"]
    assert len(effects("release")) == 1


def test_a_timeout_is_in_doubt_not_failed(saga_store: SagaStore, worker_env: dict[str, str],
                                          ledger: Path) -> None:
    sid = saga_store.submit([ORDER[0], {"tool": "update_crm", "args": {"note": "slow"}}],
                            agent_id="agent-t")
    with workers(worker_env, TOOLS):
        state = saga_store.wait(sid, timeout=60)
    assert state.steps[1].status == "in_doubt"
    assert "timed out" in str(state.steps[1].error)
    assert state.status is Status.NEEDS_ATTENTION  # update_crm is irreversible
    assert len(effects("release")) == 1


@pytest.mark.parametrize("serializer", [JSONSerializer, None])
def test_a_job_naming_os_system_is_refused(client: redis.Redis, worker_env: dict[str, str],
                                           tmp_path: Path, serializer: object,
                                           worker_kind: str) -> None:
    """A job written straight into Redis naming os.system never runs."""
    marker = tmp_path / "pwned"
    q = Queue(jobs.STEP_QUEUE, connection=client, serializer=serializer)
    q.enqueue("os.system", f"touch {marker}")
    log = tmp_path / "worker.log"
    w = WorkerProcess(worker_env, TOOLS, "--burst", log=log).start()
    assert w.proc is not None
    assert w.proc.wait(60) == 0
    assert not marker.exists()
    assert "refused job" in log.read_text()


@pytest.mark.parametrize("serves", [(), ("--queues", jobs.STEP_QUEUE)])
def test_a_job_id_rq_cannot_take_is_dropped_and_the_worker_goes_on(
        saga_store: SagaStore, client: redis.Redis, worker_env: dict[str, str],
        ledger: Path, tmp_path: Path, worker_kind: str, serves: tuple[str, ...]) -> None:
    """Whoever may push onto a queue (an agent's user may) can push a job id RQ
    cannot take: not UTF-8, or with a space, a dot, a NUL. RQ's dequeue raised on
    it and its worker quit; each such id took a worker down. It is dropped with a
    log line, off the intermediate list too when the pop moved it there (a worker
    of one queue), and the saga queued behind it runs."""
    step_queue = jobs.queue_key(jobs.STEP_QUEUE)
    junks = JUNK_IDS
    for junk in junks:
        client.rpush(step_queue, junk)
    sid = saga_store.submit(ORDER[:1], agent_id="agent-j")
    log = tmp_path / "worker.log"
    with workers(worker_env, TOOLS, *serves, log=log) as (w,):
        assert saga_store.wait(sid, timeout=60).status is Status.COMMITTED
        assert w.alive
    text = log.read_text()
    for junk in junks:  # (the asyncio worker's clean-up may drop one a second time)
        assert f"a job id RQ cannot take ({junk[:80]!r})" in text, text
    assert "Traceback" not in text
    assert client.llen(step_queue) == 0
    # the saga's own job may still be there a moment: RQ takes it off after the job
    moved = client.lrange(Queue(jobs.STEP_QUEUE, connection=client).intermediate_queue_key,
                          0, -1)
    assert not set(moved) & set(junks), moved
    assert len(effects("reserve")) == 1


def test_a_junk_job_id_left_on_the_intermediate_list_is_dropped(
        saga_store: SagaStore, client: redis.Redis, worker_env: dict[str, str],
        ledger: Path, tmp_path: Path, worker_kind: str) -> None:
    """A worker killed between moving a junk id onto the intermediate list and
    dropping it leaves it there; RQ's registry clean-up, at the next worker's
    start, read it as a job and that worker quit. The clean-up drops it."""
    moved = Queue(jobs.STEP_QUEUE, connection=client).intermediate_queue_key
    client.rpush(moved, *JUNK_IDS)
    sid = saga_store.submit(ORDER[:1], agent_id="agent-j")
    log = tmp_path / "worker.log"
    with workers(worker_env, TOOLS, "--queues", jobs.STEP_QUEUE, log=log) as (w,):
        assert saga_store.wait(sid, timeout=60).status is Status.COMMITTED
        # the RQ worker cleans at its start, the asyncio worker's chores a moment later
        assert_eventually(lambda: "cleaning group registries" in log.read_text().partition(
            f"a job id RQ cannot take ({JUNK_IDS[-1]!r})")[2], timeout=30,
            what="the junk ids dropped, then RQ's clean-up to its end")
        assert w.alive
    text = log.read_text()
    assert "Traceback" not in text
    for junk in JUNK_IDS:
        assert f"a job id RQ cannot take ({junk[:80]!r})" in text, text
    assert not set(client.lrange(moved, 0, -1)) & set(JUNK_IDS)


def test_a_worker_killed_between_moving_a_junk_id_and_dropping_it(
        saga_store: SagaStore, client: redis.Redis, worker_env: dict[str, str],
        ledger: Path, tmp_path: Path, worker_kind: str) -> None:
    """kill -9 between RQ's move of a junk id onto the intermediate list and its
    drop: the id stays there; the next worker drops it and runs the saga."""
    env = {**worker_env, "SAGA_QUEUES": jobs.STEP_QUEUE}  # one queue: RQ's LMOVE
    step_queue = jobs.queue_key(jobs.STEP_QUEUE)
    moved = Queue(jobs.STEP_QUEUE, connection=client).intermediate_queue_key
    client.rpush(step_queue, b"x y")
    sid = saga_store.submit(ORDER[:1], agent_id="agent-j")
    kill_at(env, TOOLS, "junk_moved", tmp_path)
    assert client.lrange(moved, 0, -1) == [b"x y"]  # the window the kill left
    log = tmp_path / "worker.log"
    with workers(env, TOOLS, log=log) as (w,):
        assert saga_store.wait(sid, timeout=60).status is Status.COMMITTED
        # RQ's clean-up holds its lock until it ends: a raise in it would leave it held
        lock = Queue(jobs.STEP_QUEUE, connection=client).registry_cleaning_key
        assert_eventually(lambda: "a job id RQ cannot take (b'x y')" in log.read_text()
                          and not client.exists(lock), timeout=30,
                          what="the junk id dropped, and RQ's clean-up to its end")
        assert w.alive
    assert b"x y" not in client.lrange(moved, 0, -1)
    assert len(effects("reserve")) == 1


def test_invalid_arguments_write_nothing_then_abort(saga_store: SagaStore,
                                                    client: redis.Redis) -> None:
    """The first invalid call is a repairable error; the second aborts the saga."""
    from saga_store import InvalidToolCall, SagaAborted
    saga = saga_store.saga(agent_id="agent-v")
    before = client.xlen(saga_store.events.keys.log(saga.saga_id))
    with pytest.raises(InvalidToolCall) as exc:
        saga.call("reserve_inventory", {"sku": "A", "qty": "many"})
    assert exc.value.errors[0]["loc"] == ["qty"]
    assert client.xlen(saga_store.events.keys.log(saga.saga_id)) == before
    assert client.llen(jobs.queue_key(jobs.STEP_QUEUE)) == 0
    with pytest.raises(SagaAborted):
        saga.call("no_such_tool", {})
    assert kinds(saga_store, saga.saga_id)[-1] == K.SAGA_FAILED


def test_same_key_with_different_args_is_rejected(saga_store: SagaStore,
                                                  worker_env: dict[str, str],
                                                  ledger: Path) -> None:
    from saga_store import KeyReuseError
    with workers(worker_env, TOOLS):
        with saga_store.saga(agent_id="a") as s1:
            r1 = s1.call("reserve_inventory", {"sku": "A", "qty": 1}, idempotency_key="order-9")
        with saga_store.saga(agent_id="a") as s2:
            assert s2.call("reserve_inventory", {"sku": "A", "qty": 1},
                           idempotency_key="order-9") == r1
            with pytest.raises(KeyReuseError):
                s2.call("reserve_inventory", {"sku": "B", "qty": 1}, idempotency_key="order-9")
    assert len(effects("reserve")) == 1


def test_secrets_never_reach_the_log(saga_store: SagaStore, client: redis.Redis,
                                     worker_env: dict[str, str], ledger: Path) -> None:
    """The card number is in no stream entry, even when the tool's error quotes it."""
    from saga_store import StepError
    with workers(worker_env, TOOLS):
        with saga_store.saga(agent_id="a") as saga:
            saga.call("charge_payment", {"amount_cents": 1, "card_number": CARD})
        bad = "5555666677778888"
        with pytest.raises(StepError, match="declined"), saga_store.saga(agent_id="a") as s2:
            s2.call("charge_payment", {"amount_cents": 1, "card_number": bad})
    blob = b""
    for key in client.scan_iter(match="ss:*"):
        if client.type(key) == b"stream":
            blob += b"".join(v for _, f in client.xrange(key) for v in f.values())
    assert CARD.encode() not in blob
    assert bad.encode() not in blob
    assert b"$secret" in blob


def test_bad_results_and_retryable_errors(saga_store: SagaStore, worker_env: dict[str, str],
                                          ledger: Path) -> None:
    from saga_store import StepInDoubt
    with workers(worker_env, TOOLS):
        with saga_store.saga(agent_id="a") as saga:
            assert saga.call("flaky", {"fail_times": 2}) == {"ok": True}
        # it returned, so it ran: in doubt (a kind of StepError), never "failed"
        with pytest.raises(StepInDoubt, match="not a JSON object"), \
                saga_store.saga(agent_id="a") as s2:
            s2.call("bad_result", {})


def test_a_result_too_large_to_log_is_an_effect_that_is_undone(
        saga_store: SagaStore, worker_env: dict[str, str], ledger: Path) -> None:
    """The tool ran and returned more than an event may hold: it ran once (not once
    per redelivery), the step is in doubt, not failed, and the unwind undoes it."""
    sid = saga_store.submit([{"tool": "crm_export", "args": {"customer": "c9"}}],
                            agent_id="agent-big")
    with workers(worker_env, TOOLS):
        state = saga_store.wait(sid, timeout=60)
    assert [e[0] for e in effects()] == ["crm", "crm-revert"]
    assert state.steps[0].status == "in_doubt"
    assert "could not be logged" in str(state.steps[0].error)
    assert state.status is Status.COMPENSATED
    assert Verifier(saga_store.events.log).verify().ok


def test_sigterm_lets_the_current_step_finish(saga_store: SagaStore, worker_env: dict[str, str],
                                              ledger: Path) -> None:
    sid = _sigterm_in_first_step(saga_store, worker_env, [])
    assert saga_store.state(sid).status is Status.COMMITTED


def _sigterm_in_first_step(store: SagaStore, env: dict[str, str],
                           then: list[dict[str, object]]) -> str:
    """Submit a 1 s first step (then ``then``), SIGTERM the only worker while that
    step runs, and check it exits cleanly; returns the saga id."""
    sid = store.submit([{"tool": "slow_noop", "args": {"seconds": 1.0}}, *then],
                       agent_id="agent-t")
    w = WorkerProcess(env, TOOLS).start()
    try:
        assert_eventually(lambda: K.STEP_STARTED in kinds(store, sid), timeout=30,
                          what="the step to start")
        assert w.terminate() == 0
    finally:
        w.kill()
    return sid


def _queued(queues: redis.Redis, store: SagaStore, sid: str) -> list[int]:
    """The steps of a saga that went to a worker as an RQ job (acknowledged job
    hashes are kept a while, so this sees jobs already run)."""
    return [e["step"] for e in store.events.log.bodies(sid) if e["kind"] == K.STEP_INTENT
            and queues.exists(jobs.job_key(jobs.step_job_id(e["idem_key"], e["seq"], sid)))]


@pytest.mark.cluster
def test_a_plan_runs_in_one_worker_each_next_step_claimed_with_the_outcome(
        saga_store: SagaStore, queues: redis.Redis, worker_env: dict[str, str],
        ledger: Path) -> None:
    """Eager steps: only step 0 is queued; each later step is started in the same
    append as the previous outcome, by the worker that ran it, with 2 workers up."""
    with workers(worker_env, TOOLS, count=2):
        sid = saga_store.submit(ORDER, agent_id="agent-e")
        assert saga_store.wait(sid, timeout=30).status is Status.COMMITTED
    events = saga_store.events.log.bodies(sid)
    assert _queued(queues, saga_store, sid) == [0]
    for step in (1, 2):
        at = next(i for i, e in enumerate(events)
                  if e["kind"] == K.STEP_STARTED and e["step"] == step)
        assert [(e["kind"], e.get("step")) for e in events[at - 2:at]] == [
            (K.STEP_SUCCEEDED, step - 1), (K.STEP_INTENT, step)]
    started = {e["data"]["worker"] for e in events if e["kind"] == K.STEP_STARTED}
    assert len(started) == 1
    assert (len(effects("reserve")), len(effects("charge"))) == (1, 1)
    assert Verifier(saga_store.events.log).verify().ok


@pytest.mark.cluster
def test_with_eager_steps_off_every_step_goes_through_the_queue(
        saga_store: SagaStore, queues: redis.Redis, worker_env: dict[str, str],
        ledger: Path) -> None:
    with workers({**worker_env, "SAGA_EAGER_STEPS": "0"}, TOOLS):
        sid = saga_store.submit(ORDER, agent_id="agent-q")
        assert saga_store.wait(sid, timeout=30).status is Status.COMMITTED
    assert _queued(queues, saga_store, sid) == [0, 1, 2]
    assert (len(effects("reserve")), len(effects("charge"))) == (1, 1)


def test_sigterm_mid_plan_queues_the_next_step_instead_of_running_it(
        saga_store: SagaStore, queues: redis.Redis, worker_env: dict[str, str],
        ledger: Path, worker_kind: str) -> None:
    """A worker asked to stop finishes its step and hands the rest of the plan to
    the queue, so a warm shutdown never waits for a whole saga."""
    sid = _sigterm_in_first_step(saga_store, worker_env, ORDER[:2])
    assert kinds(saga_store, sid, 1) == [K.STEP_INTENT]
    assert _queued(queues, saga_store, sid) == [0, 1]
    with workers(worker_env, TOOLS):
        assert saga_store.wait(sid, timeout=30).status is Status.COMMITTED
    assert (len(effects("reserve")), len(effects("charge"))) == (1, 1)


def test_submit_many_writes_all_plans_or_none(saga_store: SagaStore, client: redis.Redis,
                                              worker_env: dict[str, str],
                                              ledger: Path) -> None:
    """Many plans in two round trips: a bad step in any plan writes nothing at all;
    good ones each become their own saga and commit."""
    before = client.dbsize()
    bad = [ORDER, [{"tool": "reserve_inventory", "args": {"sku": "A", "qty": "many"}}]]
    with pytest.raises(InvalidInput, match=r"plans\[1\]: steps\[0\]"):
        saga_store.submit_many(bad, agent_id="agent-m")
    assert client.dbsize() == before
    plans = [[{"tool": "reserve_inventory", "args": {"sku": f"S{i}", "qty": 1}},
              {"tool": "noop", "args": {"n": i}}] for i in range(20)]
    with workers(worker_env, TOOLS, count=2):
        ids = saga_store.submit_many(plans, agent_id="agent-m")
        states = [saga_store.wait(sid, timeout=30) for sid in ids]
    assert len(set(ids)) == 20
    assert all(st.status is Status.COMMITTED for st in states)
    assert sorted(e[2] for e in effects("reserve")) == sorted(f"S{i}x1" for i in range(20))
    # ids come back in the order of the plans
    assert [saga_store.events.log.bodies(sid)[0]["data"]["plan"][0]["args"]["sku"]
            for sid in ids] == [f"S{i}" for i in range(20)]
    assert Verifier(saga_store.events.log).verify().ok


def _contents(client: redis.Redis) -> dict[bytes, bytes | None]:
    """Every key and what it holds (DUMP: type and value, not the TTL)."""
    return {k: client.dump(k) for k in client.scan_iter(count=1000)}


def test_a_refused_submit_writes_nothing(saga_store: SagaStore, client: redis.Redis,
                                         worker_env: dict[str, str], ledger: Path) -> None:
    """Submitting under a taken saga id is refused before anything is written: the
    victim's secret card, its schedule and its log are as they were, and its charge
    runs with its own card. Its secret values are gone once it closes."""
    sid = saga_store.submit(ORDER, agent_id="agent-v", saga_id="victim-1")
    before, score = _contents(client), client.zscore(saga_store.events.keys.active(sid), sid)
    forged = [dict(ORDER[0]), {**ORDER[1], "args": {"amount_cents": 1200,
                                                    "card_number": "4999999999999999"}}]
    with pytest.raises(InvalidInput, match="already exists"):
        saga_store.submit(forged, agent_id="agent-x", saga_id="victim-1")
    assert _contents(client) == before
    assert client.zscore(saga_store.events.keys.active(sid), sid) == score
    with workers(worker_env, TOOLS):
        assert saga_store.wait(sid, timeout=30).status is Status.COMMITTED
    assert len(effects("charge")) == 1
    assert not client.exists(saga_store.events.keys.secrets(sid))


def test_submit_many_refused_late_leaves_no_blob(saga_store: SagaStore,
                                                 client: redis.Redis) -> None:
    """A plan that is only found too large while it is encoded (after earlier plans
    were): the earlier plans' payload blobs are not left behind."""
    big = [{"tool": "update_crm", "args": {"note": "x" * 20_000}}]
    too_big = [{"tool": "update_crm", "args": {"note": "y" * 300_000}}]
    assert saga_store.events.keys  # the store's first use records its layout (ss:layout)
    before = _contents(client)
    with pytest.raises(InvalidInput, match="exceeds"):
        saga_store.submit_many([big, big, too_big], agent_id="agent-m")
    assert _contents(client) == before


def test_a_client_driven_commit_retires_its_secrets(saga_store: SagaStore,
                                                    client: redis.Redis,
                                                    worker_env: dict[str, str],
                                                    ledger: Path) -> None:
    """The card number given to a client-driven saga is gone from Redis once the
    saga commits, in the commit's own script call."""
    with workers(worker_env, TOOLS), saga_store.saga("agent-d") as saga:
        saga.call("charge_payment", {"amount_cents": 5, "card_number": CARD})
        assert client.exists(saga_store.events.keys.secrets(saga.saga_id))
    assert saga_store.state(saga.saga_id).status is Status.COMMITTED
    assert not client.exists(saga_store.events.keys.secrets(saga.saga_id))
    assert not any(CARD.encode() in repr(v).encode() for v in _contents(client).values())


@pytest.mark.cluster
def test_plan_file_through_the_cli(client: redis.Redis, worker_env: dict[str, str],
                                   ledger: Path, tmp_path: Path) -> None:
    """saga run --wait --json prints saga_id and state; saga workers lists who ran it;
    a bad plan writes nothing."""
    import subprocess
    import sys
    plan = tmp_path / "plan.json"
    plan.write_bytes(orjson.dumps({"agent_id": "agent-cli", "steps": ORDER}))
    cmd = [sys.executable, "-m", "saga_store.cli.main", "run", "--tools", TOOLS, str(plan),
           "--wait",
           "--json"]
    with workers(worker_env, TOOLS):
        out = subprocess.run(cmd, env=worker_env, capture_output=True, timeout=60, check=False)
        listed = subprocess.run([sys.executable, "-m", "saga_store.cli.main", "workers",
                                 "--json"], env=worker_env, capture_output=True, timeout=60,
                                check=False)
    assert out.returncode == 0, out.stderr
    assert listed.returncode == 0, listed.stderr
    assert orjson.loads(listed.stdout)["workers"], "the worker that ran it is registered"
    res = orjson.loads(out.stdout)
    assert res["state"] == "committed"
    assert res["saga_id"]
    plan.write_bytes(orjson.dumps({"agent_id": "x", "steps": [
        {"tool": "reserve_inventory", "args": {"sku": "A", "qty": 1}},
        {"tool": "reserve_inventory", "args": {"qty": "x"}}]}))
    before = {k: client.pttl(k) for k in client.scan_iter(count=1000)}
    out = subprocess.run(cmd[:-2], env=worker_env, capture_output=True, timeout=60, check=False)
    assert out.returncode == 2
    assert b"steps[1]" in out.stderr
    after = set(client.scan_iter(count=1000))
    assert after <= set(before), after - set(before)  # no key written
    # and none gone but the stopped workers' leases lapsing meanwhile (e.g. a sweeper's)
    assert all(before[k] >= 0 for k in set(before) - after), set(before) - after
