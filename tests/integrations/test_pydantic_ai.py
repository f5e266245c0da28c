"""Pydantic AI adapter, with a FunctionModel, a private Redis and real worker
processes: the order story unwinds exactly once, the next model request already
sees the rolled-back calls, a gated call goes through Pydantic AI's deferred
approval, and the rebuilt history runs again."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is not installed: "
                                          "pip install 'saga-store[pydantic-ai]'")

from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from saga_store import SagaStore, Status
from saga_store.client.context import rebuild_history
from saga_store.integrations.pydantic_ai import (
    SagaSession,
    SagaToolset,
    rebuild,
    saga_history_processor,
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

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
Turn = ModelResponse | Callable[[list[ModelMessage]], ModelResponse]


class Script:
    """A scripted model: one response per request, and every request it received."""

    def __init__(self, *turns: ModelResponse) -> None:
        self.turns, self.received = list(turns), []  # type: list[ModelResponse], list[Any]

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.received.append(list(messages))
        return self.turns.pop(0)

    @property
    def model(self) -> FunctionModel:
        return FunctionModel(self)


def calls(*tools: tuple[tuple[str, dict[str, Any]], str]) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart(t[0], dict(t[1]), tool_call_id=cid)
                                for t, cid in tools])


def text(s: str) -> ModelResponse:
    return ModelResponse(parts=[TextPart(s)])


def returns(messages: list[ModelMessage]) -> dict[str, Any]:
    return {p.tool_call_id: p.content for m in messages if isinstance(m, ModelRequest)
            for p in m.parts if isinstance(p, ToolReturnPart)}


def notes(messages: list[ModelMessage]) -> list[str]:
    """The system notes in a history; Pydantic AI frames one that is not at the start
    as a user part, ``<system>...</system>``, when it sends it."""
    out = []
    for m in messages:
        for p in m.parts if isinstance(m, ModelRequest) else []:
            if isinstance(p, SystemPromptPart):
                out.append(p.content)
            elif isinstance(p, UserPromptPart) and isinstance(p.content, str) \
                    and p.content.startswith("<system>Saga "):
                out.append(p.content.removeprefix("<system>").removesuffix("</system>"))
    return out


def test_the_order_story_unwinds_and_the_next_request_sees_it(
        store: SagaStore, worker_env: dict[str, str], ledger: Path) -> None:
    script = Script(calls((RESERVE, "call_1")), calls((CHARGE, "call_2")),
                    calls((CRM_FAILS, "call_3")), text("The order could not be placed."))
    with workers(worker_env, TOOLS), store.saga(agent_id="shop") as saga:
        agent = Agent(script.model, toolsets=[SagaToolset(saga)],
                      capabilities=[ProcessHistory(saga_history_processor(saga))])
        result = asyncio.run(agent.run("Order a laptop for ana"))
        sid = saga.saga_id
    assert result.output == "The order could not be placed."
    assert_order_unwound()
    state = final(store, sid)
    assert state.status is Status.COMPENSATED
    assert "payment confirmed" in returns(script.received[2])["call_2"]
    seen = returns(script.received[3])  # the request right after the failure
    assert seen["call_1"].startswith("rolled back:")
    assert seen["call_2"].startswith("rolled back:")
    assert "refund" in seen["call_2"]
    assert seen["call_3"].startswith("error:")
    assert "CRM unavailable" in seen["call_3"]
    assert len(notes(script.received[3])) == 1
    # a later turn: the same texts as rebuild_history, and Pydantic AI runs on it
    history = rebuild(result.all_messages(), [state])
    expected = {m["tool_call_id"]: m["content"] for m in rebuild_history([state], "openai")
                if m["role"] == "tool"}
    assert returns(history) == expected
    assert notes(history) == [m["content"] for m in rebuild_history([state])
                              if m["role"] == "system"]
    assert rebuild(history, [state]) == history
    nxt = Script(text("Nothing was charged."))
    again = asyncio.run(Agent(nxt.model).run("Was I charged?", message_history=history))
    assert again.output == "Nothing was charged."
    assert returns(nxt.received[0]) == expected
    assert_verified(store)


def test_an_invalid_call_is_a_model_retry(
        store: SagaStore, worker_env: dict[str, str], ledger: Path) -> None:
    bad = (("reserve_inventory", {"sku": "LAPTOP-15", "qty": "many"}), "call_bad")
    script = Script(calls(bad), calls((RESERVE, "call_ok")), text("Reserved."))
    with workers(worker_env, TOOLS), store.saga(agent_id="shop") as saga:
        result = asyncio.run(Agent(script.model, toolsets=[SagaToolset(saga)]).run("Reserve"))
        sid = saga.saga_id
    assert result.output == "Reserved."
    # Pydantic AI 2 sends a ModelRetry back as a result marked as retried
    retry = [p for m in script.received[1] if isinstance(m, ModelRequest) for p in m.parts
             if isinstance(p, ToolReturnPart | RetryPromptPart) and p.tool_call_id == "call_bad"]
    assert len(retry) == 1
    assert getattr(retry[0], "outcome", "retried") == "retried"
    assert "invalid arguments for reserve_inventory" in str(retry[0].content)
    assert final(store, sid).status is Status.COMMITTED
    assert [k for k, _, _ in effects()] == ["reserve"]


def test_a_gated_call_is_deferred_for_approval_and_recorded(
        store: SagaStore, worker_env: dict[str, str], ledger: Path) -> None:
    script = Script(calls((INVOICE, "call_inv")), text("Invoice sent."))
    with workers(worker_env, TOOLS), store.saga(agent_id="shop") as saga:
        toolset = SagaToolset(saga)
        agent = Agent(script.model, toolsets=[toolset], output_type=[str, DeferredToolRequests],
                      capabilities=[ProcessHistory(saga_history_processor(saga))])
        first = asyncio.run(agent.run("Invoice ana"))
        assert isinstance(first.output, DeferredToolRequests)
        assert [p.tool_name for p in first.output.approvals] == ["send_invoice"]
        assert first.output.metadata["call_inv"]["reversibility"] == "irreversible"
        assert not effects("invoice")
        answers = asyncio.run(toolset.decide(first.output, {"call_inv": True}, by="alice"))
        done = asyncio.run(agent.run(message_history=first.all_messages(),
                                     deferred_tool_results=answers))
        sid = saga.saga_id
    assert done.output == "Invoice sent."
    assert len(effects("invoice")) == 1
    assert decisions(store, sid) == [(K.APPROVAL_GRANTED, 0, "alice")]
    assert final(store, sid).status is Status.COMMITTED
    assert_verified(store)


def test_a_denied_call_is_recorded_and_the_saga_unwinds(
        store: SagaStore, worker_env: dict[str, str], ledger: Path) -> None:
    script = Script(calls((RESERVE, "call_1")), calls((INVOICE, "call_inv")),
                    text("I did not send it."))
    with workers(worker_env, TOOLS), store.saga(agent_id="shop") as saga:
        toolset = SagaToolset(saga)
        agent = Agent(script.model, toolsets=[toolset], output_type=[str, DeferredToolRequests],
                      capabilities=[ProcessHistory(saga_history_processor(saga))])
        first = asyncio.run(agent.run("Reserve, then invoice"))
        assert isinstance(first.output, DeferredToolRequests)
        answers = asyncio.run(toolset.decide(first.output, {"call_inv": False}, by="bob",
                                             reason="wrong address"))
        done = asyncio.run(agent.run(message_history=first.all_messages(),
                                     deferred_tool_results=answers))
        sid = saga.saga_id
    assert done.output == "I did not send it."
    assert decisions(store, sid) == [(K.APPROVAL_DENIED, 1, "bob")]
    assert final(store, sid).status is Status.COMPENSATED
    assert [k for k, _, _ in effects()] == ["reserve", "release"]
    seen = returns(script.received[-1])
    assert seen["call_1"].startswith("rolled back:")
    assert "denied by bob: wrong address" in seen["call_inv"]
    assert isinstance(script.received[0][0], ModelRequest)
    assert isinstance(script.received[0][0].parts[0], UserPromptPart)


def test_one_reply_with_several_calls_says_which_were_rolled_back(
        store: SagaStore, worker_env: dict[str, str], ledger: Path) -> None:
    """Reserve, charge and a failing call in one response (Pydantic AI runs them at
    once): the next request shows every result of that response as it is now."""
    script = Script(calls((RESERVE, "call_1"), (CHARGE, "call_2"), (CRM_FAILS, "call_3")),
                    text("Rolled back."))
    with workers(worker_env, TOOLS), store.saga(agent_id="shop") as saga:
        agent = Agent(script.model, toolsets=[SagaToolset(saga)],
                      capabilities=[ProcessHistory(saga_history_processor(saga))])
        asyncio.run(agent.run("Order"))
        sid = saga.saga_id
    assert final(store, sid).status is Status.COMPENSATED
    seen = returns(script.received[1])
    for cid in ("call_1", "call_2"):  # whichever ran before the failure was undone
        assert seen[cid].startswith(("rolled back:", "charge_payment was not run",
                                     "reserve_inventory was not run")), seen
    assert "CRM unavailable" in seen["call_3"]
    assert kinds_undone()


def kinds_undone() -> bool:
    """Every effect that happened was undone once: a charge by a refund, a
    reservation by a release; nothing else."""
    kinds = [k for k, _, _ in effects()]
    return kinds.count("charge") == kinds.count("refund") <= 1 and \
        kinds.count("reserve") == kinds.count("release") <= 1 and not effects("crm")


def test_rebuild_answers_the_call_in_flight_and_the_sdk_takes_it(
        store: SagaStore, worker_env: dict[str, str], ledger: Path) -> None:
    """A history saved before the in-flight call's result: rebuild gives every tool
    call its return from the log, Pydantic AI's own message types load it, and the
    agent runs on it."""
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    from saga_store import StepError
    with workers(worker_env, TOOLS):
        with store.saga(agent_id="shop") as saga:
            saga.call(*RESERVE, tool_call_id="call_1")
            with pytest.raises(StepError):
                saga.call(*CRM_FAILS, tool_call_id="call_2")
        state = final(store, saga.saga_id)
    saved: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart("Order")]), calls((RESERVE, "call_1")),
        ModelRequest(parts=[ToolReturnPart(RESERVE[0], "{}", tool_call_id="call_1")]),
        calls((CRM_FAILS, "call_2"), (RESERVE, "call_9"))]
    fixed = rebuild(saved, [state])
    loaded = ModelMessagesTypeAdapter.validate_json(ModelMessagesTypeAdapter.dump_json(fixed))
    seen = returns(loaded)
    assert seen["call_1"].startswith("rolled back:")
    assert "CRM unavailable" in seen["call_2"]
    assert seen["call_9"].startswith("not run: no saga logged this call")
    assert rebuild(fixed, [state]) == fixed
    nxt = Script(text("Nothing is booked."))
    again = asyncio.run(Agent(nxt.model).run("Was I charged?", message_history=loaded))
    assert again.output == "Nothing is booked."


def test_after_a_rollback_the_run_goes_on_in_a_new_saga(
        store: SagaStore, worker_env: dict[str, str], ledger: Path) -> None:
    """``on_rollback="new_saga"`` in Pydantic AI's own run: the call after the
    rollback opens the next saga, and the model still reads the first one's calls
    as rolled back."""
    script = Script(calls((RESERVE, "call_1")), calls((CRM_FAILS, "call_2")),
                    calls((RESERVE, "call_3")), text("Reserved again."))
    with workers(worker_env, TOOLS), \
            SagaSession(store, "shop", conversation_id="c-new", on_rollback="new_saga") as s:
        agent = Agent(script.model, toolsets=[SagaToolset(s)],
                      capabilities=[ProcessHistory(saga_history_processor(s))])
        done = asyncio.run(agent.run("Reserve a laptop"))
    assert done.output == "Reserved again."
    first, second = s.sagas[0], s.sagas[-1]
    assert first != second
    assert final(store, first).status is Status.COMPENSATED
    assert final(store, second).status is Status.COMMITTED  # committed on exit
    assert [k for k, _, _ in effects()] == ["reserve", "release", "reserve"]
    seen = returns(script.received[-1])
    assert str(seen["call_1"]).startswith("rolled back:")
    assert "reservation_id" in str(seen["call_3"])
    assert any(f"Saga {first} is compensated" in n for n in notes(script.received[-1]))
