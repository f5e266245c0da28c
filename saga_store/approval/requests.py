"""Human approval of gated steps.

A gated step's worker appends ``approval_requested`` (with an impact preview),
adds the step to ``ss:approvals`` and lets the job go: nothing holds a worker
while a person decides. :func:`decide` appends ``approval_granted`` or
``approval_denied`` (who, and why) and queues the step again; the worker then
runs it, or fails it so the saga compensates. The sweeper turns approvals
past their deadline into denials ``by: timeout``. Deadlines are set and checked
by Redis's clock: the host that asks and the one whose sweeper looks need not
agree on the time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from saga_store.errors import ConflictError, FencedOff, InvalidInput, NoSuchSaga, no_such_saga
from saga_store.execution.enqueue import enqueue_step, server_ms
from saga_store.ids import check_saga_id
from saga_store.log.pipeline import lean
from saga_store.log.stream import SideWrite
from saga_store.protocol import build
from saga_store.protocol.delivery import denial
from saga_store.protocol.state import Status
from saga_store.protocol.vocab import Approval, Phase

__all__ = [
    "Pending",
    "deadline",
    "decide",
    "denial",
    "expire_due",
    "member",
    "pending",
    "preview", "request",
]

if TYPE_CHECKING:
    from saga_store.approval.policy import Verdict
    from saga_store.client.api import SagaStore
    from saga_store.log.store import ChainWriter

NO_DEADLINE = 2**52  # score of an approval that never times out
MAX_NAME = 128


@dataclass
class Pending:
    saga_id: str
    step: int
    preview: dict[str, Any]
    expires_ms: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"saga_id": self.saga_id, "step": self.step, "expires_ms": self.expires_ms,
                **self.preview}


def preview(tool: str, logged_args: dict[str, Any], reversibility: str,
            compensation: dict[str, Any] | None, verdict: Verdict,
            timeout_s: float) -> dict[str, Any]:
    """What a person sees before deciding (for a worker's step or a gateway's
    call alike): secrets masked, what would undo it, why it was gated."""
    args = {k: "***" if isinstance(v, dict) and "$secret" in v else v
            for k, v in logged_args.items()}
    out: dict[str, Any] = {
        "tool": tool, "args": args, "reversibility": reversibility,
        "compensation": compensation, "production": verdict.production,
        "reason": verdict.reason}
    if timeout_s:
        out["timeout_s"] = timeout_s
    return out


def request(writer: ChainWriter, step: int, tool: str, preview_data: dict[str, Any],
            timeout_s: float) -> None:
    """Ask a person about step ``step``: its ``approval_requested`` (forward phase
    only) and its place in ``ss:approvals``, in one round trip, for workers and
    gateways alike (after reading Redis's clock for the deadline). Raises as the
    append does (:class:`FencedOff` once unwinding began); a member whose append
    lost is dropped by the next decision or deadline. Of layout 3 the index is in
    the saga's slot: the append script lists the step itself, due by Redis's clock,
    so a request is never in the log without its deadline."""
    names, item = writer.store.keys, build.approval_requested(step, tool, preview_data)
    index, what = names.approvals(writer.saga_id), member(writer.saga_id, step)
    if names.bucketed:
        due = (int(timeout_s * 1000), "r") if timeout_s else (NO_DEADLINE, "")
        writer.append_many([item], phase=Phase.FORWARD,
                           side=[SideWrite("zadd", index, (what, *due))])
        return
    call = writer.prepare([item], phase=Phase.FORWARD)
    at = deadline(writer.store.redis, timeout_s)
    pipe = lean(writer.store.redis)
    queued = call.queue(pipe)
    pipe.zadd(index, {what: at})
    writer.applied(call, queued(pipe.execute(raise_on_error=False)))


def member(saga_id: str, step: int) -> str:
    return f"{saga_id}:{step}"


def deadline(client: Any, timeout_s: float) -> int:
    """The deadline of an approval asked now, by Redis's clock (no round trip
    without a timeout)."""
    return server_ms(client) + int(timeout_s * 1000) if timeout_s else NO_DEADLINE


def pending(store: SagaStore, limit: int = 1000) -> list[Pending]:
    """Approvals waiting for a decision, oldest deadline first."""
    out = []
    pipe: Any = store.redis.pipeline(transaction=False)
    for key in store.events.keys.all_approvals():
        pipe.execute_command("ZRANGE", key, 0, limit - 1, "WITHSCORES")
    rows = sorted((pair for got in pipe.execute() for pair in _pairs(got)),
                  key=lambda pair: pair[1])[:limit]
    for raw, score in rows:
        saga_id, _, step_s = raw.decode().rpartition(":")
        st = store.state(saga_id)
        step = st.steps.get(int(step_s))
        if step is None or step.approval is not Approval.REQUESTED \
                or st.status is not Status.RUNNING:
            continue
        data = step.approval_data or {}
        out.append(Pending(saga_id, int(step_s), dict(data),
                           None if score >= NO_DEADLINE else int(score)))
    return out


def decide(store: SagaStore, saga_id: str, step: int, *, grant: bool, by: str,
           reason: str = "", withdrawn: bool = False) -> None:
    """Record a person's decision on a pending approval and queue the step again.
    ``withdrawn``: no person decided; the caller that asked took its request back
    (recorded as a denial that says so)."""
    check_saga_id(saga_id)
    by = by.strip()
    if not by or len(by) > MAX_NAME or any(c in by for c in "\n\r"):
        raise InvalidInput(f"--by must name who decides (1-{MAX_NAME} characters, one line)",
                           field="by")
    if len(reason) > 2000:
        raise InvalidInput("the reason is over 2000 characters; shorten it", field="reason")
    for _ in range(5):
        st = store.state(saga_id)
        if st.seq < 0:
            raise NoSuchSaga(no_such_saga(saga_id))
        s = st.steps.get(step)
        if s is None or s.approval is not Approval.REQUESTED:
            state = ("no such step" if s is None else _decided(s.approval, s.approval_data)
                     if s.approval else "it never asked for one")
            raise InvalidInput(f"step {step} of saga {saga_id} has no pending approval "
                               f"({state}); 'saga approvals' lists the pending ones",
                               field="step")
        if st.status is not Status.RUNNING:
            raise InvalidInput(f"saga {saga_id} is {st.status}; there is nothing to approve")
        data: dict[str, Any] = {"by": by, "at_ms": int(time.time() * 1000)}
        if reason:
            data["reason"] = reason
        if withdrawn:
            data["withdrawn"] = True
        writer = store.events.writer(saga_id)
        try:
            writer.append_many([build.approval_decided(step, grant, data)],
                               phase=Phase.FORWARD)
        except FencedOff:
            raise InvalidInput(f"saga {saga_id} began unwinding; the step will not run",
                               ) from None
        except ConflictError:
            continue  # the log moved: read again and decide again
        trip = store.trip()
        trip.log.zrem(store.events.keys.approvals(saga_id), member(saga_id, step))
        # a worker's step: queue it again; a gateway, or an inline caller, watches the log
        if st.executor is None and not st.inline:
            enqueue_step(trip.queue, store.queue, saga_id, step, s.intent_seq,
                         s.idem_key or "", s.tool)
        trip.execute()
        return
    raise ConflictError(f"saga {saga_id} kept moving; try again")


def _decided(approval: Approval, approval_data: Any) -> str:
    """How a step's approval ended, for a refusal to decide it again."""
    decision = (approval_data or {}).get("decision")
    decision = decision if isinstance(decision, dict) else {}
    if decision.get("withdrawn"):
        return f"its request was withdrawn: {decision.get('reason') or 'no reason given'}"
    by = f" by {decision['by']}" if decision.get("by") else ""
    return f"already {approval}{by}"


def _pairs(rows: Any) -> list[tuple[bytes, float]]:
    """ZRANGE WITHSCORES as (member, score), whatever shape the client returned."""
    if rows and not isinstance(rows[0], list | tuple):
        rows = list(zip(rows[::2], rows[1::2], strict=True))
    return [(m, float(s)) for m, s in rows]


def expire_due(store: SagaStore, limit: int = 100, now_ms: int | None = None,
               buckets: list[int] | None = None) -> int:
    """Deny approvals past their deadline (``by: timeout``) by Redis's clock
    (``now_ms``, if the caller has just read it); returns how many. ``buckets``:
    of layout 3, look in those buckets' indexes only (a sweeper's share)."""
    now = server_ms(store.redis) if now_ms is None else now_ms
    pipe: Any = lean(store.redis)
    for key in store.events.keys.all_approvals(buckets):
        pipe.execute_command("ZRANGEBYSCORE", key, "-inf", now, "LIMIT", 0, limit)
    due: list[bytes] = [raw for got in pipe.execute() for raw in got][:limit]
    n = 0
    for raw in due:
        saga_id, _, step_s = raw.decode().rpartition(":")
        try:
            decide(store, saga_id, int(step_s), grant=False, by="timeout",
                   reason="no decision before the approval deadline")
            n += 1
        except InvalidInput:
            # already decided, or unwinding
            store.redis.zrem(store.events.keys.approvals(saga_id), raw)
    return n
