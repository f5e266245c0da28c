"""One exception root with families; every message says what to do next.

    SagaError
    ├── InvalidInput          bad ids, arguments, payloads: nothing was written
    ├── IntegrityError        the log does not verify (tamper, anchor mismatch)
    ├── ConflictError         a compare-and-set lost; re-read and decide again
    ├── IdempotencyError      a key reused with other arguments, or in progress
    ├── StepError             a tool failed; ``retryable`` says whether to retry
    ├── CompensationError     an undo failed
    ├── StoreUnavailable      Redis could not be reached or answered wrongly
    └── CannotVerify          verification could not run (e.g. the wrong key)
"""

from __future__ import annotations

from typing import Any


class SagaError(Exception):
    """Root of every error Saga Store raises on purpose."""

    code = "saga_error"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form for agents and ``--json`` output."""
        return {"error": self.code, "message": str(self)}


class InvalidInput(SagaError, ValueError):
    """Input was refused before anything was written."""

    code = "invalid_input"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        if self.field is not None:
            out["field"] = self.field
        return out


class IntegrityError(SagaError):
    """The log failed verification."""

    code = "integrity"


class AnchorMismatch(IntegrityError):
    """The ledger is behind or forked from an exported anchor."""

    code = "anchor_mismatch"


class ConflictError(SagaError):
    """A compare-and-set append lost the race (``head`` is the chain's head now)
    or was fenced off (``head`` is None)."""

    code = "conflict"

    def __init__(self, message: str, head: Any = None) -> None:
        super().__init__(message)
        self.head = head


class FencedOff(ConflictError):
    """The writer no longer holds the saga's lease, or the saga left the
    phase the write needs (for example a forward step after unwinding began)."""

    code = "fenced_off"


class IdempotencyError(SagaError):
    """An idempotency key was misused."""

    code = "idempotency"


class KeyReuseError(IdempotencyError):
    """The same idempotency key came with different arguments."""

    code = "key_reused"


class StepError(SagaError):
    """A step failed; ``retryable`` tells the caller whether trying again may help."""

    code = "step_failed"

    def __init__(self, message: str, *, retryable: bool = False, data: Any = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.data = data

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["retryable"] = self.retryable
        return out


class CompensationError(SagaError):
    """A compensation could not be completed."""

    code = "compensation_failed"


class StoreUnavailable(SagaError):
    """Redis could not be reached; check the URL, the server and the network."""

    code = "store_unavailable"


class CannotVerify(SagaError):
    """Verification could not be carried out; this says nothing about integrity."""

    code = "cannot_verify"


class StepInDoubt(StepError):
    """The step's outcome is unknown (it timed out or its worker died after the
    effect may have happened); the saga is being unwound."""

    code = "step_in_doubt"


class SagaAborted(SagaError):
    """The saga is unwinding (a step failed or someone aborted it): no more calls."""

    code = "saga_aborted"


class StepPending(SagaError):
    """No worker finished the step in time; it stays queued. Is ``saga worker`` running?"""

    code = "step_pending"
