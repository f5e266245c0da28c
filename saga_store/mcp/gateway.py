"""The MCP gateway: Saga Store in front of any MCP server.

The gateway owns the downstream session, so it runs every call itself; what
workers would decide, it decides the same way, in the same chain: each
``tools/call`` is a step (intent, started, outcome), classified, gated by the
policy, deduplicated by its idempotency key, and, when a later mutating call
fails, the session's earlier calls are compensated last first through the
downstream server's own compensation tools.

Tools are classified and undone as :mod:`saga_store.mcp.classify` says (the
tools-map, then the server's declarations: :mod:`saga_store.mcp.declared`).

Session boundaries: one saga per client session (committed when the session
ends), or explicit ones with the ``saga_begin`` / ``saga_commit`` /
``saga_abort`` tools the gateway adds. After a rollback, later calls open a new
saga. Sagas the gateway has open are listed under ``ss:gateway:{<id>}``: the
next gateway for the same downstream finishes their unwinds before serving.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from saga_store import keys
from saga_store.approval import notify
from saga_store.approval import requests as approvals
from saga_store.approval.policy import Policy, Verdict
from saga_store.client.context import project, tell
from saga_store.errors import ConflictError, FencedOff, InvalidInput, KeyReuseError
from saga_store.execution.idempotency import (
    DedupeRecords,
    args_digest,
    explicit_key,
    step_key,
)
from saga_store.ids import scoped_saga_id
from saga_store.log.canonical import check_json
from saga_store.log.store import ChainWriter
from saga_store.mcp.argcheck import Check, compile_check
from saga_store.mcp.cancel import REASON, Cancellation
from saga_store.mcp.classify import Classification, classify
from saga_store.mcp.identity import gateway_id
from saga_store.mcp.leases import Leases
from saga_store.mcp.mapcheck import mapping_problem
from saga_store.mcp.results import (
    CallOutcome,
    as_outcome,
    replayed,
    scrubbed,
)
from saga_store.mcp.turns import CURRENT, Turns, exclusive_now
from saga_store.protocol import build, unwind, unwinding
from saga_store.protocol.delivery import Act, gate, last_approval
from saga_store.protocol.forward import (
    Leftover,
    commit_blocker,
    failure_unwinds,
    left_over,
    repeat_of,
)
from saga_store.protocol.outcome import Outcome
from saga_store.protocol.state import SagaState, StepState, fold
from saga_store.protocol.vocab import (
    CompStatus,
    OutcomeKind,
    Phase,
    Reversibility,
    StepStatus,
    Unclassified,
)
from saga_store.tools.secrets import Secrets
from saga_store.verify.checker import read_verified

if TYPE_CHECKING:
    from saga_store.client.api import SagaStore

__all__ = ["CallFn", "CallOutcome", "Gateway", "gateway_id"]
log = logging.getLogger("saga_store.gateway")
META_IDEMPOTENCY = "dev.chronomcp/idempotency_key"
# the tools the gateway adds: name -> (description, input schema)
SESSION_TOOLS: dict[str, tuple[str, dict[str, Any]]] = {
    "saga_begin": ("Start a saga: later calls are undone together if one fails, until "
                   "saga_commit. [saga: session control]", {"type": "object", "properties": {}}),
    "saga_commit": ("Commit the open saga: its calls stand. [saga: session control]",
                    {"type": "object", "properties": {}}),
    "saga_abort": ("Undo the open saga's calls, last first. [saga: session control]",
                   {"type": "object", "properties": {"reason": {"type": "string"}}}),
}
EXECUTOR = "mcp-gateway"
TELL_AFTER_EVENTS = 96  # about 32 calls' worth (intent, started, outcome)
TELL_AFTER_S = 1.0
APPROVAL_POLL_S = 0.1

CallFn = Callable[[str, dict[str, Any], dict[str, Any]], Awaitable["CallOutcome"]]
# how a task-augmented call reaches the server: the client's ``task`` params too
TaskCallFn = Callable[[str, dict[str, Any], dict[str, Any], dict[str, Any]],
                      Awaitable["CallOutcome"]]
Answer = Callable[["CallOutcome"], Awaitable[None]]


def session_tools() -> list[dict[str, Any]]:
    """The tools the gateway adds to a listing, as MCP ``Tool`` objects on the wire."""
    return [{"name": n, "description": d, "inputSchema": schema}
            for n, (d, schema) in SESSION_TOOLS.items()]


@dataclass
class Session:
    """The gateway's side of one client session."""

    agent_id: str
    writer: ChainWriter | None = None
    state: SagaState | None = None
    explicit: bool = False
    # context events: the seq up to which they went out (None: unknown, the log
    # decides) and what this gateway appended since, to go out with its next append
    told: int | None = None
    untold: list[dict[str, Any]] = field(default_factory=list)
    told_at: float = 0.0
    salt: bytes = field(default_factory=lambda: os.urandom(16))
    # calls whose outcome is logged but whose answer never left (the gateway failed in
    # between): the call's saga-scoped key -> its step. Only these are replayed
    # without an explicit key, and once.
    undelivered: dict[str, int] = field(default_factory=dict)


class Gateway:
    """Runs each call as a saga step. ``call`` reaches the downstream server."""

    def __init__(self, saga_store: SagaStore, policy: Policy,
                 tools_map: Mapping[str, Classification], call: CallFn, gid: str,
                 agent_id: str = "mcp-client", dedupe_ttl_s: int = 7 * 24 * 3600) -> None:
        self.saga_store, self.store = saga_store, saga_store.events
        self.policy, self.tools_map, self.call = policy, tools_map, call
        self.gid = gid
        self.tools: dict[str, Any] = {}
        self._validators: dict[str, tuple[Check | None, Any] | None] = {}
        self.session = Session(agent_id)
        self.dedupe = DedupeRecords(self.store.redis, dedupe_ttl_s)
        self._turns = Turns()
        self._classes: dict[str, Classification] = {}
        self._reported: set[tuple[str, str]] = set()  # mapping problems logged
        self._seen: dict[str, Any] = {}  # every tool listed so far, on any page
        # every saga this gateway works on is leased to it: a second gateway for the
        # same downstream leaves them alone, and one that lost its lease writes nothing
        self.leases = Leases(self.store.redis, EXECUTOR, saga_store.settings.lease_ms,
                             self.store.keys)
        self.recovered = False  # what was left at the start is done: keep looking
        # the client's side: where notifications to it go (none in-process), and
        # whether its session is closing (a call waiting for approval withdraws it)
        self.to_client: Callable[[dict[str, Any]], Awaitable[None]] | None = None
        self.closing = False
        # MCP tasks: how a task-augmented call reaches the server, and its result
        self.call_task: TaskCallFn | None = None
        self.task_result: Callable[[str], Awaitable[CallOutcome]] | None = None

    # -- tools/list ------------------------------------------------------------

    def set_tools(self, tools: list[Any]) -> None:
        self.tools = {t.name: t for t in tools}
        self._seen.update(self.tools)
        self._validators, self._classes = {}, {}
        for t in tools:  # a compensation that cannot work is said now, not mid-unwind
            self.classification(t.name)

    def learn(self, tools: list[Any]) -> None:
        """Tools from one page of a client's tools/list: they replace what was known of
        them (their schema may have changed)."""
        for t in tools:
            self.tools[t.name] = t
            self._seen[t.name] = t
            self._validators.pop(t.name, None)
        self._classes = {}  # an earlier page's compensation may be on this one

    def classification(self, name: str) -> Classification:
        """How ``name`` is classified, worked out once per listing of the tool."""
        cls = self._classes.get(name)
        if cls is None:
            tool = self.tools.get(name)
            cls = classify(tool, self.tools_map) if tool is not None \
                else self.tools_map.get(name, Classification(Unclassified.UNKNOWN))
            if tool is not None and cls.compensation is not None:
                problem = mapping_problem(tool, cls.compensation, {**self._seen, **self.tools})
                if problem is not None:
                    cls = cls.unusable(problem)
                    if (name, problem) not in self._reported:
                        self._reported.add((name, problem))
                        log.warning("tool %s (%s): its compensation cannot make a valid "
                                    "call (%s); its calls are treated as not undoable",
                                    name, cls.source, problem)
            self._classes[name] = cls
        return cls

    def listed(self, tools: list[Any]) -> list[Any]:
        """What the client sees of ``tools/list``: the downstream's tools, each with its
        reversibility in its description, then the session tools."""
        import mcp_types as types
        self.set_tools(tools)
        return [*(t.model_copy(update={"description": self.describe(t)}) for t in tools),
                *(types.Tool.model_validate(t) for t in session_tools())]

    def describe(self, tool: Any) -> str:
        """The tool's description with what the model must know: can it be undone."""
        base = (tool.description or "").rstrip()
        note = f"[saga: {self.classification(tool.name).label()}]"
        return f"{base}\n\n{note}" if base else note

    # -- sagas -------------------------------------------------------------------

    def _open(self) -> ChainWriter:
        s = self.session
        if s.writer is None:
            s.writer = self.store.open(s.agent_id, saga_id=scoped_saga_id(s.agent_id),
                                       data={"executor": EXECUTOR, "gateway": self.gid},
                                       lease=self.leases.lease)
            self.leases.held.add(s.writer.saga_id)
            # the state of a saga just opened is known: no need to read it back
            s.state = SagaState(s.writer.saga_id, agent_id=s.agent_id, seq=s.writer.head.seq,
                                executor=EXECUTOR)
            # an opening tells the agent nothing
            s.told, s.untold, s.told_at = s.writer.head.seq, [], time.monotonic()
            self.store.redis.sadd(keys.gateway_sagas(self.gid), s.writer.saga_id)
        return s.writer

    def _refresh(self) -> SagaState:
        s = self.session
        assert s.writer is not None
        s.state = fold(s.writer.saga_id, self.store.log.bodies(s.writer.saga_id))
        return s.state

    def _add(self, writer: ChainWriter, items: list[tuple[str, dict[str, Any]]],
             phase: Phase | None = None) -> None:
        """Append events and fold them into the session's state as they are, so a
        call costs the same at depth 3,000 as at depth 1 (no re-read of the log)."""
        s, st = self.session, self.session.state
        mine = st is not None and s.writer is writer
        due = mine and (len(s.untold) >= TELL_AFTER_EVENTS
                        or time.monotonic() - s.told_at >= TELL_AFTER_S)
        # a lean pipeline: an append costs a fifth less than through redis-py
        events = writer.append_riding(items, self._tell if due else None, phase=phase)
        if st is None or not mine:
            return
        for ev in events:
            st.apply(ev)
        if s.told is not None and events[0]["seq"] == s.told + len(s.untold) + 1:
            s.untold += events
        else:  # someone else appended too: the log says what is untold
            self._project(writer)

    def _tell(self, pipe: Any) -> None:
        """Queue on ``pipe`` the context events of what this gateway appended and the
        agent has not been told yet. They ride on an append every TELL_AFTER_EVENTS
        events or TELL_AFTER_S seconds (most calls carry none: nothing on the
        common path), and go out at once on a failure, rollback, approval request
        or close."""
        s = self.session
        s.told_at = time.monotonic()
        if s.told is None or not s.untold or s.writer is None:
            return
        tell(pipe, self.store.keys, s.writer.saga_id, s.agent_id, None, s.untold)
        s.told, s.untold = s.untold[-1]["seq"], []

    def _project(self, writer: ChainWriter) -> None:
        """Tell the agent everything past its cursor, from the log."""
        project(self.store, writer.saga_id)
        if self.session.writer is writer:
            self.session.told, self.session.untold = writer.head.seq, []

    def _close(self, writer: ChainWriter) -> None:
        pipe = self.store.redis.pipeline(transaction=False)
        pipe.srem(keys.gateway_sagas(self.gid), writer.saga_id)
        self.leases.close_on(pipe, writer.saga_id)
        pipe.execute()
        self._project(writer)
        if self.session.writer is writer:
            self.session.writer, self.session.state = None, None

    # -- leases ------------------------------------------------------------------

    async def keep_alive(self) -> None:
        """Renew the leases a third of their time to live apart, for as long as the
        gateway runs: an idle session, a long call or an approval wait keep them.
        Once the gateway has recovered at its start, it also takes over sagas whose
        gateway stopped since, or whose lease lapsed since (one on another host
        dies without anyone knowing but its lease)."""
        import anyio
        import redis
        while True:
            await anyio.sleep(self.leases.ttl_ms / 3000)
            try:
                self.leases.renew()
            except redis.RedisError as exc:
                log.warning("could not renew the gateway's leases: %s", exc)
                continue
            if not self.recovered:
                continue
            try:
                for sid, how in await self.recover(quiet=True):
                    log.warning("finished saga %s left by another gateway: %s", sid, how)
            except Exception as exc:  # e.g. another gateway got there first: next round
                log.warning("could not finish what another gateway left: %s", exc)

    def _lost(self, exc: ConflictError) -> CallOutcome | None:
        """If ``exc`` means another gateway took the session's saga over (this one
        stalled past its lease: the append was fenced off, or the other holds the
        lease or closed the saga), drop the saga and say so; later calls open a new
        saga. None if the conflict is of another kind."""
        s = self.session
        if s.writer is None:
            return None
        sid = s.writer.saga_id
        taken = isinstance(exc, FencedOff) or self.leases.lost(sid)
        if not (taken or self.store.meta(sid).get("phase") == Phase.CLOSED):
            return None
        self.leases.held.discard(sid)
        s.writer, s.state = None, None
        how = ("another gateway for this server took it over and settles it" if taken
               else "it was closed outside this gateway (by another gateway, or by hand)")
        return CallOutcome(False, None, f"the gateway no longer holds saga {sid}: {how} "
                                        f"({exc}); what became of this call is in that "
                                        f"saga's log: saga show {sid}")

    def commit(self) -> str | None:
        """Commit the session's saga (the session ended, or saga_commit)."""
        writer, st = self.session.writer, self.session.state
        if writer is None or st is None:
            return None
        blocker = commit_blocker(st)
        if blocker is not None:
            raise InvalidInput(f"saga {writer.saga_id} cannot commit ({blocker}); abort it "
                               "instead")
        try:
            writer.append_many([build.saga_committed()], phase=Phase.FORWARD)
        except ConflictError as exc:
            if (lost := self._lost(exc)) is None:
                raise
            log.warning("%s", lost.text)  # the other gateway closes it
            return None
        self._close(writer)
        return writer.saga_id

    async def abort(self, reason: str) -> str | None:
        """Roll back the session's saga; its id, or None if none was open."""
        writer = self.session.writer
        if writer is None:
            return None
        try:
            await self.rollback(writer, reason)
        except ConflictError as exc:
            if (lost := self._lost(exc)) is None:
                raise
            log.warning("%s", lost.text)  # the other gateway finishes it
            return None
        return writer.saga_id

    # -- tools/call -------------------------------------------------------------

    async def handle(self, name: str, args: dict[str, Any], meta: Mapping[str, Any] | None,
                     task: Mapping[str, Any] | None = None, answer: Answer | None = None,
                     cancel: Cancellation | None = None) -> CallOutcome:
        """One tools/call from the client, start to end. The mutating calls of one
        session run one at a time, in arrival order (a saga's steps are undone last
        first), even when the client sends them concurrently or in a batch; reads
        run beside each other (:mod:`saga_store.mcp.turns`).

        A task-augmented call (``task``: the client's ``params.task``) is answered
        through ``answer`` as soon as the server has made it a task; the step's
        outcome is the task's result, which the gateway waits for itself.

        ``cancel``: the client may cancel the call (:mod:`saga_store.mcp.cancel`)."""
        turn = await self._turns.take(shared=self._reads(name))
        held = CURRENT.set((self._turns, turn))
        try:
            if cancel is not None and cancel.requested:  # before its turn: nothing ran
                return CallOutcome(False, None, f"{REASON} before it ran")
            return await self._handle(name, args, meta, task, answer, cancel)
        except ConflictError as exc:  # incl. FencedOff
            if (lost := self._lost(exc)) is None:
                raise
            return lost
        finally:
            CURRENT.reset(held)
            self._turns.give(turn)

    def _reads(self, name: str) -> bool:
        """Whether a call of ``name`` only reads, by the classification the policy uses."""
        return name not in SESSION_TOOLS and self.classification(name).for_policy(
            self.policy.trust_server_hints) == "readonly"

    async def _handle(self, name: str, args: dict[str, Any], meta: Mapping[str, Any] | None,
                      task: Mapping[str, Any] | None = None, answer: Answer | None = None,
                      cancel: Cancellation | None = None) -> CallOutcome:
        try:  # before the schema's check, which would take NaN and recurse into any depth
            check_json(args, "arguments", self.saga_store.settings.max_depth)
        except InvalidInput as exc:
            return CallOutcome(False, None, f"invalid arguments for {name}: {exc}")
        if name in SESSION_TOOLS:
            return await self._session_tool(name, args)
        cls = self.classification(name)
        # A tool the server does not list: the call still goes to it, so the client
        # gets the server's own answer, and its refusal rolls nothing back (a server
        # cannot run a tool it does not have); one a person would have to approve is
        # refused here. Arguments the tool's listed schema rejects are refused here,
        # unsent: a server that coerces them might run part of the call, which a
        # refusal would then hide.
        problem = self._invalid(name, args)
        refused = problem if problem and self.tools and name not in self.tools else None
        if problem and (refused is None or gate(None, lambda: self.policy.decide(
                name, cls.for_policy(self.policy.trust_server_hints), args)) is not None):
            return CallOutcome(False, None, problem)  # nothing ran; nothing to undo
        writer = self._open()
        st = self.session.state
        assert st is not None
        logged, secrets = Secrets.redact(args, cls.secret, self.session.salt)
        # A call that was answered is never answered again from the log: calling again
        # is the client's choice (a read sees what changed since; a write is made
        # again). Replayed are only a call under the same explicit key (the client
        # says it is the same call) and one whose answer never left the gateway.
        reads = self._reads(name)
        explicit = None if reads else (meta or {}).get(META_IDEMPOTENCY)
        if self.session.undelivered and not explicit:
            lost = self.session.undelivered.pop(step_key(writer.saga_id, name, logged), None)
            if lost is not None and st.steps[lost].finished:
                return self._repeat(writer, st, lost)
        key = explicit_key(str(explicit)) if explicit else step_key(
            writer.saga_id, name, [logged, st.next_step])
        try:
            repeated = repeat_of(st, key, name, logged) if explicit else None
        except KeyReuseError as exc:
            return CallOutcome(False, None, str(exc))  # nothing ran; nothing to undo
        if repeated is not None:  # the same call again in this saga: its recorded answer
            return self._repeat(writer, st, repeated)
        # what an explicit key's record holds of the arguments (no key: nothing to hold)
        digest = args_digest(name, args, cls.secret, self.saga_store.settings.hmac_key) \
            if explicit else ""
        if explicit:
            try:
                claim = self._claim(key, digest, writer.saga_id, st.next_step)
            except KeyReuseError as exc:
                return CallOutcome(False, None, str(exc))
            if claim.status == "exists":
                if claim.state == "pending":  # nothing recorded yet: no answer to give
                    return CallOutcome(False, None, "a call with that idempotency key is in "
                                       "progress; try again shortly")
                return replayed(claim.state == OutcomeKind.SUCCEEDED, claim.result, None)
        step = st.next_step
        verdict = self.policy.decide(name, cls.for_policy(self.policy.trust_server_hints),
                                     args)
        gated = gate(None, lambda: verdict)  # the workers' gate: run, deny, or ask a person
        intent = build.step_intent(step, name, logged, cls.reversibility, None, key,
                                   keyed=bool(explicit))
        started = build.step_started(step, 1, worker=EXECUTOR)
        try:
            self._add(writer, [intent, started] if gated is None else [intent],
                      phase=Phase.FORWARD)
        except (FencedOff, ConflictError, InvalidInput):
            # refused, so certainly not logged: a retry must be able to run the call
            # (a lost reply may have logged it: then the claim stays, for the log to settle)
            if explicit:
                self.dedupe.release(st.agent_id, key, digest, writer.saga_id, step)
            raise
        if gated is not None:
            denial = gated.outcome.error if gated.outcome is not None else \
                await self._gate(writer, step, name, logged, cls, verdict, meta, cancel)
            if denial is not None:
                self._add(writer, [build.step_outcome(step, OutcomeKind.FAILED, error=denial)])
                if explicit:  # the key's record says how it ended, not "pending" for a week
                    self.dedupe.finish(st.agent_id, key, "failed", {"text": denial})
                return await self._failed(writer, name, cls, CallOutcome(False, None, denial))
            self._add(writer, [started], phase=Phase.FORWARD)
        outcome = await self._call(name, args, key, meta=meta, task=task, cancel=cancel)
        if cancel is not None and cancel.requested and outcome.in_doubt and not cls.mutating:
            # a read cut off changed nothing: it failed, and the session goes on
            outcome = CallOutcome(False, None, f"{REASON} while it ran")
        if outcome.task_id is not None:  # the client polls the task; its result is the outcome
            if answer is not None:
                await answer(outcome)
            outcome = await self._task_result(outcome.task_id)
        outcome = scrubbed(outcome, secrets)
        said = as_outcome(outcome)
        # the server refused a call of a tool it does not list: refused before it
        # ran, so nothing is rolled back for it
        refusal = {"refused": refused} if refused and not outcome.ok \
            and not outcome.in_doubt else {}
        try:
            self._add(writer, [build.step_outcome(step, said.kind, result=said.result,
                                                  error=said.error, tool=name, **refusal)])
            if explicit:
                self.dedupe.finish(st.agent_id, key,
                                   "succeeded" if outcome.ok else "failed", outcome.logged())
            if refusal:
                self._project(writer)
            elif not outcome.ok or outcome.in_doubt:
                outcome = await self._failed(writer, name, cls, outcome)
        except BaseException:
            # the outcome may be logged (an append whose reply was lost did happen) and
            # its answer does not leave: the client's retry in this session gets it
            self.session.undelivered[step_key(writer.saga_id, name, logged)] = step
            raise
        return outcome  # the agent is told with the next append

    def _claim(self, key: str, digest: str, saga_id: str, step: int) -> Any:
        """Claim an explicit key; a pending claim that can never become a step (its
        session's saga was rolled back before the call was logged) is taken over."""
        agent = self.session.agent_id
        claim = self.dedupe.claim(agent, key, digest, saga_id, step)
        return self.dedupe.take_over(agent, key, digest, saga_id, step, claim, self.store.state)

    async def _call(self, name: str, args: dict[str, Any], key: str,
                    timeout_s: float | None = None,
                    meta: Mapping[str, Any] | None = None,
                    task: Mapping[str, Any] | None = None,
                    cancel: Cancellation | None = None) -> CallOutcome:
        """Call downstream, passing the idempotency key in ``_meta`` for servers that
        honour one (a resent compensation after a crash is then harmless), beside
        what the client's own ``_meta`` says (its progressToken, say: the server's
        progress notifications pass through to it). A call that outlasts
        ``timeout_s``, or that the client cancels while it runs, is in doubt."""
        if cancel is not None:
            out: CallOutcome | None = None
            if not cancel.requested:
                with cancel:
                    out = await self._call(name, args, key, timeout_s, meta, task)
            if out is None:  # cut off: the server's answer, if it comes, is dropped
                return CallOutcome(False, None, f"{REASON} while it ran",
                                   in_doubt=f"{REASON} while the call ran")
            return out
        import anyio
        meta = {**(meta or {}), META_IDEMPOTENCY: key}
        try:
            if task is not None and self.call_task is not None:
                with anyio.fail_after(timeout_s):
                    return await self.call_task(name, args, meta, dict(task))
            if timeout_s is None:  # most calls: no cancel scope to enter and leave
                return await self.call(name, args, meta)
            with anyio.fail_after(timeout_s):
                return await self.call(name, args, meta)
        except Exception as exc:  # the downstream broke mid-call: unknown if it ran
            return CallOutcome(False, None, f"{type(exc).__name__}: {exc}",
                               in_doubt=f"the call did not return: {type(exc).__name__}")

    async def _task_result(self, task_id: str) -> CallOutcome:
        """The result of an MCP task the server made of a call (``tasks/result``
        waits for it to end); one the gateway cannot get is in doubt."""
        try:
            assert self.task_result is not None
            return await self.task_result(task_id)
        except Exception as exc:
            return CallOutcome(False, None, f"task {task_id}: {type(exc).__name__}: {exc}",
                               in_doubt=f"the task's result did not come: {type(exc).__name__}")

    async def _failed(self, writer: ChainWriter, name: str, cls: Classification,
                      outcome: CallOutcome) -> CallOutcome:
        """A call failed: a read-only one rolls nothing back; a mutating one rolls
        back the session's saga, and the answer says what was undone."""
        kind = OutcomeKind.IN_DOUBT if outcome.in_doubt else OutcomeKind.FAILED
        if not failure_unwinds(kind, cls.reversibility, session=True):
            self._project(writer)
            return outcome
        await exclusive_now()  # a read in doubt rolls back alone, as a mutating call
        ended, undone = await self.rollback(writer, f"{name} failed: {outcome.text[:300]}")
        standing = still_standing(self.store.state(writer.saga_id))
        server_said = outcome.raw is not None or outcome.error is not None
        if server_said and not (undone or standing):
            return outcome  # nothing was undone and nothing stands: the server's answer only
        note = f"[saga {writer.saga_id} rolled back: {ended}; " + rollback_note(
            undone, standing) + "]"
        return dataclasses.replace(outcome, text=f"{outcome.text}\n\n{note}", note=note)

    def _repeat(self, writer: ChainWriter, st: SagaState, step: int) -> CallOutcome:
        s = st.steps[step]
        with contextlib.suppress(ConflictError):
            self._add(writer, [build.duplicate_suppressed(step, s.status)])
        return replayed(s.status is StepStatus.SUCCEEDED, s.result, s.error)

    def _invalid(self, name: str, args: dict[str, Any]) -> str | None:
        if self.tools and name not in self.tools:  # a typo is not a failure to undo
            return (f"this server has no tool named {name!r}; tools/list shows the tools "
                    "it has")
        checks = self._validator(name)
        if checks is None:
            return None
        fast, validator = checks
        if fast is not None and fast(args):
            return None  # what the fast check accepts, jsonschema accepts
        import jsonschema  # type: ignore[import-untyped]  # the package ships no type hints
        error = jsonschema.exceptions.best_match(validator.iter_errors(args))
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path) or "arguments"
        return f"invalid arguments for {name} at {where}: {error.message}"

    def _validator(self, name: str) -> tuple[Check | None, Any] | None:
        """The tool's input-schema checks, built once per tools/list: the fast one
        (None if the schema uses more than it knows) and jsonschema's validator."""
        if name in self._validators:
            return self._validators[name]
        tool = self.tools.get(name)
        schema = getattr(tool, "input_schema", None) if tool is not None else None
        checks = None
        if schema:
            import jsonschema
            kind = jsonschema.validators.validator_for(schema)
            try:
                kind.check_schema(schema)
                checks = (compile_check(schema), kind(schema))
            except jsonschema.SchemaError:
                checks = None  # the server's schema is broken; let the server judge
        self._validators[name] = checks
        return checks

    async def _gate(self, writer: ChainWriter, step: int, name: str, args: dict[str, Any],
                    cls: Classification, verdict: Verdict,
                    meta: Mapping[str, Any] | None = None,
                    cancel: Cancellation | None = None) -> str | None:
        """Ask a person: None if they grant the call, else why not."""
        timeout_s = self.policy.approval_timeout_s
        undo = ({"tool": cls.compensation.tool, "mapping": dict(cls.compensation.args)}
                if cls.compensation else None)
        preview = approvals.preview(name, args, cls.reversibility, undo, verdict, timeout_s)
        if cls.scope:  # the server's own word on what the call touches
            preview["side_effect_scope"] = list(cls.scope)
        if cls.notes:
            preview["notes"] = cls.notes
        approvals.request(writer, step, name, preview, timeout_s)
        self._project(writer)
        notify.approval_requested(writer.saga_id, step, name, self.session.agent_id,
                                  verdict.reason)
        log.warning("saga %s step %d (%s) waits for approval: saga approve %s %d",
                    writer.saga_id, step, name, writer.saga_id, step)
        return await self._await_decision(writer, step, name, timeout_s,
                                          (meta or {}).get("progressToken"), verdict, cancel)

    async def _await_decision(self, writer: ChainWriter, step: int, name: str,
                              timeout_s: float, token: Any, verdict: Verdict,
                              cancel: Cancellation | None = None) -> str | None:
        """Wait for the step's approval to be decided: granted (None), denied (why),
        denied by its deadline, or withdrawn when the client cancels the call or its
        session closes. A
        client that gave a progressToken hears that the call waits, at once and
        then every ``approval_progress_s``, so its request timeout (reset on
        progress) does not end the call while a person decides."""
        import anyio
        now = time.monotonic()
        deadline = now + timeout_s if timeout_s else None
        every = self.saga_store.settings.approval_progress_s
        told, next_tell = 0, now
        while True:
            decided = gate(last_approval(self._refresh().steps[step]), lambda: verdict)
            if decided is None or decided.act is Act.FAIL:  # a person decided
                writer.head = self.store.log.head(writer.saga_id)
                return decided.outcome.error if decided and decided.outcome else None
            now = time.monotonic()
            cancelled = cancel is not None and cancel.requested
            if cancelled or self.closing or (deadline is not None and now > deadline):
                by, why = (("gateway", REASON) if cancelled else
                           ("gateway", "the client's session closed before a decision")
                           if self.closing else
                           ("timeout", "no decision before the deadline"))
                with contextlib.suppress(InvalidInput, ConflictError):
                    approvals.decide(self.saga_store, writer.saga_id, step, grant=False,
                                     by=by, reason=why, withdrawn=by == "gateway")
                continue
            if token is not None and self.to_client is not None and now >= next_tell:
                told += 1
                await self._still_waiting(token, told, writer.saga_id, step, name)
                next_tell = now + every
            if cancel is not None:  # a cancellation is acted on at once, not at the next poll
                await cancel.wait(APPROVAL_POLL_S)
            else:
                await anyio.sleep(APPROVAL_POLL_S)

    async def _still_waiting(self, token: Any, told: int, saga_id: str, step: int,
                             name: str) -> None:
        how = f"saga approve {saga_id} {step} (or saga deny {saga_id} {step} --reason ...)"
        message = (f"{name} waits for a person's approval: {how}" if told == 1 else
                   f"{name} still waits for approval: {how}")
        with contextlib.suppress(Exception):  # a client gone mid-wait: the close withdraws
            assert self.to_client is not None
            await self.to_client({"jsonrpc": "2.0", "method": "notifications/progress",
                                  "params": {"progressToken": token, "progress": told,
                                             "message": message}})

    async def _session_tool(self, name: str, args: dict[str, Any]) -> CallOutcome:
        if name == "saga_begin":
            committed = self.commit()
            self.session.explicit = True
            writer = self._open()
            text = f"saga {writer.saga_id} begun"
            if committed:
                text += f" (saga {committed} committed first)"
            return CallOutcome(True, {"saga_id": writer.saga_id}, text)
        if name == "saga_commit":
            sid = self.commit()
            return CallOutcome(True, {"saga_id": sid},
                               f"saga {sid} committed" if sid else "no saga was open")
        reason = str(args.get("reason") or "aborted by the client")
        current = self.session.writer
        if current is None:
            return CallOutcome(True, {"saga_id": None}, "no saga was open")
        writer = current
        ended, undone = await self.rollback(writer, reason)
        standing = still_standing(self.store.state(writer.saga_id))
        return CallOutcome(True, {"saga_id": writer.saga_id, "state": ended,
                                  "undone": undone, "standing": standing},
                           f"saga {writer.saga_id} {ended}; {rollback_note(undone, standing)}")

    # -- the unwind ----------------------------------------------------------------

    async def rollback(self, writer: ChainWriter, reason: str) -> tuple[str, list[str]]:
        """Compensate the saga's succeeded mutating calls, last first, through the
        downstream server: the workers' own unwind loop
        (:func:`saga_store.protocol.unwinding.unwinding`), with their retries, jittered
        backoff, probes and keys. Works from the log, so a later gateway can finish
        it. Returns how the saga ended and what was undone, last first."""
        import anyio
        bodies, head, verdict = read_verified(self.store.log, writer.saga_id)
        if not verdict.ok:  # compensations take their arguments from this log
            log.error("saga %s: its log does not verify (%s at seq %s); nothing is undone",
                      writer.saga_id, verdict.reason, verdict.first_bad_seq)
            return "untrusted: its log does not verify", []
        st = fold(writer.saga_id, bodies)
        writer.head = head
        if st.final:
            self._close(writer)
            return str(st.status), []
        self._apply(writer, st, unwind.opening(st, reason))
        undone: list[str] = []
        loop = unwinding.unwinding(st, GatewayCatalogue(self))
        answer: Outcome | None = None
        while True:
            try:
                req = loop.send(answer)
            except StopIteration as stop:
                end: unwind.Close | unwind.Done = stop.value
                break
            answer = None
            if isinstance(req, unwinding.Write):
                self._apply(writer, st, req.items)
                if req.settles is not None and req.outcome is not None and req.outcome.ok:
                    undone.append(f"{st.steps[req.settles.step].tool} (step {req.settles.step})")
            elif isinstance(req, unwinding.Wait):
                await anyio.sleep(req.seconds)
            elif isinstance(req, unwind.Probe):
                answer = probe_outcome(await self._call(req.tool, req.args, req.key))
            else:
                comp = self.classification(st.steps[req.step].tool or "").compensation
                answer = as_outcome(await self._call(req.undo.tool, req.args, req.key,
                                                     comp.timeout_s if comp else None))
        if isinstance(end, unwind.Close):
            if end.attention:  # listed before the close is visible (see the compensator)
                self.store.redis.sadd(self.store.keys.needs_attention(writer.saga_id),
                                      writer.saga_id)
            self._apply(writer, st, [end.item])
            self._close(writer)
            notify.needs_attention(writer.saga_id, st.agent_id, end.attention)
            return ("needs attention" if end.attention else "compensated"), undone
        # stuck: it waits for a person, or the next gateway to start
        self._project(writer)
        if self.session.writer is writer:  # the session's next call opens a new saga
            self.session.writer, self.session.state = None, None
        return str(end.status), undone

    def _apply(self, writer: ChainWriter, st: SagaState, items: list[build.Item]) -> None:
        """Append ``items`` (with the gateway's lease) and fold them into ``st``."""
        if not items:
            return
        for ev in writer.append_riding(items):
            st.apply(ev)

    async def recover(self, quiet: bool = False) -> list[tuple[str, str]]:
        """Finish what a previous gateway for this downstream left: unwinds it began,
        and sessions it never closed (committed if every call has an outcome, else
        rolled back). Sagas another running gateway holds are left to it. Returns
        (saga id, how it ended)."""
        done = []
        members: set[bytes] = self.store.redis.smembers(  # type: ignore[assignment]  # redis-py types a decoded reply
            keys.gateway_sagas(self.gid))
        for raw in sorted(members):
            sid = raw.decode()
            if sid in self.leases.held:  # this gateway's own
                continue
            if not self.leases.claim(sid):
                log.log(logging.DEBUG if quiet else logging.WARNING,
                        "saga %s belongs to a gateway for this server that is still "
                        "running; left to it", sid)
                continue
            bodies, head, verdict = read_verified(self.store.log, sid)
            if not verdict.ok:  # never settle, nor enter in the ledger, a forged saga
                log.error("saga %s: its log does not verify (%s at seq %s); left alone (run "
                          "'saga verify --saga %s')", sid, verdict.reason,
                          verdict.first_bad_seq, sid)
                continue
            st = fold(sid, bodies)
            writer = ChainWriter(self.store, sid, head, self.leases.lease)
            self.store.pay_ledger_debts(sid, st)  # what a gateway killed mid-close owed
            left = left_over(st)
            if left is Leftover.CLOSE:
                self._close(writer)
                continue
            if left is Leftover.COMMIT:
                writer.append_many([build.saga_committed()], phase=Phase.FORWARD)
                self._close(writer)
                done.append((sid, "committed"))
                continue
            ended, _ = await self.rollback(writer, "the previous gateway stopped mid-session")
            done.append((sid, ended))
        self.recovered = True
        return done


class GatewayCatalogue:
    """What the unwind knows of a downstream server's tools: their classification."""

    resume_hint = "fix the cause, then restart the gateway to finish the unwind"

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def undo_of(self, st: StepState) -> unwind.Undo | str:
        cls = self.gateway.classification(st.tool or "")
        if cls.compensation is None:
            return f"{st.tool} is {cls.reversibility}: {cls.label()}"
        return unwind.Undo(cls.compensation.tool, cls.compensation.args,
                           cls.compensation.max_attempts)

    def probe_of(self, st: StepState) -> unwind.Probing | None:
        probe = self.gateway.classification(st.tool or "").probe
        return unwind.Probing(probe.tool, probe.args) if probe is not None else None


def probe_outcome(out: CallOutcome) -> Outcome:
    """A probe's answer in the protocol's terms: ``{"happened": false}`` when the
    server says so in its structured content, else the call's result as the gateway
    logs results (it happened); a call that failed or broke tells nothing."""
    if not out.ok or out.in_doubt:
        return Outcome.failed(out.text[:2000])
    if isinstance(out.structured, dict) and out.structured.get("happened") is False:
        return Outcome.succeeded({"happened": False})
    return Outcome.succeeded(out.logged())


def still_standing(st: SagaState) -> list[str]:
    """The calls of a rolled-back saga whose effects were not undone: what the
    client must not believe gone. Reads and failed calls changed nothing."""
    out = []
    for s in st.steps.values():
        if s.reversibility is Reversibility.READONLY or s.compensation in (
                CompStatus.SUCCEEDED, CompStatus.RESOLVED):
            continue
        if s.status is StepStatus.SUCCEEDED:
            why = ("irreversible" if s.reversibility is Reversibility.IRREVERSIBLE else
                   "unclassified, not undoable" if s.reversibility is Unclassified.UNKNOWN
                   else "its undo did not succeed")
            out.append(f"{s.tool} (step {s.step}, {why})")
        elif s.status is StepStatus.IN_DOUBT:
            out.append(f"{s.tool} (step {s.step}, may have happened: its outcome is unknown)")
    return out


def rollback_note(undone: list[str], standing: list[str]) -> str:
    """What a rollback undid and what still stands, for the client."""
    text = (f"undone, last first: {', '.join(undone)}; their results no longer hold. "
            if undone else "nothing was undone. ")
    if standing:
        return text + f"Still standing, not undone: {', '.join(standing)}."
    return text + "Nothing else this session changed still stands."
