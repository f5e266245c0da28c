"""Saga Store: durable, verifiable sagas for AI agent tool calls.

>>> from saga_store import tool, Reversibility
"""

from saga_store.client.api import AsyncSaga, Saga, SagaStore
from saga_store.errors import (
    ConflictError,
    IdempotencyError,
    IntegrityError,
    InvalidInput,
    InvalidToolCall,
    KeyReuseError,
    MappingError,
    NoSuchSaga,
    RetryableError,
    SagaAborted,
    SagaError,
    StepError,
    StepInDoubt,
    StepPending,
    StoreUnavailable,
)
from saga_store.protocol.state import SagaState, Status
from saga_store.protocol.vocab import Reversibility
from saga_store.settings import Settings
from saga_store.tools.registry import Registry
from saga_store.tools.spec import RetryPolicy, StepContext, tool

__all__ = [
    "AsyncSaga", "ConflictError", "IdempotencyError", "IntegrityError", "InvalidInput",
    "InvalidToolCall", "KeyReuseError", "MappingError", "NoSuchSaga", "Registry",
    "RetryPolicy", "RetryableError", "Reversibility", "Saga", "SagaAborted", "SagaError",
    "SagaState", "SagaStore", "Settings", "Status", "StepContext", "StepError", "StepInDoubt",
    "StepPending", "StoreUnavailable", "tool",
]
