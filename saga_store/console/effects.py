"""What a person may do to a saga now, and what each action would do, said
before they confirm it: "resume: the unwind will retry release_inventory
(attempt 4)". Read from the saga's fold and events; the library's own checks
decide again when the action is taken.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from saga_store.log.events import EventKind as K
from saga_store.protocol.state import SagaState, StepState
from saga_store.protocol.vocab import SETTLED, Reversibility, Status, StepStatus

ACTIONS = ("approve", "deny", "resume", "resolve", "abort", "acknowledge")
# actions whose form must say why (the library or the log would have nothing else)
NEEDS_WHY = frozenset({"deny", "resolve", "abort"})


@dataclass(frozen=True)
class Offer:
    action: str
    label: str  # the button: "Approve step 1"
    effect: str  # one sentence: what happens when confirmed
    step: int | None = None
    plan: list[str] = field(default_factory=list)  # the unwind it starts, last step first
    danger: bool = False


def undo_tools(bodies: list[dict[str, Any]]) -> dict[int, str]:
    """Each step's compensation tool, as its last compensation intent named it."""
    return {ev["step"]: ev["tool"] for ev in bodies
            if ev.get("kind") == K.COMPENSATION_INTENT and ev.get("tool")}


def unwind_plan(state: SagaState, undo: dict[int, str]) -> list[str]:
    """What an unwind starting now would deal with, last step first."""
    plan = []
    for n in sorted(state.steps, reverse=True):
        st = state.steps[n]
        if st.compensation in SETTLED:
            continue
        name = f"#{n} {st.tool or '?'}"
        if st.status is StepStatus.INTENT:
            plan.append(f"{name}: never ran, nothing to undo")
        elif st.reversibility is Reversibility.READONLY:
            plan.append(f"{name}: read-only, nothing to undo")
        elif st.reversibility is Reversibility.IRREVERSIBLE:
            plan.append(f"{name}: cannot be undone; the saga will end needing attention")
        elif st.status is StepStatus.FAILED:
            plan.append(f"{name}: failed; undone only if its declaration says a failure "
                        "may have had an effect")
        else:
            how = f"by {undo[n]}" if n in undo else "by its declared compensation"
            doubt = " (in doubt: probed first where it has a probe)" \
                if st.status is StepStatus.IN_DOUBT else ""
            plan.append(f"{name}: undone {how}{doubt}")
    return plan


def _approval(state: SagaState, st: StepState, plan: list[str]) -> list[Offer]:
    preview = st.approval_data if isinstance(st.approval_data, dict) else {}
    comp = preview.get("compensation")
    undo = f"undo: {comp['tool']}" if isinstance(comp, dict) and comp.get("tool") \
        else "undo: none, it cannot be undone"
    name = f"step {st.step} ({st.tool})"
    return [Offer("approve", f"Approve step {st.step}",
                  f"approve {name}: it is queued to run now, once ({undo})", st.step),
            Offer("deny", f"Deny step {st.step}",
                  f"deny {name}: it never runs; the saga fails and unwinds what ran",
                  st.step, plan, danger=True)]


def _stuck(state: SagaState, undo: dict[int, str], plan: list[str]) -> list[Offer]:
    reason = state.reason if isinstance(state.reason, dict) else {}
    n = reason.get("step")
    st = state.steps.get(n) if isinstance(n, int) else None
    if st is None:
        return []
    what = f"step {st.step} ({st.tool})"
    retry = undo.get(st.step)
    attempt = st.compensation_attempts + 1
    resume = (f"resume: the unwind will retry {retry} for {what} (attempt {attempt})" if retry
              else f"resume: the unwind will try the compensation of {what} again")
    rest = [p for p in plan if not p.startswith(f"#{st.step} ")]
    return [Offer("resume", "Resume the unwind", resume, st.step, plan),
            Offer("resolve", f"Resolve step {st.step} by hand",
                  f"resolve {what} as undone by hand: your name and note go into the "
                  "saga's log, the unwind goes on past it, and the saga ends needing "
                  "attention", st.step, rest, danger=True)]


def offers(state: SagaState, bodies: list[dict[str, Any]]) -> list[Offer]:
    """The actions ``state`` allows, each with its effect."""
    undo = undo_tools(bodies)
    plan = unwind_plan(state, undo)
    out: list[Offer] = []
    if state.status is Status.RUNNING:
        for n in state.pending_approvals:
            out += _approval(state, state.steps[n], plan)
        out.append(Offer("abort", "Abort", "abort: the saga stops going forward and unwinds "
                         "what ran, last step first", None, plan, danger=True))
    elif state.status is Status.STUCK:
        out += _stuck(state, undo, plan)
    elif state.status is Status.NEEDS_ATTENTION:
        out.append(Offer("acknowledge", "Acknowledge",
                         "acknowledge: the saga leaves the attention list; your name and "
                         "note are recorded in ss:attention:acks and its log stays as it is"))
    return out


def find(state: SagaState, bodies: list[dict[str, Any]], action: str,
         step: int | None) -> Offer | None:
    """The offer for ``action`` (on ``step``, for those that name one), if allowed now."""
    for offer in offers(state, bodies):
        if offer.action == action and (step is None or offer.step in (None, step)):
            return offer
    return None
