"""The forward path, decided without I/O: what an outcome leads to, and when a
saga may commit."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from typing import Any

from saga_store.errors import KeyReuseError
from saga_store.protocol import build
from saga_store.protocol.build import Item
from saga_store.protocol.outcome import Outcome
from saga_store.protocol.state import SagaState, Status
from saga_store.protocol.vocab import Follow, OutcomeKind, Reversibility, StepStatus


def commit_blocker(state: SagaState) -> str | None:
    """The one commit rule: every step succeeded, except reads that failed and calls
    the callee refused before running them (they changed nothing). Returns why the
    saga may not commit, or None."""
    for n in sorted(state.steps):
        st = state.steps[n]
        if st.status is StepStatus.SUCCEEDED:
            continue
        if st.status is StepStatus.FAILED and (st.refused or
                                               st.reversibility is Reversibility.READONLY):
            continue
        return f"step {n} ({st.tool}) is {st.status}, not succeeded"
    return None


def failure_unwinds(kind: OutcomeKind, reversibility: str | None, *, session: bool) -> bool:
    """The one failure rule: whether a step's outcome unwinds its saga. Every outcome
    but success does, on workers. In a ``session`` (an agent calling through the MCP
    gateway, which answers each call and goes on) a read that failed does not: it
    changed nothing, the commit rule lets it stand, and the agent decides what
    next. A read in doubt unwinds even there: the saga could not commit over it."""
    if kind is OutcomeKind.SUCCEEDED:
        return False
    return not (session and kind is OutcomeKind.FAILED
                and reversibility == Reversibility.READONLY)


class Leftover(StrEnum):
    """What becomes of a saga whose driver stopped mid-session (:func:`left_over`)."""

    CLOSE = "close"  # final already: only the driver's bookkeeping is left
    COMMIT = "commit"  # going forward, and the commit rule holds: its calls stand
    UNWIND = "unwind"  # anything else: unwound (begun, resumed or finished)


def left_over(state: SagaState) -> Leftover:
    """What a driver that finds a session another one left does with it: a saga
    going forward whose every call settled as the commit rule wants is committed
    (its calls were answered: they stand), any other unfinished one is unwound."""
    if state.final:
        return Leftover.CLOSE
    if state.status is Status.RUNNING and commit_blocker(state) is None:
        return Leftover.COMMIT
    return Leftover.UNWIND


def repeat_of(state: SagaState, key: str, tool: str, logged_args: Any) -> int | None:
    """The step a call repeats (the same idempotency key in this saga), or None for a
    new call; raises :class:`KeyReuseError` when the key came with another tool or
    other arguments (the Stripe rule, in the saga as across sagas)."""
    n = state.by_key.get(key)
    if n is None:
        return None
    prior = state.steps[n]
    if prior.tool != tool or prior.args != logged_args:
        raise KeyReuseError(f"idempotency key was already used in this saga for step {n} "
                            f"({prior.tool}) with other arguments; use a new key for a "
                            "different call")
    return n


def logged_call(state: SagaState, tool_call_id: str, tool: str, args: Mapping[str, Any],
                secret: frozenset[str] = frozenset()) -> int | None:
    """The step a call sent again is (the same ``tool_call_id`` in this saga's log), or
    None for a call the saga has not seen. A framework that resumes from its own
    checkpoint sends its calls again with their ids: the log answers them, they never
    run twice. Raises :class:`KeyReuseError` when the id came with another tool or
    other arguments (``secret`` fields are compared by name only: their logged
    digests are salted, and the salt goes with the saga's secrets when it closes)."""
    def plain(a: Any) -> Any:
        return {k: ("$secret" if k in secret else v) for k, v in a.items()} \
            if isinstance(a, Mapping) else a

    for n in sorted(state.steps):
        prior = state.steps[n]
        if prior.tool_call_id != tool_call_id:
            continue
        if prior.tool != tool or plain(prior.args) != plain(args):
            raise KeyReuseError(f"tool_call_id {tool_call_id} is step {n} ({prior.tool}) of "
                                f"saga {state.saga_id}, with other arguments; a new call "
                                "needs a new tool_call_id")
        return n
    return None


def outcome_events(step: int, intent: Mapping[str, Any], outcome: Outcome, *,
                   unwinding: bool, plan: Sequence[Mapping[str, Any]] | None,
                   next_intent: Callable[[int, Mapping[str, Any]], Item],
                   ) -> tuple[list[Item], Follow]:
    """The events that record ``outcome`` for ``step``, and what follows them: the
    plan's next intent, the saga's commit, or its failure. ``next_intent`` builds
    the intent of a plan step from its entry (the driver knows the tools)."""
    extra: dict[str, Any] = {}
    if outcome.kind is OutcomeKind.SUCCEEDED:
        if outcome.tries > 1:
            extra["tries"] = outcome.tries
        if outcome.postcondition_failed:
            extra["postcondition_failed"] = outcome.postcondition_failed
        item = build.step_outcome(step, outcome.kind, result=outcome.result,
                                  tool=intent.get("tool"),
                                  tool_call_id=intent.get("tool_call_id"), **extra)
    else:
        if outcome.retryable:
            extra["retryable"] = True
        item = build.step_outcome(step, outcome.kind, error=outcome.error, **extra)
    items = [item]
    if unwinding:
        # a late outcome is a fact the unwind needs; the compensator may have
        # stepped back while this worker held the lease, so it is queued again
        return items, Follow.COMPENSATE
    if failure_unwinds(outcome.kind, None, session=False) or outcome.postcondition_failed:
        why = outcome.error or f"postcondition {outcome.postcondition_failed} failed"
        items.append(build.saga_failed(f"step {step}: {why}"))
        return items, Follow.COMPENSATE
    if plan is None:
        return items, Follow.NONE  # the caller drives the next step
    if step + 1 < len(plan):
        items.append(next_intent(step + 1, plan[step + 1]))
        return items, Follow.NEXT
    items.append(build.saga_committed())
    return items, Follow.COMMITTED
