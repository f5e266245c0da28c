"""Search: the sagas whose log names a tool, an idempotency key, an error text,
a conversation id, or a text in a step's arguments (the saga that charged order
1002). No index holds these, so it is a scan, bounded and said
so: the newest ``MAX_SAGAS`` sagas (the ledger's order, as the list pages
them), each read from its log. A search's URL is its query
(``/search?by=tool&q=charge_payment``), to link or bookmark.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from saga_store import SagaStore
from saga_store.log.events import EventKind as K

from .listing import Filters, Row, list_page
from .masking import mask, short_json
from .render import page

MAX_SAGAS = 500
CHUNK = 100
MAX_HITS = 100
FIELDS = {"tool": "tool", "key": "idempotency key", "error": "error text",
          "conversation": "conversation id", "args": "arguments"}
_ERRORS = frozenset({K.STEP_FAILED, K.STEP_IN_DOUBT, K.COMPENSATION_FAILED, K.SAGA_FAILED,
                     K.SAGA_STUCK, K.STEP_NOT_COMPENSABLE})


@dataclass(frozen=True)
class Hit:
    row: Row
    seq: int | None  # the first event that matched (None: the saga itself did)
    what: str


def _match(by: str, q: str, row: Row, bodies: list[dict[str, Any]]) -> Hit | None:
    if by == "conversation":
        return Hit(row, None, f"conversation {row.conversation_id}") \
            if row.conversation_id == q else None
    needle = q.lower()
    for ev in bodies:
        if by == "tool" and ev.get("tool") == q:
            return Hit(row, ev["seq"], f"{ev['kind']} step {ev.get('step')}")
        if by == "key" and (ev.get("idem_key") or "").startswith(q):
            return Hit(row, ev["seq"], f"{ev['kind']} step {ev.get('step')} {ev['idem_key']}")
        if by == "args" and ev.get("kind") == K.STEP_INTENT:
            # what the log holds: secret arguments are digests there, and masked here
            args = mask((ev.get("data") or {}).get("args"))
            if needle in orjson.dumps(args).decode().lower():
                return Hit(row, ev["seq"], f"step {ev.get('step')} {ev.get('tool')} "
                           f"{short_json(args)}")
        if by == "error" and ev.get("kind") in _ERRORS:
            text = orjson.dumps(mask(ev.get("data"))).decode()
            if needle in text.lower():
                return Hit(row, ev["seq"], f"{ev['kind']}: {short_json(mask(ev.get('data')))}")
    return None


def run(store: SagaStore, by: str, q: str) -> tuple[list[Hit], int, bool]:
    """Hits (newest saga first), how many sagas were read, whether older ones were
    left unsearched."""
    hits: list[Hit] = []
    cursor: int | None = None
    read = 0
    while read < MAX_SAGAS and len(hits) < MAX_HITS:
        got = list_page(store.events, Filters(), cursor, min(CHUNK, MAX_SAGAS - read))
        for row in got.rows:
            bodies = [] if by == "conversation" else store.events.log.bodies(row.saga_id)
            hit = _match(by, q, row, bodies)
            if hit is not None:
                hits.append(hit)
        read += len(got.rows)
        if got.next_cursor is None or not got.rows:
            return hits, read, False
        cursor = int(got.next_cursor)
    return hits, read, True


async def search_page(request: Request) -> Response:
    by = request.query_params.get("by", "tool")
    q = request.query_params.get("q", "").strip()
    if by not in FIELDS:
        raise HTTPException(400, f"by: one of {', '.join(FIELDS)}")
    if len(q) > 200:
        raise HTTPException(400, "q: at most 200 characters")
    hits: list[Hit] = []
    read, more = 0, False
    if q:
        hits, read, more = await run_in_threadpool(run, request.app.state.saga_store, by, q)
    return page(request, "search.html", {"by": by, "q": q, "fields": FIELDS, "hits": hits,
                                         "read": read, "more": more, "max_sagas": MAX_SAGAS,
                                         "max_hits": MAX_HITS})
