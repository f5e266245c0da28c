"""LangGraph: a ``ToolNode`` whose every call is a step of a saga.

>>> graph = StateGraph(MessagesState)                               # doctest: +SKIP
>>> graph.add_node("tools", saga_tool_node(saga))                   # doctest: +SKIP

* Each call runs as ``saga.call(tool, args, tool_call_id=<the ToolCall's id>)``;
  arguments the saga refuses come back as an error ``ToolMessage`` for the
  model to repair.
* A call the saga's policy gates calls ``interrupt()`` with the impact preview
  (the graph needs a checkpointer). Resume it with
  ``Command(resume={"approved": True, "by": "alice"})`` (or ``False``, with a
  ``"reason"``); the decision is recorded in the chain with who decided. A
  denial fails the step, so the saga unwinds what ran. Calls that ran before
  it in the same node run again on resume and get their recorded results.
* A failed step answers with a ``Command`` that replaces the earlier calls'
  ``ToolMessage``\\ s by id with "rolled back" results, adds the failed call's
  result and the saga's closing note, so the next model call sees the truth.
  :func:`rebuild` gives the same replacements for a stored history.

The tools the node holds (``node.tools_by_name``) carry the registry's schemas
for ``model.bind_tools``; the node runs them only through the saga.

Needs ``pip install 'saga-store[langgraph]'``.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from langchain_core.messages import BaseMessage, SystemMessage, ToolMessage
from langchain_core.tools import StructuredTool
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command, interrupt

from saga_store import AsyncSaga, Saga, SagaState
from saga_store.integrations._common import (
    Approval,
    Outcome,
    SagaCalls,
    calls_for,
    exposed,
    operator,
    rewrite,
    tool_defs,
)

__all__ = ["rebuild", "saga_tool_node"]

Execute = Callable[[ToolCallRequest], Any]


def saga_tool_node(saga: Saga | AsyncSaga, names: Iterable[str] | None = None, *,
                   on_failure: str = "result", name: str = "tools",
                   messages_key: str = "messages") -> ToolNode:
    """A ``ToolNode`` for the registry's tools (``names``, or all but compensations
    and probes), each call a step of ``saga``. ``on_failure="raise"`` raises a failed
    step's error out of the graph instead of answering with it."""
    calls = calls_for(saga, on_failure=on_failure)
    specs = exposed(calls.store.registry, names)
    tools = [_schema_tool(d) for d in tool_defs(calls.store.registry, specs)]

    def wrap(request: ToolCallRequest, execute: Execute) -> ToolMessage | Command[Any]:
        tc = request.tool_call
        outcome = calls.run(tc["name"], tc["args"], tc["id"], _gate(calls, tc))
        return _answer(calls, request, outcome, messages_key)

    async def awrap(request: ToolCallRequest,
                    execute: Callable[[ToolCallRequest], Awaitable[Any]],
                    ) -> ToolMessage | Command[Any]:
        tc = request.tool_call
        outcome = await calls.arun(tc["name"], tc["args"], tc["id"], _gate(calls, tc))
        return _answer(calls, request, outcome, messages_key)

    return ToolNode(tools, name=name, messages_key=messages_key, wrap_tool_call=wrap,
                    awrap_tool_call=awrap)


def _schema_tool(d: dict[str, Any]) -> StructuredTool:
    def never(**kwargs: Any) -> str:
        raise RuntimeError(f"{d['name']} runs only as a saga step, through saga_tool_node")

    async def anever(**kwargs: Any) -> str:
        return never(**kwargs)

    return StructuredTool(name=d["name"], description=d["description"],
                          args_schema=d["parameters"], func=never, coroutine=anever)


def _gate(calls: SagaCalls, tc: Any) -> Approval | None:
    """Ask a person through ``interrupt`` when the policy gates the call; on resume,
    the answer: ``True``/``False`` or ``{"approved": ..., "by": ..., "reason": ...}``."""
    preview = calls.gated(tc["name"], tc["args"])
    if preview is None:
        return None
    answer = interrupt({"saga_id": calls.saga_id, "tool_call_id": tc["id"], **preview})
    if isinstance(answer, dict):
        return Approval(bool(answer.get("approved")), str(answer.get("by") or operator()),
                        str(answer.get("reason") or ""))
    return Approval(bool(answer), operator())


def _answer(calls: SagaCalls, request: ToolCallRequest, outcome: Outcome,
            messages_key: str) -> ToolMessage | Command[Any]:
    tc = request.tool_call
    status = "success" if outcome.ok else "error"
    message = ToolMessage(content=outcome.text, tool_call_id=tc["id"], name=tc["name"],
                          status=status, id=str(uuid.uuid4()))
    if outcome.ok or outcome.retry:
        return message
    # the step failed and the saga has unwound: replace what the history says of
    # its calls (by message id) in the same update that answers this call
    state = request.state
    earlier = state.get(messages_key, []) if isinstance(state, dict) else \
        getattr(state, messages_key, [])
    update = rebuild([*earlier, message], calls.states())
    if not any(isinstance(m, ToolMessage) and m.tool_call_id == tc["id"] for m in update):
        update.append(message)
    return Command(update={messages_key: update})


def rebuild(messages: Sequence[BaseMessage], states: Iterable[SagaState],
            ) -> list[BaseMessage]:
    """The replacement messages for a history, from the sagas' logs: each changed
    ``ToolMessage`` again with its id (so the ``add_messages`` reducer replaces it)
    and what ``rebuild_history`` says of the call, then each saga's closing note as a
    ``SystemMessage`` (id ``saga-note-<saga id>``) unless the history has it."""
    states = list(states)
    results: list[tuple[str | None, str | None]] = []
    notes = []
    for m in messages:
        if isinstance(m, ToolMessage):
            results.append((m.tool_call_id, m.content if isinstance(m.content, str) else None))
            continue
        if isinstance(m, SystemMessage) and isinstance(m.content, str):
            notes.append(m.content)
        results.append((None, None))
    plan = rewrite(results, states, notes)
    note_ids = {}
    for st in states:
        note_ids[st.saga_id] = f"saga-note-{st.saga_id}"
    out: list[BaseMessage] = []
    for i, m in enumerate(messages):
        if i in plan.texts:
            out.append(m.model_copy(update={
                "content": plan.texts[i],
                "status": "error" if i in plan.errors else getattr(m, "status", "success")}))
        for note in plan.notes_after.get(i, []):
            sid = next((s for s in note_ids if f"Saga {s} " in note), "")
            out.append(SystemMessage(content=note, id=note_ids.get(sid) or str(uuid.uuid4())))
    return out
