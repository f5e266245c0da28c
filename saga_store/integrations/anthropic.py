"""Anthropic SDK: the ``tool_use`` blocks of a reply as steps of a saga.

The raw loop::

    tools = anthropic_tools(saga)
    while True:
        reply = client.messages.create(model=..., max_tokens=1024, tools=tools,
                                       messages=messages)
        messages.append({"role": "assistant", "content": reply.content})
        if reply.stop_reason != "tool_use":
            break
        messages.append({"role": "user",
                         "content": run_tool_uses(saga, reply, messages=messages)})

The beta tool runner, given the same schemas (not runnable tools, so it runs
nothing itself)::

    runner = client.beta.messages.tool_runner(model=..., max_tokens=1024,
                                              tools=anthropic_tools(saga), messages=messages)
    for reply in runner:
        results = run_tool_uses(saga, reply)
        if results:
            runner.append_messages({"role": "user", "content": results})
        if any(r.get("is_error") for r in results):  # say what was rolled back
            states = [store.state(saga.saga_id)]
            runner.set_messages_params(
                lambda p: {**p, "messages": rebuild(p["messages"], states)})

(The runner warns that it holds no runnable tool for those calls: the saga runs
them, as its "handle the tool call manually" case says.)

* Each ``tool_use`` runs as ``saga.call(name, input, tool_call_id=<its id>)``.
  Arguments the saga refuses come back as an ``is_error`` result for the model
  to repair.
* A failed step's result says what failed and what was rolled back; given
  ``messages``, the earlier results of the saga's rolled-back calls in it are
  rewritten in place, so the next request already says so. :func:`rebuild`
  does the same for a stored history, closing notes included.
* A call the saga's policy gates is decided by ``approve(preview)`` (``True``,
  ``False``, an :class:`Approval` or ``{"approved", "by", "reason"}``) and the
  decision is recorded in the chain; without ``approve``, the call waits for a
  decision made elsewhere (``saga approve``). With a :class:`SagaSession`,
  ``approve`` answering None means a person decides later: the call and the
  ones after it in the reply are not run, the saga is parked
  (``session.parked`` says so), and the saved reply run again, in any process,
  hours later, asks ``approve`` again.

Needs ``pip install 'saga-store[anthropic]'``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from saga_store import AsyncSaga, Saga, SagaState
from saga_store.integrations._common import (
    Approval,
    SagaCalls,
    calls_for,
    exposed,
    operator,
    tool_defs,
)
from saga_store.integrations._rewrite import rewrite, unanswered
from saga_store.integrations._session import SagaSession

__all__ = ["Approval", "SagaSession", "anthropic_tools", "arun_tool_uses", "rebuild",
           "run_tool_uses"]

Approver = Callable[[dict[str, Any]], Any]


def anthropic_tools(saga: Saga | AsyncSaga | SagaSession, names: Iterable[str] | None = None,
                    ) -> list[dict[str, Any]]:
    """Tool definitions (``name``, ``description``, ``input_schema``) for the tools
    the model may call: ``names``, or every tool that is not a compensation or probe."""
    registry = saga.store.registry if isinstance(saga, SagaSession) else \
        calls_for(saga).store.registry
    return [{"name": d["name"], "description": d["description"], "input_schema": d["parameters"]}
            for d in tool_defs(registry, exposed(registry, names))]


def run_tool_uses(saga: Saga | AsyncSaga | SagaSession, message: Any, *,
                  messages: list[Any] | None = None, approve: Approver | None = None,
                  names: Iterable[str] | None = None, on_failure: str = "result",
                  ) -> list[dict[str, Any]]:
    """Run the ``tool_use`` blocks of ``message`` (a ``Message``, ``BetaMessage`` or
    dict) as steps, in order; returns one ``tool_result`` block per call, for the next
    user turn. With ``messages`` (the history so far), a failure also rewrites the
    earlier results of the rolled-back calls in it, in place.

    With a :class:`SagaSession`, the saga is the one ``messages`` (a saved history,
    loaded in any process) already belongs to: a ``tool_use`` sent again is answered
    from its log, never run twice."""
    uses = _tool_uses(message)
    history: list[str | None] = []
    if isinstance(saga, SagaSession):
        saga.options["on_failure"] = on_failure
        history = [b.get("id") for m in messages or [] for b in _tool_uses(m)]
        calls = saga.calls(uses[0]["id"] if uses else None, history)
    else:
        calls = calls_for(saga, on_failure=on_failure)
    allowed = {s.name for s in exposed(calls.store.registry, names)}
    blocks = []
    for use in uses:
        if isinstance(saga, SagaSession):  # after a rollback, maybe the next saga
            calls = saga.calls(use["id"], history)
        approval = _decision(calls, use, allowed, approve, isinstance(saga, SagaSession))
        if approval is WAIT:
            assert isinstance(saga, SagaSession)
            saga.park(use["id"])
            break  # a person decides later: this call and the ones after it wait
        blocks.append(_run(calls, use, allowed, approval))
        if isinstance(saga, SagaSession):
            saga.unpark(use["id"])
    if calls.final is not None:
        # the reply's earlier calls succeeded before one failed: their results say
        # what is true now (the failed call's own result carries the closing note)
        turn = rebuild([{"role": "user", "content": blocks}], [calls.final], notes=False)
        blocks = [b if b.get("is_error") else r for b, r in zip(blocks, turn[0]["content"],
                                                                 strict=True)]
        if messages is not None:
            messages[:] = rebuild(messages, [calls.final], notes=False)
    return blocks


async def arun_tool_uses(saga: Saga | AsyncSaga, message: Any, **kwargs: Any,
                         ) -> list[dict[str, Any]]:
    """:func:`run_tool_uses` on a worker thread (for ``AsyncAnthropic``)."""
    return await asyncio.to_thread(run_tool_uses, saga, message, **kwargs)


WAIT = Approval(False, "")  # no decision yet: a person decides later


def _decision(calls: SagaCalls, use: Mapping[str, Any], allowed: set[str],
              approve: Approver | None, can_wait: bool) -> Approval | None:
    """``approve``'s answer for a gated call (asked once), None for a call that is
    not gated, has no ``approve`` or is logged already (sent again, its log answers).
    :data:`WAIT` when ``approve`` answered None with a :class:`SagaSession`
    (``can_wait``): the session parks the saga, so the decision may come from any
    process, hours later, by running the saved reply again."""
    if use["name"] not in allowed or approve is None or SagaSession.logged(calls, use["id"]):
        return None
    preview = calls.gated(use["name"], use.get("input"))
    if preview is None:
        return None
    answer = approve({"saga_id": calls.saga_id, "tool_use_id": use["id"], **preview})
    return WAIT if answer is None and can_wait else _approval(answer)


def _run(calls: SagaCalls, use: Mapping[str, Any], allowed: set[str],
         approval: Approval | None) -> dict[str, Any]:
    name, args, use_id = use["name"], use.get("input"), use["id"]
    if name not in allowed:  # a compensation or probe only runs on the saga's behalf
        return {"type": "tool_result", "tool_use_id": use_id, "is_error": True,
                "content": f"unknown tool {name!r}; call one of: {', '.join(sorted(allowed))}"}
    outcome = calls.run(name, args, use_id, approval)
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": use_id,
                             "content": outcome.text}
    if not outcome.ok:
        block["is_error"] = True
    return block


def _approval(answer: Any) -> Approval:
    if isinstance(answer, Approval):
        return answer
    if isinstance(answer, Mapping):
        return Approval(bool(answer.get("approved")), str(answer.get("by") or operator()),
                        str(answer.get("reason") or ""))
    return Approval(bool(answer), operator())


def _tool_uses(message: Any) -> list[Mapping[str, Any]]:
    content = message.get("content") if isinstance(message, Mapping) else \
        getattr(message, "content", None)
    out = []
    for block in content if isinstance(content, list) else []:
        b = block if isinstance(block, Mapping) else _as_dict(block)
        if b.get("type") == "tool_use":
            out.append(b)
    return out


def _as_dict(block: Any) -> dict[str, Any]:
    dump = getattr(block, "model_dump", None)
    return dict(dump()) if callable(dump) else {}


def rebuild(messages: Sequence[Any], states: Iterable[SagaState], *,
            notes: bool = True) -> list[Any]:
    """Message params rewritten from the sagas' logs: each ``tool_result`` of a saga's
    call says what ``rebuild_history`` says of it (``is_error`` for a failed or
    in-doubt call), and, with ``notes``, each saga's closing note is a text block at
    the end of the user turn holding its last result. A ``tool_use`` with no result
    (the call in flight when the agent stopped) gets one, from the log. Other
    blocks are unchanged."""
    states = list(states)
    messages = _answer_all(messages, states)
    where: list[tuple[int, int]] = []
    results: list[tuple[str | None, str | None]] = []
    present: list[str] = []
    for m, msg in enumerate(messages):
        if not isinstance(msg, Mapping) or msg.get("role") != "user":
            continue
        content = msg.get("content")
        if isinstance(content, str):
            present.append(content)
            continue
        for b, block in enumerate(content if isinstance(content, list) else []):
            if not isinstance(block, Mapping):
                continue
            if block.get("type") == "text":
                present.append(str(block.get("text")))
            elif block.get("type") == "tool_result":
                where.append((m, b))
                text = block.get("content")
                results.append((block.get("tool_use_id"), text if isinstance(text, str) else None))
    plan = rewrite(results, states, present)
    if not notes:
        plan.notes_after.clear()
    out = list(messages)
    touched: dict[int, list[Any]] = {}
    for i, (m, b) in enumerate(where):
        if i not in plan.texts and i not in plan.notes_after:
            continue
        content = touched.setdefault(m, list(out[m]["content"]))
        if i in plan.texts:
            block = {k: v for k, v in content[b].items() if k != "is_error"}
            block["content"] = plan.texts[i]
            if i in plan.errors:
                block["is_error"] = True
            content[b] = block
    for i, (m, _) in enumerate(where):
        for note in plan.notes_after.get(i, []):
            touched.setdefault(m, list(out[m]["content"])).append({"type": "text", "text": note})
    for m, content in touched.items():
        out[m] = {**out[m], "content": content}
    return out


def _answer_all(messages: Sequence[Any], states: list[SagaState]) -> list[Any]:
    """``messages`` with a ``tool_result`` for every ``tool_use``: those missing go
    first in the next user turn (a new one if there is none), as the API requires."""
    out = list(messages)
    m = 0
    while m < len(out):
        msg = out[m]
        if not isinstance(msg, Mapping) or msg.get("role") != "assistant":
            m += 1
            continue
        ids = [str(u["id"]) for u in _tool_uses(msg)]
        nxt = out[m + 1] if m + 1 < len(out) else None
        turn = nxt if isinstance(nxt, Mapping) and nxt.get("role") == "user" else None
        content = turn.get("content") if turn is not None else None
        blocks = list(content) if isinstance(content, list) else \
            ([{"type": "text", "text": content}] if isinstance(content, str) else [])
        have = {b.get("tool_use_id") for b in blocks if isinstance(b, Mapping)}
        missing = [i for i in ids if i not in have]
        if missing:
            texts = unanswered(missing, states)
            added = [{"type": "tool_result", "tool_use_id": i, "content": texts[i][0],
                      **({"is_error": True} if texts[i][1] else {})} for i in missing]
            if turn is None:
                out.insert(m + 1, {"role": "user", "content": added})
            else:
                out[m + 1] = {**turn, "content": [*added, *blocks]}
        m += 1
    return out
