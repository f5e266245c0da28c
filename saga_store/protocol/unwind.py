"""The unwind, decided without I/O: what to do next to a failed saga.

:func:`next_action` looks at the folded state and says what a driver does
next: append events that settle a step (:class:`Append`), ask a probe whether
an in-doubt call happened (:class:`Probe`), run a compensation
(:class:`Compensate`), or close the saga (:class:`Close`). The loop that asks
again after each answer, appending what :func:`probed` or :func:`compensated`
make of it, is written once (:mod:`saga_store.protocol.unwinding`); drivers
differ only in how they call tools, append and wait: the workers' compensator
through the registry, the MCP gateway through its downstream server
(:class:`Catalogue`). :func:`opening` says how an unwind begins (failed, or
resumed when stuck).

Rules, last step first (:func:`saga_store.state.unwind_order`):

- a step that never started is failed (it never will run); a started step
  with no outcome is in doubt;
- a failed or read-only step has nothing to undo;
- an in-doubt step is first settled by its probe, when it has one: called with
  arguments from its static mapping of the step's input and with the step's own
  key (it looks the call up by it);
- a step whose tool cannot be undone is ``step_not_compensable``: the saga
  will end needing a person;
- a compensable step gets ``compensation_intent`` then its compensation, with
  arguments from the static mapping only and a key derived from the step's;
  a failure is retried with jittered backoff up to the compensation's ``max_attempts``
  (counted from the last resume), then the saga is stuck;
- when every step is settled: ``saga_compensated``, or
  ``saga_needs_attention`` naming the steps a person must look at.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from saga_store.errors import MappingError
from saga_store.execution.idempotency import compensation_key
from saga_store.protocol import build
from saga_store.protocol.build import Item
from saga_store.protocol.mapping import resolve_all
from saga_store.protocol.outcome import Outcome
from saga_store.protocol.state import SagaState, StepState, unwind_order
from saga_store.protocol.vocab import CompStatus, OutcomeKind, Reversibility, Status, StepStatus


@dataclass(frozen=True)
class Undo:
    """How one step is undone: the compensation tool, its static mapping, and how
    often it is tried before the saga is stuck."""

    tool: str
    mapping: Mapping[str, str]
    max_attempts: int = 3
    backoff: Callable[[int], float] = lambda attempt: min(2.0, 0.05 * 2 ** (attempt - 1))


@dataclass(frozen=True)
class Probing:
    """How an in-doubt step's probe is asked: the tool, and its arguments as a
    static mapping from the step's input (a probe never sees an output: there is
    none). A registry tool's probe maps each of its parameters the step has."""

    tool: str
    mapping: Mapping[str, str]


class Catalogue(Protocol):
    """What an unwind needs to know of the tools: the workers' registry, or what
    the gateway knows of its downstream server's tools."""

    resume_hint: str

    def undo_of(self, st: StepState) -> Undo | str:
        """How to undo the step, or why it cannot be undone."""

    def probe_of(self, st: StepState) -> Probing | None:
        """The probe that tells whether the step's in-doubt call happened, if any."""


@dataclass(frozen=True)
class Append:
    """Append these events, apply them to the state, and ask again."""

    items: list[Item]


@dataclass(frozen=True)
class Probe:
    """Ask ``tool`` whether step ``step``'s in-doubt call happened: with ``args``
    (from the probe's mapping) and the step's own key (``key``: the probe looks
    the call up by it)."""

    step: int
    tool: str
    args: dict[str, Any] = field(default_factory=dict)
    key: str = ""


@dataclass(frozen=True)
class Compensate:
    """Append ``intent``, then call ``undo.tool`` with ``args`` and key ``key``."""

    step: int
    undo: Undo
    attempt: int
    key: str
    args: dict[str, Any]
    intent: Item


@dataclass(frozen=True)
class Close:
    """Every step is settled: append ``item`` (releasing the lease)."""

    item: Item
    attention: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Done:
    """Nothing for an unwind to do: the saga is final, stuck, or not unwinding."""

    status: Status


Action = Append | Probe | Compensate | Close | Done
CANCELLED = "cancelled: the saga unwound before it started"
STOPPED = "its executor stopped before recording an outcome; unknown if it ran"


def next_action(state: SagaState, tools: Catalogue,
                probed: frozenset[int] = frozenset()) -> Action:
    """What to do next to unwind ``state``. ``probed``: steps whose probe this
    driver already asked in this pass without a verdict (they are compensated)."""
    if state.final or state.status in (Status.RUNNING, Status.STUCK):
        return Done(state.status)
    attention: list[str] = []
    for st in unwind_order(state, attention):
        n = st.step
        if st.status is StepStatus.INTENT:
            return Append([build.step_outcome(n, OutcomeKind.FAILED, error=CANCELLED)])
        if st.status is StepStatus.STARTED:
            return Append([build.step_outcome(n, OutcomeKind.IN_DOUBT, error=STOPPED)])
        if st.status is StepStatus.FAILED or st.reversibility is Reversibility.READONLY:
            continue
        if st.status is StepStatus.IN_DOUBT and n not in probed:
            probe = _probe(state, st, tools.probe_of(st))
            if probe is not None:
                return probe
        undo = tools.undo_of(st)
        if isinstance(undo, str):
            return Append([build.not_compensable(n, undo)])
        return _compensate(state, st, undo)
    return Close(build.saga_closed_unwound(attention), attention)


def _probe(state: SagaState, st: StepState, probing: Probing | None) -> Probe | None:
    """The probe of ``st``; None when it has none, or its mapping finds no value (the
    step is compensated unprobed, as when a probe cannot tell)."""
    if probing is None:
        return None
    try:
        args = resolve_all(probing.mapping, st.args or {}, None)
    except MappingError:
        return None
    return Probe(st.step, probing.tool, args, step_probe_key(state, st))


def _compensate(state: SagaState, st: StepState, undo: Undo) -> Action:
    n, attempt = st.step, st.compensation_attempts + 1
    in_doubt = st.status is StepStatus.IN_DOUBT
    try:
        args = resolve_all(undo.mapping, st.args or {}, st.result, in_doubt=in_doubt)
    except MappingError as exc:
        if in_doubt:  # no result to map from: a person decides
            return Append([build.not_compensable(n, str(exc))])
        return Append([build.compensation_intent(n, undo.tool, attempt, None, None),
                       build.compensation_failed(n, str(exc)),
                       build.saga_stuck(n, str(exc), _resolve_hint(state, st))])
    key = step_compensation_key(state, st)
    return Compensate(n, undo, attempt, key, args,
                      build.compensation_intent(n, undo.tool, attempt, key, args))


def step_compensation_key(state: SagaState, st: StepState) -> str:
    """The one derivation of a compensation's idempotency key: from the step's own
    key (every step written since keys exist has one), else from its position."""
    return compensation_key(st.idem_key or f"{state.saga_id}/{st.step}")


def step_probe_key(state: SagaState, st: StepState) -> str:
    """The key a probe is called with: the step's own, so the probe can look up the
    call made under it (derived from its position for steps logged without one)."""
    return st.idem_key or f"{state.saga_id}/{st.step}"


def opening(state: SagaState, reason: str) -> list[Item]:
    """What a driver appends to unwind ``state`` now: ``saga_failed`` for a saga
    still going forward, ``saga_resumed`` for a stuck one (a driver started again is
    how a stuck unwind resumes), nothing for one already unwinding or final."""
    if state.status is Status.RUNNING:
        return [build.saga_failed(reason)]
    if state.status is Status.STUCK:
        return [build.saga_resumed(state.reason)]
    return []


def compensated(state: SagaState, act: Compensate, outcome: Outcome,
                hint: str) -> tuple[list[Item], float | None]:
    """The events a compensation's outcome makes, and the delay before trying it
    again (None: no retry, because it succeeded or the saga is now stuck)."""
    st = state.steps[act.step]
    if outcome.kind is OutcomeKind.SUCCEEDED:
        return [build.compensation_succeeded(act.step, act.undo.tool, st.tool_call_id,
                                             outcome.result, st.tool)], None
    items = [build.compensation_failed(act.step, outcome.error, act.attempt)]
    if act.attempt - st.resume_base >= act.undo.max_attempts:
        items.append(build.saga_stuck(act.step, outcome.error, hint))
        return items, None
    return items, act.undo.backoff(act.attempt)


def probed(act: Probe, result: Any) -> list[Item]:
    """The events a probe's answer makes: a result dict means the call happened,
    ``{"happened": false}`` that it did not; anything else settles nothing."""
    if not isinstance(result, dict):
        return []
    if result.get("happened") is False:
        return [build.step_outcome(act.step, OutcomeKind.FAILED,
                                   error="did not happen (probe)", resolved_by="probe")]
    return [build.step_outcome(act.step, OutcomeKind.SUCCEEDED, result=result,
                               resolved_by="probe")]


def _resolve_hint(state: SagaState, st: StepState) -> str:
    return (f"the compensation cannot be called as declared; undo it by hand, then "
            f"'saga resolve {state.saga_id} {st.step} --by NAME --note ...'")


def resolvable(state: SagaState, step: int) -> str | None:
    """Why a person may not settle ``step``'s compensation by hand now (None: they may)."""
    st = state.steps.get(step)
    if st is None:
        return f"saga {state.saga_id} has no step {step}"
    if state.status is not Status.STUCK:
        return f"saga {state.saga_id} is {state.status}, not stuck; only a stuck unwind " \
               "is resolved by hand"
    if st.compensation not in (CompStatus.INTENT, CompStatus.FAILED):
        return f"step {step}'s compensation is not what the unwind is stuck on"
    return None
