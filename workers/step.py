"""Running one step: the worker's side of the durable path.

The log decides everything. A delivery (an RQ job carrying saga id, step and
the intent's seq) is checked against the log: a stale job is dropped, a step
that already has an outcome is recorded as a suppressed duplicate, a step
whose earlier attempts never finished is retried with the same idempotency
key, declared in doubt, or dead-lettered, as its policy says. The step is
claimed by appending ``step_started`` while taking the saga's lease (fencing
token, Redis-timed); its outcome is appended while releasing it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from saga_store import keys
from saga_store.approval import notify
from saga_store.approval import requests as approvals
from saga_store.approval.policy import Decision, Policy, Verdict
from saga_store.client.api import SagaStore
from saga_store.client.context import project, tell
from saga_store.errors import ConflictError, FencedOff, InvalidInput, UnknownTool
from saga_store.execution.enqueue import (
    enqueue_compensation,
    enqueue_step,
    intent,
    unschedule,
)
from saga_store.execution.trip import Trip
from saga_store.faults import fault
from saga_store.ids import check_saga_id
from saga_store.keys import SagaKeys
from saga_store.log.events import EventKind as K
from saga_store.log.pipeline import answered, lean
from saga_store.log.store import ChainWriter
from saga_store.log.stream import Head, Lease, body_and_hash
from saga_store.ops import tracing
from saga_store.protocol import build
from saga_store.protocol.build import Item
from saga_store.protocol.delivery import Act, StepView, ToolFacts, on_delivery
from saga_store.protocol.forward import outcome_events
from saga_store.protocol.outcome import Outcome
from saga_store.protocol.vocab import Follow, LeaseMode, OutcomeKind, Phase
from saga_store.tools.spec import StepContext, ToolSpec

from .invoke import Call, Invoker, Send, Work, drive
from .lease import HandBack, Hold, LeaseLost

log = logging.getLogger("saga_store.worker")
_APPROVAL_KINDS = frozenset({K.APPROVAL_REQUESTED, K.APPROVAL_GRANTED, K.APPROVAL_DENIED})
MAX_REDECIDE = 50


@dataclass
class _Continuation:
    """A plan's next step, claimed by this worker in the previous outcome's append."""

    writer: ChainWriter
    step: int
    view: StepView
    token: str
    spec: ToolSpec


class StepRunner:
    def __init__(self, store: SagaStore, worker_name: str,
                 keep_going: Callable[[], bool] = lambda: True,
                 invoker: Invoker | None = None) -> None:
        self.store, self.name = store, worker_name
        self.invoker = invoker or Invoker()
        self.counts: dict[str, int] = {}
        # run a plan's next step here, claimed in the outcome's own append, instead
        # of queueing it for any worker; ``keep_going`` is False once asked to stop
        self.eager = store.settings.eager_steps
        self.keep_going = keep_going
        self._next: _Continuation | None = None
        self._unwind = False  # this worker unwinds the saga it just failed
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def reset(self) -> None:
        """Forget what a delivery left behind (a claimed next step, an unwind due),
        should it have ended by raising before it got to them."""
        self._next = None
        self._unwind = False

    def run(self, saga_id: str, step: int, intent_seq: int, extra: Any = None,
            reads: Any = None) -> str:
        """Handle one delivery; returns what happened (for logs and metrics).
        ``extra(pipe)`` adds the job's acknowledgement to the last round trip;
        ``reads`` are the log reads of :func:`queue_reads`, if already done."""
        return drive(self.work(saga_id, step, intent_seq, extra, reads), self.invoker)

    def work(self, saga_id: str, step: int, intent_seq: int, extra: Any = None,
             reads: Any = None) -> Work[str]:
        """:meth:`run` as work that yields its tool calls (see :mod:`.invoke`)."""
        check_saga_id(saga_id)
        fault("after_dequeue")
        for _ in range(MAX_REDECIDE):
            view = self.read(saga_id, step, intent_seq, reads)
            reads = None
            what = yield from self._decide(saga_id, step, intent_seq, view, extra)
            if what != "conflict":
                break
        else:
            raise ConflictError(f"saga {saga_id} step {step}: the log kept moving under the "
                                "worker")
        self.counts[what] = self.counts.get(what, 0) + 1
        while self._next is not None:  # the plan's next steps, already claimed
            nxt, self._next = self._next, None
            fault("after_started")
            what = yield from self._execute(nxt.writer, saga_id, nxt.step, nxt.view,
                                            nxt.token, None, nxt.spec)
            self.counts[what] = self.counts.get(what, 0) + 1
        if self._unwind:
            self._unwind = False
            from .compensator import Compensator
            self.counts["unwound"] = self.counts.get("unwound", 0) + 1
            yield from Compensator(self.store, self.name, self.invoker).work(saga_id)
        return what

    def read(self, saga_id: str, step: int, intent_seq: int, reads: Any = None) -> StepView:
        if reads is None:
            pipe: Any = lean(self.store.events.log.raw)
            queue_reads(pipe, self.store.events.keys, saga_id, intent_seq)
            reads = pipe.execute()
        rows, first, ctx_seq = reads
        view = StepView(ctx_seq=int(ctx_seq) if ctx_seq is not None else -1)
        for eid, fields in rows:
            body, h = body_and_hash(fields)
            ev = orjson.loads(body)
            view.events.append(ev)
            view.head = Head(keys.seq_of_entry_id(eid), h)
            kind = ev["kind"]
            if ev["seq"] < intent_seq:
                continue  # the event before the intent: read only for the projection
            if ev["seq"] == intent_seq:
                if kind == K.STEP_INTENT and ev.get("step") == step:
                    view.intent = ev
                continue
            if kind in (K.SAGA_FAILED, K.COMPENSATION_INTENT, K.STEP_NOT_COMPENSABLE):
                view.unwinding = True
            if ev.get("step") != step:
                continue
            if kind == K.STEP_STARTED:
                view.started += 1
            elif kind == K.STEP_RELEASED:
                view.released += 1
            elif kind in _APPROVAL_KINDS:
                view.approval = (kind, ev.get("data"))
            elif kind in (K.STEP_SUCCEEDED, K.STEP_FAILED, K.STEP_IN_DOUBT):
                view.outcome = ev
        if first:
            started = orjson.loads(body_and_hash(first[0][1])[0])
            view.agent_id = started.get("agent_id")
            view.conversation_id = (started.get("data") or {}).get("conversation_id")
            plan = (started.get("data") or {}).get("plan")
            view.plan = plan if isinstance(plan, list) else None
        if view.intent is not None and not self._links_hold(saga_id, rows, first):
            log.error("saga %s: its log does not verify where step %d was read (forged, or "
                      "written with another SAGA_HMAC_KEY than this worker's); the step is "
                      "not run (run 'saga verify --saga %s')", saga_id, step, saga_id)
            if self.store.metrics is not None:
                self.store.metrics.verify_failures.inc()
            view.intent = None  # a forged intent or plan never drives a tool
        return view

    def _links_hold(self, saga_id: str, rows: list[Any], first: list[Any]) -> bool:
        """Whether the entries read link up under this worker's chain key: each row
        from the second on to the one before it, the saga's first event (its plan) to
        the genesis. Someone who can write Redis but lacks the HMAC key cannot make
        them link, so what the step does comes from the saga's own chain."""
        chain = self.store.events.log.chain
        genesis = chain.genesis(saga_id)
        if first:
            body, h = body_and_hash(first[0][1])
            if chain.link(genesis, body) != h:
                return False
        prev = None
        for eid, fields in rows:
            if keys.seq_of_entry_id(eid) == 0:
                prev = genesis
            body, h = body_and_hash(fields)
            if prev is not None and chain.link(prev, body) != h:
                return False
            prev = h
        return True

    def _decide(self, saga_id: str, step: int, intent_seq: int, view: StepView,
                extra: Any) -> Work[str]:
        writer = ChainWriter(self.store.events, saga_id, view.head)
        spec, unknown = self._spec(view)
        facts = None if spec is None else ToolFacts(
            spec.retry.max_deliveries, spec.after_crash != "in_doubt",
            lambda: _verdict(self.store.policy, spec, (view.intent or {})["data"]["args"]))
        decided = on_delivery(view, facts, unknown)
        metrics = self.store.metrics
        if decided.act in (Act.STALE, Act.CANCELLED, Act.AWAIT):
            self._ack(extra)
            return str(decided.act)
        if decided.act is Act.DUPLICATE:
            assert view.outcome is not None
            if metrics is not None:
                metrics.dedupe_hits.labels("duplicate_delivery").inc()
            # a note only, and refused by the append script once the saga is closed
            with contextlib.suppress(ConflictError):
                writer.append_many([build.duplicate_suppressed(step, view.outcome["kind"])])
            self._ack(extra)
            return "duplicate"
        token = f"{self.name}:{os.urandom(6).hex()}"
        ttl = self.store.settings.lease_ms + (int(spec.timeout * 1000) if spec else 0)
        if decided.act is Act.FAIL:
            assert decided.outcome is not None
            return (yield from self._finish(writer, saga_id, step, view, token, extra,
                                            decided.outcome, spec, acquire=ttl))
        assert spec is not None
        if decided.act is Act.GATE:
            assert decided.verdict is not None
            return self._request_approval(writer, saga_id, step, view, spec, decided.verdict,
                                          extra)
        data: dict[str, Any] = {"worker": self.name}
        if view.started - view.released:
            data["after_unfinished_attempts"] = view.started - view.released
        if view.released:
            data["after_released"] = view.released
        call = writer.prepare([build.step_started(step, view.started + 1, **data)],
                              lease=Lease(token, LeaseMode.ACQUIRE, ttl), phase=Phase.FORWARD)
        pipe = lean(self.store.redis)
        queued = call.queue(pipe)
        # events already in the log (the previous step's outcome, say) ride along
        caught_up = self._project_known(pipe, saga_id, view, view.events)
        try:
            writer.applied(call, queued((yield Send(pipe))))
        except FencedOff as exc:
            if exc.lease_lost:  # another worker is running it: this copy is a duplicate
                return self._busy(writer, step, extra)
            self._ack(extra)
            return "busy"
        except ConflictError:
            return "conflict"
        view.events.append({"kind": K.STEP_STARTED, "seq": writer.head.seq, "step": step})
        if not caught_up:
            project(self.store.events, saga_id)
        view.ctx_seq = writer.head.seq  # step_started has no projection of its own
        fault("after_started")
        return (yield from self._execute(writer, saga_id, step, view, token, extra, spec))

    def _execute(self, writer: ChainWriter, saga_id: str, step: int, view: StepView,
                 token: str, extra: Any, spec: ToolSpec) -> Work[str]:
        """Call the tool of a started step (this worker holds the lease), then record
        the outcome."""
        assert view.intent is not None
        metrics = self.store.metrics
        args = self.store.secrets.restore(saga_id, step, view.intent["data"]["args"])
        ctx = StepContext(view.intent["idem_key"], saga_id, step, view.started + 1,
                          view.intent.get("tool_call_id"), view.agent_id)
        secrets = {k: args[k] for k in spec.secret if k in args}
        began = time.perf_counter()
        data = view.intent["data"]
        with tracing.tool_span(spec.name, ctx.tool_call_id, saga_id, step,
                               parent=data.get("trace")) as span:
            hold = Hold.of(self.store, saga_id, token, writer.head.seq)
            try:
                outcome = yield Call(spec, args, ctx, secrets, hold)
            except InvalidInput as exc:  # the logged args no longer fit the tool
                outcome = Outcome.failed(str(exc))
            except LeaseLost:
                # another worker has the step now (this one stalled past its lease):
                # it decides; nothing is appended from here
                log.warning("saga %s step %d: its lease went to another worker between "
                            "two tries; no further try runs here", saga_id, step)
                self._ack(extra)
                return "fenced"
            except HandBack as exc:
                return (yield from self._hand_back(writer, saga_id, step, view, token, extra,
                                                   str(exc)))
            tracing.outcome(span, outcome.kind, outcome.error)
        if metrics is not None:
            self._child(metrics.step_seconds, spec.name).observe(time.perf_counter() - began)
        return (yield from self._finish(writer, saga_id, step, view, token, extra, outcome,
                                        spec, hold=hold))

    def _finish(self, writer: ChainWriter, saga_id: str, step: int, view: StepView,
                token: str, extra: Any, outcome: Outcome, spec: ToolSpec | None,
                acquire: int = 0, hold: Hold | None = None) -> Work[str]:
        """Append the outcome (and what follows from it), releasing the lease, or
        keeping it for the plan's next step when this worker runs that one too.
        ``hold``: the lease the call kept, taken back if it lapsed (a stall longer
        than the lease) while nobody acted on the saga."""
        for _ in range(MAX_REDECIDE):
            items, follow = self._outcome_events(saga_id, step, view, outcome)
            if follow is Follow.COMPENSATE and self.eager and self.keep_going():
                follow = Follow.UNWIND  # by this worker, right after the append (not queued)
            lease = Lease(token, LeaseMode.ACQUIRE, acquire) if acquire else \
                Lease(token, LeaseMode.RELEASE)
            claim = None if acquire else self._claimable(step, view, follow)
            if claim is not None:
                follow = Follow.EAGER
                items.append(build.step_started(step + 1, 1, worker=self.name))
                lease = Lease(token, LeaseMode.ACQUIRE, claim[1])
            try:
                call = writer.prepare(items, lease=lease)
            except InvalidInput as exc:
                if outcome.kind is not OutcomeKind.SUCCEEDED:
                    raise
                # the tool returned: its effect happened, though its result is too large
                # (or too odd) to log; the unwind must still deal with it
                outcome = Outcome(OutcomeKind.IN_DOUBT, error=f"the tool returned, but its "
                                  f"result could not be logged ({exc}); its effect is "
                                  "assumed to stand", tries=outcome.tries)
                continue
            fault("after_tool")
            all_in_one = follow in (Follow.NEXT, Follow.EAGER) and not acquire
            if all_in_one:
                # plan: outcome, next job (or the claim of the next step), dedupe record
                # and acknowledgement in one round trip; if the append loses, a queued
                # next job finds no intent at its seq and is dropped. The projection of
                # what this appends rides on the next step's round trip.
                trip = self.store.trip()
                queued = call.queue(trip.log)
                self._after_outcome(trip, saga_id, step, view, outcome, spec, follow, extra,
                                    items, writer.head.seq + len(items))
                if follow is Follow.EAGER:  # events already in the log: safe to project now
                    self._project_known(trip.log, saga_id, view, view.events)
                reply = queued((yield Send(trip)))
            elif not self.store.settings.wait_replicas:
                pipe = lean(self.store.redis)
                queued = call.queue(pipe)
                reply = queued((yield Send(pipe)))
            else:
                reply = None
            try:
                writer.applied(call, reply if reply is not None
                               else call.send(self.store.redis), ledger=False)
            except FencedOff as exc:
                if acquire and exc.lease_lost:
                    # an outcome decided on delivery (dead letter, in doubt) while another
                    # worker runs the step: this copy is a duplicate, as for a start
                    return self._busy(writer, step, extra)
                if exc.lease_lost and hold is not None and hold.fence():
                    hold = None  # lapsed, and nobody acted meanwhile: taken back, once
                    continue
                log.warning("saga %s step %d: lease lost before the outcome was recorded; "
                            "the next holder decides", saga_id, step)
                return "lease_lost"
            except ConflictError:
                known = view.intent
                view = self.read(saga_id, step, known["seq"] if known else 0)
                if view.outcome is not None:
                    return "conflict"
                if _identity(view.intent) != _identity(known):
                    # the log went back behind this step (a failover that lost
                    # writes, or a hand): an outcome appended now would chain a
                    # result for a step the log no longer holds
                    log.error("saga %s step %d: its intent is no longer in the log (the "
                              "log went back behind it: a failover lost writes?); the "
                              "call ran, its outcome is not recorded; the sweeper drives "
                              "the saga on from what the log holds", saga_id, step)
                    return "intent_lost"
                continue
            break
        else:
            raise ConflictError(f"saga {saga_id}: could not record the outcome of step {step}")
        if acquire:  # dead letter / in doubt took the lease to write; hand it on
            self.store.redis.pexpire(self.store.events.keys.lease(saga_id), 0)
        fault("after_outcome")
        metrics = self.store.metrics
        if metrics is not None:
            self._child(metrics.steps, spec.name if spec else "unknown", outcome.kind).inc()
            if follow is Follow.COMMITTED:
                metrics.sagas_finished.labels("committed").inc()
        if claim is not None:
            appended = writer.appended(items)
            self._next = _Continuation(writer, step + 1, StepView(
                intent=appended[-2], head=writer.head, plan=view.plan,
                agent_id=view.agent_id, conversation_id=view.conversation_id,
                events=appended, ctx_seq=view.ctx_seq), token, claim[0])
        self._unwind = follow is Follow.UNWIND
        if all_in_one:
            return outcome.kind  # all sent with the append
        trip = self.store.trip()
        settle = writer.close_on(trip.log) if writer.closed else None  # the ledger's entry
        self._after_outcome(trip, saga_id, step, view, outcome, spec, follow, extra, items,
                            writer.head.seq)
        inline = self._project_known(trip.log, saga_id, view, writer.appended(items))
        # ss:active is the sweeper's cue to project: leave it only once that is done
        if follow is Follow.COMMITTED and inline:
            self._closed(trip.log, saga_id)
        answered((yield Send(trip)), *([settle] if settle else []))
        if not inline:
            project(self.store.events, saga_id)
            if follow is Follow.COMMITTED:
                done = lean(self.store.redis)
                self._closed(done, saga_id)
                done.execute()
        return outcome.kind

    def _busy(self, writer: ChainWriter, step: int, extra: Any) -> str:
        """A delivery of a step another worker holds the lease for: noted, acknowledged."""
        if self.store.metrics is not None:
            self.store.metrics.dedupe_hits.labels("in_flight").inc()
        with contextlib.suppress(ConflictError):
            writer.append_many([build.duplicate_suppressed(step, "running elsewhere")])
        self._ack(extra)
        return "busy"

    def _hand_back(self, writer: ChainWriter, saga_id: str, step: int, view: StepView,
                   token: str, extra: Any, why: str) -> Work[str]:
        """Asked to stop between two tries: log ``step_released`` (releasing the
        lease) and queue the step again, in one round trip, for another worker; the
        next delivery counts as no lost one. Refused (the lease is gone, the log
        moved): whoever has the step decides."""
        assert view.intent is not None
        trip = self.store.trip()
        try:
            call = writer.prepare([build.step_released(step, why)],
                                  lease=Lease(token, LeaseMode.RELEASE))
            queued = call.queue(trip.log)
            enqueue_step(trip.queue, self.store.queue, saga_id, step, view.intent["seq"],
                         view.intent["idem_key"], view.intent.get("tool"))
            if extra is not None:
                extra(trip.queue)
            writer.applied(call, queued((yield Send(trip))), ledger=False)
        except (FencedOff, ConflictError):
            self._ack(extra)
            return "fenced"
        log.info("saga %s step %d: handed back between two tries (%s)", saga_id, step, why)
        return "released"

    def _child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, remembered: labels() validates and locks each time."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def _closed(self, pipe: Any, saga_id: str) -> None:
        unschedule(pipe, self.store.events.keys, saga_id)

    def _claimable(self, step: int, view: StepView, follow: Follow,
                   ) -> tuple[ToolSpec, int] | None:
        """The next step's tool and lease time when this worker may run it at once:
        eager steps on, not asked to stop, the tool registered here, and the policy
        letting it run without a person (else the step goes through the queue)."""
        if follow is not Follow.NEXT or not self.eager or view.plan is None \
                or not self.keep_going():
            return None
        nxt = view.plan[step + 1]
        try:
            spec = self.store.registry.get(nxt["tool"])
        except UnknownTool:
            return None
        if _verdict(self.store.policy, spec, nxt["args"]).decision is not Decision.ALLOW:
            return None
        return spec, int(spec.timeout * 1000) + self.store.settings.lease_ms

    def _spec(self, view: StepView) -> tuple[ToolSpec | None, str]:
        """The step's tool in this worker's registry, or None and why not."""
        try:
            return self.store.registry.get((view.intent or {}).get("tool") or ""), ""
        except UnknownTool as exc:
            return None, str(exc)

    def _request_approval(self, writer: ChainWriter, saga_id: str, step: int,
                          view: StepView, spec: ToolSpec, verdict: Verdict,
                          extra: Any) -> str:
        """The gate asked for a person: record the request with its preview and leave
        the step in ss:approvals until someone decides."""
        assert view.intent is not None
        args = view.intent["data"]["args"]
        policy = self.store.policy
        undo = ({"tool": spec.compensation, "mapping": dict(spec.mapping)}
                if spec.compensation else None)
        data = approvals.preview(spec.name, args, str(spec.reversibility), undo, verdict,
                                 policy.approval_timeout_s)
        try:
            approvals.request(writer, step, spec.name, data, policy.approval_timeout_s)
        except FencedOff:
            self._ack(extra)
            return "cancelled"  # unwinding began: this step will never run
        except ConflictError:
            return "conflict"
        self._ack(extra)
        project(self.store.events, saga_id)
        notify.approval_requested(saga_id, step, spec.name, view.agent_id, verdict.reason)
        log.info("saga %s step %d (%s) waits for approval: %s", saga_id, step, spec.name,
                 verdict.reason)
        return "awaiting_approval"

    def _after_outcome(self, trip: Trip, saga_id: str, step: int, view: StepView,
                       outcome: Outcome, spec: ToolSpec | None, follow: Follow,
                       extra: Any, items: list[Item],
                       head_seq: int) -> None:
        """Queue what follows an outcome: the next job or the unwind and the job's
        acknowledgement (on the queues), the dedupe record of an explicit key (on
        the log)."""
        if follow is Follow.NEXT:
            enqueue_step(trip.queue, self.store.queue, saga_id, step + 1, head_seq,
                         items[-1][1]["idem_key"], items[-1][1].get("tool"))
        elif follow is Follow.COMPENSATE:
            enqueue_compensation(trip.queue, saga_id)
        intent = view.intent or {}
        if (intent.get("data") or {}).get("keyed"):
            self.store.dedupe.finish(view.agent_id, intent["idem_key"], outcome.kind,
                                     outcome.result or {"error": outcome.error}, trip.log)
        if extra is not None:
            extra(trip.queue)

    def _outcome_events(self, saga_id: str, step: int, view: StepView, outcome: Outcome,
                        ) -> tuple[list[Item], Follow]:
        def next_intent(n: int, planned: Mapping[str, Any]) -> Item:
            spec = self.store.registry.get(planned["tool"])
            # a plan's steps all carry the submitter's span context
            return intent(saga_id, n, spec, planned["args"], planned.get("tool_call_id"),
                          trace=((view.intent or {}).get("data") or {}).get("trace"))
        return outcome_events(step, view.intent or {}, outcome, unwinding=view.unwinding,
                              plan=view.plan, next_intent=next_intent)

    def _project_known(self, pipe: Any, saga_id: str, view: StepView,
                       events: list[dict[str, Any]]) -> bool:
        """Queue on ``pipe`` the context events of ``events`` past the cursor, and move
        the cursor, when nothing between the cursor and them is unknown to this
        worker; False when the caller must fall back to :func:`project`."""
        if view.agent_id is None:
            return True  # nobody to tell
        later = [e for e in events if e["seq"] > view.ctx_seq]
        if not later:
            return True
        known = {e["seq"] for e in view.events} | {e["seq"] for e in events}
        if any(s not in known for s in range(view.ctx_seq + 1, later[-1]["seq"] + 1)):
            return False
        tell(pipe, self.store.events.keys, saga_id, view.agent_id, view.conversation_id,
             sorted({e["seq"]: e for e in [*view.events, *events]
                     if e["seq"] > view.ctx_seq}.values(), key=lambda e: e["seq"]))
        view.ctx_seq = later[-1]["seq"]
        return True

    def _ack(self, extra: Any) -> None:
        if extra is not None:
            pipe = lean(self.store.queues)
            extra(pipe)
            pipe.execute()


def _verdict(policy: Policy, spec: ToolSpec, args: dict[str, Any]) -> Verdict:
    """What the policy says of a call of ``spec`` with the logged ``args``."""
    return policy.decide(spec.name, str(spec.reversibility), args,
                         Decision(spec.approval) if spec.approval else None)


def queue_reads(pipe: Any, names: SagaKeys, saga_id: str, intent_seq: int) -> None:
    """Queue what a step delivery reads: the log from one event before the intent
    (the previous step's outcome, still to be projected), the saga's first event
    (plan, agent) and the projection cursor."""
    log_key = names.log(saga_id)
    pipe.execute_command("XRANGE", log_key, keys.entry_id(max(0, intent_seq - 1)), "+")
    pipe.execute_command("XRANGE", log_key, "0-1", "0-1")
    pipe.execute_command("HGET", names.meta(saga_id), "ctx_seq")


def run_step(store: SagaStore, worker: str, saga_id: str, step: int, intent_seq: int) -> str:
    """The job function :data:`saga_store.execution.jobs.STEP_FUNC` names: one delivery
    of one step (the worker calls :class:`StepRunner` itself, with its reads)."""
    return StepRunner(store, worker).run(saga_id, step, intent_seq)


def _identity(intent: Mapping[str, Any] | None) -> tuple[Any, ...] | None:
    """What tells a step's intent from any other: where it stands and its key. An
    intent read from the log and the one this worker appended (eager steps) are
    not the same dict, but they are the same intent."""
    if intent is None:
        return None
    return (intent.get("seq"), intent.get("kind"), intent.get("step"), intent.get("idem_key"))
