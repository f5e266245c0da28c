"""The client API: sagas of tool calls, executed by workers.

>>> store = SagaStore.from_url("redis://127.0.0.1:6379/0", Registry.from_modules("myapp.tools"))
>>> with store.saga(agent_id="agent-7", conversation_id="conv-1") as saga:  # doctest: +SKIP
...     hold = saga.call("reserve_inventory", {"sku": "LAPTOP-15", "qty": 1},
...                      tool_call_id="call_1")
...     saga.call("charge_payment", {"amount_cents": 1_200_000}, tool_call_id="call_2")

The block commits on normal exit and aborts (compensating what ran) on an
exception. Steps run on workers (``saga worker``); the caller waits on the
saga's stream with XREAD BLOCK, not by polling and not on RQ's result API.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import orjson
import redis

from . import jobs, keys
from .connection import connect
from .context import project
from .errors import (
    ConflictError,
    FencedOff,
    InvalidInput,
    SagaAborted,
    StepError,
    StepInDoubt,
    StepPending,
)
from .events import EventKind as K
from .idempotency import DedupeRecords, args_digest, explicit_key, step_key
from .ids import check_id, new_id
from .log import Head
from .registry import Registry
from .secrets import Secrets
from .settings import Settings
from .state import SagaState, Status, fold
from .store import ChainWriter, Store
from .tools import InvalidToolCall, ToolSpec

if TYPE_CHECKING:
    from .metrics import Metrics

WAIT_SLICE_MS = 1000


class SagaStore:
    """A store, a registry and the step queue: everything an agent needs."""

    def __init__(self, client: redis.Redis, registry: Registry,
                 settings: Settings | None = None, *, queue: str = jobs.STEP_QUEUE,
                 invalid_call_limit: int = 2, metrics: Metrics | None = None) -> None:
        self.settings = settings or Settings()
        self.registry = registry
        self.store = Store(client, self.settings)
        self.metrics = metrics
        self.store.log.metrics = metrics
        self.redis = client
        self.queue = queue
        self.invalid_call_limit = invalid_call_limit
        self.secrets = Secrets(client, self.settings.dedupe_ttl_s)
        self.dedupe = DedupeRecords(client, self.settings.dedupe_ttl_s)

    @classmethod
    def from_url(cls, url: str, registry: Registry, settings: Settings | None = None,
                 **kwargs: Any) -> Self:
        return cls(connect(url), registry, settings, **kwargs)

    # -- sagas driven by the caller ---------------------------------------

    def saga(self, agent_id: str, *, conversation_id: str | None = None,
             saga_id: str | None = None) -> Saga:
        """Open a saga; use it as a context manager (commit on exit, abort on error)."""
        writer = self.store.open(agent_id, saga_id=saga_id, conversation_id=conversation_id)
        state = SagaState(writer.saga_id, agent_id=agent_id, conversation_id=conversation_id,
                          seq=writer.head.seq)
        return Saga(self, writer, state)

    def asaga(self, agent_id: str, **kwargs: Any) -> AsyncSaga:
        """The asyncio form: ``async with store.asaga(...) as saga: await saga.call(...)``."""
        return AsyncSaga(self, agent_id, kwargs)

    # -- plans the workers drive -------------------------------------------

    def submit(self, steps: Sequence[Mapping[str, Any]], *, agent_id: str,
               conversation_id: str | None = None, saga_id: str | None = None) -> str:
        """Submit a whole plan; workers run it to the end. Every step is validated
        first: one bad step and nothing is written."""
        if not steps:
            raise InvalidInput("a plan needs at least one step", field="steps")
        plan = []
        for i, step in enumerate(steps):
            if not isinstance(step, Mapping):
                raise InvalidInput(f"steps[{i}] must be an object with tool and args")
            try:
                spec = self.registry.get(step.get("tool"))  # type: ignore[arg-type]
                args = spec.validate(step.get("args", {}))
            except InvalidInput as exc:
                raise InvalidInput(f"steps[{i}]: {exc}", field=f"steps[{i}]") from None
            call_id = step.get("tool_call_id") or f"call_{i}"
            check_id(call_id, f"steps[{i}].tool_call_id")
            plan.append((spec, args, call_id))
        sid = check_id(saga_id, "saga_id") if saga_id else new_id()
        logged_plan: list[dict[str, Any]] = []
        secret_values: dict[int, dict[str, Any]] = {}
        salt = self.secrets.salt(sid) if any(s.secret for s, _, _ in plan) else b""
        for n, (spec, args, call_id) in enumerate(plan):
            logged, values = Secrets.redact(args, spec.secret, salt)
            if values:
                secret_values[n] = values
            logged_plan.append({"tool": spec.name, "args": logged, "tool_call_id": call_id})
        first_spec, _, first_call_id = plan[0]
        intent = intent_fields(sid, 0, first_spec, logged_plan[0]["args"], first_call_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(keys.ACTIVE, {sid: _ms() + 2 * self.settings.lease_ms})
        for n, values in secret_values.items():
            self.secrets.put(pipe, sid, n, values)
        pipe.execute()
        writer = self.store.open(agent_id, saga_id=sid, conversation_id=conversation_id,
                                 data={"plan": logged_plan}, then=[(K.STEP_INTENT, intent)])
        enqueue_step(self.redis, self.queue, sid, 0, writer.head.seq, intent["idem_key"])
        return sid

    def wait(self, saga_id: str, timeout: float | None = None) -> SagaState:
        """Block until the saga is final (committed, compensated, needs attention)
        or stuck; returns its state. Raises :class:`StepPending` on timeout."""
        check_id(saga_id, "saga_id")
        state = fold(saga_id, self.store.log.bodies(saga_id))
        return self.follow(state, lambda st: st.final or st.status is Status.STUCK, timeout)

    def follow(self, state: SagaState, done: Any, timeout: float | None) -> SagaState:
        """Apply new events of ``state``'s saga until ``done(state)``; XREAD BLOCK."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done(state):
            left_ms = WAIT_SLICE_MS if deadline is None else \
                int(min(WAIT_SLICE_MS, (deadline - time.monotonic()) * 1000))
            if left_ms <= 0:
                raise StepPending(f"saga {state.saga_id} did not get there within {timeout}s; "
                                  "is 'saga worker' running?")
            for entry in self.store.log.wait(state.saga_id, state.seq, left_ms):
                state.apply(orjson.loads(entry.body))
                state.head_hash = entry.hash
        return state

    def state(self, saga_id: str) -> SagaState:
        return self.store.state(saga_id)

    def abort(self, saga_id: str, reason: str = "aborted") -> bool:
        """Start unwinding a saga that is still going forward; False if it was not."""
        check_id(saga_id, "saga_id")
        writer = self.store.writer(saga_id)
        for _ in range(20):
            try:
                writer.append(K.SAGA_FAILED, data={"reason": reason}, phase="forward")
            except FencedOff:
                return False
            except ConflictError:
                continue
            enqueue_compensation(self.redis, saga_id)
            return True
        raise ConflictError(f"saga {saga_id} kept changing; try the abort again")

    def resume(self, saga_id: str) -> bool:
        """Try a stuck saga's unwind again (after its cause was fixed); False if not stuck."""
        check_id(saga_id, "saga_id")
        state = self.state(saga_id)
        if state.status is not Status.STUCK:
            return False
        writer = self.store.writer(saga_id)
        writer.append(K.SAGA_RESUMED, data={"after": state.reason})
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(keys.ACTIVE, {saga_id: _ms() + 2 * self.settings.lease_ms})
        enqueue_compensation(pipe, saga_id)
        pipe.execute()
        return True


class Saga:
    """One saga driven by the caller. Not thread-safe: one agent, one saga."""

    def __init__(self, store: SagaStore, writer: ChainWriter, state: SagaState) -> None:
        self.store, self.writer, self.state = store, writer, state
        self.invalid_calls = 0

    @property
    def saga_id(self) -> str:
        return self.writer.saga_id

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.state.status is not Status.RUNNING:
            return
        if exc is None:
            self.commit()
        else:
            self.abort(f"{type(exc).__name__}: {exc}")

    def call(self, tool: str, args: Mapping[str, Any] | None = None, *,
             tool_call_id: str | None = None, idempotency_key: str | None = None,
             timeout: float | None = None) -> dict[str, Any]:
        """Run one tool call as the saga's next step and return its result.

        Raises :class:`~saga_store.tools.InvalidToolCall` for arguments the agent
        can repair (nothing is written); the second invalid call aborts the saga
        (:class:`SagaAborted`). A failed step raises :class:`StepError`, an
        unknown outcome :class:`StepInDoubt`; either way the saga unwinds.
        """
        if self.state.status is not Status.RUNNING:
            raise SagaAborted(f"saga {self.saga_id} is {self.state.status}; start a new saga")
        spec, validated = self._validate(tool, args or {})
        if tool_call_id is not None:
            check_id(tool_call_id, "tool_call_id")
        salt = self.store.secrets.salt(self.saga_id) if spec.secret else b""
        logged, secret_values = self.store.secrets.redact(validated, spec.secret, salt)
        key = explicit_key(idempotency_key) if idempotency_key else \
            step_key(self.saga_id, spec.name, logged)
        if key in self.state.by_key:  # the agent repeated a call: answer from the log
            if self.store.metrics is not None:
                self.store.metrics.dedupe_hits.labels("repeated_call").inc()
            return self._answer(self.state.by_key[key], timeout or spec.timeout + 30)
        n = self.state.next_step
        if idempotency_key:
            claim = self.store.dedupe.claim(key, args_digest(spec.name, validated),
                                            self.saga_id, n)
            if claim.status == "exists":
                return self._elsewhere(claim, timeout or spec.timeout + 30)
        intent = intent_fields(self.saga_id, n, spec, logged, tool_call_id, key)
        if idempotency_key:
            intent["data"]["keyed"] = True  # the worker updates the key's record
        self._append_intent(n, intent, secret_values)
        return self._answer(n, timeout or spec.timeout + 30)

    def _validate(self, tool: str, args: Mapping[str, Any]) -> tuple[ToolSpec, dict[str, Any]]:
        try:
            spec = self.store.registry.get(tool)
            return spec, spec.validate(dict(args))
        except InvalidInput as exc:
            self.invalid_calls += 1
            if self.invalid_calls >= self.store.invalid_call_limit:
                self.abort(f"{self.invalid_calls} invalid tool calls: {exc}")
                raise SagaAborted(f"saga {self.saga_id} aborted after {self.invalid_calls} "
                                  f"invalid calls; last: {exc}") from exc
            raise

    def _append_intent(self, n: int, intent: dict[str, Any],
                       secret_values: Mapping[str, Any]) -> None:
        r = self.store.redis
        self._sync_head()
        while True:
            pipe = r.pipeline(transaction=False)
            pipe.zadd(keys.ACTIVE, {self.saga_id: _ms() + 2 * self.store.settings.lease_ms})
            if secret_values:
                self.store.secrets.put(pipe, self.saga_id, n, secret_values)
            call = self.writer.prepare([(K.STEP_INTENT, intent)], phase="forward")
            call.send(pipe)
            # the job goes in the same round trip: if the append loses, the worker
            # finds no intent at that seq and drops the job
            enqueue_step(pipe, self.store.queue, self.saga_id, n, self.writer.head.seq + 1,
                         intent["idem_key"])
            replies = pipe.execute(raise_on_error=False)
            try:  # zadd, [hset + expire of the secrets], the append script, the job
                self.writer.applied(call, replies[3 if secret_values else 1])
                self.state.apply({**intent, "kind": K.STEP_INTENT, "seq": self.writer.head.seq})
                self.state.head_hash = self.writer.head.hash
                return
            except FencedOff:
                self._catch_up()
                raise SagaAborted(f"saga {self.saga_id} is unwinding; no more calls") from None
            except ConflictError:
                self._catch_up()  # someone else wrote: re-read, then decide again
                if self.state.status is not Status.RUNNING:
                    raise SagaAborted(f"saga {self.saga_id} is {self.state.status}") from None
                intent["step"] = n = self.state.next_step

    def _sync_head(self) -> None:
        """Writers append to this saga too (its steps' workers): use the newest head
        seen while following the stream, so the next append does not lose the CAS."""
        if self.state.seq > self.writer.head.seq and self.state.head_hash:
            self.writer.head = Head(self.state.seq, self.state.head_hash)

    def _catch_up(self) -> None:
        for ev in self.store.store.log.bodies(self.saga_id, self.state.seq + 1):
            self.state.apply(ev)
        self.writer.head = self.store.store.log.head(self.saga_id)

    def _answer(self, n: int, timeout: float) -> dict[str, Any]:
        st = self.store.follow(self.state, lambda s: s.steps[n].finished, timeout).steps[n]
        if st.status == "succeeded":
            return dict(st.result or {})
        if st.status == "in_doubt":
            raise StepInDoubt(f"step {n} ({st.tool}) is in doubt: {st.error}; "
                              "the saga is being unwound", data=st.error)
        raise StepError(f"step {n} ({st.tool}) failed: {st.error}; the saga is being unwound",
                        data=st.error)

    def _elsewhere(self, claim: Any, timeout: float) -> dict[str, Any]:
        """An explicit key already used by (claim.saga_id, claim.step): same answer."""
        if claim.state == "succeeded":
            return dict(claim.result or {})
        other = fold(claim.saga_id, self.store.store.log.events(claim.saga_id))
        if claim.step not in other.steps:
            raise StepPending("that idempotency key is in progress; try again shortly")
        sub = SagaStore.follow(self.store, other, lambda s: s.steps[claim.step].finished, timeout)
        st = sub.steps[claim.step]
        if st.status == "succeeded":
            return dict(st.result or {})
        raise StepError(f"the call with that idempotency key ended {st.status}: {st.error}")

    def commit(self) -> None:
        open_steps = [s.step for s in self.state.steps.values()
                      if s.status not in ("succeeded", "suppressed")]
        if open_steps:
            raise InvalidInput(f"cannot commit: step {open_steps[0]} has not succeeded")
        self._sync_head()
        for _ in range(20):
            try:
                self.writer.append(K.SAGA_COMMITTED, phase="forward")
                break
            except FencedOff:
                self._catch_up()
                raise SagaAborted(f"saga {self.saga_id} is {self.state.status}; "
                                  "it can't commit") from None
            except ConflictError:
                self._catch_up()  # e.g. a duplicate delivery noted itself; decide again
                if any(s.status != "succeeded" for s in self.state.steps.values()):
                    raise SagaAborted(f"saga {self.saga_id} changed while committing") from None
        self.state.status = Status.COMMITTED
        project(self.store.store, self.saga_id)
        self.store.redis.zrem(keys.ACTIVE, self.saga_id)

    def abort(self, reason: str = "aborted by the caller") -> None:
        """Stop going forward and unwind what ran (compensations, in reverse order)."""
        if self.store.abort(self.saga_id, reason):
            self.state.status = Status.COMPENSATING


class AsyncSaga:
    """``async with store.asaga(agent_id=...) as saga: await saga.call(...)``.

    The blocking parts run in a worker thread, so an event loop is never stalled.
    """

    def __init__(self, store: SagaStore, agent_id: str, kwargs: dict[str, Any]) -> None:
        self._store, self._agent_id, self._kwargs = store, agent_id, kwargs
        self.saga: Saga | None = None

    async def __aenter__(self) -> Self:
        self.saga = await asyncio.to_thread(self._store.saga, self._agent_id, **self._kwargs)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        assert self.saga is not None
        await asyncio.to_thread(self.saga.__exit__, exc_type, exc, tb)

    @property
    def saga_id(self) -> str:
        assert self.saga is not None
        return self.saga.saga_id

    async def call(self, tool: str, args: Mapping[str, Any] | None = None,
                   **kwargs: Any) -> dict[str, Any]:
        assert self.saga is not None, "use 'async with store.asaga(...)'"
        return await asyncio.to_thread(self.saga.call, tool, args, **kwargs)

    async def abort(self, reason: str = "aborted by the caller") -> None:
        assert self.saga is not None
        await asyncio.to_thread(self.saga.abort, reason)


def intent_fields(saga_id: str, n: int, spec: ToolSpec, logged_args: dict[str, Any],
                  tool_call_id: str | None, key: str | None = None) -> dict[str, Any]:
    return {"step": n, "tool": spec.name, "tool_call_id": tool_call_id,
            "idem_key": key or step_key(saga_id, spec.name, logged_args),
            "data": {"args": logged_args, "reversibility": spec.reversibility.value}}


def enqueue_step(pipe: Any, queue: str, saga_id: str, step: int, intent_seq: int,
                 idem_key: str) -> None:
    jobs.push(pipe, queue, jobs.step_job_id(idem_key, intent_seq, saga_id), jobs.STEP_FUNC,
              [saga_id, step, intent_seq])


def enqueue_compensation(pipe: Any, saga_id: str) -> None:
    jobs.push(pipe, jobs.COMPENSATION_QUEUE, jobs.compensation_job_id(saga_id),
              jobs.COMPENSATE_FUNC, [saga_id])


def _ms() -> int:
    return time.time_ns() // 1_000_000


__all__ = ["AsyncSaga", "InvalidToolCall", "Saga", "SagaStore"]
