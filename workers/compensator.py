"""The compensator: the workers' driver of the unwind.

What to do next is decided by :mod:`saga_store.protocol.unwind` from the
folded log, and asked for by the one unwind loop the MCP gateway drives too
(:mod:`saga_store.protocol.unwinding`); this module does the I/O around it: it
takes the saga's lease, reads the log, runs the probes and compensations the
loop yields through the registry, appends the events it yields, waits out its
back-offs with the lease kept, and closes the saga. Every append
carries the lease token, so a compensator that lost its lease can write
nothing; after a crash the next one resumes from the log and never repeats a
finished compensation (they have their own keys anyway).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from saga_store.approval import notify
from saga_store.client.api import SagaStore
from saga_store.client.context import project, tell
from saga_store.errors import ConflictError, FencedOff, InvalidInput
from saga_store.execution.enqueue import schedule, unschedule
from saga_store.faults import fault
from saga_store.keys import SagaKeys
from saga_store.log.pipeline import answered, lean
from saga_store.log.store import ChainWriter
from saga_store.log.stream import Lease, release_lease
from saga_store.ops import tracing
from saga_store.protocol import unwind, unwinding
from saga_store.protocol.build import Item
from saga_store.protocol.outcome import Outcome
from saga_store.protocol.state import SagaState, StepState, fold
from saga_store.protocol.vocab import LeaseMode, Reversibility
from saga_store.tools.registry import Registry
from saga_store.tools.spec import StepContext, ToolSpec
from saga_store.verify.checker import read_verified

from .invoke import Call, Invoker, Pause, Send, Work, drive
from .lease import HandBack, Hold, LeaseLost

log = logging.getLogger("saga_store.compensator")
MAX_REDECIDE = 50


def run_compensation(store: SagaStore, worker: str, saga_id: str, ack: Any = None,
                     invoker: Invoker | None = None) -> str:
    """One delivery of a saga's unwind, run on this thread; ``invoker`` runs its
    tools."""
    return Compensator(store, worker, invoker).run(saga_id, ack)


class RegistryCatalogue:
    """What the unwind knows of a worker's tools: its registry."""

    resume_hint = "fix the cause, then run 'saga resume SAGA_ID'"

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def spec(self, name: str | None) -> ToolSpec | None:
        try:
            return self.registry.get(name or "")
        except InvalidInput:
            return None

    def undo_of(self, st: StepState) -> unwind.Undo | str:
        spec = self.spec(st.tool)
        if spec is None:
            return "tool is not registered here"
        if spec.reversibility is not Reversibility.COMPENSABLE or not spec.compensation:
            return f"tool is {spec.reversibility}"
        comp = self.registry.get(spec.compensation)
        return unwind.Undo(comp.name, spec.mapping, comp.retry.max_attempts, comp.retry.backoff)

    def probe_of(self, st: StepState) -> unwind.Probing | None:
        """The step's probe, given each of its parameters the step has (an in-doubt
        call is looked up by what it was asked)."""
        spec = self.spec(st.tool)
        probe = self.spec(spec.probe) if spec is not None and spec.probe else None
        if probe is None:
            return None
        given = st.args or {}
        return unwind.Probing(probe.name, {p: f"$.input.{p}" for p in probe.params
                                           if p in given})


class Compensator:
    def __init__(self, store: SagaStore, worker: str, invoker: Invoker | None = None) -> None:
        self.store, self.worker = store, worker
        self.invoker = invoker or Invoker()
        self.tools = RegistryCatalogue(store.registry)
        self._released = False

    def run(self, saga_id: str, ack: Any = None) -> str:
        return drive(self.work(saga_id, ack), self.invoker)

    def work(self, saga_id: str, ack: Any = None) -> Work[str]:
        """:meth:`run` as work that yields its tool calls and back-offs (see
        :mod:`.invoke`)."""
        fault("comp_after_dequeue")
        what = yield from self._run(saga_id)
        if ack is not None:
            pipe = lean(self.store.queues)
            ack(pipe)
            pipe.execute()
        return what

    def _run(self, saga_id: str) -> Work[str]:
        r, lease_ms = self.store.redis, self.store.settings.lease_ms
        token = f"{self.worker}:comp:{os.urandom(6).hex()}"
        pipe = lean(r)
        pipe.set(self.store.events.keys.lease(saga_id), token, nx=True, px=lease_ms)
        [got] = answered((yield Send(pipe)))
        if not got:
            return "busy"  # a step or another compensator holds the saga; swept later
        # should this process die, the sweeper looks as soon as the lease can lapse;
        # the agent's context cursor comes back in the same round trip
        pipe = lean(r)
        schedule(pipe, self.store.events.keys, saga_id, lease_ms + 100)
        _context_of(pipe, self.store.events.keys, saga_id)
        ctx: list[Any] | None = answered((yield Send(pipe)))[-1]
        self._released = False
        try:
            for _ in range(MAX_REDECIDE):
                try:
                    return (yield from self._unwind(saga_id, token, ctx))
                except (FencedOff, LeaseLost):
                    return "fenced"
                except ConflictError:
                    ctx = None  # someone appended: re-read and decide again
                except HandBack:
                    # asked to stop between two tries: the lease is given up below and
                    # the sweeper hands the unwind to another worker
                    log.info("saga %s: unwind handed back between two tries", saga_id)
                    return "handed back"
            return "conflict"
        finally:
            if not self._released:  # the closing append gives it up itself
                release_lease(r, self.store.events.keys.lease(saga_id), token)

    def _unwind(self, saga_id: str, token: str, ctx: list[Any] | None) -> Work[str]:
        bodies, head, verdict = read_verified(self.store.events.log, saga_id)
        if not verdict.ok:  # a compensation's arguments come from this log: never forged ones
            log.error("saga %s: its log does not verify (%s at seq %s); nothing is undone "
                      "(run 'saga verify --saga %s')", saga_id, verdict.reason,
                      verdict.first_bad_seq, saga_id)
            if self.store.metrics is not None:
                self.store.metrics.verify_failures.inc()
            return "untrusted"
        state = fold(saga_id, bodies)
        if isinstance(unwind.next_action(state, self.tools), unwind.Done):
            project(self.store.events, saga_id)
            return str(state.status)
        if ctx is None:
            pipe = lean(self.store.redis)
            _context_of(pipe, self.store.events.keys, saga_id)
            ctx = pipe.execute()[0]
        writer = Writer(ChainWriter(self.store.events, saga_id, head), bodies, ctx, state)
        lease = Lease(token, LeaseMode.ACQUIRE, self.store.settings.lease_ms)
        loop = unwinding.unwinding(state, self.tools)
        answer: Any = None
        while True:
            try:
                req = loop.send(answer)
            except StopIteration as stop:
                end: unwind.Close | unwind.Done = stop.value
                break
            answer = yield from self._do(req, writer, state, lease)
        if isinstance(end, unwind.Close):
            return (yield from self._close(writer, state, end, token))
        return str(end.status)

    def _do(self, req: unwinding.Request, writer: Writer, state: SagaState,
            lease: Lease) -> Work[Outcome | None]:
        """One thing the unwind asks for, done on this worker (its lease kept)."""
        if isinstance(req, unwinding.Write):
            yield from writer.append(req.items, lease)
            if self.store.metrics is not None:
                self.store.metrics.count_uncalled_compensations(req.items)
            if req.settles is not None and req.outcome is not None:
                self._count(req.settles.undo.tool, req.outcome)
                if req.outcome.ok:
                    fault("comp_after_outcome")  # its retraction rides on the next append
            return None
        if isinstance(req, unwinding.Wait):
            yield Pause(req.seconds, self._hold(writer, lease))
            return None
        st = state.steps[req.step]
        if isinstance(req, unwind.Probe):
            ctx = StepContext(req.key, state.saga_id, st.step, 1, st.tool_call_id,
                              state.agent_id)
            found: Outcome = yield Call(self.store.registry.get(req.tool), req.args, ctx,
                                        lease=self._hold(writer, lease))
            return found
        return (yield from self._compensate(writer, state, req, lease))

    def _compensate(self, writer: Writer, state: SagaState, act: unwind.Compensate,
                    lease: Lease) -> Work[Outcome]:
        """One try of a compensation, its intent logged: the call, in its span."""
        fault("comp_after_intent")
        st = state.steps[act.step]
        ctx = StepContext(act.key, state.saga_id, act.step, act.attempt, st.tool_call_id,
                          state.agent_id)
        with tracing.tool_span(act.undo.tool, st.tool_call_id, state.saga_id, act.step,
                               parent=st.trace, compensation=True) as span:
            outcome: Outcome = yield Call(self.store.registry.get(act.undo.tool), act.args,
                                          ctx, lease=self._hold(writer, lease))
            tracing.outcome(span, outcome.kind, outcome.error)
        fault("comp_after_tool")
        return outcome

    def _hold(self, writer: Writer, lease: Lease) -> Hold:
        """The saga's lease, kept while a call or a back-off runs (see :mod:`.lease`)."""
        return Hold.of(self.store, writer.chain.saga_id, lease.token, writer.chain.head.seq)

    def _close(self, writer: Writer, state: SagaState, act: unwind.Close,
               token: str) -> Work[str]:
        fault("comp_before_close")
        if act.attention:  # listed before the close is visible: whoever sees it can ack it
            self.store.redis.sadd(self.store.events.keys.needs_attention(state.saga_id),
                                  state.saga_id)
        yield from writer.append([act.item], Lease(token, LeaseMode.RELEASE))
        self._released = True
        fault("comp_after_close")
        ended = "needs_attention" if act.attention else "compensated"
        metrics = self.store.metrics
        if metrics is not None:
            metrics.sagas_finished.labels(ended).inc()
            if state.failed_ts:
                metrics.compensation_lag.observe(max(0.0, time.time() - state.failed_ts / 1000))
        pipe = lean(self.store.redis)
        writer.tell(pipe)  # the saga's close, before it leaves ss:active: the sweeper's cue
        settle = writer.chain.close_on(pipe)  # the ledger's closing entry, in the same trip
        unschedule(pipe, self.store.events.keys, state.saga_id)
        answered((yield Send(pipe)), settle)
        notify.needs_attention(state.saga_id, state.agent_id, act.attention)
        return ended

    def _count(self, tool: str, outcome: Outcome) -> None:
        """Count a compensation once its outcome is in the log, never before: a
        process killed in between leaves the counter behind the log, not ahead."""
        if self.store.metrics is not None:
            self.store.metrics.compensations.labels(tool, str(outcome.kind)).inc()


class Writer:
    """The compensator's appends, each over one lean pipeline, applied to the
    state as they land. The context events of what is already in the log past
    the agent's cursor (a retraction, a close) ride on the next append's round
    trip instead of costing three of their own."""

    def __init__(self, chain: ChainWriter, known: list[dict[str, Any]], ctx: list[Any],
                 state: SagaState) -> None:
        self.chain, self.known, self.state = chain, known, state  # known: every event
        self.cursor = int(ctx[0]) if ctx[0] is not None else -1
        # whose context this is comes from the verified log, never from the cache
        self.agent, self.conversation = state.agent_id, state.conversation_id

    def append(self, items: list[Item], lease: Lease) -> Work[None]:
        if not items:
            return
        # the closer settles the ledger entry itself, in its last round trip
        pipe, done = self.chain.riding(items, self.tell, lease=lease, ledger=False)
        events = done((yield Send(pipe)))
        self.known += events
        for ev in events:
            self.state.apply(ev)

    def tell(self, pipe: Any) -> None:
        """Queue the context events past the cursor on ``pipe``, and move the cursor."""
        later = [e for e in self.known if e["seq"] > self.cursor]
        if self.agent is None or not later:
            return
        tell(pipe, self.chain.store.keys, self.chain.saga_id, self.agent, self.conversation, later)
        self.cursor = later[-1]["seq"]


def _context_of(pipe: Any, names: SagaKeys, saga_id: str) -> None:
    pipe.hmget(names.meta(saga_id), "ctx_seq")
