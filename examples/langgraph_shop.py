"""A LangGraph agent whose tool calls are a saga: ``make example-langgraph``.

Offline the graph's model is LangChain's GenericFakeChatModel, scripted with the
order story's calls (reserve, charge, a CRM call that hangs). With
``ANTHROPIC_API_KEY`` or ``OPENAI_API_KEY`` set and langchain-anthropic or
langchain-openai installed, it runs on a real chat model (``SAGA_EXAMPLE_MODEL``)
bound to the node's tools.
"""

from __future__ import annotations

import os
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from saga_store.integrations.langgraph import SagaSession, saga_tool_node

from .agent_runtime import (
    ORDER,
    PROMPT,
    conversation,
    heading,
    real_model,
    saga_store,
    show,
    wrapped,
)


def scripted() -> Any:
    turns = [AIMessage(content="", tool_calls=[{"name": t, "args": dict(a), "id": c,
                                                "type": "tool_call"}]) for t, a, c in ORDER]
    turns.append(AIMessage(content="I could not place the order: the earlier steps were "
                                   "rolled back, so nothing is reserved or charged."))
    return GenericFakeChatModel(messages=iter(turns))


def live_model(key: str, node: ToolNode) -> Any:
    if key == "ANTHROPIC_API_KEY":
        from langchain_anthropic import ChatAnthropic  # type: ignore[import-not-found]  # optional, real-model mode only
        chat = ChatAnthropic(model=os.environ.get("SAGA_EXAMPLE_MODEL", "claude-sonnet-4-5"))
    else:
        from langchain_openai import ChatOpenAI  # type: ignore[import-not-found]  # optional, real-model mode only
        chat = ChatOpenAI(model=os.environ.get("SAGA_EXAMPLE_MODEL", "gpt-4.1-mini"))
    return chat.bind_tools(list(node.tools_by_name.values()))


def main() -> None:
    key = real_model("ANTHROPIC_API_KEY", "OPENAI_API_KEY")
    print(f"LangGraph, {'a real chat model' if key else 'scripted model'}, ", end="")
    with saga_store() as store:
        # the session opens the saga at the model's first call, named after it
        with SagaSession(store, "shop-agent", conversation_id=conversation()) as session:
            node = saga_tool_node(session)
            model = live_model(key, node) if key else scripted()

            def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
                if any(isinstance(m, ToolMessage) and m.status == "error"
                       for m in state["messages"]):
                    heading("what the model is shown after the CRM call")
                    for m in state["messages"]:
                        if isinstance(m, ToolMessage):
                            print(wrapped(m.content))
                return {"messages": [model.invoke(state["messages"])]}

            graph = StateGraph(MessagesState)
            graph.add_node("agent", agent)
            graph.add_node("tools", node)
            graph.add_edge(START, "agent")
            graph.add_conditional_edges("agent", tools_condition)
            graph.add_edge("tools", "agent")
            out = graph.compile().invoke({"messages": [HumanMessage(PROMPT)]})
        sid = session.sagas[0]
        heading("the agent's answer")
        print(wrapped(out["messages"][-1].content))
        show(store, sid)


if __name__ == "__main__":
    main()
