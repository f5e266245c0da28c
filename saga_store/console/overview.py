"""The overview page: sagas by state (the metrics' gauges), the queues, the
oldest approval still waiting, and the sagas a person must look at (stuck,
needing attention), each named with its state in words.

The stuck list is the sagas in flight whose cached state says stuck (as the
``saga_sagas{state="stuck"}`` gauge counts them), each folded from its log
to say where it is stuck; at most ``MAX_LISTED`` are listed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from saga_store import SagaStore
from saga_store.approval import requests as approvals
from saga_store.approval.attention import needing_attention
from saga_store.execution.enqueue import in_flight
from saga_store.log.events import EventKind as K

from .counts import Counts, Tally
from .render import page
from .states import Shown, shown
from .throughput import MAX_READ, last_hour

MAX_LISTED = 50


@dataclass(frozen=True)
class Listed:
    saga_id: str
    agent_id: str | None
    shown: Shown
    since_ms: int | None  # when it got there (its last event)


@dataclass(frozen=True)
class Waiting:
    saga_id: str
    step: int
    tool: str
    since_ms: int | None


def _stuck(store: SagaStore) -> list[Listed]:
    names = store.events.keys
    sagas = in_flight(store.redis, names)
    pipe = store.redis.pipeline(transaction=False)
    for sid in sagas:
        pipe.hget(names.meta(sid), "state")
    out: list[Listed] = []
    for sid, state in zip(sagas, pipe.execute(), strict=True):
        if state == b"stuck" and len(out) < MAX_LISTED:
            st = store.state(sid)
            out.append(Listed(sid, st.agent_id, shown(st, store.registry), st.updated_ts))
    return sorted(out, key=lambda r: r.since_ms or 0)


def _oldest_approval(store: SagaStore) -> Waiting | None:
    """The approval that has waited longest (of the first ``MAX_LISTED`` by deadline)."""
    oldest: Waiting | None = None
    for p in approvals.pending(store, limit=MAX_LISTED):
        asked = [e.get("ts") for e in store.events.log.bodies(p.saga_id)
                 if e.get("kind") == K.APPROVAL_REQUESTED and e.get("step") == p.step]
        since = int(asked[-1]) if asked and asked[-1] else None
        if oldest is None or (since or 0) < (oldest.since_ms or 0):
            oldest = Waiting(p.saga_id, p.step, str(p.preview.get("tool") or "?"), since)
    return oldest


def read(store: SagaStore, tally: Tally) -> dict[str, Any]:
    counts: Counts = tally.read()
    attention = [Listed(a.saga_id, a.agent_id, Shown("needs_attention", "could not undo "
                                                     + (", ".join(a.needs_attention) or "?")),
                        a.updated_ts) for a in needing_attention(store.events.log)]
    return {"counts": counts, "stuck": _stuck(store), "attention": attention[:MAX_LISTED],
            "oldest": _oldest_approval(store), "now_ms": int(time.time() * 1000),
            "max_listed": MAX_LISTED, "hour": last_hour(store.events), "max_read": MAX_READ}


async def overview_page(request: Request) -> Response:
    tally: Tally = request.app.state.tally
    ctx = await run_in_threadpool(read, request.app.state.saga_store, tally)
    return page(request, "overview.html", ctx)
