"""Who is working: the workers RQ has registered, their queues, what waits.

RQ keeps a registration per worker (``rq:worker:<name>``, a hash with its
host, pid, state, current job and last heartbeat, expiring unless renewed)
and a set of registrations per queue (``rq:workers:<queue>``). A worker killed
with SIGKILL stays registered until its hash expires (minutes), so a worker
counts as live only while its heartbeat is recent. A worker busy in one long
tool call does not beat (steps run in its own process), so :data:`STALE_S`
is generous.

Workers write neither their busy state nor their current job to RQ (the log
already says what a step is doing, and each write would cost every step a
round trip), so both are read from the sagas' leases: a worker's lease token
begins with its name (``<worker>:<hex>`` for a step, ``<worker>:comp:<hex>``
for an unwind).
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import asdict, dataclass
from typing import Any

from rq.queue import Queue
from rq.worker import Worker

from saga_store import keys
from saga_store.execution import jobs
from saga_store.execution.enqueue import in_flight

QUEUES = (jobs.STEP_QUEUE, jobs.COMPENSATION_QUEUE)
STALE_S = 60.0  # no heartbeat for this long: taken for gone
_TOKEN = re.compile(r"^(?P<name>.+?)(?P<comp>:comp)?:[0-9a-f]{12}$")


@dataclass(frozen=True)
class WorkerInfo:
    name: str
    hostname: str | None
    pid: int | None
    state: str
    current_job: str | None
    queues: tuple[str, ...]
    heartbeat_age_s: float | None  # None: it never beat

    @property
    def live(self) -> bool:
        return self.heartbeat_age_s is not None and self.heartbeat_age_s < STALE_S

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "queues": list(self.queues), "live": self.live}


def registered(client: Any, queue: str | None = None) -> list[WorkerInfo]:
    """Every worker RQ has registered (on ``queue`` only, if given), by name."""
    found = Worker.all(connection=client,
                       queue=Queue(queue, connection=client) if queue else None)
    now = dt.datetime.now(dt.UTC)
    held = holding(client) if found else {}
    out = []
    for w in found:
        beat = w.last_heartbeat
        if beat is not None and beat.tzinfo is None:
            beat = beat.replace(tzinfo=dt.UTC)
        age = None if beat is None else max(0.0, (now - beat).total_seconds())
        job = w.get_current_job_id() or held.get(w.name)
        state = "busy" if w.name in held else str(w.get_state())
        out.append(WorkerInfo(w.name, w.hostname, w.pid, state, job,
                              tuple(w.queue_names()), age))
    return sorted(out, key=lambda w: w.name)


def holding(client: Any) -> dict[str, str]:
    """What each worker holds a saga's lease for, by worker name: ``step of <saga>``
    or ``unwind of <saga>`` (one GET per saga in flight, pipelined)."""
    sagas = in_flight(client)
    pipe = client.pipeline(transaction=False)
    for sid in sagas:
        pipe.get(keys.saga_lease(sid))
    out = {}
    for sid, token in zip(sagas, pipe.execute(), strict=True):
        m = _TOKEN.match(token.decode(errors="replace")) if token else None
        if m:
            out[m["name"]] = f"{'unwind' if m['comp'] else 'step'} of {sid}"
    return out


def serving(client: Any, queue: str = jobs.STEP_QUEUE) -> list[WorkerInfo]:
    """The live workers that take jobs from ``queue``."""
    return [w for w in registered(client, queue) if w.live]


def queue_lengths(client: Any, queues: tuple[str, ...] = QUEUES) -> dict[str, int]:
    pipe = client.pipeline(transaction=False)
    for q in queues:
        pipe.llen(jobs.queue_key(q))
    return dict(zip(queues, map(int, pipe.execute()), strict=True))
