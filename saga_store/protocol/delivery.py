"""A step delivery, decided without I/O: what a worker does with a job.

The worker reads the log from the step's intent on (:class:`StepView`) and
asks :func:`on_delivery`. The answer is one of:

- ``STALE``: no intent at the job's seq (the append it was queued with lost);
- ``DUPLICATE``: the step already has an outcome; a note is appended;
- ``CANCELLED``: unwinding began before the step ever started: it never will;
- ``AWAIT``: a person has not decided the step's approval yet;
- ``GATE``: the policy wants a person: request approval;
- ``FAIL`` / ``DOUBT`` with the outcome to record (an unknown tool, a denial,
  a step that kept killing its worker, an unfinished attempt of a tool that
  must not be re-run blind);
- ``START`` with the attempt number: claim the step and call the tool.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from saga_store.approval.policy import Decision, Verdict
from saga_store.log.events import EventKind as K
from saga_store.log.stream import EMPTY, Head
from saga_store.protocol.outcome import Outcome
from saga_store.protocol.state import StepState
from saga_store.protocol.vocab import Approval, OutcomeKind


@dataclass
class StepView:
    """What the log says about one step, read from its intent on."""

    intent: dict[str, Any] | None = None
    started: int = 0
    released: int = 0  # of those starts, handed back by their worker with no try running
    outcome: dict[str, Any] | None = None
    unwinding: bool = False
    approval: tuple[str, Any] | None = None  # the step's last approval event (kind, data)
    head: Head = EMPTY
    plan: list[dict[str, Any]] | None = None
    agent_id: str | None = None
    conversation_id: str | None = None
    events: list[dict[str, Any]] = field(default_factory=list)  # from the intent on
    ctx_seq: int = -1  # how far the context projection has got


class Act(StrEnum):
    STALE = "stale"
    DUPLICATE = "duplicate"
    CANCELLED = "cancelled"
    AWAIT = "awaiting_approval"
    GATE = "gate"
    FAIL = "fail"
    START = "start"


@dataclass(frozen=True)
class ToolFacts:
    """What the decision needs of the step's tool (None when it is not registered)."""

    max_deliveries: int
    re_run_blind: bool  # an unfinished attempt may be retried with the same key
    gate: Callable[[], Verdict]  # what the policy says of the call (asked only if needed)


@dataclass(frozen=True)
class Decided:
    act: Act
    outcome: Outcome | None = None  # for FAIL
    attempt: int = 0  # for START
    verdict: Verdict | None = None  # for GATE: what the policy said, and why


def on_delivery(view: StepView, tool: ToolFacts | None, tool_error: str = "") -> Decided:
    """What to do with a delivery of the step ``view`` describes."""
    if view.intent is None:
        return Decided(Act.STALE)
    if view.outcome is not None:
        return Decided(Act.DUPLICATE)
    if view.unwinding and view.started == 0:
        return Decided(Act.CANCELLED)
    if tool is None:
        return Decided(Act.FAIL, Outcome.failed(f"{tool_error} (in this worker)"))
    # a start its worker handed back (asked to stop between two tries) is no lost
    # delivery: only the others count towards dead-lettering and being in doubt
    lost = view.started - view.released
    if lost >= tool.max_deliveries:
        # in doubt, not failed: any of those attempts may have had its effect before
        # its worker died, and a failed step is never undone (the unwind probes or
        # compensates an in-doubt one)
        return Decided(Act.FAIL, Outcome(OutcomeKind.IN_DOUBT, error=(
            f"dead-lettered: {lost} deliveries never finished (the step keeps "
            "killing its worker); whether any of them took effect is unknown")))
    if not view.started:  # a step that started once had passed its gate
        gated = _gate(view, tool)
        if gated is not None:
            return gated
    elif lost and not tool.re_run_blind:
        return Decided(Act.FAIL, Outcome(OutcomeKind.IN_DOUBT, error=(
            f"attempt {view.started} never finished; its outcome is unknown")))
    return Decided(Act.START, attempt=view.started + 1)


def _gate(view: StepView, tool: ToolFacts) -> Decided | None:
    return gate(view.approval, tool.gate)


def gate(approval: tuple[str, Any] | None, policy: Callable[[], Verdict]) -> Decided | None:
    """The one approval gate, for a worker's delivery and a gateway's call alike:
    None if the step may run; FAIL with the denial; AWAIT while a person decides;
    GATE to ask one. ``approval``: the step's last approval event (kind, data), if
    any (:func:`last_approval`); ``policy`` is asked only when there is none."""
    if approval is not None:
        kind, data = approval
        if kind == K.APPROVAL_GRANTED:
            return None
        if kind == K.APPROVAL_DENIED:
            return Decided(Act.FAIL, Outcome.failed(denial(data)))
        return Decided(Act.AWAIT)  # requested and not decided yet
    verdict = policy()
    if verdict.decision is Decision.ALLOW:
        return None
    if verdict.decision is Decision.DENY:
        return Decided(Act.FAIL, Outcome.failed(f"denied by policy ({verdict.reason})"))
    return Decided(Act.GATE, verdict=verdict)


_APPROVAL_KINDS = {Approval.REQUESTED: K.APPROVAL_REQUESTED, Approval.GRANTED: K.APPROVAL_GRANTED,
                   Approval.DENIED: K.APPROVAL_DENIED}


def last_approval(st: StepState) -> tuple[str, Any] | None:
    """A folded step's last approval event as :func:`gate` takes it (kind, data)."""
    if st.approval is None:
        return None
    data = st.approval_data if st.approval is Approval.REQUESTED else \
        (st.approval_data or {}).get("decision")
    return _APPROVAL_KINDS[st.approval], data


def denial(decision: Any) -> str:
    """The error a denied step fails with: who denied it, and why."""
    d = decision if isinstance(decision, dict) else {}
    why = f": {d['reason']}" if d.get("reason") else ""
    if d.get("withdrawn"):
        return f"approval request withdrawn by {d.get('by', 'its caller')}{why}"
    return f"denied by {d.get('by', 'someone')}{why}"
