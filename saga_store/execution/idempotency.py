"""Idempotency keys (contract) and dedupe records for explicit keys.

Default key: SHA-256 over canonical ``(saga_id, tool, args)``, so an agent that
repeats a call in the same saga gets the stored result; such keys are
deduplicated by the saga's own log (it keeps every intent with its key).

Explicit key (Stripe-style): given by the caller, it replaces the saga-derived
part, so it deduplicates across sagas. Its record ``ss:idem:{key}`` holds a
digest of the arguments, where the step is and how it ended, with its own
retention (default 7 days), never tied to RQ's job TTLs. A claim is one
script (``lua/claim.lua``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson
import redis

from saga_store import keys
from saga_store.errors import KeyReuseError
from saga_store.log.canonical import canonical
from saga_store.log.scripts import CLAIM

_DOMAIN = "saga-store/idem/v1"



def step_key(saga_id: str, tool: str, args: Any) -> str:
    return hashlib.sha256(canonical([_DOMAIN, "step", saga_id, tool, args])).hexdigest()


def explicit_key(key: str) -> str:
    return hashlib.sha256(canonical([_DOMAIN, "explicit", key])).hexdigest()


def compensation_key(step_idem_key: str) -> str:
    """The compensation of a step has its own key, derived from the step's."""
    return hashlib.sha256(canonical([_DOMAIN, "compensation", step_idem_key])).hexdigest()


def args_digest(tool: str, args: Any) -> str:
    return hashlib.sha256(canonical([_DOMAIN, "args", tool, args])).hexdigest()


@dataclass(frozen=True)
class Claim:
    status: str  # new, exists
    saga_id: str | None = None
    step: int | None = None
    state: str | None = None  # pending, succeeded, failed, in_doubt
    result: Any = None


class DedupeRecords:
    def __init__(self, client: redis.Redis, ttl_s: int) -> None:
        self.redis, self.ttl_s = client, ttl_s
        self._claim = client.register_script(CLAIM)

    def claim(self, key: str, digest: str, saga_id: str, step: int) -> Claim:
        """Take ``key`` for (saga, step), or report who has it. Raises
        :class:`KeyReuseError` if it was used with other arguments."""
        reply = self._claim(keys=[keys.idem(key)], args=[digest, saga_id, step, self.ttl_s])
        status = reply[0].decode()
        if status == "conflict":
            raise KeyReuseError("idempotency key was already used with different arguments; "
                                "use a new key for a different call")
        if status == "new":
            return Claim("new")
        saga, step_s, state, result = (x.decode() for x in reply[1:5])
        return Claim("exists", saga, int(step_s), state,
                     orjson.loads(result) if result else None)

    def finish(self, key: str, state: str, result: Any, pipe: Any = None) -> None:
        """Record how the keyed step ended (on ``pipe`` when given)."""
        target = pipe if pipe is not None else self.redis
        target.hset(keys.idem(key), mapping={"state": state, "result": canonical(result)})

    def release(self, key: str) -> None:
        """Forget a claim that never became a step (its intent was not written)."""
        self.redis.pexpire(keys.idem(key), 0)  # expire now (no DEL right needed)
