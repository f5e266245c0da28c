"""A LangGraph agent run in a process of its own, for the crash tests: the order
story's graph with a SqliteSaver checkpointer and a SagaSession, started fresh
(``first``) or resumed from its checkpoint (``resume``); or, for the approval
tests, run until a gated invoice interrupts (``gated``) and resumed with a
person's decision (``approve``); it writes what the model was shown to a JSON file.

    python -m tests.integrations.langgraph_resume DB first|resume|gated|approve OUT TEXT
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatResult
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command
from pydantic import Field

from saga_store import Registry, SagaStore, Settings
from saga_store.integrations.langgraph import SagaSession, saga_tool_node

from ..integration_support import CHARGE, INVOICE, RESERVE, TOOLS

THREAD = {"configurable": {"thread_id": "order-1"}}


class RecordingModel(GenericFakeChatModel):
    """GenericFakeChatModel that keeps every message list it was called with."""

    received: list[list[BaseMessage]] = Field(default_factory=list)

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.received.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


def calls(tool: tuple[str, dict[str, Any]], cid: str) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": tool[0], "args": dict(tool[1]),
                                              "id": cid, "type": "tool_call"}])


def graph(model: RecordingModel, session: SagaSession, saver: Any) -> Any:
    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", saga_tool_node(session))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=saver)


def seen(messages: list[BaseMessage]) -> list[dict[str, Any]]:
    return [{"type": type(m).__name__, "content": m.content,
             "tool_call_id": m.tool_call_id if isinstance(m, ToolMessage) else None}
            for m in messages]


def main(db: str, mode: str, out: str, final_text: str) -> None:
    store = SagaStore.from_url(os.environ["SAGA_REDIS_URL"], Registry.from_modules(TOOLS),
                               Settings.from_env())
    turns = {"first": [calls(RESERVE, "call_1"), calls(CHARGE, "call_2")],
             "gated": [calls(RESERVE, "call_1"), calls(INVOICE, "call_inv")]}.get(mode, [])
    model = RecordingModel(messages=iter([*turns, AIMessage(content=final_text)]))
    with SqliteSaver.from_conn_string(db) as saver, \
            SagaSession(store, "shop", conversation_id="order-1") as session:
        app = graph(model, session, saver)
        start: Any = {"messages": [HumanMessage("Order a laptop")]}
        if mode == "resume":
            start = None
        elif mode == "approve":
            start = Command(resume={"approved": True, "by": "alice"})
        # "sync": the checkpoint holding the model's tool calls is saved before the
        # tools run (LangGraph's default saves it while they run, and a SIGKILL then
        # can lose it: the resume asks the model again, as if it never called)
        result = app.invoke(start, THREAD, durability="sync")
        sagas = session.sagas
    with open(out, "w") as f:
        json.dump({"received": [seen(r) for r in model.received], "sagas": sagas,
                   "last": result["messages"][-1].content,
                   "interrupts": [i.value["tool_call_id"]
                                  for i in result.get("__interrupt__", [])]}, f)


if __name__ == "__main__":
    main(*sys.argv[1:5])
