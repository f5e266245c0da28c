"""A saga driven by its caller: ``with store.saga(...) as saga: saga.call(...)``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from saga_store.client.context import UNDONE, project
from saga_store.errors import (
    ConflictError,
    FencedOff,
    InvalidInput,
    SagaAborted,
    SagaTakenOver,
    StepError,
    StepInDoubt,
    StepPending,
    StepRolledBack,
)
from saga_store.execution.enqueue import enqueue_step, intent, schedule
from saga_store.execution.idempotency import (
    Claim,
    args_digest,
    claim_fate,
    explicit_key,
    step_key,
)
from saga_store.faults import fault
from saga_store.ids import check_id
from saga_store.log.events import EventKind as K
from saga_store.log.store import ChainWriter
from saga_store.log.stream import Head, SideWrite
from saga_store.ops import tracing
from saga_store.protocol import build
from saga_store.protocol.forward import commit_blocker, logged_call, repeat_of
from saga_store.protocol.state import SagaState, Status
from saga_store.protocol.vocab import Approval, Fence, OutcomeKind, Phase, StepStatus
from saga_store.tools.spec import ToolSpec

if TYPE_CHECKING:
    from saga_store.client.api import SagaStore


class Saga:
    """One saga driven by the caller. Not thread-safe: one agent, one saga."""

    def __init__(self, store: SagaStore, writer: ChainWriter, state: SagaState,
                 inline: Any = None, holder: int = 0) -> None:
        self.store, self.writer, self.state = store, writer, state
        self.inline = inline  # the in-process executor, or None: workers run the steps
        self.invalid_calls = state.invalid_calls
        # the caller's generation: 0 for the opener, one more for each attach. Every
        # append is guarded by the absence of the next generation's taken-over key,
        # so a process that attached fences off every handle before it
        self.holder = holder
        self._renewed = time.monotonic()  # when the client lease was last renewed
        self._span: tracing.SagaSpan | None = None  # while its with-block runs

    @property
    def saga_id(self) -> str:
        return self.writer.saga_id

    def __enter__(self) -> Self:
        self._span = tracing.SagaSpan(self.state.agent_id or "", self.saga_id)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if self.state.status is not Status.RUNNING or isinstance(exc, SagaTakenOver) \
                    or self.taken_over():
                return  # ended already, or another process drives it now
            if exc is None:
                self.commit()
            else:
                self.abort(f"{type(exc).__name__}: {exc}")
        finally:
            if self._span is not None:
                self._span.end(str(self.state.status))

    def call(self, tool: str, args: Mapping[str, Any] | None = None, *,
             tool_call_id: str | None = None, idempotency_key: str | None = None,
             timeout: float | None = None) -> dict[str, Any]:
        """Run one tool call as the saga's next step and return its result.

        Raises :class:`~saga_store.tools.InvalidToolCall` for arguments the agent
        can repair (nothing is written); the second invalid call aborts the saga
        (:class:`SagaAborted`). A failed step raises :class:`StepError`, an
        unknown outcome :class:`StepInDoubt`; either way the saga unwinds.
        """
        if tool_call_id is not None:
            check_id(tool_call_id, "tool_call_id")
            if any(st.tool_call_id == tool_call_id for st in self.state.steps.values()):
                return self._replay(tool, {} if args is None else args, tool_call_id, timeout)
        if self.state.status is not Status.RUNNING:
            raise SagaAborted(f"saga {self.saga_id} is {self.state.status}; start a new saga")
        spec, validated = self._validate(tool, {} if args is None else args)
        salt = self.store.secrets.salt(self.saga_id) if spec.secret else b""
        logged, secret_values = self.store.secrets.redact(validated, spec.secret, salt)
        key = explicit_key(idempotency_key) if idempotency_key else \
            step_key(self.saga_id, spec.name, logged)
        repeated = repeat_of(self.state, key, spec.name, logged)
        if repeated is not None:  # the agent repeated a call: answer from the log
            if self.store.metrics is not None:
                self.store.metrics.dedupe_hits.labels("repeated_call").inc()
            return self._answer(repeated, timeout or spec.timeout + 30)
        n = self.state.next_step
        wait = timeout or spec.timeout + 30
        if not idempotency_key:
            item = intent(self.saga_id, n, spec, logged, tool_call_id, key)
            return self._answer(self._append_intent(n, item[1], secret_values), wait)
        digest = args_digest(spec.name, validated, spec.secret,
                             self.store.settings.hmac_key)
        claim = self.store.dedupe.claim(self.state.agent_id, key, digest, self.saga_id, n)
        if claim.status == "exists":
            claim = self._take_over(key, digest, claim, n)
            if claim.status == "exists":
                return self._elsewhere(claim, key, wait)
        fault("after_claim")  # a client killed here leaves a claim with no step
        # an explicit key: the worker updates the key's record
        item = intent(self.saga_id, n, spec, logged, tool_call_id, key, keyed=True)
        try:
            step = self._append_intent(n, item[1], secret_values)
        except (SagaAborted, InvalidInput):
            # refused, so certainly not logged: no step can ever run under this claim.
            # Any other failure (a connection lost with the reply) may have logged it:
            # the claim stays, and the log settles it (see claim_fate)
            self.store.dedupe.release(self.state.agent_id, key, digest, self.saga_id, n)
            raise
        return self._answer(step, wait)

    def _replay(self, tool: str, args: Mapping[str, Any], tool_call_id: str,
                timeout: float | None) -> dict[str, Any]:
        """A call the log already has (same ``tool_call_id``): its logged outcome, never
        a second run. A call that succeeded and was rolled back since raises
        :class:`StepRolledBack`; one the saga is unwinding waits for its undo."""
        spec = self.store.registry.get(tool)
        validated = spec.validate(args, self.store.settings.max_depth)
        n = logged_call(self.state, tool_call_id, spec.name, validated, spec.secret)
        assert n is not None
        if self.store.metrics is not None:
            self.store.metrics.dedupe_hits.labels("repeated_call").inc()
        wait = timeout or spec.timeout + 30
        st = self.state.steps[n]
        if not st.finished or st.status is not StepStatus.SUCCEEDED:
            return self._answer(n, wait)  # waits for its outcome; a failure raises
        if self.state.status not in (Status.RUNNING, Status.COMMITTED):
            # unwinding: wait until the unwind settled this step (or the saga)
            self.store.follow(self.state, lambda s: s.final or s.status is Status.STUCK
                              or s.steps[n].compensation in UNDONE, wait)
            if st.compensation in UNDONE:
                raise StepRolledBack(
                    f"{st.tool} (tool_call_id {tool_call_id}) ran as step {n} of saga "
                    f"{self.saga_id} and was rolled back since; it is not run again. "
                    "Start a new saga to do it again", data=st.compensation_result)
        return dict(st.result or {})

    def _take_over(self, key: str, digest: str, claim: Any, n: int) -> Any:
        """Take over a pending claim of the key that can never become a step (its
        saga was aborted, or its client died and the saga was swept); otherwise
        ``claim`` as it was."""
        if claim.state != "pending":
            return claim
        if claim.saga_id == self.saga_id:  # ours, from a call whose reply was lost
            self._catch_up()
            if claim_fate(self.state, key)[0] == "pending":
                return Claim("new")  # not in our log: this saga's one driver calls again
            return claim
        return self.store.dedupe.take_over(self.state.agent_id, key, digest, self.saga_id, n,
                                           claim, self.store.events.state)

    def _validate(self, tool: str, args: Any) -> tuple[ToolSpec, dict[str, Any]]:
        try:
            spec = self.store.registry.get(tool)
            return spec, spec.validate(args, self.store.settings.max_depth)
        except InvalidInput as exc:
            self.invalid_calls += 1
            if self.invalid_calls >= self.store.invalid_call_limit:
                self.abort(f"{self.invalid_calls} invalid tool calls: {exc}")
                raise SagaAborted(f"saga {self.saga_id} aborted after {self.invalid_calls} "
                                  f"invalid calls; last: {exc}") from exc
            raise

    def _append_intent(self, n: int, fields: dict[str, Any],
                       secret_values: Mapping[str, Any]) -> int:
        """Log the intent as the next step (its number moves if someone else wrote
        first) and queue its job; returns the step it became."""
        self._sync_head()
        while True:
            trip = self.store.trip()
            pipe = trip.log
            schedule(pipe, self.store.events.keys, self.saga_id, 2 * self.store.settings.lease_ms)
            # the secret values go with the intent: a lost race leaves none behind
            side = self.store.secrets.writes(self.saga_id, {n: secret_values}) \
                if secret_values else []
            side += self.store.driver_lease(self.saga_id)  # a call renews the client lease
            side.append(self._guard())
            call = self.writer.prepare([(K.STEP_INTENT, fields)], phase=Phase.FORWARD,
                                       side=side)
            queued = call.queue(pipe)
            # the job goes in the same round trip: if the append loses, the worker
            # finds no intent at that seq and drops the job. Run inline, there is
            # none: this process runs the step next (if it dies first, the sweeper
            # queues it from the log)
            if self.inline is None:
                enqueue_step(trip.queue, self.store.queue, self.saga_id, n,
                             self.writer.head.seq + 1, fields["idem_key"], fields["tool"])
            replies = trip.execute(raise_on_error=False)
            try:
                self.writer.applied(call, queued(replies))
                self._renewed = time.monotonic()
                self.state.apply({**fields, "kind": K.STEP_INTENT, "seq": self.writer.head.seq})
                self.state.head_hash = self.writer.head.hash
                return n
            except FencedOff as exc:
                self._catch_up()
                self._refuse_if_taken(exc)
                raise SagaAborted(f"saga {self.saga_id} is unwinding; no more calls") from None
            except ConflictError:
                self._catch_up()  # someone else wrote: re-read, then decide again
                if self.state.status is not Status.RUNNING:
                    raise SagaAborted(f"saga {self.saga_id} is {self.state.status}") from None
                fields["step"] = n = self.state.next_step

    def _guard(self) -> SideWrite:
        """No append once another process attached: its generation's key exists."""
        return SideWrite("absent", self.store.taken_key(self.saga_id, self.holder + 1))

    def _refuse_if_taken(self, exc: FencedOff) -> None:
        if exc.reason is Fence.GUARD:
            raise SagaTakenOver(
                f"saga {self.saga_id} was attached by another process, which drives it now; "
                f"this handle is fenced off. Call store.attach({self.saga_id!r}) to drive it "
                "from here again") from None

    def taken_over(self) -> bool:
        """Whether another process attached this saga since this handle got it."""
        return bool(self.store.redis.exists(self.store.taken_key(self.saga_id, self.holder + 1)))

    def _sync_head(self) -> None:
        """Writers append to this saga too (its steps' workers): use the newest head
        seen while following the stream, so the next append does not lose the CAS."""
        if self.state.seq > self.writer.head.seq and self.state.head_hash:
            self.writer.head = Head(self.state.seq, self.state.head_hash)

    def _catch_up(self) -> None:
        for ev in self.store.events.log.bodies(self.saga_id, self.state.seq + 1):
            self.state.apply(ev)
        self.writer.head = self.store.events.log.head(self.saga_id)
        if self.writer.head.seq == self.state.seq:
            self.state.head_hash = self.writer.head.hash
        else:  # appended to meanwhile: the next read links from the log, not from here
            self.state.head_hash = b""

    def keepalive(self) -> bool:
        """Renew the client lease without making a call: for a caller that thinks
        (or waits on a person) longer than ``SAGA_CLIENT_LEASE_S`` between calls.
        False if it had lapsed already (it is not brought back: the next call
        renews it, unless the sweeper has aborted the saga meanwhile)."""
        held = self.store.redis.set(self.store.events.keys.driver(self.saga_id), "1",
                                    px=self.store.client_lease_ms, xx=True)
        self._renewed = time.monotonic()
        return bool(held)

    def park(self, seconds: float) -> None:
        """Suspend the client lease while the run waits for a person (a framework's
        approval interruption): the lease lasts ``seconds``, the approval's own
        deadline, instead of ``SAGA_CLIENT_LEASE_S``; the decision may come from
        another process (``store.attach``), which takes the lease back."""
        self.store.redis.set(self.store.events.keys.driver(self.saga_id), "1",
                             px=max(1, int(seconds * 1000)))
        self._renewed = time.monotonic()

    def _renew_now_and_then(self) -> None:
        """While waiting on a step: renew the client lease once a third of it passed."""
        if time.monotonic() - self._renewed > self.store.settings.client_lease_s / 3:
            self.keepalive()

    def _run_here(self, n: int) -> None:
        """Inline: run step ``n`` in this process, by the workers' step driver (which
        also unwinds the saga here if the step fails)."""
        st = self.state.steps[n]
        self.inline.steps.run(self.saga_id, n, st.intent_seq)

    def _tick(self, n: int) -> Any:
        """While waiting on step ``n``: renew the client lease; inline, also run the
        step once its approval was decided (a person, elsewhere, decided it)."""
        def tick() -> None:
            self._renew_now_and_then()
            st = self.state.steps.get(n)
            if self.inline is not None and st is not None and not st.finished \
                    and st.approval in (Approval.GRANTED, Approval.DENIED):
                self._run_here(n)
        return tick

    def _answer(self, n: int, timeout: float) -> dict[str, Any]:
        if self.inline is not None and not self.state.steps[n].finished:
            self._run_here(n)
        st = self.store.follow(self.state, lambda s: s.steps[n].finished, timeout,
                               self._tick(n)).steps[n]
        if st.status is StepStatus.SUCCEEDED:
            return dict(st.result or {})
        if st.status is StepStatus.IN_DOUBT:
            raise StepInDoubt(f"step {n} ({st.tool}) is in doubt: {st.error}; "
                              "the saga is being unwound", data=st.error)
        raise StepError(f"step {n} ({st.tool}) failed: {st.error}; the saga is being unwound",
                        data=st.error)

    def _elsewhere(self, claim: Any, key: str, timeout: float) -> dict[str, Any]:
        """An explicit key already used by another call: the same answer."""
        if claim.state == OutcomeKind.SUCCEEDED:
            return dict(claim.result or {})
        other = self.store.events.state(claim.saga_id)
        _, step = claim_fate(other, key)
        if step is None:
            raise StepPending("that idempotency key is in progress; try again shortly")
        sub = self.store.follow(other, lambda s: s.steps[step].finished, timeout)
        st = sub.steps[step]
        if st.status is StepStatus.SUCCEEDED:
            return dict(st.result or {})
        raise StepError(f"the call with that idempotency key ended {st.status}: {st.error}")

    def commit(self) -> None:
        blocker = commit_blocker(self.state)
        if blocker is not None:
            raise InvalidInput(f"cannot commit: {blocker}")
        self._sync_head()
        for _ in range(20):
            try:
                self.writer.append_many([build.saga_committed()], phase=Phase.FORWARD,
                                        side=[self._guard()])
                break
            except FencedOff as exc:
                self._catch_up()
                self._refuse_if_taken(exc)
                raise SagaAborted(f"saga {self.saga_id} is {self.state.status}; "
                                  "it can't commit") from None
            except ConflictError:
                self._catch_up()  # e.g. a duplicate delivery noted itself; decide again
                if commit_blocker(self.state) is not None:
                    raise SagaAborted(f"saga {self.saga_id} changed while committing") from None
        self.state.status = Status.COMMITTED
        project(self.store.events, self.saga_id)
        self.store.redis.zrem(self.store.events.keys.active(self.saga_id), self.saga_id)

    def abort(self, reason: str = "aborted by the caller") -> None:
        """Stop going forward and unwind what ran (compensations, in reverse order);
        inline, the unwind runs here before this returns."""
        if self.taken_over():
            self._refuse_if_taken(FencedOff("taken over", Fence.GUARD))
        if self.store.abort(self.saga_id, reason, queue=self.inline is None):
            self.state.status = Status.COMPENSATING
            if self.inline is not None:
                self.inline.unwinds.run(self.saga_id)


class AsyncSaga:
    """``async with store.asaga(agent_id=...) as saga: await saga.call(...)``.

    The blocking parts run in a worker thread, so an event loop is never stalled.
    """

    def __init__(self, store: SagaStore, agent_id: str, kwargs: dict[str, Any],
                 saga: Saga | None = None) -> None:
        self._store, self._agent_id, self._kwargs = store, agent_id, kwargs
        self.saga: Saga | None = saga  # given: an attached saga, entered already

    async def __aenter__(self) -> Self:
        if self.saga is None:
            self.saga = await asyncio.to_thread(self._store.saga, self._agent_id,
                                                **self._kwargs)
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

    async def keepalive(self) -> bool:
        assert self.saga is not None
        return await asyncio.to_thread(self.saga.keepalive)

    async def abort(self, reason: str = "aborted by the caller") -> None:
        assert self.saga is not None
        await asyncio.to_thread(self.saga.abort, reason)
