"""The event envelope (contract) and the kinds of event.

An event is stored as its canonical *body*: the envelope without ``prev`` and
``hash``, with absent (None) fields left out. ``prev`` and ``hash`` travel
beside the body as raw bytes and are put back when an event is read.
"""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1


class EventKind(StrEnum):
    SAGA_STARTED = "saga_started"
    STEP_INTENT = "step_intent"
    STEP_STARTED = "step_started"
    STEP_SUCCEEDED = "step_succeeded"
    STEP_FAILED = "step_failed"
    STEP_IN_DOUBT = "step_in_doubt"
    STEP_DUPLICATE_SUPPRESSED = "step_duplicate_suppressed"
    STEP_RELEASED = "step_released"  # handed back between two tries: not a delivery lost
    STEP_INVALID = "step_invalid"
    SAGA_FAILED = "saga_failed"
    COMPENSATION_INTENT = "compensation_intent"
    COMPENSATION_SUCCEEDED = "compensation_succeeded"
    COMPENSATION_FAILED = "compensation_failed"
    COMPENSATION_RESOLVED = "compensation_resolved"  # a person settled it by hand
    STEP_NOT_COMPENSABLE = "step_not_compensable"
    SAGA_COMMITTED = "saga_committed"
    SAGA_COMPENSATED = "saga_compensated"
    SAGA_NEEDS_ATTENTION = "saga_needs_attention"
    SAGA_STUCK = "saga_stuck"
    SAGA_RESUMED = "saga_resumed"
    APPROVAL_REQUESTED = "approval_requested"
    APPROVAL_GRANTED = "approval_granted"
    APPROVAL_DENIED = "approval_denied"
    # ledger chain only
    LEDGER_OPENED = "saga_opened"
    LEDGER_CLOSED = "saga_closed"
    LEDGER_ARCHIVED = "saga_archived"  # a tombstone: the saga moved out of Redis
    # root chain only: the heads of the ledger chains (layout 2)
    LEDGER_HEADS = "ledger_heads"


KNOWN_KINDS = frozenset(k.value for k in EventKind)
TERMINAL_KINDS = frozenset({
    EventKind.SAGA_COMMITTED, EventKind.SAGA_COMPENSATED, EventKind.SAGA_NEEDS_ATTENTION,
})


class Event(BaseModel):
    """One entry of a chain, as users and exports see it (contract)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    v: int = SCHEMA_VERSION
    saga_id: str
    seq: int = Field(ge=0)
    kind: str
    ts: int
    step: int | None = None
    tool: str | None = None
    tool_call_id: str | None = None
    agent_id: str | None = None
    idem_key: str | None = None
    attempt: int | None = None
    data: Any = None
    prev: str = ""
    hash: str = ""


def body_dict(
    saga_id: str,
    seq: int,
    kind: str,
    *,
    ts: int | None = None,
    step: int | None = None,
    tool: str | None = None,
    tool_call_id: str | None = None,
    agent_id: str | None = None,
    idem_key: str | None = None,
    attempt: int | None = None,
    data: Any = None,
) -> dict[str, Any]:
    """The envelope without prev/hash, absent fields left out (what gets hashed)."""
    out: dict[str, Any] = {
        "v": SCHEMA_VERSION, "saga_id": saga_id, "seq": seq, "kind": kind,
        "ts": ts if ts is not None else time.time_ns() // 1_000_000,
    }
    for name, value in (("step", step), ("tool", tool), ("tool_call_id", tool_call_id),
                        ("agent_id", agent_id), ("idem_key", idem_key),
                        ("attempt", attempt), ("data", data)):
        if value is not None:
            out[name] = value
    return out
