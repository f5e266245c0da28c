"""Saga Store: durable, verifiable sagas for AI agent tool calls.

>>> from saga_store import tool, Reversibility
"""

from .client import AsyncSaga, Saga, SagaStore
from .errors import (
    CompensationError,
    ConflictError,
    IdempotencyError,
    IntegrityError,
    InvalidInput,
    KeyReuseError,
    SagaAborted,
    SagaError,
    StepError,
    StepInDoubt,
    StepPending,
    StoreUnavailable,
)
from .protocol.vocab import Reversibility
from .registry import Registry
from .settings import Settings
from .state import SagaState, Status
from .tools import (
    InvalidToolCall,
    RetryableError,
    RetryPolicy,
    StepContext,
    tool,
)

__all__ = [
    "AsyncSaga", "CompensationError", "ConflictError", "IdempotencyError", "IntegrityError",
    "InvalidInput", "InvalidToolCall", "KeyReuseError", "Registry", "RetryPolicy",
    "RetryableError", "Reversibility", "Saga", "SagaAborted", "SagaError", "SagaState",
    "SagaStore", "Settings", "Status", "StepContext", "StepError", "StepInDoubt",
    "StepPending", "StoreUnavailable", "tool",
]
