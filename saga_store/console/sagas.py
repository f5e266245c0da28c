"""Pages about sagas: the list and one saga (timeline, history, export)."""

from __future__ import annotations

import datetime as dt
import io
import time
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from saga_store import SagaStore, Status
from saga_store.client.context import FORMATS, rebuild_history
from saga_store.ids import valid_id
from saga_store.protocol.state import fold
from saga_store.verify.export import export

from . import timeline
from .effects import offers, undo_tools, unwind_plan
from .listing import Filters, list_page
from .masking import mask_messages
from .render import flash, page
from .states import reason_lines, shown
from .verify_status import chain_of

STATES = [s.value for s in Status]


def _store(request: Request) -> SagaStore:
    store: SagaStore = request.app.state.saga_store
    return store


def _time(text: str | None, what: str) -> int | None:
    """A form's UTC date-time (``2026-12-01T09:30``) as epoch ms."""
    if not text:
        return None
    try:
        t = dt.datetime.fromisoformat(text)
    except ValueError:
        raise HTTPException(400, f"{what}: not a date and time (YYYY-MM-DDTHH:MM)") from None
    return int(t.replace(tzinfo=t.tzinfo or dt.UTC).timestamp() * 1000)


def _filters(request: Request) -> tuple[Filters, dict[str, str]]:
    q = request.query_params
    raw = {k: q.get(k, "").strip() for k in ("state", "agent", "since", "until")}
    if raw["state"] and raw["state"] not in STATES:
        raise HTTPException(400, f"state: one of {', '.join(STATES)}")
    if raw["agent"] and not valid_id(raw["agent"]):
        raise HTTPException(400, "agent: not a valid agent id")
    return Filters(raw["state"] or None, raw["agent"] or None,
                   _time(raw["since"], "since"), _time(raw["until"], "until")), raw


async def sagas_list(request: Request) -> Response:
    filters, raw = _filters(request)
    cursor_text = request.query_params.get("cursor", "")
    if cursor_text and not cursor_text.isdigit():
        raise HTTPException(400, "cursor: not a page cursor")
    cursor = int(cursor_text) if cursor_text else None
    size = request.app.state.config.page_size
    result = await run_in_threadpool(list_page, _store(request).events, filters, cursor, size)
    keep = {k: v for k, v in raw.items() if v}
    return page(request, "sagas.html", {"page": result, "filters": raw, "states": STATES,
                                        "keep": keep, "first": cursor is None})


def saga_id_of(request: Request) -> str:
    sid: str = request.path_params["saga_id"]
    if not valid_id(sid):
        raise HTTPException(404, "no such saga")
    return sid


def live_context(store: SagaStore, saga_id: str, fmt: str,
                 read_only: bool = False) -> dict[str, Any]:
    """Everything the live part of a saga page shows (state, timeline, the history
    the agent sees in ``fmt``, what a person may do), from one read of its log."""
    bodies, head = store.events.log.bodies_and_head(saga_id)
    if not bodies:
        raise HTTPException(404, f"no saga {saga_id}")
    st = fold(saga_id, bodies)
    now = time.time_ns() // 1_000_000
    created = st.created_ts or now
    took = (st.updated_ts or now) - created if st.final else now - created
    return {"saga": st, "seq": head.seq, "tl": timeline.build(bodies, now, st.final),
            "took": took, "live": not st.final, "fmt": fmt, "formats": FORMATS,
            "history": mask_messages(rebuild_history([st], fmt)),
            "shown": shown(st, store.registry, undo_tools(bodies)),
            "reasons": reason_lines(st),
            "offers": offers(st, bodies), "read_only": read_only,
            "plan": [] if st.final else unwind_plan(st, undo_tools(bodies))}


def with_format(request: Request) -> str:
    fmt = request.query_params.get("format", "openai")
    if fmt not in FORMATS:
        raise HTTPException(400, f"format: one of {', '.join(FORMATS)}")
    return fmt


async def saga_page(request: Request) -> Response:
    sid, fmt = saga_id_of(request), with_format(request)
    store = _store(request)
    ctx = await run_in_threadpool(live_context, store, sid, fmt, request.state.read_only)
    # checked after the read above: the verdict covers at least what the page shows
    chain = await run_in_threadpool(chain_of, store.events, sid)
    return page(request, "saga.html", {**ctx, "chain": chain, **flash(request)})


async def saga_export(request: Request) -> Response:
    """The saga and the ledger as JSONL, which ``saga verify --file`` accepts."""
    sid = saga_id_of(request)
    store = _store(request)
    if (await run_in_threadpool(store.events.log.head, sid)).empty:
        raise HTTPException(404, f"no saga {sid}")

    def write() -> bytes:
        out = io.BytesIO()
        export(store.events.log, out, [sid])
        return out.getvalue()

    body = await run_in_threadpool(write)
    return Response(body, media_type="application/x-ndjson", headers={
        "content-disposition": f'attachment; filename="saga-{sid}.jsonl"'})
