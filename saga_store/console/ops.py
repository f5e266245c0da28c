"""Pages where a person acts: the approvals inbox, the attention list, the
verification status, and signing in. Every decision goes through the
library (``approvals.decide``, ``attention.acknowledge``) with the signed-in
operator's name, so it is recorded exactly as the CLI records it."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from saga_store import ConflictError, InvalidInput, SagaStore
from saga_store.approval import requests as approvals
from saga_store.approval.attention import acknowledge, needing_attention
from saga_store.ids import valid_id

from .masking import mask
from .render import flash, page
from .security import SESSION_COOKIE, checked_form, operator_of, safe_next, session_cookie
from .verify_status import VerifyStatus


def _store(request: Request) -> SagaStore:
    store: SagaStore = request.app.state.saga_store
    return store


def _back(path: str, **message: str) -> RedirectResponse:
    """See-other back to a page, with what happened (shown escaped, never as HTML)."""
    return RedirectResponse(f"{path}?{urlencode(message)}" if message else path, 303)


def _preview(p: approvals.Pending) -> dict[str, Any]:
    d = p.to_dict()
    d["args"] = mask(d.get("args") or {})
    comp = d.get("compensation")
    if isinstance(comp, dict):
        d["compensation"] = {"tool": comp.get("tool"), "mapping": comp.get("mapping") or {}}
    return d


async def approvals_page(request: Request) -> Response:
    pending = await run_in_threadpool(approvals.pending, _store(request))
    return page(request, "approvals.html", {"pending": [_preview(p) for p in pending],
                                            **flash(request)})


async def decide(request: Request) -> Response:
    form = await checked_form(request)
    sid, step_text = request.path_params["saga_id"], request.path_params["step"]
    verdict = request.path_params["verdict"]
    if not valid_id(sid) or not step_text.isdigit() or verdict not in ("approve", "deny"):
        raise HTTPException(404, "no such approval")
    grant = verdict == "approve"
    reason = str(form.get("reason") or "").strip()
    if not grant and not reason:
        return _back("/approvals", error=f"saga {sid} step {step_text}: a denial needs a "
                                         "reason; nothing was recorded")
    who = operator_of(request)
    try:
        await run_in_threadpool(lambda: approvals.decide(
            _store(request), sid, int(step_text), grant=grant, by=who, reason=reason))
    except (InvalidInput, ConflictError) as exc:
        return _back("/approvals", error=str(exc))
    verb = "approved" if grant else "denied"
    return _back("/approvals", done=f"saga {sid} step {step_text}: {verb} by {who}")


async def attention_page(request: Request) -> Response:
    rows = await run_in_threadpool(needing_attention, _store(request).events.log)
    return page(request, "attention.html", {"rows": rows, **flash(request)})


async def ack(request: Request) -> Response:
    form = await checked_form(request)
    sid = request.path_params["saga_id"]
    who = operator_of(request)
    note = str(form.get("note") or "")
    try:
        await run_in_threadpool(acknowledge, _store(request).redis, sid, who, note)
    except InvalidInput as exc:
        return _back("/attention", error=str(exc))
    return _back("/attention", done=f"saga {sid}: acknowledged by {who}")


async def verify_page(request: Request) -> Response:
    status: VerifyStatus = request.app.state.verify
    head = await run_in_threadpool(status.ledger_head)
    return page(request, "verify.html", {"status": status, "last": status.last, "head": head,
                                         "anchor_file": status.anchor_file,
                                         **flash(request)})


async def verify_run(request: Request) -> Response:
    await checked_form(request)
    status: VerifyStatus = request.app.state.verify
    started = status.start()
    return _back("/verify", done="verification started" if started
                 else "a verification is already running")


async def login_page(request: Request) -> Response:
    return page(request, "login.html", {"next": safe_next(request.query_params.get("next")),
                                        "error": ""})


async def login(request: Request) -> Response:
    form = await checked_form(request)
    config = request.app.state.config
    target = safe_next(str(form.get("next") or "/"))
    found = config.token_holder(str(form.get("token") or "")) if config.token_login else None
    if found is None:
        return page(request, "login.html", {"next": target, "error": "that token is not "
                                            "accepted"}, status_code=401)
    response = RedirectResponse(target, 303)
    name, read_only = found
    response.set_cookie(SESSION_COOKIE, session_cookie(config.signing_key, name,
                                                       read_only=read_only),
                        max_age=12 * 3600, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")
    return response


async def logout(request: Request) -> Response:
    await checked_form(request)
    response = RedirectResponse("/login", 303)
    response.delete_cookie(SESSION_COOKIE)
    return response
