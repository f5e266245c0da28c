"""What every framework adapter shares (saga_store.integrations._common), without
any framework: which tools the model sees, the mapping of framework call ids
the id rules refuse, failures raised on request, and the asyncio saga."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from saga_store import Registry, SagaAborted, SagaStore, Status, StepError
from saga_store.ids import check_id
from saga_store.integrations._common import calls_for, exposed, tool_defs
from saga_store.integrations._rewrite import rewrite, step_call_id
from saga_store.testing.workers import workers

from ..integration_support import CHARGE, CRM_FAILS, RESERVE, TOOLS
from ..ledger_tools import effects


def test_compensations_and_probes_are_shown_only_when_named() -> None:
    registry = Registry.from_modules(TOOLS)
    names = [s.name for s in exposed(registry)]
    assert "release_inventory" not in names
    assert "refund_payment" not in names
    assert {"reserve_inventory", "charge_payment", "update_crm", "send_invoice"} <= set(names)
    assert [s.name for s in exposed(registry, ["refund_payment"])] == ["refund_payment"]
    probes = Registry.from_modules("tests.ledger_tools")
    assert "crm_probe" not in [s.name for s in exposed(probes)]
    d = tool_defs(registry, exposed(registry, ["reserve_inventory"]))[0]
    assert d["description"].endswith("Can be undone (by release_inventory).")
    assert d["parameters"]["required"] == ["sku", "qty"]


def test_framework_ids_the_id_rules_refuse_map_to_a_stable_digest() -> None:
    assert step_call_id("call_abc-1") == "call_abc-1"
    odd = "call:1 {weird}"
    mapped = step_call_id(odd)
    assert mapped == step_call_id(odd)
    assert mapped is not None
    assert mapped.startswith("h-")
    assert check_id(mapped) == mapped
    assert step_call_id("x" * 200) != step_call_id("x" * 201)


@pytest.mark.real_redis
def test_a_mapped_id_is_the_steps_id_and_the_rewrite_finds_it(
        store: SagaStore, worker_env: dict[str, str], ledger: Path) -> None:
    with workers(worker_env, TOOLS), store.saga(agent_id="shop") as saga:
        calls = calls_for(saga)
        assert calls.run(*RESERVE, "res: 1").ok
        failed = calls.run(*CRM_FAILS, "crm: 2")
        sid = saga.saga_id
    assert not failed.ok
    assert "Rolled back, latest first: reserve_inventory" in failed.text
    state = store.state(sid)
    assert [s.tool_call_id for s in state.steps.values()] == [step_call_id("res: 1"),
                                                              step_call_id("crm: 2")]
    plan = rewrite([("res: 1", "{}"), (None, None), ("crm: 2", failed.text)], [state])
    assert plan.texts[0].startswith("rolled back:")
    assert plan.texts[2].startswith("error:")
    assert plan.errors == {2}
    assert list(plan.notes_after) == [2]


@pytest.mark.real_redis
def test_on_failure_raise_raises_once_the_unwind_is_done(
        store: SagaStore, worker_env: dict[str, str], ledger: Path) -> None:
    with workers(worker_env, TOOLS), store.saga(agent_id="shop") as saga:
        calls = calls_for(saga, on_failure="raise")
        calls.run(*RESERVE, "c1")
        calls.run(*CHARGE, "c2")
        with pytest.raises(StepError, match="CRM unavailable"):
            calls.run(*CRM_FAILS, "c3")
        # by the time it raised, the unwind had finished: refund, then release
        assert store.state(saga.saga_id).status is Status.COMPENSATED
        assert [k for k, _, _ in effects()] == ["reserve", "charge", "refund", "release"]
        with pytest.raises(SagaAborted, match="start a new saga"):
            calls.run(*RESERVE, "c4")  # the saga stopped going forward: nothing runs
        calls.on_failure = "result"
        closed = calls.run(*RESERVE, "c5")
    assert not closed.ok
    assert "was not run" in closed.text
    assert "Rolled back, latest first: charge_payment" in closed.text
    assert [k for k, _, _ in effects()].count("reserve") == 1


@pytest.mark.real_redis
def test_an_asyncio_saga_runs_its_calls_off_the_event_loop(
        store: SagaStore, worker_env: dict[str, str], ledger: Path) -> None:
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0.001)

    async def story() -> tuple[str, bool, bool]:
        async with store.asaga(agent_id="shop") as saga:
            calls = calls_for(saga)
            tick = asyncio.create_task(ticker())
            first = await calls.arun(*RESERVE, "c1")
            done.set()
            await tick
            again = await calls.arun(*RESERVE, "c1")  # a repeat: the stored result
            return saga.saga_id, first.ok, again.text == first.text

    with workers(worker_env, TOOLS):
        sid, ok, same = asyncio.run(story())
    assert ok
    assert same
    assert ticks > 1  # the loop kept running while the step ran on a worker
    assert store.state(sid).status is Status.COMMITTED
    assert [k for k, _, _ in effects()] == ["reserve"]


@pytest.mark.real_redis
def test_the_second_invalid_call_ends_the_repair_and_unwinds(
        store: SagaStore, worker_env: dict[str, str], ledger: Path) -> None:
    bad = ("reserve_inventory", {"sku": "LAPTOP-15", "qty": "many"})
    with workers(worker_env, TOOLS), store.saga(agent_id="shop") as saga:
        calls = calls_for(saga)
        assert calls.run(*RESERVE, "c1").ok
        first = calls.run(*bad, "c2")
        assert first.retry  # the one repair the saga allows
        second = calls.run(*bad, "c3")
        sid = saga.saga_id
    assert not second.retry
    assert not second.ok
    assert "aborted after 2 invalid calls" in second.text
    assert "reserve_inventory was undone" in second.text
    assert store.state(sid).status is Status.COMPENSATED
    assert [k for k, _, _ in effects()] == ["reserve", "release"]
