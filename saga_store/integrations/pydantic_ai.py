"""Pydantic AI: the model's tool calls as steps of a saga.

>>> toolset = SagaToolset(saga)                                     # doctest: +SKIP
>>> agent = Agent(model, toolsets=[toolset], output_type=[str, DeferredToolRequests],
...               capabilities=[ProcessHistory(saga_history_processor(saga))])  # doctest: +SKIP

(Pydantic AI 2 takes history processors as the ``ProcessHistory`` capability;
before it, the same function went in ``Agent(history_processors=[...])``.)

* Each call runs as ``saga.call(tool, args, tool_call_id=<Pydantic AI's id>)``;
  arguments the saga refuses come back as ``ModelRetry``.
* A call the saga's policy gates raises ``ApprovalRequired`` (the impact
  preview is its metadata): the run ends with ``DeferredToolRequests``.
  :meth:`SagaToolset.decide` turns a person's decisions into the
  ``DeferredToolResults`` of the next run and records who decided in the
  chain (a denial fails the step, so the saga unwinds what ran).
* A failed step's result says what failed and what was rolled back, and
  :func:`saga_history_processor` rewrites the earlier results before the next
  model request; :func:`rebuild` does the same for a stored history.

Needs ``pip install 'saga-store[pydantic-ai]'``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from saga_store.integrations import missing_extra

try:
    from pydantic_ai import (
        ApprovalRequired,
        DeferredToolRequests,
        DeferredToolResults,
        ModelRetry,
        RunContext,
        ToolDenied,
    )
    from pydantic_ai.messages import (
        ModelMessage,
        ModelRequest,
        ModelResponse,
        RetryPromptPart,
        SystemPromptPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
    from pydantic_ai.tools import ToolDefinition
    from pydantic_ai.toolsets import AbstractToolset, ToolsetTool
    from pydantic_core import SchemaValidator, core_schema
except ImportError as exc:  # the framework is an extra
    raise missing_extra("pydantic-ai", exc) from exc

from saga_store import AsyncSaga, InvalidInput, Saga, SagaState
from saga_store.integrations._common import (
    Approval,
    SagaCalls,
    calls_for,
    exposed,
    gated,
    operator,
    tool_defs,
)
from saga_store.integrations._rewrite import rewrite, unanswered
from saga_store.integrations._session import SagaSession

__all__ = ["SagaSession", "SagaToolset", "rebuild", "saga_history_processor"]

# the saga validates every call (and counts the invalid ones) before anything is
# written: Pydantic AI passes the arguments through as they came
_AS_GIVEN = SchemaValidator(schema=core_schema.dict_schema())


class SagaToolset(AbstractToolset[Any]):
    """The registry's tools (``names``, or all but compensations and probes) as a
    toolset whose every call is a step of ``saga``."""

    def __init__(self, saga: Saga | AsyncSaga | SagaSession, names: Iterable[str] | None = None,
                 *, on_failure: str = "result", id: str | None = None,
                 max_retries: int = 2) -> None:
        self.session = saga if isinstance(saga, SagaSession) else None
        self._fixed: SagaCalls | None = None
        if isinstance(saga, SagaSession):
            saga.options["on_failure"] = on_failure
            store = saga.store
        else:
            self._fixed = calls_for(saga, on_failure=on_failure)
            store = self._fixed.store
        self.store = store
        self._defs = tool_defs(store.registry, exposed(store.registry, names))
        self._id, self.max_retries = id, max_retries

    @property
    def calls(self) -> SagaCalls:
        """The calls of the saga this toolset runs now (a session's current one)."""
        if self._fixed is not None:
            return self._fixed
        assert self.session is not None
        if self.session.current is None:
            raise InvalidInput("the session has no saga yet: it opens one at the first call")
        return self.session.current

    def _bind(self, call_id: str | None, history: Sequence[ModelMessage] = ()) -> SagaCalls:
        """With a session: the saga the history (its tool call ids) belongs to."""
        if self.session is None:
            return self.calls
        ids = [p.tool_call_id for m in history if isinstance(m, ModelResponse)
               for p in m.parts if isinstance(p, ToolCallPart)]
        return self.session.calls(call_id, ids)

    @property
    def id(self) -> str | None:
        return self._id

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        return {d["name"]: ToolsetTool(
            toolset=self, max_retries=self.max_retries, args_validator=_AS_GIVEN,
            tool_def=ToolDefinition(name=d["name"], description=d["description"],
                                    parameters_json_schema=d["parameters"]))
            for d in self._defs}

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any],
                        tool: ToolsetTool[Any]) -> Any:
        approval = None
        preview = gated(self.store, name, tool_args)
        if preview is not None:
            if not ctx.tool_call_approved:
                if self.session is not None:  # the run ends here until a person decides
                    await asyncio.to_thread(self._bind, ctx.tool_call_id, ctx.messages)
                    self.session.park(ctx.tool_call_id or "")
                raise ApprovalRequired(metadata=preview)
            meta = ctx.tool_call_metadata if isinstance(ctx.tool_call_metadata, dict) else {}
            approval = Approval(True, str(meta.get("by") or operator()),
                                str(meta.get("reason") or ""))
        calls = await asyncio.to_thread(self._bind, ctx.tool_call_id, ctx.messages)
        outcome = await calls.arun(name, tool_args, ctx.tool_call_id, approval)
        if self.session is not None and ctx.tool_call_id:
            self.session.unpark(ctx.tool_call_id)
        if outcome.retry:
            raise ModelRetry(outcome.text)
        return outcome.text

    async def decide(self, requests: DeferredToolRequests, approved: Mapping[str, bool], *,
                     by: str | None = None, reason: str = "") -> DeferredToolResults:
        """The ``DeferredToolResults`` for a person's decisions (tool call id ->
        approved, one for each call in ``requests.approvals``). A grant is recorded,
        with ``by``, when the step reaches its gate in the next run; a denial is
        recorded now (the step is logged, denied at its gate, and the saga unwinds),
        and the model is told what was rolled back."""
        who = by or operator()
        missing = [p.tool_call_id for p in requests.approvals if p.tool_call_id not in approved]
        if missing:  # an unanswered call is not a denial: say which ones need an answer
            raise InvalidInput(f"no decision for tool call(s) {', '.join(missing)}",
                               field="approved")
        results = DeferredToolResults()
        for part in requests.approvals:
            cid = part.tool_call_id
            if approved[cid]:
                results.approvals[cid] = True
                results.metadata[cid] = {"by": who, "reason": reason}
                continue
            calls = await asyncio.to_thread(self._bind, cid)
            outcome = await calls.arun(part.tool_name, part.args_as_dict(), cid,
                                       Approval(False, who, reason))
            if self.session is not None:
                self.session.unpark(cid)
            results.approvals[cid] = ToolDenied(outcome.text)
        return results


def saga_history_processor(saga: Saga | AsyncSaga | SagaSession) -> Any:
    """A history processor (``ProcessHistory(...)`` in ``Agent(capabilities=[...])``,
    or ``Agent(history_processors=[...])`` before Pydantic AI 2): before each model
    request, the results of this saga's rolled-back calls say so, and its closing
    note follows them."""
    fixed = None if isinstance(saga, SagaSession) else calls_for(saga)

    async def processor(messages: list[ModelMessage]) -> list[ModelMessage]:
        calls = fixed if fixed is not None else getattr(saga, "current", None)
        if calls is None:
            return messages
        states = await asyncio.to_thread(calls.states)
        return rebuild(messages, states) if states else messages

    return processor


def rebuild(messages: Sequence[ModelMessage], states: Iterable[SagaState],
            ) -> list[ModelMessage]:
    """``messages`` rewritten from the sagas' logs: each call's ``ToolReturnPart`` says
    what ``rebuild_history`` says of it, and each saga's closing note follows its last
    result as a ``SystemPromptPart`` in the same request. A ``ToolCallPart`` with no
    result (the call in flight when the agent stopped) gets one, from the log, first
    in the next request (a new one if there is none). The rest is unchanged."""
    states = list(states)
    messages = _answer_all(messages, states)
    where: list[tuple[int, int]] = []
    results: list[tuple[str | None, str | None]] = []
    notes: list[str] = []
    for m, msg in enumerate(messages):
        if not isinstance(msg, ModelRequest):
            continue
        for p, part in enumerate(msg.parts):
            # a note may come back framed as a user part (``<system>...</system>``)
            if isinstance(part, SystemPromptPart | UserPromptPart) and \
                    isinstance(part.content, str):
                notes.append(part.content)
            if isinstance(part, ToolReturnPart):
                where.append((m, p))
                results.append((part.tool_call_id,
                                part.content if isinstance(part.content, str) else None))
    plan = rewrite(results, states, notes)
    if not plan:
        return list(messages)
    out = list(messages)
    changes: dict[int, dict[int, tuple[Any, list[str]]]] = {}
    for i, (m, p) in enumerate(where):
        if i in plan.texts or i in plan.notes_after:
            changes.setdefault(m, {})[p] = (plan.texts.get(i), plan.notes_after.get(i, []))
    for m, by_part in changes.items():
        request = out[m]
        assert isinstance(request, ModelRequest)
        parts: list[Any] = []
        for p, part in enumerate(request.parts):
            text, after = by_part.get(p, (None, []))
            parts.append(part if text is None else replace(part, content=text))
            parts.extend(SystemPromptPart(content=note) for note in after)
        out[m] = replace(request, parts=parts)
    return out


def _answer_all(messages: Sequence[ModelMessage], states: list[SagaState],
                ) -> list[ModelMessage]:
    """``messages`` with a ``ToolReturnPart`` for every ``ToolCallPart``."""
    out = list(messages)
    m = 0
    while m < len(out):
        msg = out[m]
        if not isinstance(msg, ModelResponse):
            m += 1
            continue
        calls = {p.tool_call_id: p.tool_name for p in msg.parts if isinstance(p, ToolCallPart)}
        nxt = out[m + 1] if m + 1 < len(out) else None
        request = nxt if isinstance(nxt, ModelRequest) else None
        have = {p.tool_call_id for p in request.parts
                if isinstance(p, ToolReturnPart | RetryPromptPart)} if request else set()
        texts = unanswered([c for c in calls if c not in have], states)
        added = [ToolReturnPart(tool_name=calls[c], content=texts[c][0], tool_call_id=c)
                 for c in texts]
        if added and request is None:
            out.insert(m + 1, ModelRequest(parts=added))
        elif added and request is not None:
            out[m + 1] = replace(request, parts=[*added, *request.parts])
        m += 1
    return out
