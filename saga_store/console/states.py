"""A saga's state as the log says it, for people: not just ``running`` but
waiting for approval, in doubt, retrying (attempt n of m); and why it stopped,
as sentences rather than the JSON of its closing event.

``Status`` has six values; what an operator needs to tell apart inside
``running`` and ``compensating`` is in the steps, so it is read from the fold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from saga_store.protocol.state import SagaState, StepState
from saga_store.protocol.vocab import CompStatus, StepStatus
from saga_store.tools.registry import Registry

from .masking import short_json

# every key a saga is shown under, in the order the overview lists them
KEYS = ("waiting_approval", "in_doubt", "retrying", "running", "compensating", "stuck",
        "needs_attention", "committed", "compensated")
WORDS = {"waiting_approval": "waiting for approval", "in_doubt": "in doubt",
         "needs_attention": "needs attention"}


@dataclass(frozen=True)
class Shown:
    key: str  # one of KEYS
    text: str  # the words on the page: "retrying charge_payment (attempt 2 of 3)"


def _limit(registry: Registry | None, tool: str | None, field: str) -> int | None:
    """A tool's declared limit (``max_deliveries`` of a step, ``max_attempts`` of a
    compensation), when this console's registry knows the tool (``saga console``
    knows those of ``--tools``; without, the page says "attempt n")."""
    if registry is None or not tool or tool not in registry:
        return None
    limit = getattr(getattr(registry.get(tool), "retry", None), field, None)
    return limit if isinstance(limit, int) else None


def _attempt(n: int, limit: int | None) -> str:
    return f"attempt {n} of {limit}" if limit else f"attempt {n}"


def _step(st: StepState) -> str:
    return f"step {st.step} ({st.tool or '?'})"


def shown(state: SagaState, registry: Registry | None = None,
          undo: dict[int, str] | None = None) -> Shown:
    """What ``state`` is, in the words the list, the saga page and the overview use;
    ``undo``: each step's compensation tool, as the log named it."""
    status = str(state.status)
    steps = sorted(state.steps.values(), key=lambda s: s.step)
    if status == "running":
        if state.pending_approvals:
            n = state.pending_approvals[0]
            return Shown("waiting_approval", f"waiting for approval: {_step(state.steps[n])}")
        for st in steps:
            if st.status is StepStatus.IN_DOUBT:
                return Shown("in_doubt", f"in doubt: {_step(st)}")
        for st in steps:
            if st.status is StepStatus.STARTED and st.attempts > 1:
                limit = _limit(registry, st.tool, "max_deliveries")
                return Shown("retrying", f"retrying {_step(st)}, "
                                         f"{_attempt(st.attempts, limit)}")
        return Shown("running", "running")
    if status == "compensating":
        for st in reversed(steps):
            again = st.compensation_attempts - st.resume_base
            if st.compensation in (CompStatus.INTENT, CompStatus.FAILED) and (
                    again > 1 or st.compensation is CompStatus.FAILED):
                tool = (undo or {}).get(st.step)
                limit = _limit(registry, tool, "max_attempts")
                by = f" by {tool}" if tool else ""
                # a failed attempt waits for its retry: the next one is the one to come
                n = again + 1 if st.compensation is CompStatus.FAILED else again
                return Shown("retrying", f"compensating, retrying the undo of {_step(st)}{by}: "
                                         f"{_attempt(n, limit)}")
        return Shown("compensating", "compensating")
    if status == "stuck":
        reason = state.reason if isinstance(state.reason, dict) else {}
        at = reason.get("step")
        on = _step(state.steps[at]) if isinstance(at, int) and at in state.steps \
            else "its unwind"
        return Shown("stuck", f"stuck undoing {on}")
    return Shown(status, WORDS.get(status, status))


def reason_lines(state: SagaState) -> list[tuple[str, str]]:
    """Why the saga stopped or unwinds, as (heading, text) pairs, never raw JSON
    when the log's fields are known: a stuck saga's error and the hint of what
    to do, an abort's reason, what could not be undone."""
    reason = state.reason
    if reason is None:
        return []
    if not isinstance(reason, dict):
        return [("reason", str(reason))]
    lines: list[tuple[str, str]] = []
    if "reason" in reason:
        lines.append(("why it unwinds", _text(reason["reason"])))
    if "error" in reason:
        lines.append(("error", _text(reason["error"])))
    if reason.get("hint"):
        lines.append(("what to do", _text(reason["hint"])))
    if "needs_attention" in reason:
        lines.append(("could not undo", ", ".join(map(str, reason["needs_attention"] or []))
                      or "see the events"))
    if not lines:
        lines.append(("reason", short_json(reason)))
    return lines


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("message"), str):
        kind = value.get("type") or value.get("code")
        return f"{kind}: {value['message']}" if kind else value["message"]
    return short_json(value)
