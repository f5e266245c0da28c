"""One exception root with families; every message says what to do next.

    SagaError
    ├── InvalidInput          bad ids, arguments, payloads: nothing was written
    │   ├── InvalidToolCall   a call's arguments do not fit its tool (the agent repairs)
    │   ├── UnknownTool       no tool of that name is registered
    │   ├── NoSuchSaga        the saga id names no saga
    │   └── MappingError      a compensation's mapping did not resolve
    ├── IntegrityError        the log does not verify (tamper, anchor mismatch)
    ├── ConflictError         a compare-and-set lost; re-read and decide again
    ├── IdempotencyError      a key reused with other arguments, or in progress
    ├── StepError             a tool failed; ``retryable`` says whether to retry
    │   ├── RetryableError    raised by a tool: a transient failure, try again
    │   └── StepInDoubt       the outcome is unknown
    ├── SagaAborted           the saga is unwinding: no more calls
    │   └── StepRolledBack    a call sent again ran once and was rolled back since
    ├── SagaTakenOver         another process attached the saga: this handle stops
    ├── StoreUnavailable      Redis could not be reached or answered wrongly
    └── CannotVerify          verification could not run (e.g. the wrong key)
"""

from __future__ import annotations

from typing import Any

from saga_store.protocol.vocab import Fence


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


class MappingError(InvalidInput):
    """A compensation's static mapping did not resolve against the step's input and
    output (a field the tool did not return, say)."""

    code = "mapping_unresolved"


class InvalidToolCall(InvalidInput):
    """The agent's arguments do not fit the tool; ``errors`` says where and why."""

    code = "invalid_tool_call"

    def __init__(self, tool: str, errors: list[dict[str, Any]]) -> None:
        where = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(arguments)'}: {e['msg']}"
                          for e in errors)
        super().__init__(f"invalid arguments for {tool}: {where}; fix them and call again")
        self.tool, self.errors = tool, errors

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "tool": self.tool, "errors": self.errors}


class UnknownTool(InvalidInput):
    """No tool of that name is registered (in this process)."""

    code = "unknown_tool"


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
    """The writer no longer holds the saga's lease (``reason`` is
    :attr:`Fence.LEASE`), or the saga left the phase the write needs
    (:attr:`Fence.PHASE`: for example a forward step after unwinding began)."""

    code = "fenced_off"

    def __init__(self, message: str, reason: Fence) -> None:
        super().__init__(message)
        self.reason = reason

    @property
    def lease_lost(self) -> bool:
        return self.reason is Fence.LEASE


class NoSuchSaga(InvalidInput):
    """The saga id names no saga; nothing was written."""

    code = "no_such_saga"

    def __init__(self, message: str) -> None:
        super().__init__(message, field="saga_id")


def no_such_saga(saga_id: str) -> str:
    return f"no such saga {saga_id}; 'saga ls' lists the sagas there are"


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



class StoreUnavailable(SagaError):
    """Redis could not be reached; check the URL, the server and the network."""

    code = "store_unavailable"


class CannotVerify(SagaError):
    """Verification could not be carried out; this says nothing about integrity."""

    code = "cannot_verify"


class RetryableError(StepError):
    """Raise from a tool for a transient failure: the step is tried again."""

    def __init__(self, message: str, data: Any = None) -> None:
        super().__init__(message, retryable=True, data=data)


class StepInDoubt(StepError):
    """The step's outcome is unknown (it timed out or its worker died after the
    effect may have happened); the saga is being unwound."""

    code = "step_in_doubt"


class SagaAborted(SagaError):
    """The saga is unwinding (a step failed or someone aborted it): no more calls."""

    code = "saga_aborted"


class StepRolledBack(SagaAborted):
    """A call sent again (same ``tool_call_id``) already ran in the saga and was rolled
    back since; it is not run again. ``data`` is what its compensation returned."""

    code = "step_rolled_back"

    def __init__(self, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.data = data


class SagaTakenOver(SagaError):
    """Another process attached the saga (``store.attach``) and drives it now; this
    handle's calls are refused. Attach again to drive it from here."""

    code = "saga_taken_over"


class StepPending(SagaError):
    """No worker finished the step in time; it stays queued. Is ``saga worker`` running?"""

    code = "step_pending"
