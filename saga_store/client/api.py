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
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

import orjson
import redis

from saga_store.approval.policy import Policy
from saga_store.client.saga import AsyncSaga, Saga
from saga_store.errors import (
    ConflictError,
    FencedOff,
    IntegrityError,
    InvalidInput,
    InvalidToolCall,
    StepPending,
    StoreUnavailable,
)
from saga_store.execution import jobs
from saga_store.execution.enqueue import (
    enqueue_compensation,
    enqueue_step,
    intent,
    now_ms,
    schedule,
)
from saga_store.execution.idempotency import DedupeRecords
from saga_store.execution.trip import Trip
from saga_store.faults import fault
from saga_store.ids import check_id, check_saga_id, plan_call_id, scoped_saga_id
from saga_store.log.pipeline import execute, lean
from saga_store.log.replicas import queue_wait, shortfall
from saga_store.log.store import EventStore, Opening
from saga_store.log.stream import SideWrite, body_and_hash
from saga_store.ops.cluster import is_cluster
from saga_store.ops.connection import connect, connect_queue
from saga_store.protocol import build, unwind
from saga_store.protocol.state import SagaState, Status, fold
from saga_store.protocol.vocab import Phase
from saga_store.settings import Settings
from saga_store.tools.registry import Registry
from saga_store.tools.secrets import Secrets

if TYPE_CHECKING:
    from saga_store.ops.metrics import Metrics

WAIT_SLICE_MS = 1000
CONFIRM_TTL_MS = 10_000  # the key a resend's WAIT is confirmed by: it only has to replicate
CONFIRM = "redis.call('SET', KEYS[1], '1', 'PX', ARGV[1]) return 1"
EXECUTORS = ("workers", "inline")


@dataclass
class _Planned:
    saga_id: str
    opening: Opening
    idem_key: str
    agent_id: str
    conversation_id: str | None
    plan: list[dict[str, Any]]  # as logged (secret arguments as salted digests)
    calls: list[tuple[Any, Any, str]]  # (spec, validated args, call id) of each step


def _masked(plan: Any) -> Any:
    """A logged plan with each secret argument's digest blanked (digests of two
    submits are salted apart)."""
    if not isinstance(plan, list):
        return plan
    return [{**step, "args": {k: "$secret" if isinstance(v, dict) and "$secret" in v else v
                              for k, v in (step.get("args") or {}).items()}}
            if isinstance(step, dict) else step for step in plan]


ON_WORKERS = ("this store's tools come from saga_registry and live in this process only: "
              "open the saga with executor='inline', or, to run them on workers (plans "
              "always are), declare them with @tool in a module the workers import "
              "(saga worker --tools) and build the store on Registry.from_modules")


class SagaStore:
    """A store, a registry and the step queue: everything an agent needs."""

    def __init__(self, client: redis.Redis, registry: Registry,
                 settings: Settings | None = None, *, queue: str = jobs.STEP_QUEUE,
                 invalid_call_limit: int = 2, metrics: Metrics | None = None,
                 policy: Policy | None = None, queues: redis.Redis | None = None) -> None:
        """``client`` holds the log; ``queues``, RQ's queues (default: ``client``, which
        must then be a standalone Redis: a Redis Cluster cannot hold them)."""
        if queues is None and is_cluster(client):
            raise StoreUnavailable(
                "the log is on a Redis Cluster, which cannot hold RQ's queues; give a "
                "standalone Redis for them (queues=, or SAGA_QUEUE_URL=redis://host:port/0)")
        self.queues = client if queues is None else queues
        self.settings = settings or Settings()
        self.registry = registry
        self.events = EventStore(client, self.settings)
        self.metrics = metrics
        self.events.log.metrics = metrics
        self.redis = client
        self.queue = queue
        self.invalid_call_limit = invalid_call_limit
        self.secrets = Secrets(client, self.settings.dedupe_ttl_s, self.events.log)
        self.dedupe = DedupeRecords(client, self.settings.dedupe_ttl_s)
        if policy is None:
            policy = (Policy.load(self.settings.policy_file) if self.settings.policy_file
                      else Policy.permissive())
        self.policy = policy
        self._runner: Any = None  # the in-process executor, made on first use
        self._recovered: set[str] = set()  # agents whose due sagas it recovered

    @classmethod
    def from_url(cls, url: str, registry: Registry, settings: Settings | None = None, *,
                 queue_url: str | None = None, **kwargs: Any) -> Self:
        """A store on ``url`` (the log: a Redis, or a ``redis+cluster://`` Redis
        Cluster), with RQ's queues on ``queue_url`` (default ``SAGA_QUEUE_URL``, else
        ``url`` itself; required with a cluster); settings from the environment
        (``SAGA_HMAC_KEY`` and the rest) unless given, so the client and the
        workers agree on how they chain."""
        client = connect(url)
        queues = connect_queue(client, url, queue_url)
        return cls(client, registry, settings or Settings.from_env(), queues=queues, **kwargs)

    def trip(self) -> Trip:
        """A round trip on the log and the queues (one pipeline when they are one Redis)."""
        return Trip(self.redis, self.queues)

    # -- sagas driven by the caller ---------------------------------------

    def saga(self, agent_id: str, *, conversation_id: str | None = None,
             saga_id: str | None = None, executor: str = "workers") -> Saga:
        """Open a saga; use it as a context manager (commit on exit, abort on error).

        ``executor="workers"`` (the default) hands each step to ``saga worker``
        processes; ``executor="inline"`` runs its steps and its unwind in this
        process, through the workers' own drivers (same log, dedupe, leases and
        compensation), so an agent can be tried with no worker running. Should
        this process die, any worker's sweeper, or the next process's
        :meth:`recover`, finishes the saga from the log.

        The caller holds the saga's client lease (``SAGA_CLIENT_LEASE_S``, default
        300 s): each call renews it, and so does waiting for a call's outcome. A
        caller that goes quiet for longer (killed, or thinking: call
        :meth:`Saga.keepalive`) is taken for gone, and a worker's sweeper aborts
        the saga and unwinds what ran."""
        if executor not in EXECUTORS:
            raise InvalidInput(f"executor {executor!r}: use one of {', '.join(EXECUTORS)}",
                               field="executor")
        if self.registry.inline_only and executor != "inline":
            raise InvalidInput(ON_WORKERS, field="executor")
        inline = self._inline(agent_id) if executor == "inline" else None
        sid = check_saga_id(saga_id) if saga_id else scoped_saga_id(agent_id)
        opening = self.events.prepare_open(agent_id, saga_id=sid,
                                           conversation_id=conversation_id,
                                           data={"client_lease_ms": self.client_lease_ms,
                                                 **({"runner": "inline"} if inline else {})},
                                           side=self.driver_lease(sid))
        # in ss:active from its first event: should the caller die at once, the
        # sweeper still finds it when the client lease lapses
        pipe = lean(self.redis)
        schedule(pipe, self.events.keys, sid, self.client_lease_ms + 1000, nx=True)
        queued = opening.call.queue(pipe)
        replies = pipe.execute(raise_on_error=False)
        added, reply = replies[0], queued(replies)
        if opening.refused(reply):
            if added:
                self.redis.zrem(self.events.keys.active(sid), sid)
            raise InvalidInput(f"saga {sid} already exists; choose another id or omit it",
                               field="saga_id")
        writer = opening.applied(reply)
        state = SagaState(sid, agent_id=agent_id, conversation_id=conversation_id,
                          seq=writer.head.seq, head_hash=writer.head.hash)
        return Saga(self, writer, state, inline)

    def attach(self, saga_id: str, *, executor: str = "workers") -> Saga:
        """Re-open a client-driven saga from any process: the framework's own state
        (a checkpoint, a run state, a saved history) named it, and its calls go on here.

        A saga still going forward is taken over: this handle holds the client lease
        from now on, and every handle before it (the process that opened it, an
        earlier attach) is fenced off, its next call refused with
        :class:`SagaTakenOver`. A saga that stopped going forward comes back as it
        is: calls it already logged answer from the log, new ones are refused.

        >>> saga = store.attach("shop_01J...")                       # doctest: +SKIP
        >>> saga.call("charge_payment", {...}, tool_call_id="call_2")  # doctest: +SKIP
        """
        if executor not in EXECUTORS:
            raise InvalidInput(f"executor {executor!r}: use one of {', '.join(EXECUTORS)}",
                               field="executor")
        check_saga_id(saga_id)
        state, writer = self.events.read_for_write(saga_id)  # NoSuchSaga if none
        if state.plan or state.executor is not None:
            raise InvalidInput(f"saga {saga_id} is not driven by a client (it is a "
                               f"{'plan the workers run' if state.plan else 'gateway saga'}); "
                               "nothing to attach", field="saga_id")
        inline = self._inline(state.agent_id or "") if executor == "inline" else None
        holder = 0
        if state.status is Status.RUNNING:
            meta = self.events.keys.meta(saga_id)
            holder = int(self.redis.hincrby(meta, "driver_gen", 1))
            pipe = lean(self.redis)
            # fences off the generation before, which fenced off the ones before it
            pipe.set(self.taken_key(saga_id, holder), "1",
                     px=int(self.settings.dedupe_ttl_s * 1000))
            for w in self.driver_lease(saga_id):  # the client lease is this caller's now
                getattr(pipe, w.op)(w.key, *w.args)
            pipe.execute()
        return Saga(self, writer, state, inline, holder=holder)

    async def aattach(self, saga_id: str, *, executor: str = "workers") -> AsyncSaga:
        """:meth:`attach` for asyncio: an :class:`AsyncSaga` entered already."""
        saga = await asyncio.to_thread(self.attach, saga_id, executor=executor)
        return AsyncSaga(self, saga.state.agent_id or "", {}, saga)

    def taken_key(self, saga_id: str, holder: int) -> str:
        """The key whose existence fences off every client-lease holder of ``saga_id``
        before generation ``holder`` (a process attached it as ``holder``)."""
        return f"{self.events.keys.driver(saga_id)}:taken:{holder}"

    def _inline(self, agent_id: str) -> Any:
        """This store's in-process runner; the first use for an agent recovers that
        agent's sagas that are due."""
        if self._runner is None:
            # the workers' own drivers (mypy checks them apart: they live in workers/)
            from saga_store.workers.inline import InlineRunner
            self._runner = InlineRunner(self, f"inline-{os.getpid()}")
        if agent_id not in self._recovered:
            self._recovered.add(agent_id)
            self.recover(agent_id)
        return self._runner

    def recover(self, agent_id: str) -> int:
        """Finish here what a dead process left of ``agent_id``'s sagas: one sweep of
        those that are due (their leases lapsed), running in this process what a
        worker's sweeper would have queued (a step to redeliver, an unwind, the
        abort of a saga whose caller is gone). Touches no other agent's saga and
        runs no queued job. Called by the first inline saga of an agent; call it
        again to wait out a lease. Returns how many steps and unwinds it ran."""
        from saga_store.workers.sweeper import Sweeper
        check_id(agent_id, "agent_id")
        self._recovered.add(agent_id)
        runner = self._inline(agent_id)
        return int(Sweeper(self, runner.steps.name, interval_s=0, here=runner,
                           agent=agent_id).sweep())

    @property
    def client_lease_ms(self) -> int:
        return int(self.settings.client_lease_s * 1000)

    def driver_lease(self, saga_id: str) -> list[SideWrite]:
        """The writes that (re)start a client-driven saga's caller lease, made with
        the append they ride on."""
        key = self.events.keys.driver(saga_id)
        return [SideWrite("set", key, ("1",)),
                SideWrite("pexpire", key, (self.client_lease_ms,))]

    def asaga(self, agent_id: str, **kwargs: Any) -> AsyncSaga:
        """The asyncio form: ``async with store.asaga(...) as saga: await saga.call(...)``."""
        return AsyncSaga(self, agent_id, kwargs)

    # -- plans the workers drive -------------------------------------------

    def submit(self, steps: Sequence[Mapping[str, Any]], *, agent_id: str,
               conversation_id: str | None = None, saga_id: str | None = None) -> str:
        """Submit a whole plan; workers run it to the end. Every step is validated
        first: one bad step and nothing is written.

        With ``saga_id``, submitting is idempotent: the same plan submitted again
        under the same id (after a "not confirmed" error, a lost reply, a crash)
        attaches to the saga that id names, if it stands, and returns its id; it
        never runs the plan twice. Another plan under a taken id is refused."""
        plan = self._validate(steps)
        return self._write([self._prepare(plan, agent_id, conversation_id, saga_id)])[0]

    def submit_many(self, plans: Sequence[Sequence[Mapping[str, Any]]], *, agent_id: str,
                    conversation_id: str | None = None) -> list[str]:
        """Submit several plans at once, as independent sagas; returns their ids in
        order. All are validated first (one bad step and nothing is written), then
        written in two round trips whatever their number."""
        valid = []
        for k, steps in enumerate(plans):
            try:
                valid.append(self._validate(steps))
            except InvalidInput as exc:
                raise InvalidInput(f"plans[{k}]: {exc}", field=f"plans[{k}]") from None
        return self._write([self._prepare(plan, agent_id, conversation_id, None)
                            for plan in valid])

    def _validate(self, steps: Sequence[Mapping[str, Any]]) -> list[tuple[Any, Any, str]]:
        """Each step's tool, validated arguments and call id; writes nothing."""
        if self.registry.inline_only:  # a plan is always run by workers
            raise InvalidInput(ON_WORKERS, field="steps")
        if not steps:
            raise InvalidInput("a plan needs at least one step", field="steps")
        plan = []
        for i, step in enumerate(steps):
            if not isinstance(step, Mapping):
                raise InvalidInput(f"steps[{i}] must be an object with tool and args")
            try:
                # arg-type: checked at run time
                spec = self.registry.get(step.get("tool"))  # type: ignore[arg-type]
                args = spec.validate(step.get("args", {}), self.settings.max_depth)
            except InvalidInput as exc:
                raise InvalidInput(f"steps[{i}]: {exc}", field=f"steps[{i}]") from None
            call_id = step.get("tool_call_id") or ""  # none: _prepare makes one per saga
            if call_id:
                check_id(call_id, f"steps[{i}].tool_call_id")
            plan.append((spec, args, call_id))
        return plan

    def _prepare(self, plan: list[tuple[Any, Any, str]], agent_id: str,
                 conversation_id: str | None, saga_id: str | None) -> _Planned:
        """A validated plan's opening, encoded (a plan with secrets gets its salt)."""
        sid = check_saga_id(saga_id) if saga_id else scoped_saga_id(agent_id)
        plan = [(s, a, c or plan_call_id(sid, n)) for n, (s, a, c) in enumerate(plan)]
        logged_plan: list[dict[str, Any]] = []
        secret_values: dict[int, dict[str, Any]] = {}
        # a new saga's salt: written with its opening, so a refused open writes none
        salt = os.urandom(16) if any(s.secret for s, _, _ in plan) else b""
        for n, (spec, args, call_id) in enumerate(plan):
            logged, values = Secrets.redact(args, spec.secret, salt)
            if values:
                secret_values[n] = values
            logged_plan.append({"tool": spec.name, "args": logged, "tool_call_id": call_id})
        first_spec, _, first_call_id = plan[0]
        first = intent(sid, 0, first_spec, logged_plan[0]["args"], first_call_id)
        opening = self.events.prepare_open(
            agent_id, saga_id=sid, conversation_id=conversation_id, data={"plan": logged_plan},
            then=[first], side=self.secrets.writes(sid, secret_values, salt or None))
        return _Planned(sid, opening, first[1]["idem_key"], agent_id, conversation_id,
                        logged_plan, plan)

    def _write(self, planned: list[_Planned]) -> list[str]:
        # in ss:active before they exist, in the opens' round trip: should this
        # process die after an open, the sweeper finds it. NX: a saga that is
        # already there (an id taken, this open refused) keeps its own schedule
        ahead = lean(self.redis)
        look_after = 2 * self.settings.lease_ms
        added_at = []
        for p in planned:
            added_at.append(len(ahead))
            schedule(ahead, self.events.keys, p.saga_id, look_after, nx=True)
        queued = [p.opening.call.queue(ahead) for p in planned]
        replies = ahead.execute(raise_on_error=False)
        for got in replies[:queued[0].at if queued else None]:  # the schedules'
            if isinstance(got, Exception):
                raise got
        opened = [q(replies) for q in queued]
        taken = [p for p, got in zip(planned, opened, strict=True) if p.opening.refused(got)]
        if taken:  # only ids a caller chose can be taken: submit, one plan
            for p, k in zip(planned, added_at, strict=True):
                if p in taken and replies[k]:
                    self.redis.zrem(self.events.keys.active(p.saga_id), p.saga_id)
            if len(planned) == 1:
                # the same plan sent again attaches only to a saga a replica holds: one
                # on the master only (its first send not confirmed) is not confirmed
                # now either, and one gone by the time it is read was lost in a failover
                unconfirmed = self._confirm_standing(taken[0].saga_id) \
                    if self.events.log.settings.wait_replicas else None
                if unconfirmed is not None:
                    raise unconfirmed
                standing = self._resubmitted(taken[0])
                if standing is None:
                    raise StoreUnavailable(
                        f"submit of {taken[0].saga_id} is not confirmed: the saga refused "
                        "this open as one that stands and was gone when read (a failover "
                        f"lost it); submit again with saga_id={taken[0].saga_id}")
                if standing:
                    return [taken[0].saga_id]  # it stands: its workers or sweeper drive it
            raise InvalidInput(f"saga {taken[0].saga_id} already exists with another plan; "
                               "choose another id or omit it (nothing was written)",
                               field="saga_id")
        fault("submit_between")
        # the ledger entries go with the first jobs, chained by a sweeper of the
        # workers that run the plans; a process killed before this round trip owes
        # them, and a sweeper pays from the log (the opening recorded the debt)
        trip = self.trip()
        for p, got in zip(planned, opened, strict=True):
            writer = p.opening.applied(got, trip.log, defer_ledger=True)
            enqueue_step(trip.queue, self.queue, p.saga_id, 0, writer.head.seq, p.idem_key,
                         p.plan[0]["tool"])
        execute(trip, *(p.opening.ledger_written for p in planned))
        return [p.saga_id for p in planned]

    def _confirm_standing(self, saga_id: str) -> StoreUnavailable | None:
        """Whether the replicas hold a saga whose open this client's resend found
        standing: a write under the saga's hash tag, then a WAIT on that connection.
        A refused open writes nothing, and a WAIT covers only what its connection
        wrote (a resend's connection is usually a new one); once a replica has this
        write it has everything the master had before it, the saga's opening among
        it. The error it amounts to when they do not, or None."""
        pipe = lean(self.redis)
        # a script, as any write of an agent's user to its own keys
        pipe.eval(CONFIRM, 1, self.events.keys.base(saga_id) + ":confirm", CONFIRM_TTL_MS)
        queue_wait(pipe, self.events.log.settings)
        return shortfall(saga_id, pipe.execute(raise_on_error=False)[-1],
                         self.events.log.settings)

    def _resubmitted(self, p: _Planned) -> bool | None:
        """Whether the saga ``p`` names was opened by this very plan (the same agent,
        conversation, tools, arguments and call ids): a submit sent again. Secret
        arguments are compared under the saga's own salt while the saga keeps it
        (until it closes); after that, a plan that differs only in a secret is the
        same plan, and the closed saga's id is returned. None: there is no such
        saga (any more)."""
        rows = next(self.events.log.pages(p.saga_id, 0, page=1), [])
        if not rows:
            return None
        first = orjson.loads(body_and_hash(rows[0][1])[0])
        data = first.get("data") or {}
        if first.get("agent_id") != p.agent_id or \
                data.get("conversation_id") != p.conversation_id:
            return False
        kept = self.redis.hget(self.events.keys.secrets(p.saga_id), "_salt")
        salt = kept if isinstance(kept, bytes) else None
        ours = [{**step, "args": Secrets.redact(args, spec.secret, salt)[0]} if salt else step
                for step, (spec, args, _) in zip(p.plan, p.calls, strict=True)]
        return _masked(data.get("plan")) == _masked(ours) if not salt else \
            data.get("plan") == ours

    def wait(self, saga_id: str, timeout: float | None = None) -> SagaState:
        """Block until the saga is final (committed, compensated, needs attention)
        or stuck; returns its state. Raises :class:`StepPending` on timeout."""
        check_saga_id(saga_id)
        state = fold(saga_id, self.events.log.bodies(saga_id))
        return self.follow(state, lambda st: st.final or st.status is Status.STUCK, timeout)

    def follow(self, state: SagaState, done: Any, timeout: float | None,
               tick: Any = None) -> SagaState:
        """Apply new events of ``state``'s saga until ``done(state)``; XREAD BLOCK.
        ``tick`` is called about once a second while waiting."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done(state):
            if tick is not None:
                tick()
            left_ms = WAIT_SLICE_MS if deadline is None else \
                int(min(WAIT_SLICE_MS, (deadline - time.monotonic()) * 1000))
            if left_ms <= 0:
                raise StepPending(f"saga {state.saga_id} did not get there within {timeout}s; "
                                  "is 'saga worker' running?")
            link = self.events.log.chain.link
            for entry in self.events.log.wait(state.saga_id, state.seq, left_ms):
                if state.head_hash and link(state.head_hash, entry.body) != entry.hash:
                    raise IntegrityError(
                        f"saga {state.saga_id}: an event at seq {state.seq + 1} does not link "
                        "under this store's key: the workers chain with another SAGA_HMAC_KEY "
                        "(or none), or the log was forged; give every process the same key, "
                        f"then run 'saga verify --saga {state.saga_id}'")
                state.apply(orjson.loads(entry.body))
                state.head_hash = entry.hash
        return state

    def state(self, saga_id: str) -> SagaState:
        return self.events.state(saga_id)

    def abort(self, saga_id: str, reason: str = "aborted", *, queue: bool = True) -> bool:
        """Start unwinding a saga that is still going forward; False if it was not.
        Raises :class:`NoSuchSaga` (writing nothing) for an id that names no saga.
        ``queue=False``: the caller runs the unwind itself (the inline executor)."""
        self.events.require(saga_id)
        self._run_by_workers(saga_id, "end it from its client with the saga_abort tool, or "
                                      "stop its gateway: the next gateway for that server "
                                      "rolls back a session left with a call unsettled")
        writer = self.events.writer(saga_id)
        for _ in range(20):
            try:
                writer.append_many([build.saga_failed(reason)], phase=Phase.FORWARD)
            except FencedOff:
                return False
            except ConflictError:
                continue
            if queue:
                enqueue_compensation(self.queues, saga_id)
            return True
        raise ConflictError(f"saga {saga_id} kept changing; try the abort again")

    def _run_by_workers(self, saga_id: str, instead: str,
                        state: SagaState | None = None) -> None:
        """Refuse to hand a saga the MCP gateway runs to the workers' compensator: only
        a gateway can undo its calls, through the downstream server."""
        executor = (state or self.state(saga_id)).executor
        if executor is not None:
            raise InvalidInput(f"saga {saga_id} is run by the MCP gateway ({executor}), not "
                               f"by workers; {instead}", field="saga_id")

    def resume(self, saga_id: str, *, by: str | None = None, note: str | None = None) -> bool:
        """Try a stuck saga's unwind again (after its cause was fixed); False if not stuck.
        ``by`` and ``note`` (who resumed it, and why) go into the ``saga_resumed``
        event. Raises :class:`NoSuchSaga` (writing nothing) for an id that names no
        saga, :class:`InvalidInput` for a note over 2000 characters."""
        if note is not None and len(note) > 2000:
            raise InvalidInput("--note: at most 2000 characters")
        for _ in range(20):
            state, writer = self.events.read_for_write(saga_id)
            if state.status is not Status.STUCK:
                return False
            self._run_by_workers(saga_id, "start 'saga mcp-guard' for its server again: a "
                                          "gateway finishes the unwinds it finds before serving",
                                 state)
            try:
                writer.append_many([build.saga_resumed(state.reason, by, note)])
                break
            except ConflictError:
                continue  # someone else resumed or resolved it meanwhile: decide again
        else:
            raise ConflictError(f"saga {saga_id} kept changing; try again")
        trip = self.trip()
        schedule(trip.log, self.events.keys, saga_id, 2 * self.settings.lease_ms)
        enqueue_compensation(trip.queue, saga_id)
        trip.execute()
        return True

    def resolve(self, saga_id: str, step: int, *, by: str, note: str) -> None:
        """Record that a person settled step ``step``'s compensation by hand (the
        unwind is stuck on it: a mapping that cannot resolve, a compensation that
        keeps failing), then let the unwind go on. The saga then ends
        ``needs_attention``, naming the step, for the person to acknowledge."""
        self.events.require(saga_id)
        if not note.strip() or len(note) > 2000:
            raise InvalidInput("--note must say what was done by hand (1-2000 characters)",
                               field="note")
        for _ in range(20):
            state, writer = self.events.read_for_write(saga_id)
            why = unwind.resolvable(state, step)
            if why is not None:
                raise InvalidInput(why, field="step")
            try:
                writer.append_many([build.compensation_resolved(step, by, note, now_ms()),
                                    build.saga_resumed(state.reason)], phase=Phase.UNWINDING)
            except ConflictError:
                continue  # the log moved (a late duplicate's note): decide again
            if state.executor is None:  # a gateway finishes its own unwinds
                trip = self.trip()
                schedule(trip.log, self.events.keys, saga_id, 2 * self.settings.lease_ms)
                enqueue_compensation(trip.queue, saga_id)
                trip.execute()
            return
        raise ConflictError(f"saga {saga_id} kept changing; try again")


__all__ = ["AsyncSaga", "InvalidToolCall", "Saga", "SagaStore"]
