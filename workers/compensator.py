"""The compensator: unwinds a failed saga, LIFO, from static declarations.

It takes the saga's lease, folds the log and walks the steps from the last
to the first. A step that never started is marked failed (it never will); a
started step with no outcome is in doubt; an in-doubt step is first settled
by the tool's probe when one is declared. A completed compensable step gets
``compensation_intent``, its compensation (arguments from the static mapping
only, its own idempotency key derived from the step's), then
``compensation_succeeded``. An irreversible step gets
``step_not_compensable`` and the saga ends ``needs_attention``. A
compensation that keeps failing is retried with backoff and jitter, then the
saga is ``stuck`` until ``saga resume``. Every append carries the lease
token, so a compensator that lost its lease can write nothing; after a crash
the next one resumes from the log and never repeats a finished compensation.
"""

from __future__ import annotations

import logging
import os
import random
import time
from typing import Any

from saga_store import keys, notify
from saga_store.client import SagaStore
from saga_store.context import project, tell
from saga_store.errors import ConflictError, FencedOff, InvalidInput
from saga_store.events import EventKind as K
from saga_store.idempotency import compensation_key
from saga_store.log import Lease, release_lease
from saga_store.pipeline import execute, lean
from saga_store.state import SagaState, Status, StepState, fold, unwind_order
from saga_store.store import ChainWriter
from saga_store.tools import Reversibility, StepContext

from .faults import fault
from .invoke import Invoker

log = logging.getLogger("saga_store.compensator")
MAX_REDECIDE = 50


class MappingError(InvalidInput):
    code = "mapping_unresolved"


def run_compensation(store: SagaStore, worker: str, saga_id: str, ack: Any = None) -> str:
    return Compensator(store, worker).run(saga_id, ack)


class Compensator:
    def __init__(self, store: SagaStore, worker: str) -> None:
        self.store, self.worker = store, worker
        self.invoker = Invoker()
        self._released = False

    def run(self, saga_id: str, ack: Any = None) -> str:
        fault("comp_after_dequeue")
        what = self._run(saga_id)
        if ack is not None:
            pipe = lean(self.store.redis)
            ack(pipe)
            pipe.execute()
        return what

    def _run(self, saga_id: str) -> str:
        r, lease_ms = self.store.redis, self.store.settings.lease_ms
        token = f"{self.worker}:comp:{os.urandom(6).hex()}"
        pipe = lean(r)
        pipe.set(keys.saga_lease(saga_id), token, nx=True, px=lease_ms)
        pipe.time()
        got, (secs, micros) = pipe.execute()
        if not got:
            return "busy"  # a step or another compensator holds the saga; swept later
        # should this process die, the sweeper looks as soon as the lease can lapse;
        # the agent's context cursor comes back in the same round trip
        pipe = lean(r)
        pipe.zadd(keys.ACTIVE, {saga_id: secs * 1000 + micros // 1000 + lease_ms + 100})
        _context_of(pipe, saga_id)
        ctx: list[Any] | None = pipe.execute()[1]
        self._released = False
        try:
            for _ in range(MAX_REDECIDE):
                try:
                    return self._unwind(saga_id, token, ctx)
                except ConflictError as exc:
                    if isinstance(exc, FencedOff):
                        return "fenced"
                    ctx = None  # someone appended: re-read and decide again
            return "conflict"
        finally:
            if not self._released:  # the closing append gives it up itself
                release_lease(r, keys.saga_lease(saga_id), token)

    def _unwind(self, saga_id: str, token: str, ctx: list[Any] | None) -> str:
        bodies, head = self.store.store.log.bodies_and_head(saga_id)
        state = fold(saga_id, bodies)
        if state.final or state.status in (Status.RUNNING, Status.STUCK):
            project(self.store.store, saga_id)
            return str(state.status)
        if ctx is None:
            pipe = lean(self.store.redis)
            _context_of(pipe, saga_id)
            ctx = pipe.execute()[0]
        writer = Writer(ChainWriter(self.store.store, saga_id, head), bodies, ctx)
        lease = Lease(token, "acquire", self.store.settings.lease_ms)
        attention: list[str] = []
        for st in unwind_order(state, attention):
            n = st.step
            outcome = self._settle(writer, state, st, lease)
            if outcome is None:
                continue
            if outcome == "irreversible":
                attention.append(f"step {n} ({st.tool})")
                continue
            if not self._compensate(writer, state, st, lease):
                return "stuck"
            if st.compensation == "not_compensable":
                attention.append(f"step {n} ({st.tool})")
        final = K.SAGA_NEEDS_ATTENTION if attention else K.SAGA_COMPENSATED
        data = {"needs_attention": attention} if attention else None
        fault("comp_before_close")
        writer.append_many([(final, {"data": data})], lease=Lease(token, "release"))
        self._released = True
        metrics = self.store.metrics
        if metrics is not None:
            metrics.sagas_finished.labels("needs_attention" if attention else "compensated").inc()
            if state.failed_ts:
                metrics.compensation_lag.observe(max(0.0, time.time() - state.failed_ts / 1000))
        pipe = lean(self.store.redis)
        writer.tell(pipe)  # the saga's close, before it leaves ss:active: the sweeper's cue
        settle = writer.chain.close_on(pipe)  # the ledger's closing entry, in the same trip
        if attention:
            pipe.sadd(keys.NEEDS_ATTENTION, saga_id)
        pipe.zrem(keys.ACTIVE, saga_id)
        pipe.pexpire(keys.saga_secrets(saga_id), 0)
        execute(pipe, settle)
        notify.needs_attention(saga_id, state.agent_id, attention)
        return "compensated" if not attention else "needs_attention"

    def _settle(self, writer: Writer, state: SagaState, st: StepState,
                lease: Lease) -> str | None:
        """Bring a step to a known outcome; None if there is nothing to undo."""
        n = st.step
        if st.status == "intent":
            writer.append(K.STEP_FAILED, step=n, lease=lease,
                          data={"error": "cancelled: the saga unwound before it started"})
            st.status = "failed"
            return None
        if st.status == "started":
            writer.append(K.STEP_IN_DOUBT, step=n, lease=lease, data={
                "error": "its worker stopped before recording an outcome; unknown if it ran"})
            st.status = "in_doubt"
        if st.status in ("failed", "suppressed") or st.reversibility == "readonly":
            return None
        try:
            spec = self.store.registry.get(st.tool or "")
        except InvalidInput:
            spec = None
        if st.status == "in_doubt" and spec is not None and spec.probe:
            happened = self._probe(spec.probe, state, st)
            if happened is False:
                writer.append(K.STEP_FAILED, step=n, lease=lease,
                              data={"error": "did not happen (probe)", "resolved_by": "probe"})
                st.status = "failed"
                return None
            if isinstance(happened, dict):
                writer.append(K.STEP_SUCCEEDED, step=n, lease=lease,
                              data={"result": happened, "resolved_by": "probe"})
                st.status, st.result = "succeeded", happened
        if spec is None or spec.reversibility is not Reversibility.COMPENSABLE:
            why = "tool is not registered here" if spec is None else f"tool is {spec.reversibility}"
            writer.append(K.STEP_NOT_COMPENSABLE, step=n, lease=lease, data={"reason": why})
            st.compensation = "not_compensable"
            return "irreversible"
        return "compensable"

    def _compensate(self, writer: Writer, state: SagaState, st: StepState,
                    lease: Lease) -> bool:
        """Run the step's compensation until it succeeds or its retries run out."""
        spec = self.store.registry.get(st.tool or "")
        comp = self.store.registry.get(spec.compensation or "")
        attempt = st.compensation_attempts
        try:
            args = resolve_mapping(spec.mapping, st.args or {}, st.result,
                                   in_doubt=st.status == "in_doubt")
        except MappingError as exc:
            if st.status == "in_doubt":  # no result to map from: a human decides
                writer.append(K.STEP_NOT_COMPENSABLE, step=st.step, lease=lease,
                              data={"reason": str(exc)})
                st.compensation = "not_compensable"
                return True
            writer.append_many([
                (K.COMPENSATION_INTENT, {"step": st.step, "tool": comp.name,
                                         "attempt": attempt + 1}),
                (K.COMPENSATION_FAILED, {"step": st.step, "data": {"error": str(exc)}}),
                (K.SAGA_STUCK, {"data": {"step": st.step, "error": str(exc)}})], lease=lease)
            return False
        while True:
            attempt += 1
            key = compensation_key(st.idem_key or f"{state.saga_id}/{st.step}")
            writer.append(K.COMPENSATION_INTENT, step=st.step, tool=comp.name, attempt=attempt,
                          idem_key=key, data={"args": args}, lease=lease)
            fault("comp_after_intent")
            ctx = StepContext(key, state.saga_id, st.step, attempt, st.tool_call_id,
                              state.agent_id)
            outcome = self.invoker.invoke(comp, args, ctx)
            fault("comp_after_tool")
            if outcome.kind == "succeeded":
                writer.append(K.COMPENSATION_SUCCEEDED, step=st.step, lease=lease,
                              tool=comp.name, tool_call_id=st.tool_call_id,
                              data={"result": outcome.result, "undid": st.tool})
                self._count(comp.name, outcome.kind)
                fault("comp_after_outcome")  # its retraction rides on the next append
                st.compensation, st.compensation_result = "succeeded", outcome.result
                return True
            writer.append(K.COMPENSATION_FAILED, step=st.step, lease=lease,
                          data={"error": outcome.error, "attempt": attempt})
            self._count(comp.name, outcome.kind)
            if attempt - st.resume_base >= comp.retry.max_attempts:
                writer.append(K.SAGA_STUCK, lease=lease, data={
                    "step": st.step, "error": outcome.error,
                    "hint": "fix the cause, then run 'saga resume SAGA_ID'"})
                return False
            delay = comp.retry.backoff(attempt)
            time.sleep(delay * (0.5 + random.random()))  # jitter: retries don't march in step

    def _count(self, tool: str, kind: str) -> None:
        """Count a compensation once its outcome is in the log, never before: a
        process killed in between leaves the counter behind the log, not ahead."""
        if self.store.metrics is not None:
            self.store.metrics.compensations.labels(tool, kind).inc()

    def _probe(self, probe: str, state: SagaState, st: StepState) -> Any:
        """Ask the probe tool whether the in-doubt call happened: it gets the step's
        arguments and idempotency key and returns a result dict (it happened),
        ``{"happened": false}`` (it did not), or raises (still unknown)."""
        spec = self.store.registry.get(probe)
        args = {k: v for k, v in (st.args or {}).items() if k in spec.params}
        ctx = StepContext(st.idem_key or "", state.saga_id, st.step, 1, st.tool_call_id,
                          state.agent_id)
        outcome = self.invoker.invoke(spec, args, ctx)
        if outcome.kind != "succeeded" or outcome.result is None:
            return None
        if outcome.result.get("happened") is False:
            return False
        return outcome.result


class Writer:
    """The compensator's appends, each over one lean pipeline. The context events of
    what is already in the log past the agent's cursor (a retraction, a close) ride
    on the next append's round trip instead of costing three of their own."""

    def __init__(self, chain: ChainWriter, known: list[dict[str, Any]],
                 ctx: list[Any]) -> None:
        self.chain, self.known = chain, known  # known: every event, in seq order
        cur, agent, conv = ctx
        self.cursor = int(cur) if cur is not None else -1
        self.agent = agent.decode() if agent else None
        self.conversation = conv.decode() if conv else None

    def append(self, kind: str, *, lease: Lease | None = None, **fields: Any) -> None:
        self.append_many([(kind, fields)], lease=lease)

    def append_many(self, items: list[tuple[str, dict[str, Any]]], *,
                    lease: Lease | None = None) -> None:
        # the closer settles the ledger entry itself, in its last round trip
        self.known += self.chain.append_riding(items, self.tell, lease=lease, ledger=False)

    def tell(self, pipe: Any) -> None:
        """Queue the context events past the cursor on ``pipe``, and move the cursor."""
        later = [e for e in self.known if e["seq"] > self.cursor]
        if self.agent is None or not later:
            return
        tell(pipe, self.chain.saga_id, self.agent, self.conversation, later)
        self.cursor = later[-1]["seq"]


def _context_of(pipe: Any, saga_id: str) -> None:
    pipe.hmget(keys.saga_meta(saga_id), "ctx_seq", "agent_id", "conversation_id")


def resolve_mapping(mapping: dict[str, str] | Any, args: dict[str, Any], result: Any, *,
                    in_doubt: bool = False) -> dict[str, Any]:
    """Compensation arguments from ``$.input.x`` / ``$.output.y`` paths only."""
    out: dict[str, Any] = {}
    for target, source in mapping.items():
        root, *path = source.split(".")[1:]
        value: Any = args if root == "input" else result
        for part in path:
            if not isinstance(value, dict) or part not in value:
                why = "the step's outcome is unknown" if root == "output" and in_doubt \
                    else "the field is missing"
                raise MappingError(f"mapping {target} <- {source} did not resolve: {why}")
            value = value[part]
        out[target] = value
    return out
