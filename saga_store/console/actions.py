"""Acting on one saga from its page: approve or deny its gated step, resume or
resolve a stuck unwind, abort, acknowledge. Each goes through the function the
CLI command calls (``approvals.decide``, ``SagaStore.resume``,
``SagaStore.resolve``, ``SagaStore.abort``, ``attention.acknowledge``), so it
is checked and recorded as the CLI records it.

An action is confirmed on a page that says what it will do, and that page
carries the seq of the saga's last event: if the log moved on before the
confirmation arrives (another operator acted, the unwind went on), nothing is
done and the person is told to look again. Two people confirming at once:
the first is done, the second finds the log moved (or, racing the same
append, the library's compare-and-set refuses it). An abort is exempt from
the seq check (a running saga's log moves as its steps run; stopping it does
not depend on which step it is at).
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from saga_store import ConflictError, InvalidInput, SagaStore
from saga_store.approval import requests as approvals
from saga_store.approval.attention import acknowledge
from saga_store.protocol.state import fold

from . import effects
from .config import ConsoleConfig, check_name
from .render import page
from .sagas import saga_id_of
from .security import checked_form, operator_of
from .states import shown

log = logging.getLogger("saga_store.console")
MAX_WHY = 2000


def _action(request: Request) -> tuple[str, str]:
    sid, action = saga_id_of(request), request.path_params["action"]
    if action not in effects.ACTIONS:
        raise HTTPException(404, f"no action {action!r}; one of {', '.join(effects.ACTIONS)}")
    return sid, action


def _step(text: Any) -> int | None:
    text = str(text or "").strip()
    if not text:
        return None
    if not text.isdigit():
        raise HTTPException(400, "step: a step number")
    return int(text)


def _read(store: SagaStore, sid: str) -> tuple[Any, list[dict[str, Any]]]:
    bodies, _ = store.events.log.bodies_and_head(sid)
    if not bodies:
        raise HTTPException(404, f"no saga {sid}")
    return fold(sid, bodies), bodies


def _back(sid: str, **message: str) -> RedirectResponse:
    return RedirectResponse(f"/sagas/{sid}?{urlencode(message)}", 303)


async def confirm_page(request: Request) -> Response:
    """What the action will do, and the form that does it."""
    sid, action = _action(request)
    step = _step(request.query_params.get("step"))
    store: SagaStore = request.app.state.saga_store
    state, bodies = await run_in_threadpool(_read, store, sid)
    offer = effects.find(state, bodies, action, step)
    if offer is None:
        return _back(sid, error=f"{action} is not possible now: saga {sid} is "
                                f"{shown(state).text}; nothing was done")
    return page(request, "confirm.html", {
        "saga": state, "shown": shown(state), "offer": offer, "seq": state.seq,
        "needs_why": action in effects.NEEDS_WHY})


def recorded_name(config: ConsoleConfig, signed_in: str, typed: str) -> str:
    """Who to record: the name typed in the form; when a token or a proxy named
    someone else, both, so the log never hides who held the credential."""
    name = check_name(typed)
    if config.open_access or name == signed_in:
        return name
    return check_name(f"{name} (signed in as {signed_in})")


def perform(store: SagaStore, sid: str, action: str, step: int | None, by: str, why: str,
            seen_seq: int | None) -> str:
    """Do ``action`` as the CLI does; what was done. Raises :class:`InvalidInput`
    or :class:`ConflictError` when the saga's state no longer allows it."""
    state, bodies = _read(store, sid)
    if action != "abort" and seen_seq is not None and state.seq != seen_seq:
        raise InvalidInput(f"saga {sid} changed since this was confirmed (its log was at "
                           f"event {seen_seq}, it is at {state.seq}: it is now "
                           f"{shown(state).text}); nothing was done; look again")
    offer = effects.find(state, bodies, action, step)
    if offer is None:
        raise InvalidInput(f"{action} is not possible now: saga {sid} is "
                           f"{shown(state).text}; nothing was done")
    step = offer.step  # the step the confirmation named, or the one the state offers
    if action in ("approve", "deny"):
        assert step is not None  # offered only for a step waiting for approval
        approvals.decide(store, sid, step, grant=action == "approve", by=by, reason=why)
        return f"step {step} {'approved' if action == 'approve' else 'denied'} by {by}"
    if action == "resume":
        if not store.resume(sid, by=by, note=why or None):
            raise InvalidInput(f"saga {sid} is {store.state(sid).status}, not stuck; "
                               "nothing was done")
        return f"unwind resumed by {by}"
    if action == "resolve":
        assert step is not None  # offered only for the step the unwind is stuck on
        store.resolve(sid, step, by=by, note=why)
        return f"step {step} resolved by hand by {by}; the unwind goes on"
    if action == "abort":
        if not store.abort(sid, f"aborted by {by}: {why}"):
            raise InvalidInput(f"saga {sid} is {store.state(sid).status}, not going forward; "
                               "nothing was done")
        return f"aborted by {by}; unwinding"
    acknowledge(store.redis, sid, by, why)
    return f"acknowledged by {by}"


async def act(request: Request) -> Response:
    """Take a confirmed action (operators only: the guard refuses read-only sign-ins)."""
    form = await checked_form(request)
    sid, action = _action(request)
    step = _step(form.get("step"))
    why = str(form.get("why") or "").strip()
    seen = str(form.get("seq") or "")
    config: ConsoleConfig = request.app.state.config
    try:
        by = recorded_name(config, operator_of(request), str(form.get("by") or ""))
    except InvalidInput:
        return _back(sid, error=f"{action}: say who you are (your name, one line, 1-128 "
                                "characters); nothing was done")
    if action in effects.NEEDS_WHY and not why:
        return _back(sid, error=f"{action}: say why (it is recorded); nothing was done")
    if len(why) > MAX_WHY:
        return _back(sid, error=f"{action}: the reason is over {MAX_WHY} characters; "
                                "nothing was done")
    store: SagaStore = request.app.state.saga_store
    try:
        done = await run_in_threadpool(perform, store, sid, action, step, by, why,
                                       int(seen) if seen.lstrip("-").isdigit() else None)
    except (InvalidInput, ConflictError) as exc:
        return _back(sid, error=str(exc))
    log.info("console: saga %s: %s (%s)", sid, done, why or "no reason given")
    return _back(sid, done=f"saga {sid}: {done}")
