"""OpenAI Agents SDK: the model's tool calls as steps of a saga.

>>> tools = saga_tools(saga)                                       # doctest: +SKIP
>>> agent = Agent(name="shop", tools=tools)                        # doctest: +SKIP
>>> config = RunConfig(call_model_input_filter=saga_input_filter(saga))  # doctest: +SKIP
>>> result = await Runner.run(agent, "order a laptop", run_config=config)  # doctest: +SKIP

* Each call runs as ``saga.call(tool, args, tool_call_id=<the SDK's call_id>)``.
* A call the saga's policy gates has ``needs_approval``: the run stops with an
  interruption; decide it with :func:`approve` / :func:`reject` (they call
  ``RunState.approve`` / ``RunState.reject`` and record who decided in the
  chain), then resume the run with the state.
* A failed step's result says what failed and what was rolled back, and
  :func:`saga_input_filter` rewrites the earlier calls' results to "rolled
  back" before the next model call. :func:`rebuild` does the same for
  ``RunResult.to_input_list()`` items in a later turn.
* With a :class:`SagaSession`, a run resumed from the SDK's own session
  (``SQLiteSession``) after a crash finds its saga from the conversation's call
  ids in the input filter, and the model is told the call that was in flight,
  which the SDK never saved, with its result from the log.

Needs ``pip install 'saga-store[openai-agents]'``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from typing import Any

import orjson

from saga_store.integrations import missing_extra

try:
    from agents import FunctionTool, RunContextWrapper, RunState, ToolApprovalItem
    from agents.run_config import CallModelData, ModelInputData
    from agents.tool_context import ToolContext
except ImportError as exc:  # the framework is an extra
    raise missing_extra("openai-agents", exc) from exc

from saga_store import AsyncSaga, Saga, SagaState
from saga_store.client.context import step_views
from saga_store.errors import InvalidInput
from saga_store.integrations._common import (
    Approval,
    SagaCalls,
    calls_for,
    exposed,
    gated,
    operator,
    tool_defs,
)
from saga_store.integrations._rewrite import rewrite, step_call_id, unanswered
from saga_store.integrations._session import SagaSession
from saga_store.log.canonical import loads

__all__ = ["SagaSession", "approve", "areject", "rebuild", "reject", "saga_id_in",
           "saga_input_filter", "saga_tools"]


def saga_tools(saga: Saga | AsyncSaga | SagaSession, names: Iterable[str] | None = None, *,
               on_failure: str = "result") -> list[FunctionTool]:
    """One ``FunctionTool`` per tool the model may call (``names``, or every tool that
    is not a compensation or a probe). ``on_failure="raise"`` fails the run instead
    of returning a failed step's result.

    With a :class:`SagaSession`, the saga's id goes into the run's context (a dict
    context gets ``"saga_id"``; an object, its ``saga_id`` attribute), so a
    ``RunState`` saved with it and resumed in any process goes on with that saga."""
    if isinstance(saga, SagaSession):
        saga.options["on_failure"] = on_failure
        store = saga.store
    else:
        store = calls_for(saga, on_failure=on_failure).store
    specs = exposed(store.registry, names)
    return [_function_tool(saga, d) for d in tool_defs(store.registry, specs)]


def _bind(saga: Saga | AsyncSaga | SagaSession, context: Any, call_id: str | None,
          ) -> SagaCalls:
    """The calls of the saga this call belongs to; a session's saga id goes into the
    run's context."""
    if not isinstance(saga, SagaSession):
        return calls_for(saga)
    calls = saga.calls(call_id, recorded=saga_id_in(context))
    if isinstance(context, MutableMapping):
        context["saga_id"] = calls.saga_id
    elif context is not None and hasattr(context, "saga_id"):
        context.saga_id = calls.saga_id
    return calls


def saga_id_in(context: Any) -> str | None:
    """The saga id a run's context holds (see :func:`saga_tools`), or None."""
    got = context.get("saga_id") if isinstance(context, Mapping) else \
        getattr(context, "saga_id", None)
    return got if isinstance(got, str) else None


def _function_tool(saga: Saga | AsyncSaga | SagaSession, d: dict[str, Any]) -> FunctionTool:
    name = d["name"]
    store = saga.store if isinstance(saga, SagaSession) else calls_for(saga).store

    async def invoke(ctx: ToolContext[Any], arguments: str) -> str:
        calls = await asyncio.to_thread(_bind, saga, ctx.context, ctx.tool_call_id)
        # the SDK invokes a call that needs approval only once it was approved
        outcome = await calls.arun(name, _parse(arguments), ctx.tool_call_id,
                                   approved_by_framework=True)
        if isinstance(saga, SagaSession):
            saga.unpark(ctx.tool_call_id)
        return outcome.text  # a refused call's text asks the model to repair it

    async def needs_approval(ctx: RunContextWrapper[Any], params: dict[str, Any],
                             call_id: str) -> bool:
        if gated(store, name, params) is None:
            return False
        if isinstance(saga, SagaSession):  # the run stops here until a person decides
            await asyncio.to_thread(_bind, saga, ctx.context, call_id)
            await asyncio.to_thread(saga.park, call_id)
        return True

    # the registry's schema is not in OpenAI's strict subset (defaults, optional
    # fields); the saga validates every call anyway, before anything is written
    return FunctionTool(name=name, description=d["description"],
                        params_json_schema=d["parameters"], on_invoke_tool=invoke,
                        strict_json_schema=False, needs_approval=needs_approval)


def _parse(arguments: str) -> Any:
    """The model's arguments with their numbers as written (orjson alone would make
    an integer beyond 64 bits a float, which the saga could not tell from one sent)."""
    try:
        return loads(arguments or "{}", "arguments")
    except InvalidInput:
        return arguments  # not an object: the saga refuses it as an invalid call


def approve(saga: Saga | AsyncSaga | SagaSession, state: RunState[Any],
            item: ToolApprovalItem, *, by: str | None = None, reason: str = "") -> None:
    """``state.approve(item)``, and the grant is recorded in the chain, with ``by``
    (default ``SAGA_OPERATOR`` or the login name), when the step reaches its gate."""
    if item.call_id is not None:
        decision = Approval(True, by or operator(), reason)
        if isinstance(saga, SagaSession):  # bound to its saga at the call
            cid = step_call_id(item.call_id)
            assert cid is not None
            saga.approvals[cid] = decision
        else:
            calls_for(saga).decide_ahead(item.call_id, decision)
    state.approve(item)


def reject(saga: Saga | AsyncSaga | SagaSession, state: RunState[Any], item: ToolApprovalItem, *,
           by: str | None = None, reason: str = "") -> str:
    """Deny a gated call: the step is logged, its gate records ``approval_denied``
    (with ``by`` and ``reason``), so it never runs and the saga unwinds what ran, as
    ``saga deny`` does. Then ``state.reject(item)`` with a message that says so,
    which the model reads when the run resumes; returns that message. Blocks until
    the unwind is done (:func:`areject` from a coroutine)."""
    context = getattr(getattr(state, "_context", None), "context", None)
    calls = _bind(saga, context, item.call_id)
    outcome = calls.run(item.name or "", _parse(item.arguments or "{}"), item.call_id,
                        Approval(False, by or operator(), reason))
    if isinstance(saga, SagaSession) and item.call_id is not None:
        saga.unpark(item.call_id)
    state.reject(item, rejection_message=outcome.text)
    return outcome.text


async def areject(saga: Saga | AsyncSaga | SagaSession, state: RunState[Any],
                  item: ToolApprovalItem, *, by: str | None = None, reason: str = "") -> str:
    """:func:`reject` on a worker thread."""
    return await asyncio.to_thread(reject, saga, state, item, by=by, reason=reason)


def saga_input_filter(saga: Saga | AsyncSaga | SagaSession) -> Any:
    """A ``RunConfig(call_model_input_filter=...)``: before each model call, the results
    of this saga's rolled-back calls say so (their pairs are kept), and the saga's
    closing note follows them."""
    fixed = None if isinstance(saga, SagaSession) else calls_for(saga)

    async def input_filter(data: CallModelData[Any]) -> ModelInputData:
        items = list(data.model_data.input)
        calls = fixed
        if isinstance(saga, SagaSession):  # a resumed conversation names its saga
            calls = await asyncio.to_thread(saga.found, _call_ids(items))
        if calls is None:
            return data.model_data
        states = await asyncio.to_thread(
            saga.states if isinstance(saga, SagaSession) else calls.states)
        if all(st.saga_id != calls.saga_id for st in states) and \
                (_unanswered(items) or _untold(items, calls.saga.state)):
            # a run stopped mid-call: the log says what its history does not
            states.append(await asyncio.to_thread(calls.store.state, calls.saga_id))
        if not states:
            return data.model_data
        return ModelInputData(input=rebuild(data.model_data.input, states),
                              instructions=data.model_data.instructions)

    return input_filter


def _call_ids(items: Sequence[Any]) -> list[str | None]:
    return [i.get("call_id") for i in items
            if isinstance(i, dict) and i.get("type") == "function_call"]


def _unanswered(items: Sequence[Any]) -> bool:
    answered = {i.get("call_id") for i in items
                if isinstance(i, dict) and i.get("type") == "function_call_output"}
    return any(c not in answered for c in _call_ids(items))


def rebuild(items: Sequence[Any], states: Iterable[SagaState]) -> list[Any]:
    """Input items (``RunResult.to_input_list()``) rewritten from the sagas' logs: each
    call's output is what ``rebuild_history`` says of it, and each saga's closing
    note follows its last output as a system message. A ``function_call`` with no
    output (the call in flight when the agent stopped) gets one, from the log, right
    after it; a call a saga logged that ``items`` lack, when they hold others of its
    calls (the SDK saves a turn to its session only once its tools return), is
    added with its result after that saga's last item. Other items are unchanged."""
    states = list(states)
    items = _answer_all(_tell_logged(list(items), states), states)
    results: list[tuple[str | None, str | None]] = []
    notes = []
    for item in items:
        if isinstance(item, dict) and item.get("type") == "function_call_output":
            text = item.get("output")
            results.append((item.get("call_id"), text if isinstance(text, str) else None))
            continue
        if isinstance(item, dict) and item.get("role") == "system" \
                and isinstance(item.get("content"), str):
            notes.append(item["content"])
        results.append((None, None))
    plan = rewrite(results, states, notes)
    out: list[Any] = []
    for i, item in enumerate(items):
        out.append({**item, "output": plan.texts[i]} if i in plan.texts else item)
        out.extend({"role": "system", "content": note} for note in plan.notes_after.get(i, []))
    return out


def _untold(items: Sequence[Any], state: SagaState) -> list[dict[str, Any]]:
    """The calls ``state`` logged that a history holding some of its calls lacks (the
    SDK saves a turn once its tools return: a run killed mid-call never saved the
    call), as ``step_views``; none for a history with none of the saga's calls."""
    have = {step_call_id(c) for c in _call_ids(items)}
    views = step_views(state)
    if not have & {v["tool_call_id"] for v in views}:
        return []
    return [v for v in views if v["tool_call_id"] not in have]


def _tell_logged(items: list[Any], states: list[SagaState]) -> list[Any]:
    """``items`` with each call a saga logged and the history lacks, and its result,
    after the last item of that saga's calls."""
    for state in states:
        untold = _untold(items, state)
        if not untold:
            continue
        mine = {v["tool_call_id"] for v in step_views(state)}
        at = max(i for i, item in enumerate(items) if isinstance(item, dict)
                 and item.get("type") in ("function_call", "function_call_output")
                 and step_call_id(item.get("call_id")) in mine)
        told: list[Any] = []
        for v in untold:
            told += [{"type": "function_call", "call_id": v["tool_call_id"], "name": v["tool"],
                      "arguments": orjson.dumps(v["args"]).decode()},
                     {"type": "function_call_output", "call_id": v["tool_call_id"],
                      "output": v["result"]}]
        items = [*items[:at + 1], *told, *items[at + 1:]]
    return items


def _answer_all(items: list[Any], states: list[SagaState]) -> list[Any]:
    """``items`` with a ``function_call_output`` for every ``function_call``."""
    answered = {i.get("call_id") for i in items
                if isinstance(i, dict) and i.get("type") == "function_call_output"}
    calls = [i.get("call_id") for i in items
             if isinstance(i, dict) and i.get("type") == "function_call"]
    texts = unanswered([c for c in calls if isinstance(c, str) and c not in answered], states)
    out: list[Any] = []
    for item in items:
        out.append(item)
        cid = item.get("call_id") if isinstance(item, dict) else None
        if item is not None and isinstance(item, dict) and item.get("type") == "function_call" \
                and cid in texts:
            out.append({"type": "function_call_output", "call_id": cid,
                        "output": texts[cid][0]})
    return out
