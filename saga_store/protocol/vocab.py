"""The saga protocol's vocabulary: every state, kind and mode as a type.

They are ``StrEnum``s, so a value read from the log or from Redis compares
equal to its member and is written as its plain string: the stored format is
unchanged.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    """A saga's state, the fold of its log."""

    RUNNING = "running"
    COMPENSATING = "compensating"
    COMMITTED = "committed"
    COMPENSATED = "compensated"
    NEEDS_ATTENTION = "needs_attention"
    STUCK = "stuck"


FINAL = frozenset({Status.COMMITTED, Status.COMPENSATED, Status.NEEDS_ATTENTION})


class StepStatus(StrEnum):
    """Where a step's forward call stands."""

    INTENT = "intent"
    STARTED = "started"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    IN_DOUBT = "in_doubt"


FINISHED = frozenset({StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.IN_DOUBT})


class CompStatus(StrEnum):
    """Where a step's compensation stands. ``RESOLVED``: a person settled it by hand."""

    INTENT = "intent"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    NOT_COMPENSABLE = "not_compensable"
    RESOLVED = "resolved"


# compensation states an unwind never comes back to
SETTLED = frozenset({CompStatus.SUCCEEDED, CompStatus.NOT_COMPENSABLE, CompStatus.RESOLVED})


class Approval(StrEnum):
    """A gated step's approval: asked for, then granted or denied."""

    REQUESTED = "requested"
    GRANTED = "granted"
    DENIED = "denied"


class OutcomeKind(StrEnum):
    """What a tool call came to."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    IN_DOUBT = "in_doubt"


class Reversibility(StrEnum):
    """Whether a tool's effect can be undone (contract)."""

    READONLY = "readonly"
    COMPENSABLE = "compensable"
    IRREVERSIBLE = "irreversible"


class Unclassified(StrEnum):
    """A tool nobody classified (an MCP server's tool with no tools-map entry,
    declaration or annotation): mutating, and not undoable. Kept apart from
    :class:`Reversibility`, which a registered tool must choose from."""

    UNKNOWN = "unknown"


class LeaseMode(StrEnum):
    """What an append does with the saga's lease (see the append script)."""

    HOLD = "hold"
    ACQUIRE = "acquire"
    RELEASE = "release"


class Phase(StrEnum):
    """The phase the append script checks. ``OPEN``: the chain must not exist yet
    (only an opening creates a chain); ``ANY``: no check beyond "not closed"."""

    ANY = ""
    OPEN = "open"
    FORWARD = "forward"
    UNWINDING = "unwinding"
    CLOSED = "closed"


def phase_of(status: Status) -> Phase:
    """The phase a saga in ``status`` is in: forward work is refused once unwinding."""
    if status is Status.RUNNING:
        return Phase.FORWARD
    return Phase.CLOSED if status in FINAL else Phase.UNWINDING


class Fence(StrEnum):
    """Why an append was fenced off."""

    LEASE = "lease"  # another holder has the saga's lease
    PHASE = "phase"  # the saga left the phase the append needs
    NO_CHAIN = "no_chain"  # the chain does not exist and the append does not open it
    GUARD = "guard"  # a key the append needs absent exists (a caller's lease came back)


class Follow(StrEnum):
    """What a step's outcome leads to."""

    NONE = "none"  # the caller drives the next step
    NEXT = "next"  # the plan's next step is queued
    EAGER = "eager"  # the plan's next step runs in this worker, claimed in the same append
    COMPENSATE = "compensate"  # the unwind is queued
    UNWIND = "unwind"  # this worker unwinds at once
    COMMITTED = "committed"  # the saga committed
