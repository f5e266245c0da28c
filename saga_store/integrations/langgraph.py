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

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from saga_store.integrations import missing_extra

try:
    from langchain_core.messages import AIMessage, BaseMessage, SystemMessage, ToolMessage
    from langchain_core.tools import StructuredTool
    from langgraph.prebuilt import ToolNode
    from langgraph.prebuilt.tool_node import ToolCallRequest
    from langgraph.types import Command, interrupt
except ImportError as exc:  # the framework is an extra
    raise missing_extra("langgraph", exc) from exc

from saga_store import AsyncSaga, Saga, SagaState
from saga_store.integrations._common import (
    Approval,
    Outcome,
    SagaCalls,
    calls_for,
    exposed,
    operator,
    tool_defs,
)
from saga_store.integrations._rewrite import rewrite, unanswered
from saga_store.integrations._session import SagaSession

__all__ = ["SagaSession", "rebuild", "result_id", "saga_id_of", "saga_tool_node"]

Execute = Callable[[ToolCallRequest], Any]
TURN_WAIT_S = 30.0  # a call whose predecessor in the reply never shows goes on after this


def saga_tool_node(saga: Saga | AsyncSaga | SagaSession, names: Iterable[str] | None = None,
                   *, on_failure: str = "result", name: str = "tools",
                   messages_key: str = "messages") -> ToolNode:
    """A ``ToolNode`` for the registry's tools (``names``, or all but compensations
    and probes), each call a step of ``saga``, or with a :class:`SagaSession`, of the
    saga the graph's state names (so a graph resumed from its checkpointer, in any
    process, goes on with its saga). ``on_failure="raise"`` raises a failed step's
    error out of the graph instead of answering with it."""
    if isinstance(saga, SagaSession):
        fixed, store = None, saga.store
        saga.options["on_failure"] = on_failure
    else:
        fixed = calls_for(saga, on_failure=on_failure)
        store = fixed.store
    specs = exposed(store.registry, names)
    tools = [_schema_tool(d) for d in tool_defs(store.registry, specs)]
    turns = _Turns()

    def bind(request: ToolCallRequest) -> SagaCalls:
        if fixed is not None:
            return fixed
        assert isinstance(saga, SagaSession)
        history = _messages(request, messages_key)
        return saga.calls(request.tool_call["id"], _call_ids(history), saga_id_of(history))

    def run(request: ToolCallRequest) -> ToolMessage | Command[Any]:
        tc = request.tool_call
        batch, index = _batch(request, messages_key)
        with turns.turn(batch, index):  # a reply's calls run in its order (see _Turns)
            calls = bind(request)
            outcome = calls.run(tc["name"], tc["args"], tc["id"],
                                _gate(calls, tc, saga if fixed is None else None))
            earlier = before(request, batch[:index], messages_key)
            return _answer(calls, request, outcome, messages_key, earlier)

    def wrap(request: ToolCallRequest, execute: Execute) -> ToolMessage | Command[Any]:
        return run(request)

    async def awrap(request: ToolCallRequest,
                    execute: Callable[[ToolCallRequest], Awaitable[Any]],
                    ) -> ToolMessage | Command[Any]:
        # a copy of the context goes with it: interrupt() finds the run's config there
        return await asyncio.to_thread(run, request)

    return ToolNode(tools, name=name, messages_key=messages_key, wrap_tool_call=wrap,
                    awrap_tool_call=awrap)


class _Turns:
    """ToolNode runs the calls of one reply at once (threads, tasks); the saga takes
    them one at a time anyway. Taking them in the reply's order makes every answer
    truthful: a call that fails answers with the replacement of every result before
    it in the reply (by their ids, :func:`result_id`), and LangGraph applies the
    node's updates in the reply's order, so no earlier success is applied after it."""

    def __init__(self) -> None:
        self._next: dict[tuple[str, ...], int] = {}
        self._cond = threading.Condition()

    def turn(self, batch: tuple[str, ...], index: int) -> Any:
        turns = self

        class _Turn:
            def __enter__(self) -> None:
                with turns._cond:
                    turns._cond.wait_for(lambda: turns._next.get(batch, 0) >= index,
                                         timeout=TURN_WAIT_S)

            def __exit__(self, *exc: object) -> None:
                with turns._cond:
                    turns._next[batch] = max(turns._next.get(batch, 0), index + 1)
                    if turns._next[batch] >= len(batch):
                        del turns._next[batch]
                    turns._cond.notify_all()

        return _Turn()


def result_id(tool_call_id: str) -> str:
    """The message id of the ``ToolMessage`` that answers a call: the same wherever
    the call is answered (again on a resume), so a replacement finds it."""
    return f"saga-result-{tool_call_id}"


def saga_id_of(messages: Sequence[BaseMessage]) -> str | None:
    """The saga the latest answered call of ``messages`` belongs to (each answer
    carries it in its artifact), or None."""
    for m in reversed(messages):
        if isinstance(m, ToolMessage) and isinstance(m.artifact, dict) \
                and isinstance(m.artifact.get("saga_id"), str):
            return str(m.artifact["saga_id"])
    return None


def _messages(request: ToolCallRequest, messages_key: str) -> list[BaseMessage]:
    state = request.state
    got = state.get(messages_key, []) if isinstance(state, dict) else \
        getattr(state, messages_key, [])
    return list(got or [])


def _call_ids(messages: Sequence[BaseMessage]) -> list[str | None]:
    return [tc.get("id") for m in messages if isinstance(m, AIMessage) for tc in m.tool_calls]


def before(request: ToolCallRequest, ids: Sequence[str],
           messages_key: str) -> list[tuple[str, str]]:
    """``(id, tool name)`` of the calls ``ids`` of the request's reply."""
    names = {tc.get("id"): tc.get("name") for m in _messages(request, messages_key)
             if isinstance(m, AIMessage) for tc in m.tool_calls}
    return [(cid, str(names.get(cid) or "")) for cid in ids]


def _batch(request: ToolCallRequest, messages_key: str) -> tuple[tuple[str, ...], int]:
    """The ids of the reply's calls not yet answered, and this call's place among them."""
    cid = request.tool_call["id"]
    history = _messages(request, messages_key)
    answered = {m.tool_call_id for m in history if isinstance(m, ToolMessage)}
    for m in reversed(history):
        if isinstance(m, AIMessage) and any(tc.get("id") == cid for tc in m.tool_calls):
            batch = tuple(str(tc.get("id")) for tc in m.tool_calls
                          if tc.get("id") not in answered or tc.get("id") == cid)
            return batch, batch.index(cid)
    return (str(cid),), 0


def _schema_tool(d: dict[str, Any]) -> StructuredTool:
    def never(**kwargs: Any) -> str:
        raise RuntimeError(f"{d['name']} runs only as a saga step, through saga_tool_node")

    async def anever(**kwargs: Any) -> str:
        return never(**kwargs)

    return StructuredTool(name=d["name"], description=d["description"],
                          args_schema=d["parameters"], func=never, coroutine=anever)


def _gate(calls: SagaCalls, tc: Any, session: Any) -> Approval | None:
    """Ask a person through ``interrupt`` when the policy gates the call; on resume,
    the answer: ``True``/``False`` or ``{"approved": ..., "by": ..., "reason": ...}``."""
    preview = calls.gated(tc["name"], tc["args"])
    if preview is None:
        return None
    if isinstance(session, SagaSession):
        session.park(tc["id"])  # until resumed: the saga waits as long as the approval
    answer = interrupt({"saga_id": calls.saga_id, "tool_call_id": tc["id"], **preview})
    if isinstance(session, SagaSession):
        session.unpark(tc["id"])
    if isinstance(answer, dict):
        return Approval(bool(answer.get("approved")), str(answer.get("by") or operator()),
                        str(answer.get("reason") or ""))
    return Approval(bool(answer), operator())


def _answer(calls: SagaCalls, request: ToolCallRequest, outcome: Outcome,
            messages_key: str, before: Sequence[tuple[str, str]],
            ) -> ToolMessage | Command[Any]:
    tc = request.tool_call
    status = "success" if outcome.ok else "error"
    message = ToolMessage(content=outcome.text, tool_call_id=tc["id"], name=tc["name"],
                          status=status, id=result_id(str(tc["id"])),
                          artifact={"saga_id": calls.saga_id})
    if outcome.ok or outcome.retry:
        return message
    # the step failed and the saga has unwound: replace what the history says of
    # its calls (by message id) in the same update that answers this call, the
    # results of the same reply answered just before it included
    earlier = _messages(request, messages_key)
    siblings = [ToolMessage(content="", tool_call_id=cid, name=tool or None, id=result_id(cid),
                            artifact={"saga_id": calls.saga_id}) for cid, tool in before]
    update = rebuild([*earlier, *siblings, message], calls.states())
    if not any(isinstance(m, ToolMessage) and m.tool_call_id == tc["id"] for m in update):
        update.append(message)
    return Command(update={messages_key: update})

def rebuild(messages: Sequence[BaseMessage], states: Iterable[SagaState],
            ) -> list[BaseMessage]:
    """The replacement messages for a history, from the sagas' logs: each changed
    ``ToolMessage`` again with its id (so the ``add_messages`` reducer replaces it)
    and what ``rebuild_history`` says of the call, then each saga's closing note as a
    ``SystemMessage`` (id ``saga-note-<saga id>``) unless the history has it. A tool
    call with no ``ToolMessage`` (the call in flight when the graph stopped) gets one
    from the log (id :func:`result_id`); the reducer adds it at the end, which is its
    place when its ``AIMessage`` is the history's last, as in a checkpoint taken
    before the call ran."""
    states = list(states)
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    pending = {str(tc["id"]): tc["name"] for m in messages if isinstance(m, AIMessage)
               for tc in m.tool_calls if tc.get("id") and tc["id"] not in answered}
    texts = unanswered(list(pending), states)
    added = {result_id(cid) for cid in texts}
    messages = [*messages, *(ToolMessage(content=text, tool_call_id=cid, name=pending[cid],
                                         id=result_id(cid),
                                         status="error" if error else "success")
                             for cid, (text, error) in texts.items())]
    results: list[tuple[str | None, str | None]] = []
    present = []
    for m in messages:
        if isinstance(m, ToolMessage):
            results.append((m.tool_call_id, m.content if isinstance(m.content, str) else None))
            continue
        if isinstance(m, SystemMessage) and isinstance(m.content, str):
            present.append(m.content)
        results.append((None, None))
    plan = rewrite(results, states, present)
    notes: list[BaseMessage] = []
    note_ids = {}
    for st in states:
        note_ids[st.saga_id] = f"saga-note-{st.saga_id}"
    out: list[BaseMessage] = []
    for i, m in enumerate(messages):
        if i in plan.texts:
            out.append(m.model_copy(update={
                "content": plan.texts[i],
                "status": "error" if i in plan.errors else getattr(m, "status", "success")}))
        elif m.id in added:
            out.append(m)
        for note in plan.notes_after.get(i, []):
            sid = next((s for s in note_ids if f"Saga {s} " in note), "")
            notes.append(SystemMessage(content=note, id=note_ids.get(sid) or f"saga-note-{i}"))
    # the reducer appends new messages in this order: a note after every new result,
    # so no note comes between a call's results
    return [*out, *notes]
