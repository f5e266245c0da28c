"""Sagas for a framework run that may resume somewhere else.

A framework persists its own state (a LangGraph checkpoint, an OpenAI Agents
``RunState``, a saved message list) and resumes from it, possibly in another
process, possibly hours later, sending the calls it had not seen answered again
with the same ids. A :class:`SagaSession` finds the saga those calls belong to
from that state alone:

* a saga the session opens is named after its first call's id
  (:func:`saga_id_for`), so the id is in the framework's history as soon as the
  model made the call, before anything ran: a process killed during the very
  first call is resumed into the same saga, never a second one;
* an adapter that can store the id in the framework's state (a LangGraph
  ``ToolMessage``'s artifact, a Pydantic AI part's metadata) does; a resume
  attaches that saga (``store.attach``: the client lease moves here, the dead or
  old process is fenced off), and the saga's log answers every call it has.

After a rollback, a call the saga has not seen is refused with a sentence saying
so (``on_rollback="refuse"``), or opens the next saga (``"new_saga"``).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable
from types import TracebackType
from typing import Any, Self

from saga_store import InvalidInput, Saga, SagaState, SagaStore, Status
from saga_store.errors import SagaTakenOver
from saga_store.ids import SCOPED_AGENT
from saga_store.integrations._common import (
    DEFAULT_UNWIND_WAIT_S,
    Approval,
    SagaCalls,
    calls_for,
)
from saga_store.integrations._rewrite import step_call_id
from saga_store.integrations.native import refuse_on_workers

ON_ROLLBACK = ("refuse", "new_saga")
DEFAULT_APPROVAL_TIMEOUT_S = 3600.0  # a parked saga's lease, when the policy sets none


def saga_id_for(agent_id: str, conversation_id: str | None, first_call_id: str) -> str:
    """The id of the saga a session opens at the call ``first_call_id``: in the
    agent's namespace when it has one, the same in every process. Providers make
    call ids unique; the conversation (a LangGraph thread) keeps apart runs of
    scripted models that reuse theirs."""
    digest = hashlib.sha256(f"{agent_id}\0{conversation_id or ''}\0{first_call_id}"
                            .encode()).hexdigest()[:32]
    return f"{agent_id}_c{digest}" if SCOPED_AGENT.fullmatch(agent_id) else f"c{digest}"


class SagaSession:
    """The sagas of one framework run (and of its resumes), opened on the first tool
    call; a context manager that commits the saga going forward on exit (aborts it
    on an exception).

    >>> with SagaSession(store, agent_id="shop") as session:          # doctest: +SKIP
    ...     app = graph.compile(checkpointer=saver)   # saga_tool_node(session)
    ...     app.invoke(inputs, config)                 # or app.invoke(None, config)
    """

    def __init__(self, store: SagaStore, agent_id: str, *, conversation_id: str | None = None,
                 executor: str = "workers", on_rollback: str = "refuse",
                 on_failure: str = "result",
                 unwind_wait_s: float = DEFAULT_UNWIND_WAIT_S) -> None:
        if on_rollback not in ON_ROLLBACK:
            raise InvalidInput(f"on_rollback must be one of {ON_ROLLBACK}, got {on_rollback!r}",
                               field="on_rollback")
        refuse_on_workers(store.registry, executor == "inline")
        self.store, self.agent_id = store, agent_id
        self.conversation_id, self.executor = conversation_id, executor
        self.on_rollback = on_rollback
        self.options: dict[str, Any] = {"on_failure": on_failure,
                                        "unwind_wait_s": unwind_wait_s}
        self.current: SagaCalls | None = None
        self.sagas: list[str] = []  # every saga this session drove, in order
        self._known: dict[str, SagaCalls] = {}
        self.parked: set[str] = set()  # calls waiting for a person's decision
        self.approvals: dict[str, Approval] = {}  # decisions made before the saga is bound
        self._lock = threading.Lock()

    @property
    def saga_id(self) -> str | None:
        return None if self.current is None else self.current.saga_id

    def calls(self, call_id: str | None, history: Iterable[str | None] = (),
              recorded: str | None = None) -> SagaCalls:
        """The calls of the saga ``call_id`` belongs to: the one the framework's state
        names (``recorded``, else a saga named after a call id of ``history``, newest
        first), else the session's own; opened at this call when there is none yet,
        or, with ``on_rollback="new_saga"``, when the current one was rolled back
        and has not seen this call."""
        with self._lock:
            found = recorded or self._named_in([call_id, *reversed(list(history))])
            if found is not None and found != self.saga_id and found not in self._known:
                self._use(self.store.attach(found, executor=self.executor))
            # a call sent again: the saga that logged it answers
            chosen = next((c for c in self._known.values() if self.logged(c, call_id)), None)
            if chosen is None:
                if self.current is None or (self.on_rollback == "new_saga"
                                            and not self._forward(self.current)):
                    self._open(call_id)
                chosen = self.current
            assert chosen is not None
            chosen.approvals.update(self.approvals)
            self.approvals.clear()
            return chosen

    def states(self) -> list[SagaState]:
        """What a history hook rewrites with: the state of every saga this session
        drove that stopped going forward (after ``on_rollback="new_saga"``, the
        rolled-back one's calls stay rolled back while the next saga runs)."""
        with self._lock:
            known = [self._known[sid] for sid in dict.fromkeys(self.sagas)]
        return [state for calls in known for state in calls.states()]

    def found(self, history: Iterable[str | None]) -> SagaCalls | None:
        """The calls of the saga a resumed history belongs to, without opening one:
        the session's own, else the newest saga named after a call id of ``history``
        (attached), else None. For a framework that resumes by calling the model
        again, with no tool call to bind the saga first."""
        with self._lock:
            if self.current is None:
                found = self._named_in(reversed(list(history)))
                if found is not None:
                    self._use(self.store.attach(found, executor=self.executor))
            return self.current

    def _named_in(self, call_ids: Iterable[str | None]) -> str | None:
        """The newest saga named after one of ``call_ids`` (one round trip)."""
        ids = [saga_id_for(self.agent_id, self.conversation_id, c) for c in call_ids if c]
        if not ids:
            return None
        pipe = self.store.redis.pipeline(transaction=False)
        for sid in ids:
            pipe.exists(self.store.events.keys.log(sid))
        return next((sid for sid, n in zip(ids, pipe.execute(), strict=True) if n), None)

    def _open(self, call_id: str | None) -> None:
        sid = saga_id_for(self.agent_id, self.conversation_id, call_id) if call_id else None
        if sid is not None and self.store.events.exists(sid):
            self._use(self.store.attach(sid, executor=self.executor))
            return
        self._use(self.store.saga(self.agent_id, conversation_id=self.conversation_id,
                                  saga_id=sid, executor=self.executor))

    def _use(self, saga: Saga) -> None:
        self.current = self._known[saga.saga_id] = calls_for(saga, **self.options)
        self.sagas.append(saga.saga_id)

    @staticmethod
    def _forward(calls: SagaCalls) -> bool:
        return calls.final is None and calls.saga.state.status is Status.RUNNING

    @staticmethod
    def logged(calls: SagaCalls, call_id: str | None) -> bool:
        """Whether ``calls``' saga logged the call ``call_id``."""
        cid = step_call_id(call_id)
        return cid is not None and any(st.tool_call_id == cid
                                       for st in calls.saga.state.steps.values())

    def park(self, call_id: str) -> None:
        """The run stops until a person decides ``call_id``: its saga's client lease
        waits as long as the approval does (the policy's ``approval_timeout_s``,
        else an hour), and leaving the session commits nothing."""
        with self._lock:
            self.parked.add(call_id)
            if self.current is not None and self._forward(self.current):
                policy_s = self.store.policy.approval_timeout_s
                self.current.saga.park(policy_s or DEFAULT_APPROVAL_TIMEOUT_S)

    def unpark(self, call_id: str) -> None:
        with self._lock:
            self.parked.discard(call_id)

    # -- ending -----------------------------------------------------------------

    def commit(self) -> None:
        """Commit the saga going forward, if any (a rolled-back one stays as it is)."""
        with self._lock:
            if self.current is not None and self._forward(self.current):
                self.current.saga.commit()

    def abort(self, reason: str = "aborted by the caller") -> None:
        with self._lock:
            if self.current is not None and self._forward(self.current):
                self.current.saga.abort(reason)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if isinstance(exc, SagaTakenOver) or \
                (self.current is not None and self.current.saga.taken_over()):
            return  # another process drives the saga now
        if exc is None and self.parked:
            return  # the run waits for a person: its resume goes on with the saga
        if exc is None:
            self.commit()
        else:
            self.abort(f"{type(exc).__name__}: {exc}")
