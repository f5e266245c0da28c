"""What a tool call came to, as every driver reports it to the protocol."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from saga_store.protocol.vocab import OutcomeKind


@dataclass(frozen=True)
class Outcome:
    """A call's outcome: ``kind``, the result of a success, the error otherwise."""

    kind: OutcomeKind
    result: dict[str, Any] | None = None
    error: str | None = None
    retryable: bool = False
    tries: int = 1
    postcondition_failed: str | None = None

    @classmethod
    def failed(cls, error: str, **kw: Any) -> Outcome:
        return cls(OutcomeKind.FAILED, error=error, **kw)

    @classmethod
    def in_doubt(cls, error: str) -> Outcome:
        return cls(OutcomeKind.IN_DOUBT, error=error)

    @classmethod
    def succeeded(cls, result: dict[str, Any] | None, **kw: Any) -> Outcome:
        return cls(OutcomeKind.SUCCEEDED, result=result, **kw)

    @property
    def ok(self) -> bool:
        return self.kind is OutcomeKind.SUCCEEDED
