"""LangGraph adapter, with LangChain's GenericFakeChatModel in a StateGraph, a
private Redis and real worker processes: the order story unwinds exactly once,
the next model call already sees the rolled-back calls (replaced by id), a
gated call goes through LangGraph's interrupt, and the rebuilt history runs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("langgraph", reason="the langgraph extra is not installed: "
                                        "pip install 'saga-store[langgraph]'")

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.outputs import ChatResult
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command
from pydantic import Field

from saga_store import Saga, SagaStore, Status, StepError
from saga_store.client.context import rebuild_history
from saga_store.integrations.langgraph import SagaSession, rebuild, saga_tool_node
from saga_store.log.events import EventKind as K

from ..integration_support import (
    CHARGE,
    CRM_FAILS,
    INVOICE,
    RESERVE,
    assert_order_unwound,
    assert_verified,
    decisions,
    final,
)
from ..ledger_tools import effects

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]


class RecordingModel(GenericFakeChatModel):
    """GenericFakeChatModel that keeps every message list it was called with."""

    received: list[list[BaseMessage]] = Field(default_factory=list)

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.received.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


def script(*turns: AIMessage) -> RecordingModel:
    return RecordingModel(messages=iter(turns))


def calls(*tools: tuple[tuple[str, dict[str, Any]], str]) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": t[0], "args": dict(t[1]), "id": cid,
                                              "type": "tool_call"} for t, cid in tools])


def graph(model: RecordingModel, saga: Saga | SagaSession, checkpointer: Any = None) -> Any:
    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", saga_tool_node(saga))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=checkpointer)


def tool_texts(messages: list[BaseMessage]) -> dict[str, Any]:
    return {m.tool_call_id: m.content for m in messages if isinstance(m, ToolMessage)}


def notes(messages: list[BaseMessage]) -> list[Any]:
    return [m.content for m in messages if isinstance(m, SystemMessage)]


def test_the_order_story_unwinds_and_the_next_model_call_sees_it(
        store: SagaStore, running: None) -> None:
    model = script(calls((RESERVE, "call_1")), calls((CHARGE, "call_2")),
                   calls((CRM_FAILS, "call_3")), AIMessage(content="It could not be placed."))
    with store.saga(agent_id="shop") as saga:
        out = graph(model, saga).invoke({"messages": [HumanMessage("Order a laptop")]})
        sid = saga.saga_id
    assert out["messages"][-1].content == "It could not be placed."
    assert_order_unwound()
    state = final(store, sid)
    assert state.status is Status.COMPENSATED
    assert "payment confirmed" in tool_texts(model.received[2])["call_2"]
    seen = model.received[3]  # the model call right after the failure
    texts = tool_texts(seen)
    assert texts["call_1"].startswith("rolled back:")
    assert texts["call_2"].startswith("rolled back:")
    assert "refund" in texts["call_2"]
    assert texts["call_3"].startswith("error:")
    assert "CRM unavailable" in texts["call_3"]
    # replaced in place, by id: still one result per call, each right after its call
    assert [type(m).__name__ for m in seen] == [
        "HumanMessage", "AIMessage", "ToolMessage", "AIMessage", "ToolMessage",
        "AIMessage", "ToolMessage", "SystemMessage"]
    # a later turn: the same texts as rebuild_history (nothing left to replace)
    expected = {m["tool_call_id"]: m["content"] for m in rebuild_history([state], "openai")
                if m["role"] == "tool"}
    assert tool_texts(out["messages"]) == expected
    assert notes(out["messages"]) == [m["content"] for m in rebuild_history([state])
                                      if m["role"] == "system"]
    assert rebuild(out["messages"], [state]) == []
    # a stored history from before the unwind gets the replacements, and runs again
    stale = [*model.received[3][:5], ToolMessage(content="{}", tool_call_id="call_2", id="tm-2")]
    fixed = rebuild(stale, [state])
    assert {m.tool_call_id: m.content for m in fixed if isinstance(m, ToolMessage)} == \
        {"call_2": expected["call_2"]}
    assert [m.id for m in fixed if isinstance(m, ToolMessage)] == ["tm-2"]
    nxt = script(AIMessage(content="Nothing was charged."))
    with store.saga(agent_id="shop") as later:
        again = graph(nxt, later).invoke({"messages": [*out["messages"],
                                                       HumanMessage("Was I charged?")]})
    assert again["messages"][-1].content == "Nothing was charged."
    assert tool_texts(nxt.received[0]) == expected
    assert_verified(store)


def test_an_invalid_call_comes_back_as_an_error_result(
        store: SagaStore, running: None) -> None:
    bad = (("reserve_inventory", {"sku": "LAPTOP-15", "qty": "many"}), "call_bad")
    model = script(calls(bad), calls((RESERVE, "call_ok")), AIMessage(content="Reserved."))
    with store.saga(agent_id="shop") as saga:
        out = graph(model, saga).invoke({"messages": [HumanMessage("Reserve")]})
        sid = saga.saga_id
    assert out["messages"][-1].content == "Reserved."
    repair = [m for m in model.received[1] if isinstance(m, ToolMessage)]
    assert repair[0].status == "error"
    assert "invalid arguments for reserve_inventory" in repair[0].content
    assert final(store, sid).status is Status.COMMITTED
    assert [k for k, _, _ in effects()] == ["reserve"]


@pytest.mark.parametrize("approved", [True, False])
def test_a_gated_call_interrupts_and_the_decision_is_in_the_chain(
        store: SagaStore, running: None, approved: bool) -> None:
    model = script(calls((RESERVE, "call_1")), calls((INVOICE, "call_inv")),
                   AIMessage(content="Done."))
    config = {"configurable": {"thread_id": "t-1"}}
    with store.saga(agent_id="shop") as saga:
        app = graph(model, saga, InMemorySaver())
        first = app.invoke({"messages": [HumanMessage("Reserve, then invoice")]}, config)
        asked = first["__interrupt__"][0].value
        assert (asked["tool"], asked["tool_call_id"]) == ("send_invoice", "call_inv")
        assert asked["reversibility"] == "irreversible"
        assert not effects("invoice")
        who = "alice" if approved else "bob"
        done = app.invoke(Command(resume={"approved": approved, "by": who,
                                          "reason": "" if approved else "wrong address"}),
                          config)
        sid = saga.saga_id
    assert done["messages"][-1].content == "Done."
    state = final(store, sid)
    if approved:
        assert decisions(store, sid) == [(K.APPROVAL_GRANTED, 1, "alice")]
        assert state.status is Status.COMMITTED
        assert [k for k, _, _ in effects()] == ["reserve", "invoice"]
    else:
        assert decisions(store, sid) == [(K.APPROVAL_DENIED, 1, "bob")]
        assert state.status is Status.COMPENSATED
        assert [k for k, _, _ in effects()] == ["reserve", "release"]
        texts = tool_texts(model.received[-1])
        assert texts["call_1"].startswith("rolled back:")
        assert "denied by bob: wrong address" in texts["call_inv"]
    assert_verified(store)


def test_calls_of_one_reply_run_one_at_a_time_as_steps(
        store: SagaStore, running: None) -> None:
    """ToolNode runs a reply's calls on threads at once; the saga takes them in turn."""
    model = script(calls((RESERVE, "call_1"), (CHARGE, "call_2")),
                   calls((CRM_FAILS, "call_3")), AIMessage(content="Rolled back."))
    with store.saga(agent_id="shop") as saga:
        graph(model, saga).invoke({"messages": [HumanMessage("Order")]})
        sid = saga.saga_id
    state = final(store, sid)
    assert state.status is Status.COMPENSATED
    assert sorted(s.tool_call_id or "" for s in state.steps.values()) == [
        "call_1", "call_2", "call_3"]
    texts = tool_texts(model.received[2])
    assert texts["call_1"].startswith("rolled back:")
    assert texts["call_2"].startswith("rolled back:")
    assert sorted(k for k, _, _ in effects()) == ["charge", "refund", "release", "reserve"]


def test_on_failure_raise_ends_the_graph_with_the_steps_error(
        store: SagaStore, running: None) -> None:
    model = script(calls((RESERVE, "call_1")), calls((CRM_FAILS, "call_2")))

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    with store.saga(agent_id="shop") as saga:
        g = StateGraph(MessagesState)
        g.add_node("agent", agent)
        g.add_node("tools", saga_tool_node(saga, on_failure="raise"))
        g.add_edge(START, "agent")
        g.add_conditional_edges("agent", tools_condition)
        g.add_edge("tools", "agent")
        with pytest.raises(StepError, match="CRM unavailable"):
            g.compile().invoke({"messages": [HumanMessage("Order")]})
        sid = saga.saga_id
    assert final(store, sid).status is Status.COMPENSATED
    assert [k for k, _, _ in effects()] == ["reserve", "release"]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["invoke", "ainvoke"])
def test_one_reply_with_several_calls_says_which_were_rolled_back(
        store: SagaStore, running: None, asynchronous: bool) -> None:
    """Reserve, charge and a failing call in one AIMessage: the next model input shows
    every result of that reply as it is now, each once, right after its call."""
    model = script(calls((RESERVE, "call_1"), (CHARGE, "call_2"), (CRM_FAILS, "call_3"),
                         (RESERVE, "call_4")),
                   AIMessage(content="Rolled back."))
    with store.saga(agent_id="shop") as saga:
        app = graph(model, saga)
        start = {"messages": [HumanMessage("Order")]}
        if asynchronous:
            asyncio.run(app.ainvoke(start))
        else:
            app.invoke(start)
        sid = saga.saga_id
    assert final(store, sid).status is Status.COMPENSATED
    seen = model.received[1]
    texts = tool_texts(seen)
    assert texts["call_1"].startswith("rolled back:")
    assert texts["call_2"].startswith("rolled back:")
    assert "CRM unavailable" in texts["call_3"]
    assert "was not run" in texts["call_4"]
    assert [m.tool_call_id for m in seen if isinstance(m, ToolMessage)] == [
        "call_1", "call_2", "call_3", "call_4"]
    assert_order_unwound()


def test_rebuild_answers_the_call_in_flight(store: SagaStore, running: None) -> None:
    """A checkpoint taken before the in-flight call ran: rebuild gives every tool
    call a ToolMessage from the log, and the graph runs on with it."""
    with store.saga(agent_id="shop") as saga:
        saga.call(*RESERVE, tool_call_id="call_1")
        with pytest.raises(StepError):
            saga.call(*CRM_FAILS, tool_call_id="call_2")
        sid = saga.saga_id
    state = final(store, sid)
    saved = [HumanMessage("Order", id="h"), calls((RESERVE, "call_1")),
             ToolMessage(content="{}", tool_call_id="call_1", id="tm-1"),
             calls((CRM_FAILS, "call_2"), (RESERVE, "call_9"))]
    fixed = rebuild(saved, [state])
    assert {m.tool_call_id: m.content for m in fixed if isinstance(m, ToolMessage)}.keys() \
        == {"call_1", "call_2", "call_9"}
    g = StateGraph(MessagesState)
    nxt = script(AIMessage(content="Nothing is booked."))
    g.add_node("agent", lambda s: {"messages": [nxt.invoke(s["messages"])]})
    g.add_edge(START, "agent")
    app = g.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t-9"}}
    app.update_state(config, {"messages": saved})
    app.update_state(config, {"messages": fixed})
    app.invoke(None, config)
    texts = tool_texts(nxt.received[0])
    assert texts["call_1"].startswith("rolled back:")
    assert "CRM unavailable" in texts["call_2"]
    assert texts["call_9"].startswith("not run: no saga logged this call")
    assert [type(m).__name__ for m in nxt.received[0]][-4:] == [
        "AIMessage", "ToolMessage", "ToolMessage", "SystemMessage"]


def test_after_a_rollback_the_graph_goes_on_in_a_new_saga(
        store: SagaStore, running: None) -> None:
    """``on_rollback="new_saga"`` in LangGraph's own loop: the call after the
    rollback opens the next saga, and the model still reads the first one's calls
    as rolled back."""
    model = script(calls((RESERVE, "call_1")), calls((CRM_FAILS, "call_2")),
                   calls((RESERVE, "call_3")), AIMessage(content="Reserved again."))
    with SagaSession(store, "shop", conversation_id="c-new", on_rollback="new_saga") as s:
        out = graph(model, s).invoke({"messages": [HumanMessage("Reserve a laptop")]})
    assert out["messages"][-1].content == "Reserved again."
    first, second = s.sagas[0], s.sagas[-1]
    assert first != second
    assert final(store, first).status is Status.COMPENSATED
    assert final(store, second).status is Status.COMMITTED  # committed on exit
    assert [k for k, _, _ in effects()] == ["reserve", "release", "reserve"]
    seen = model.received[-1]
    texts = tool_texts(seen)
    assert texts["call_1"].startswith("rolled back:")
    assert "reservation_id" in texts["call_3"]
    assert any(f"Saga {first} is compensated" in n for n in notes(seen))
