"""Saga invariants the verifier checks on top of the hash chain.

They hold for every log Saga Store writes, whatever crashed along the way:
an outcome follows an intent, a step has one outcome (an in-doubt outcome may
be resolved once, later), compensations refer to steps that ran, run in
strict reverse order and never twice, no step is announced or started once
unwinding began (a step already running may still report its outcome: that
is a fact the unwind needs), nothing follows a final event, and a committed
or compensated saga left no completed step behind (a committed saga's steps
all succeeded, except reads that failed: they changed nothing).
"""

from __future__ import annotations

from typing import Any

from saga_store.log.events import TERMINAL_KINDS
from saga_store.log.events import EventKind as K
from saga_store.protocol.vocab import Reversibility

_UNWIND_STARTS = frozenset({K.SAGA_FAILED, K.COMPENSATION_INTENT, K.STEP_NOT_COMPENSABLE})


class Invariants:
    """Feed events in order; :meth:`feed` returns a reason string at the first violation."""

    __slots__ = ("approvals", "closed", "comp_done", "comp_open", "last_comp", "outcome",
                 "readonly", "refused", "started", "unwinding", "walked")

    def __init__(self) -> None:
        self.outcome: dict[int, str | None] = {}  # step -> last outcome kind (None: intent only)
        self.readonly: set[int] = set()
        self.refused: set[int] = set()  # failures the callee refused before running them
        self.started: set[int] = set()
        self.comp_open: set[int] = set()
        self.comp_done: set[int] = set()
        self.walked: set[int] = set()  # steps the unwind has dealt with
        self.last_comp: int | None = None
        self.unwinding = False
        self.closed = False
        self.approvals: dict[int, str] = {}  # step -> the last approval event kind

    def feed(self, kind: str, step: int | None, data: Any) -> str | None:
        if self.closed:
            return f"{kind} after the saga was closed"
        if step is None:
            return self._saga_event(kind)
        if kind == K.STEP_INTENT:
            if self.unwinding:
                return "step_intent after compensation began"
            if step in self.outcome:
                return f"step {step} has a second intent"
            self.outcome[step] = None
            if isinstance(data, dict) and data.get("reversibility") == Reversibility.READONLY:
                self.readonly.add(step)
            return None
        if step not in self.outcome:
            return f"{kind} for step {step}, which has no intent"
        if kind in (K.STEP_STARTED, K.STEP_SUCCEEDED, K.STEP_FAILED, K.STEP_IN_DOUBT):
            if kind == K.STEP_FAILED and isinstance(data, dict) and data.get("refused"):
                self.refused.add(step)
            return self._forward(kind, step)
        if kind == K.STEP_DUPLICATE_SUPPRESSED:
            return None
        if kind == K.STEP_RELEASED:  # handed back by the worker that started it
            if step not in self.started or self.outcome[step] is not None:
                return f"step {step} released without being started, or after its outcome"
            return None
        if kind.startswith("approval_"):
            return self._approval(kind, step)
        return self._compensation(kind, step)

    def _forward(self, kind: str, step: int) -> str | None:
        prior = self.outcome[step]
        if kind == K.STEP_STARTED:
            if self.unwinding:
                return f"step {step} started after compensation began"
            gate = self.approvals.get(step)
            if gate in (K.APPROVAL_REQUESTED, K.APPROVAL_DENIED):
                return f"step {step} started while its approval was {gate.split('_')[1]}"
            if prior is not None:
                return f"step {step} started again after its outcome {prior}"
            self.started.add(step)
            return None
        resolving = prior == K.STEP_IN_DOUBT and kind != K.STEP_IN_DOUBT
        if prior is not None and not resolving:
            return f"step {step} has a second outcome ({prior}, then {kind})"
        if self.unwinding and kind == K.STEP_SUCCEEDED and not resolving \
                and step not in self.started:
            return f"step {step} succeeded after compensation began without having started"
        if step in self.walked and not resolving:
            return f"step {step} got an outcome after the unwind passed it"
        self.outcome[step] = kind
        return None

    def _approval(self, kind: str, step: int) -> str | None:
        prior = self.approvals.get(step)
        if kind == K.APPROVAL_REQUESTED:
            if prior is not None or step in self.started:
                return f"approval requested twice, or after step {step} started"
        elif kind in (K.APPROVAL_GRANTED, K.APPROVAL_DENIED) and prior != K.APPROVAL_REQUESTED:
            return f"{kind} for step {step} without a pending approval_requested"
        self.approvals[step] = kind
        return None

    def _compensation(self, kind: str, step: int) -> str | None:
        self.unwinding = True
        if kind in (K.COMPENSATION_INTENT, K.STEP_NOT_COMPENSABLE):
            if step in self.comp_done:
                return f"step {step} compensated twice"
            if self.last_comp is not None and step > self.last_comp:
                return (f"compensation of step {step} after step {self.last_comp}: "
                        "not in reverse order")
            if kind == K.COMPENSATION_INTENT and self.outcome[step] not in (
                    K.STEP_SUCCEEDED, K.STEP_IN_DOUBT):
                return f"compensation of step {step}, which did not succeed"
            self.last_comp = step
            self.walked.add(step)
            if kind == K.COMPENSATION_INTENT:
                self.comp_open.add(step)
            return None
        if kind == K.COMPENSATION_RESOLVED:
            if step not in self.comp_open:
                return f"step {step} resolved by hand without a compensation under way"
            self.comp_open.discard(step)
            self.comp_done.add(step)
            return None
        if kind in (K.COMPENSATION_SUCCEEDED, K.COMPENSATION_FAILED):
            if step not in self.comp_open:
                return f"{kind} for step {step} without a compensation_intent"
            if kind == K.COMPENSATION_SUCCEEDED:
                self.comp_open.discard(step)
                self.comp_done.add(step)
            return None
        return None  # kinds added later are not judged here

    def _saga_event(self, kind: str) -> str | None:
        if kind in _UNWIND_STARTS:
            self.unwinding = True
        if kind == K.SAGA_COMMITTED:
            if self.unwinding:
                return "saga_committed after compensation began"
            # a read that failed, or a call refused before it ran, changed nothing,
            # so it leaves nothing behind
            open_steps = [s for s, o in self.outcome.items() if o != K.STEP_SUCCEEDED
                          and not (o == K.STEP_FAILED and (s in self.readonly
                                                           or s in self.refused))]
            if open_steps:
                return f"saga_committed with step {open_steps[0]} not succeeded"
        if kind == K.SAGA_COMPENSATED:
            left = [s for s, o in self.outcome.items()
                    if o in (K.STEP_SUCCEEDED, K.STEP_IN_DOUBT)
                    and s not in self.comp_done and s not in self.readonly]
            if left:
                return f"saga_compensated with step {left[-1]} not compensated"
        if kind in TERMINAL_KINDS:
            self.closed = True
        return None
