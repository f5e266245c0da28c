"""The workers and queues page: what ``saga workers`` shows, in the browser.

Workers are read as :mod:`saga_store.ops.fleet` reads them (RQ's registrations,
the heartbeat noted in Redis's time, the sagas' leases for what each holds);
queue depths and the oldest job's age are the metrics' gauges; dead-lettered
jobs are RQ's failed-job registry of each queue (a job whose function raised:
the log, not RQ, records a step's own failure, so one here means a job that
never got to write its outcome). Workers register neither their kind nor their
concurrency, so the page shows the queues each one takes jobs from instead.
The sweepers' leases (layout 3) say who sweeps now and for how much longer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from saga_store import SagaStore, keys
from saga_store.execution import jobs
from saga_store.ops import fleet

from .counts import Tally
from .render import page

MAX_DEAD = 50  # dead-lettered job ids shown per queue
MAX_SWEEPERS = 64
KIND = {jobs.STEP_QUEUE: "steps", jobs.COMPENSATION_QUEUE: "unwinds"}
_HOLDS = re.compile(r"^(?P<what>step|unwind) of (?P<saga>\S+)(?P<more>.*)$")


def holds(current_job: str | None) -> dict[str, str] | None:
    """``step of <saga> (+2 more)`` as its parts, to link the saga."""
    m = _HOLDS.match(current_job or "")
    return m.groupdict() if m else None


@dataclass(frozen=True)
class Dead:
    queue: str
    count: int
    ids: list[str]


def _dead(client: Any) -> list[Dead]:
    pipe = client.pipeline(transaction=False)
    for q in fleet.QUEUES:
        pipe.zcard(f"rq:failed:{q}")
        pipe.zrange(f"rq:failed:{q}", 0, MAX_DEAD - 1)
    replies = pipe.execute()
    return [Dead(q, int(replies[2 * i]), [m.decode() for m in replies[2 * i + 1]])
            for i, q in enumerate(fleet.QUEUES)]


def _sweepers(client: Any) -> list[tuple[str, str, int]]:
    """(lease key, holder, ms left) of each sweeper lease held now."""
    found = []
    for key in client.scan_iter(match=f"{keys.PREFIX}:sweep:*", count=200):
        found.append(key)
        if len(found) >= MAX_SWEEPERS:
            break
    if not found:
        return []
    pipe = client.pipeline(transaction=False)
    for key in found:
        pipe.get(key)
        pipe.pttl(key)
    replies = pipe.execute()
    return [(k.decode(), (replies[2 * i] or b"").decode(errors="replace"),
             int(replies[2 * i + 1])) for i, k in enumerate(found) if replies[2 * i]]


def _last_sweep(client: Any) -> dict[str, Any] | None:
    """The last sweep any worker made: how long ago (by Redis's clock), by whom, how
    many indexes it looked at and jobs it queued; None before the first."""
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.SWEEPER_LAST)
    pipe.time()
    got, (secs, micros) = pipe.execute()
    if not got:
        return None
    f = {k.decode(): v.decode(errors="replace") for k, v in got.items()}
    now_ms = int(secs) * 1000 + int(micros) // 1000
    return {"ago_ms": max(0, now_ms - int(f.get("at_ms", now_ms))), "by": f.get("by", "?"),
            "indexes": f.get("indexes", "?"), "queued": f.get("queued", "?")}


def read(store: SagaStore, tally: Tally, show_all: bool) -> dict[str, Any]:
    found = fleet.registered(store.queues, log=store.redis)
    return {"workers": [w for w in found if show_all or w.live],
            "gone": sum(1 for w in found if not w.live), "show_all": show_all,
            "counts": tally.read(), "dead": _dead(store.queues),
            "sweepers": _sweepers(store.redis), "last_sweep": _last_sweep(store.redis),
            "kinds": KIND, "stale_s": fleet.STALE_S,
            "holds": holds}


async def workers_page(request: Request) -> Response:
    show_all = request.query_params.get("all") == "1"
    ctx = await run_in_threadpool(read, request.app.state.saga_store,
                                  request.app.state.tally, show_all)
    return page(request, "workers.html", ctx)
