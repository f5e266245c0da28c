"""Every event a driver appends is built here, and only here.

Each function returns an :data:`Item`, ``(kind, fields)``, the form
:meth:`~saga_store.events.ChainWriter.append_many` takes; the envelope (seq,
ts, saga id) is added when it is appended. A new event kind is one function
here, one case in :mod:`saga_store.state` and one in
:mod:`saga_store.invariants`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from saga_store.log.events import EventKind as K
from saga_store.protocol.vocab import OutcomeKind

Item = tuple[str, dict[str, Any]]


# -- forward -----------------------------------------------------------------

def saga_started(agent_id: str, data: Mapping[str, Any] | None) -> Item:
    """A saga's first event: its agent, and what its opener says of it (executor,
    plan, conversation, the open's own id...)."""
    return K.SAGA_STARTED, {"agent_id": agent_id, "data": dict(data) if data else None}


def step_intent(n: int, tool: str, logged_args: Mapping[str, Any], reversibility: str,
                tool_call_id: str | None, idem_key: str, *, keyed: bool = False,
                trace: Mapping[str, str] | None = None) -> Item:
    data: dict[str, Any] = {"args": dict(logged_args), "reversibility": str(reversibility)}
    if keyed:
        data["keyed"] = True  # an explicit key: its dedupe record follows the outcome
    if trace:
        data["trace"] = dict(trace)  # the caller's span context, for the worker's span
    return K.STEP_INTENT, {"step": n, "tool": tool, "tool_call_id": tool_call_id,
                           "idem_key": idem_key, "data": data}


def step_started(n: int, attempt: int, **data: Any) -> Item:
    return K.STEP_STARTED, {"step": n, "attempt": attempt, "data": data or None}


def step_outcome(n: int, kind: OutcomeKind, *, result: Any = None, error: Any = None,
                 tool: str | None = None, tool_call_id: str | None = None,
                 **extra: Any) -> Item:
    """``step_succeeded`` (with ``result``), ``step_failed`` or ``step_in_doubt``
    (with ``error``); ``extra`` goes into its data (``tries``, ``resolved_by``...)."""
    if kind is OutcomeKind.SUCCEEDED:
        return K.STEP_SUCCEEDED, {"step": n, "tool": tool, "tool_call_id": tool_call_id,
                                  "data": {"result": result, **extra}}
    name = K.STEP_FAILED if kind is OutcomeKind.FAILED else K.STEP_IN_DOUBT
    return name, {"step": n, "data": {"error": error, **extra}}


def duplicate_suppressed(n: int, what: str) -> Item:
    return K.STEP_DUPLICATE_SUPPRESSED, {"step": n, "data": {"outcome": str(what)}}


def step_released(n: int, why: str) -> Item:
    """A worker handed a started step back with no try of it running (each try it
    made asked for a retry): the next delivery is no redelivery of a lost one."""
    return K.STEP_RELEASED, {"step": n, "data": {"why": why}}


def approval_requested(n: int, tool: str, preview: Mapping[str, Any]) -> Item:
    return K.APPROVAL_REQUESTED, {"step": n, "tool": tool, "data": dict(preview)}


def approval_decided(n: int, grant: bool, decision: Mapping[str, Any]) -> Item:
    return (K.APPROVAL_GRANTED if grant else K.APPROVAL_DENIED), {"step": n,
                                                                  "data": dict(decision)}


def saga_committed() -> Item:
    return K.SAGA_COMMITTED, {}


def saga_failed(reason: str) -> Item:
    return K.SAGA_FAILED, {"data": {"reason": reason}}


# -- the unwind ----------------------------------------------------------------

def compensation_intent(n: int, tool: str, attempt: int, key: str | None,
                        args: Mapping[str, Any] | None) -> Item:
    return K.COMPENSATION_INTENT, {"step": n, "tool": tool, "attempt": attempt,
                                   "idem_key": key,
                                   "data": None if args is None else {"args": dict(args)}}


def compensation_succeeded(n: int, tool: str, tool_call_id: str | None, result: Any,
                           undid: str | None) -> Item:
    return K.COMPENSATION_SUCCEEDED, {"step": n, "tool": tool, "tool_call_id": tool_call_id,
                                      "data": {"result": result, "undid": undid}}


def compensation_failed(n: int, error: Any, attempt: int | None = None) -> Item:
    data: dict[str, Any] = {"error": error}
    if attempt is not None:
        data["attempt"] = attempt
    return K.COMPENSATION_FAILED, {"step": n, "data": data}


def compensation_resolved(n: int, by: str, note: str, at_ms: int) -> Item:
    return K.COMPENSATION_RESOLVED, {"step": n, "data": {"by": by, "note": note,
                                                         "at_ms": at_ms}}


def not_compensable(n: int, reason: str) -> Item:
    return K.STEP_NOT_COMPENSABLE, {"step": n, "data": {"reason": reason}}


def saga_stuck(n: int, error: Any, hint: str) -> Item:
    return K.SAGA_STUCK, {"data": {"step": n, "error": error, "hint": hint}}


def saga_resumed(after: Any, by: str | None = None, note: str | None = None) -> Item:
    """The unwind goes on after ``after`` (the stuck reason); ``by`` and ``note``
    name the person who resumed it, when a person did, for the audit trail."""
    data: dict[str, Any] = {"after": after}
    if by is not None:
        data["by"] = by
    if note:
        data["note"] = note
    return K.SAGA_RESUMED, {"data": data}


def saga_closed_unwound(attention: list[str]) -> Item:
    """``saga_compensated``, or ``saga_needs_attention`` naming what a person must see."""
    if attention:
        return K.SAGA_NEEDS_ATTENTION, {"data": {"needs_attention": attention}}
    return K.SAGA_COMPENSATED, {"data": None}

