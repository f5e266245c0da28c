"""OpenAI Agents SDK adapter, with the SDK's ScriptedModel, a private Redis and
real worker processes: the order story unwinds exactly once, the next model
call already sees the rolled-back calls, a gated call goes through the SDK's
own approval, and the rebuilt history runs again."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents", reason="the openai-agents extra is not installed: "
                                     "pip install 'saga-store[openai-agents]'")

from agents import Agent, RunConfig, Runner, set_tracing_disabled
from agents.testing import ModelCall, ScriptedModel, assistant_message, function_call

from saga_store import SagaStore, Status
from saga_store.client.context import rebuild_history
from saga_store.integrations.openai_agents import (
    SagaSession,
    approve,
    rebuild,
    reject,
    saga_input_filter,
    saga_tools,
)
from saga_store.log.events import EventKind as K
from saga_store.testing.workers import workers

from ..integration_support import (
    CHARGE,
    CRM_FAILS,
    INVOICE,
    RESERVE,
    TOOLS,
    assert_order_unwound,
    assert_verified,
    decisions,
    final,
)
from ..ledger_tools import effects

set_tracing_disabled(True)  # offline: no trace export
pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]


def call(tool: tuple[str, dict[str, Any]], call_id: str) -> Any:
    return function_call(tool[0], tool[1], call_id=call_id)


def outputs(model_call: ModelCall) -> dict[str, str]:
    """The function call outputs the model received, by call id."""
    return {i["call_id"]: i["output"] for i in model_call.input
            if isinstance(i, dict) and i.get("type") == "function_call_output"}


def system_notes(items: list[Any]) -> list[str]:
    return [i["content"] for i in items if isinstance(i, dict) and i.get("role") == "system"]


def test_the_order_story_unwinds_and_the_next_model_call_sees_it(
        store: SagaStore, worker_env: dict[str, str], ledger: Path) -> None:
    model = ScriptedModel([[call(RESERVE, "call_1")], [call(CHARGE, "call_2")],
                           [call(CRM_FAILS, "call_3")],
                           [assistant_message("The order could not be placed.")]])
    with workers(worker_env, TOOLS), store.saga(agent_id="shop") as saga:
        agent = Agent(name="shop", model=model, tools=saga_tools(saga))
        config = RunConfig(call_model_input_filter=saga_input_filter(saga))
        result = asyncio.run(Runner.run(agent, "Order a laptop for ana", run_config=config))
        sid = saga.saga_id
    assert result.final_output == "The order could not be placed."
    assert_order_unwound()
    state = final(store, sid)
    assert state.status is Status.COMPENSATED
    # the third model call saw the first two results as they were
    assert "payment confirmed" in outputs(model.calls[2])["call_2"]
    # the fourth (the one right after the failure) already sees them rolled back
    seen = outputs(model.calls[3])
    assert seen["call_1"].startswith("rolled back:")
    assert seen["call_2"].startswith("rolled back:")
    assert "refund" in seen["call_2"]
    assert seen["call_3"].startswith("error:")
    assert "CRM unavailable" in seen["call_3"]
    note = system_notes(model.calls[3].input)
    assert len(note) == 1
    assert "Rolled back, latest first: charge_payment" in note[0]
    # the rebuilt history says what rebuild_history says, for a later turn
    items = rebuild(result.to_input_list(), [state])
    expected = {m["tool_call_id"]: m["content"] for m in rebuild_history([state], "openai")
                if m["role"] == "tool"}
    assert {i["call_id"]: i["output"] for i in items
            if i.get("type") == "function_call_output"} == expected
    assert system_notes(items) == [m["content"] for m in rebuild_history([state])
                                   if m["role"] == "system"]
    assert rebuild(items, [state]) == items  # rebuilding again changes nothing
    # and the SDK takes it as the next run's input
    nxt = ScriptedModel([[assistant_message("Nothing was charged.")]])
    again = asyncio.run(Runner.run(Agent(name="shop", model=nxt),
                                   [*items, {"role": "user", "content": "Was I charged?"}]))
    assert again.final_output == "Nothing was charged."
    assert outputs(nxt.calls[0]) == expected
    assert_verified(store)


def test_an_invalid_call_goes_back_to_the_model_to_repair(
        store: SagaStore, worker_env: dict[str, str], ledger: Path) -> None:
    model = ScriptedModel([
        [function_call("reserve_inventory", {"sku": "LAPTOP-15", "qty": "many"},
                       call_id="call_bad")],
        [call(RESERVE, "call_ok")], [assistant_message("Reserved.")]])
    with workers(worker_env, TOOLS), store.saga(agent_id="shop") as saga:
        agent = Agent(name="shop", model=model, tools=saga_tools(saga))
        result = asyncio.run(Runner.run(agent, "Reserve a laptop"))
        sid = saga.saga_id
    assert result.final_output == "Reserved."
    repair = outputs(model.calls[1])["call_bad"]
    assert "invalid arguments for reserve_inventory" in repair
    assert "qty" in repair
    assert final(store, sid).status is Status.COMMITTED
    assert [k for k, _, _ in effects()] == ["reserve"]


def test_an_integer_beyond_2_53_goes_back_to_the_model_exactly_as_it_sent_it(
        store: SagaStore) -> None:
    """The SDK hands over the arguments as JSON text; read with orjson alone, 2^64
    would turn into a float. The model is told which field to fix; nothing ran."""
    model = ScriptedModel([
        [function_call("reserve_inventory", '{"sku": "LAPTOP-15", "qty": 18446744073709551616}',
                       call_id="call_huge")],
        [assistant_message("I will ask for a smaller quantity.")]])
    with store.saga(agent_id="shop") as saga:
        agent = Agent(name="shop", model=model, tools=saga_tools(saga))
        asyncio.run(Runner.run(agent, "Reserve a lot of laptops"))
        sid = saga.saga_id
    repair = outputs(model.calls[1])["call_huge"]
    assert "arguments.qty: integer 18446744073709551616 is beyond 2^53" in repair
    assert [e["kind"] for e in store.events.log.bodies(sid)
            if e["kind"] == K.STEP_INTENT] == []


def test_a_gated_call_goes_through_the_sdks_approval(
        store: SagaStore, worker_env: dict[str, str], ledger: Path) -> None:
    model = ScriptedModel([[call(INVOICE, "call_inv")], [assistant_message("Invoice sent.")]])
    with workers(worker_env, TOOLS), store.saga(agent_id="shop") as saga:
        agent = Agent(name="shop", model=model, tools=saga_tools(saga))
        config = RunConfig(call_model_input_filter=saga_input_filter(saga))
        first = asyncio.run(Runner.run(agent, "Invoice ana", run_config=config))
        assert [i.name for i in first.interruptions] == ["send_invoice"]
        assert not effects("invoice")  # nothing ran, nothing was even logged
        assert store.state(saga.saga_id).next_step == 0
        state = first.to_state()
        approve(saga, state, first.interruptions[0], by="alice")
        done = asyncio.run(Runner.run(agent, state, run_config=config))
        sid = saga.saga_id
    assert done.final_output == "Invoice sent."
    assert len(effects("invoice")) == 1
    assert decisions(store, sid) == [(K.APPROVAL_GRANTED, 0, "alice")]
    assert final(store, sid).status is Status.COMMITTED
    assert_verified(store)


def test_a_rejected_call_is_denied_in_the_chain_and_the_saga_unwinds(
        store: SagaStore, worker_env: dict[str, str], ledger: Path) -> None:
    model = ScriptedModel([[call(RESERVE, "call_1")], [call(INVOICE, "call_inv")],
                           [assistant_message("I did not send it.")]])
    with workers(worker_env, TOOLS), store.saga(agent_id="shop") as saga:
        agent = Agent(name="shop", model=model, tools=saga_tools(saga))
        config = RunConfig(call_model_input_filter=saga_input_filter(saga))
        first = asyncio.run(Runner.run(agent, "Reserve, then invoice", run_config=config))
        state = first.to_state()
        told = reject(saga, state, first.interruptions[0], by="bob", reason="wrong address")
        done = asyncio.run(Runner.run(agent, state, run_config=config))
        sid = saga.saga_id
    assert "denied by bob: wrong address" in told
    assert done.final_output == "I did not send it."
    assert decisions(store, sid) == [(K.APPROVAL_DENIED, 1, "bob")]
    assert final(store, sid).status is Status.COMPENSATED
    assert not effects("invoice")
    assert [k for k, _, _ in effects()] == ["reserve", "release"]
    seen = outputs(model.calls[2])
    assert seen["call_1"].startswith("rolled back:")
    assert "denied by bob" in seen["call_inv"]


def test_one_reply_with_several_calls_says_which_were_rolled_back(
        store: SagaStore, worker_env: dict[str, str], ledger: Path) -> None:
    """Reserve, charge and a failing call in one model reply (the SDK runs them at
    once): the next model call shows every result of that reply as it is now."""
    model = ScriptedModel([[call(RESERVE, "call_1"), call(CHARGE, "call_2"),
                            call(CRM_FAILS, "call_3")],
                           [assistant_message("Rolled back.")]])
    with workers(worker_env, TOOLS), store.saga(agent_id="shop") as saga:
        agent = Agent(name="shop", model=model, tools=saga_tools(saga))
        config = RunConfig(call_model_input_filter=saga_input_filter(saga))
        asyncio.run(Runner.run(agent, "Order", run_config=config))
        sid = saga.saga_id
    assert final(store, sid).status is Status.COMPENSATED
    seen = outputs(model.calls[1])
    for cid in ("call_1", "call_2"):  # whichever ran before the failure was undone
        assert seen[cid].startswith(("rolled back:", "charge_payment was not run",
                                     "reserve_inventory was not run")), seen
    assert "CRM unavailable" in seen["call_3"]
    kinds = [k for k, _, _ in effects()]
    assert kinds.count("charge") == kinds.count("refund") <= 1
    assert kinds.count("reserve") == kinds.count("release") <= 1


def test_rebuild_answers_the_call_in_flight_and_the_sdk_takes_it(
        store: SagaStore, worker_env: dict[str, str], ledger: Path) -> None:
    """Input items saved before the in-flight call's output: rebuild gives every
    function_call its output from the log, right after it, and the SDK runs on it."""
    from agents.items import TResponseInputItem
    from pydantic import TypeAdapter

    from saga_store import StepError
    with workers(worker_env, TOOLS):
        with store.saga(agent_id="shop") as saga:
            saga.call(*RESERVE, tool_call_id="call_1")
            with pytest.raises(StepError):
                saga.call(*CRM_FAILS, tool_call_id="call_2")
        state = final(store, saga.saga_id)
    saved: list[Any] = [
        {"role": "user", "content": "Order"},
        {"type": "function_call", "call_id": "call_1", "name": RESERVE[0],
         "arguments": '{"sku": "LAPTOP-15", "qty": 1}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "{}"},
        {"type": "function_call", "call_id": "call_2", "name": CRM_FAILS[0],
         "arguments": '{"customer": "ana", "note": "fail"}'}]
    fixed = rebuild(saved, [state])
    TypeAdapter(list[TResponseInputItem]).validate_python(fixed)
    assert [i.get("type") for i in fixed][:5] == [
        None, "function_call", "function_call_output", "function_call", "function_call_output"]
    assert fixed[2]["output"].startswith("rolled back:")
    assert "CRM unavailable" in fixed[4]["output"]
    assert rebuild(fixed, [state]) == fixed
    nxt = ScriptedModel([[assistant_message("Nothing is booked.")]])
    again = asyncio.run(Runner.run(Agent(name="shop", model=nxt), fixed))
    assert again.final_output == "Nothing is booked."
    assert set(outputs(nxt.calls[0])) == {"call_1", "call_2"}


def test_after_a_rollback_the_run_goes_on_in_a_new_saga(
        store: SagaStore, worker_env: dict[str, str], ledger: Path) -> None:
    """``on_rollback="new_saga"`` in the SDK's own run loop: the call after the
    rollback opens the next saga, and the model still reads the first one's calls
    as rolled back."""
    model = ScriptedModel([[call(RESERVE, "call_1")], [call(CRM_FAILS, "call_2")],
                           [call(RESERVE, "call_3")], [assistant_message("Reserved again.")]])
    with workers(worker_env, TOOLS), \
            SagaSession(store, "shop", conversation_id="c-new", on_rollback="new_saga") as s:
        agent = Agent(name="shop", model=model, tools=saga_tools(s))
        config = RunConfig(call_model_input_filter=saga_input_filter(s))
        result = asyncio.run(Runner.run(agent, "Reserve a laptop", run_config=config))
    assert result.final_output == "Reserved again."
    first, second = s.sagas[0], s.sagas[-1]
    assert first != second
    assert final(store, first).status is Status.COMPENSATED
    assert final(store, second).status is Status.COMMITTED  # committed on exit
    assert [k for k, _, _ in effects()] == ["reserve", "release", "reserve"]
    seen = outputs(model.calls[3])
    assert seen["call_1"].startswith("rolled back:")
    assert "reservation_id" in seen["call_3"]
    assert any(f"Saga {first} is compensated" in n for n in system_notes(model.calls[3].input))
