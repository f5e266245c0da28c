"""What every framework adapter shares; each framework module is glue around it.

* which registered tools the model sees (:func:`exposed`) and their JSON
  schemas (:func:`tool_defs`, from :meth:`Registry.schemas`);
* running one model tool call as the saga's next step (:meth:`SagaCalls.run`):
  an invalid call is a repair request, a failed or in-doubt step waits for the
  unwind and becomes a result that says what failed and what was rolled back;
* approval gates: whether the policy gates a call (:meth:`SagaCalls.gated`)
  and recording a person's decision in the chain when the worker asks;
* what a call that did not complete tells the model (:func:`failure_text`).

The rollback-aware rewrite of a history, and the step id of a framework's call
id, are :mod:`saga_store.integrations._rewrite`'s; finding a run's saga again
from the framework's own state is :mod:`saga_store.integrations._session`'s.
"""

from __future__ import annotations

import asyncio
import getpass
import logging
import os
import threading
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from saga_store import (
    AsyncSaga,
    InvalidInput,
    Registry,
    Saga,
    SagaAborted,
    SagaError,
    SagaState,
    Status,
    StepError,
    StepPending,
)
from saga_store.approval import requests as _approvals
from saga_store.approval.policy import Decision
from saga_store.client.context import closing_note, step_views
from saga_store.integrations._rewrite import step_call_id
from saga_store.integrations.native import refuse_on_workers
from saga_store.tools.spec import ToolSpec

log = logging.getLogger("saga_store.integrations")

FAILURE_MODES = ("result", "raise")
DEFAULT_UNWIND_WAIT_S = 300.0
APPROVAL_WAIT_S = 24 * 3600.0  # a gate with no deadline: how long a call waits for a person


@dataclass(frozen=True)
class Approval:
    """A person's decision on a gated call, as the framework collected it."""

    grant: bool
    by: str
    reason: str = ""


@dataclass
class Outcome:
    """What one tool call gives back to the model."""

    text: str                       # the tool result the model reads
    ok: bool                        # the step succeeded
    retry: bool = False             # the arguments were refused: ask the model to repair
    result: dict[str, Any] | None = None
    error: Exception | None = None


def operator() -> str:
    """Who decides when the framework did not say: ``SAGA_OPERATOR``, else the login."""
    by = os.environ.get("SAGA_OPERATOR", "").strip()
    if not by:
        try:
            by = getpass.getuser()
        except (KeyError, OSError):
            by = "operator"
    return by[:128]


def sync_saga(saga: Saga | AsyncSaga) -> Saga:
    """The caller-driven saga behind a ``Saga`` or an entered ``AsyncSaga``."""
    if isinstance(saga, AsyncSaga):
        if saga.saga is None:
            raise InvalidInput("enter the AsyncSaga first: 'async with store.asaga(...) as saga'")
        return saga.saga
    return saga


def exposed(registry: Registry, names: Iterable[str] | None = None) -> list[ToolSpec]:
    """The tools the model may call: ``names`` (in that order), or by default every
    registered tool that is not a compensation or a probe of another tool (those
    only run on the saga's behalf)."""
    if names is not None:
        return [registry.get(n) for n in names]
    behind = {s.compensation for s in registry} | {s.probe for s in registry}
    return [s for s in registry if s.name not in behind]


def tool_defs(registry: Registry, specs: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """``{"name", "description", "parameters"}`` per tool, from the registry's own
    OpenAI schema export (the description says whether the call can be undone)."""
    wanted = {s.name for s in specs}
    by_name = {d["function"]["name"]: d["function"] for d in registry.schemas("openai")
               if d["function"]["name"] in wanted}
    return [{"name": s.name, "description": by_name[s.name]["description"],
             "parameters": by_name[s.name]["parameters"]} for s in specs]


def gated(store: Any, tool: str, args: Any) -> dict[str, Any] | None:
    """The impact preview if ``store``'s policy wants a person to approve this call
    (the same decision a worker's gate makes), else None. Arguments that do not
    validate are not gated: the call will come back to the model for repair."""
    try:
        spec = store.registry.get(tool)
        validated = spec.validate(args, store.settings.max_depth)
    except InvalidInput:
        return None
    # secrets are masked as in the log: the policy never sees their values
    logged = {k: ({"$secret": "masked"} if k in spec.secret else v)
              for k, v in validated.items()}
    policy = store.policy
    verdict = policy.decide(spec.name, str(spec.reversibility), logged,
                            Decision(spec.approval) if spec.approval else None)
    if verdict.decision is not Decision.REQUIRE_APPROVAL:
        return None
    undo = ({"tool": spec.compensation, "mapping": dict(spec.mapping)}
            if spec.compensation else None)
    return _approvals.preview(spec.name, logged, str(spec.reversibility), undo, verdict,
                              policy.approval_timeout_s)


class SagaCalls:
    """One saga's tool calls as a framework makes them. Use :func:`calls_for`, so
    a saga's tools, history hook and approval helpers share one instance."""

    def __init__(self, saga: Saga, *, on_failure: str = "result",
                 unwind_wait_s: float = DEFAULT_UNWIND_WAIT_S) -> None:
        if on_failure not in FAILURE_MODES:
            raise InvalidInput(f"on_failure must be one of {FAILURE_MODES}, got {on_failure!r}")
        refuse_on_workers(saga.store.registry, saga.inline is not None)
        self.saga, self.store = saga, saga.store
        self.on_failure, self.unwind_wait_s = on_failure, unwind_wait_s
        self.final: SagaState | None = None  # the saga's state once it stopped going forward
        self.approvals: dict[str, Approval] = {}  # step call id -> a decision made ahead
        # frameworks run a reply's calls concurrently (threads, tasks); a Saga is
        # driven by one caller at a time, and its steps run one at a time anyway
        self._turn = threading.Lock()

    @property
    def saga_id(self) -> str:
        return self.saga.saga_id

    # -- approval gates ----------------------------------------------------

    def gated(self, tool: str, args: Any) -> dict[str, Any] | None:
        """The impact preview if the saga's policy wants a person to approve this call
        (the same decision a worker's gate makes), else None. Arguments that do not
        validate are not gated: the call will come back to the model for repair."""
        return gated(self.store, tool, args)

    def decide_ahead(self, framework_call_id: str, approval: Approval) -> None:
        """Remember a decision the framework collected before the call runs."""
        cid = step_call_id(framework_call_id)
        assert cid is not None
        self.approvals[cid] = approval

    # -- running calls -----------------------------------------------------

    def run(self, tool: str, args: Any, framework_call_id: str | None,
            approval: Approval | None = None, *, approved_by_framework: bool = False,
            ) -> Outcome:
        """Run one model tool call as the saga's next step (blocking).

        ``approval``: the person's decision on a gated call (else one given to
        :meth:`decide_ahead`); it is recorded in the chain (``approval_granted`` /
        ``approval_denied``, with who) as soon as the worker's gate asks.
        ``approved_by_framework``: the framework ran the call only after its own
        approval, so with no decision on record it counts as granted by
        :func:`operator`. A gated call with no decision waits for one made elsewhere
        (``saga approve``), up to the policy's approval timeout.

        Invalid arguments come back as ``retry``; a failed or in-doubt step (or a
        saga no longer going forward) waits for the unwind and comes back as a
        result saying what failed and what was rolled back, or is raised with
        ``on_failure="raise"``.
        """
        with self._turn:
            return self._run(tool, args, step_call_id(framework_call_id), approval,
                             approved_by_framework)

    def _run(self, tool: str, args: Any, cid: str | None, approval: Approval | None,
             approved_by_framework: bool) -> Outcome:
        if approval is None and cid is not None:
            approval = self.approvals.pop(cid, None)
        timeout = None
        if approval is None and self.gated(tool, args) is not None:
            if approved_by_framework:
                approval = Approval(True, operator())
            else:  # a person decides elsewhere: wait as long as the gate does
                timeout = self.store.policy.approval_timeout_s or APPROVAL_WAIT_S
                timeout += self.store.registry.get(tool).timeout + 30
        closed = self.saga.state.status is not Status.RUNNING  # before this call
        try:
            if approval is None:
                result = self.saga.call(tool, args, tool_call_id=cid, timeout=timeout)
            else:
                result = self._call_deciding(tool, args, cid, approval)
        except InvalidInput as exc:  # InvalidToolCall, an unknown tool: nothing was written
            return Outcome(text=str(exc), ok=False, retry=True, error=exc)
        except (StepError, SagaAborted) as exc:  # StepInDoubt is a StepError
            final = self.settle()
            if self.on_failure == "raise":
                raise
            return Outcome(text=failure_text(final, cid, tool, exc, closed=closed), ok=False,
                           error=exc)
        return Outcome(text=orjson.dumps(result).decode(), ok=True, result=result)

    async def arun(self, tool: str, args: Any, framework_call_id: str | None,
                   approval: Approval | None = None, *, approved_by_framework: bool = False,
                   ) -> Outcome:
        """:meth:`run` on a worker thread, so the event loop is never stalled."""
        return await asyncio.to_thread(self.run, tool, args, framework_call_id, approval,
                                       approved_by_framework=approved_by_framework)

    def settle(self) -> SagaState:
        """Wait for the unwind to finish (``store.wait``) and keep the final state."""
        try:
            self.final = self.store.wait(self.saga_id, timeout=self.unwind_wait_s)
        except StepPending:  # still unwinding: tell what is known now
            self.final = self.store.state(self.saga_id)
        return self.final

    def states(self) -> list[SagaState]:
        """The states a history hook rewrites with: the saga's, once it stopped going
        forward (until then nothing it did was rolled back, so no read is needed)."""
        if self.final is not None and self.final.status is not Status.COMPENSATING:
            return [self.final]
        if self.saga.state.status is Status.RUNNING and self.final is None:
            return []
        return [self.settle()]

    def _call_deciding(self, tool: str, args: Any, cid: str | None,
                       approval: Approval) -> dict[str, Any]:
        """``saga.call`` while a watcher records ``approval`` once the gate asks."""
        stop = threading.Event()
        watcher = threading.Thread(target=self._decide_when_asked, args=(cid, approval, stop),
                                   name=f"saga-approval-{self.saga_id}", daemon=True)
        watcher.start()
        try:
            return self.saga.call(tool, args, tool_call_id=cid)
        finally:
            stop.set()
            watcher.join()

    def _decide_when_asked(self, cid: str | None, approval: Approval,
                           stop: threading.Event) -> None:
        state = self.store.state(self.saga_id)  # its own fold: the caller's is being applied

        def asked(s: SagaState) -> bool:
            return stop.is_set() or s.status is not Status.RUNNING or \
                _requested(s, cid) is not None

        while not stop.is_set():
            try:
                self.store.follow(state, asked, timeout=0.25)
            except StepPending:
                continue  # look at the stop flag, then wait again
            step = _requested(state, cid)
            if step is None:
                return
            try:
                _approvals.decide(self.store, self.saga_id, step, grant=approval.grant,
                                  by=approval.by, reason=approval.reason)
            except SagaError as exc:  # decided meanwhile, unwinding, or the log kept moving
                log.warning("saga %s step %d: the decision was not recorded: %s",
                            self.saga_id, step, exc)
            return


def _requested(state: SagaState, cid: str | None) -> int | None:
    for n in sorted(state.steps, reverse=True):
        st = state.steps[n]
        if st.tool_call_id == cid and st.approval == "requested":
            return n
    return None


_CALLS: weakref.WeakKeyDictionary[Saga, SagaCalls] = weakref.WeakKeyDictionary()
_CALLS_LOCK = threading.Lock()


def calls_for(saga: Saga | AsyncSaga, **options: Any) -> SagaCalls:
    """The :class:`SagaCalls` of ``saga`` (one per saga; options apply when given)."""
    sync = sync_saga(saga)
    with _CALLS_LOCK:
        calls = _CALLS.get(sync)
        if calls is None:
            calls = _CALLS[sync] = SagaCalls(sync, **options)
        else:
            for name, value in options.items():
                if name == "on_failure" and value not in FAILURE_MODES:
                    raise InvalidInput(f"on_failure must be one of {FAILURE_MODES}")
                setattr(calls, name, value)
    return calls


def failure_text(final: SagaState, cid: str | None, tool: str, exc: Exception, *,
                 closed: bool = False) -> str:
    """The result of a call that did not complete: what failed and what was rolled back.
    ``closed``: the saga had stopped going forward before the call was made."""
    view = next((v for v in step_views(final) if v["tool_call_id"] == cid), None)
    if view is not None and view["status"] in ("failed", "in_doubt"):
        what = f"{tool} did not complete ({view['result']})."
    elif view is not None and view["status"] == "retracted":  # sent again after its undo
        what = view["result"]
    elif isinstance(exc, SagaAborted) and closed:
        what = (f"{tool} was not run: saga {final.saga_id} "
                f"{'was rolled back' if final.final else 'is being rolled back'} and takes "
                "no more calls; tell the user what was undone and let them decide whether "
                "to start over.")
    elif isinstance(exc, SagaAborted):
        what = f"{tool} was not run: {exc}."
    else:
        what = f"{tool} did not complete: {exc}."
    note = closing_note(final) or f"Saga {final.saga_id} is {final.status}."
    return f"{what} {note}"
