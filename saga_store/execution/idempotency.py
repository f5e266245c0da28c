"""Idempotency keys (contract) and dedupe records for explicit keys.

Default key: SHA-256 over canonical ``(saga_id, tool, args)``, so an agent that
repeats a call in the same saga gets the stored result; such keys are
deduplicated by the saga's own log (it keeps every intent with its key).

Explicit key (Stripe-style): given by the caller, it replaces the saga-derived
part, so it deduplicates across every saga of the agent that gives it, whatever
their ids (see :func:`saga_store.keys.idem_for`). Its record holds a
digest of the arguments (secret ones keyed, see :func:`args_digest`), where
the step is and how it ended, with its own retention (default 7 days), never
tied to RQ's job TTLs. A claim is one script (``lua/claim.lua``); a claim whose
call never became a step is settled (released, or taken over by a retry).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import redis

from saga_store import keys
from saga_store.errors import KeyReuseError
from saga_store.log.canonical import canonical
from saga_store.log.scripts import CLAIM
from saga_store.protocol.state import SagaState, Status

_DOMAIN = "saga-store/idem/v1"


def step_key(saga_id: str, tool: str, args: Any) -> str:
    return hashlib.sha256(canonical([_DOMAIN, "step", saga_id, tool, args])).hexdigest()


def explicit_key(key: str) -> str:
    return hashlib.sha256(canonical([_DOMAIN, "explicit", key])).hexdigest()


def compensation_key(step_idem_key: str) -> str:
    """The compensation of a step has its own key, derived from the step's."""
    return hashlib.sha256(canonical([_DOMAIN, "compensation", step_idem_key])).hexdigest()


def args_digest(tool: str, args: Mapping[str, Any], secret: Iterable[str] = (),
                key: bytes | None = None) -> str:
    """What an explicit key's record keeps to tell "the same call" from another.
    Secret arguments never enter it in the clear: with the deployment's HMAC key
    they enter keyed (HMAC-SHA256, so a short PIN cannot be brute-forced from
    the record without the key); without one they are left out (a retry with
    another card counts as the same call)."""
    hidden = frozenset(secret) & args.keys()
    masked = dict(args)
    for name in hidden:
        masked[name] = {"$secret": hmac.new(key, canonical(args[name]), hashlib.sha256
                                            ).hexdigest() if key else None}
    return hashlib.sha256(canonical([_DOMAIN, "args", tool, masked])).hexdigest()


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

    def claim(self, agent_id: str | None, key: str, digest: str, saga_id: str, step: int, *,
              take_from: Claim | None = None) -> Claim:
        """Take ``key`` of ``agent_id`` (the saga's agent, as its log names it) for
        (saga, step), or report who has it. Raises
        :class:`KeyReuseError` if it was used with other arguments. With
        ``take_from``: take over that pending claim, which the caller found can
        never become a step (see :func:`claim_fate`); if it moved on meanwhile,
        who has it now is reported instead."""
        args: list[Any] = [digest, saga_id, step, self.ttl_s]
        if take_from is not None:
            args += ["takeover", take_from.saga_id, take_from.step]
        reply = self._claim(keys=[keys.idem_for(agent_id, key)], args=args)
        status = reply[0].decode()
        if status == "conflict":
            raise KeyReuseError("idempotency key was already used with different arguments; "
                                "use a new key for a different call")
        if status == "new":
            return Claim("new")
        saga, step_s, state, result = (x.decode() for x in reply[1:5])
        return Claim("exists", saga, int(step_s), state,
                     orjson.loads(result) if result else None)

    def take_over(self, agent_id: str | None, key: str, digest: str, saga_id: str, step: int,
                  claim: Claim, holder: Callable[[str], SagaState]) -> Claim:
        """The one take-over of a claim: ``claim`` (what :meth:`claim` reported) is
        taken over for (``saga_id``, ``step``) when it is pending in another saga
        whose log (``holder`` folds it) says it can never become a step (see
        :func:`claim_fate`); otherwise it is returned as it was. A claim pending in
        ``saga_id`` itself is its caller's to judge (a reply of its own that was lost).
        """
        if claim.status != "exists" or claim.state != "pending" or claim.saga_id == saga_id:
            return claim
        fate, _ = claim_fate(holder(str(claim.saga_id)), key)
        if fate != "never":
            return claim
        return self.claim(agent_id, key, digest, saga_id, step, take_from=claim)

    def finish(self, agent_id: str | None, key: str, state: str, result: Any,
               pipe: Any = None) -> None:
        """Record how the keyed step ended (on ``pipe`` when given)."""
        target = pipe if pipe is not None else self.redis
        target.hset(keys.idem_for(agent_id, key),
                    mapping={"state": state, "result": canonical(result)})

    def release(self, agent_id: str | None, key: str, digest: str, saga_id: str, step: int,
                ) -> None:
        """Forget this call's claim of ``key``, its intent never written (refused,
        too large, the saga unwinding): a retry runs the call. A claim someone else
        holds by now is left alone."""
        self._claim(keys=[keys.idem_for(agent_id, key)],
                    args=[digest, saga_id, step, self.ttl_s, "release"])


def claim_fate(holder: SagaState, key: str) -> tuple[str, int | None]:
    """What a pending claim of ``key`` held by the saga ``holder`` (its log folded)
    comes to: ("step", n) it became step n (follow it); ("never", None) it never
    did and never can (that saga left its forward phase, so the append script
    refuses any new intent of it; or it does not exist): take it over; ("pending",
    None) it may yet (its caller is between the claim and the intent)."""
    for st in holder.steps.values():
        if st.idem_key == key:
            return "step", st.step
    if holder.seq < 0 or holder.status is not Status.RUNNING:
        return "never", None
    return "pending", None
