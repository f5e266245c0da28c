"""Who is working: the workers RQ has registered, their queues, what waits.

RQ keeps a registration per worker (``rq:worker:<name>``, a hash with its
host, pid, state, current job and last heartbeat, expiring unless renewed)
and a set of registrations per queue (``rq:workers:<queue>``). A worker killed
with SIGKILL stays registered until its hash expires (minutes), so a worker
counts as live only while its heartbeat is recent (an idle worker beats every
few seconds) or while it holds a saga's lease: a worker busy in a long tool
call, or in a plan's steps one after another, does not beat, but its lease
expires soon after it dies.

A heartbeat's age is read by Redis's clock: workers note each beat in Redis's
time as well (``saga_beat_ms``), since RQ's ``last_heartbeat`` is in the
worker host's, and a host whose clock ran 20 s behind the reader's would look
gone while it beat. A worker that notes no such time is aged by RQ's field and
the reader's clock.

Workers note their kind (``rq``: one job at a time; ``asyncio``: several on
an event loop) and how many jobs they run at once in their RQ hash too
(``saga_kind``, ``saga_concurrency``), written once at registration; a worker
of a version that notes neither shows as of unknown kind.

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

from rq.utils import utcparse
from rq.worker import Worker
from rq.worker_registration import WORKERS_BY_QUEUE_KEY

from saga_store.execution import jobs
from saga_store.execution.enqueue import in_flight
from saga_store.keys import SagaKeys
from saga_store.log.layout import names_of

QUEUES = (jobs.STEP_QUEUE, jobs.COMPENSATION_QUEUE)
STALE_S = 20.0  # no heartbeat for this long and no lease held: taken for gone
BEAT_FIELD = "saga_beat_ms"  # a worker's last heartbeat, by Redis's clock (ms)
KIND_FIELD = "saga_kind"  # rq or asyncio, written at registration
CONCURRENCY_FIELD = "saga_concurrency"  # jobs it runs at once, written at registration
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
    kind: str | None = None  # rq, asyncio; None: it did not say
    concurrency: int | None = None

    @property
    def live(self) -> bool:
        beating = self.heartbeat_age_s is not None and self.heartbeat_age_s < STALE_S
        return beating or self.current_job is not None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "queues": list(self.queues), "live": self.live}


def registered(client: Any, queue: str | None = None, *, work: bool = True,
               log: Any = None) -> list[WorkerInfo]:
    """Every worker RQ has registered (on ``queue`` only, if given), by name, read
    from RQ's keys on ``client`` (RQ's Redis) in two round trips and never written
    to (RQ's own listing deletes stale registrations). ``work``: also read what
    each one holds, from the leases on ``log`` (default: ``client``)."""
    index = WORKERS_BY_QUEUE_KEY % queue if queue else Worker.redis_workers_keys
    names = sorted(k.decode() for k in client.smembers(index))
    pipe = client.pipeline(transaction=False)
    for key in names:
        pipe.hmget(key, "hostname", "pid", "state", "queues", "last_heartbeat", BEAT_FIELD,
                   KIND_FIELD, CONCURRENCY_FIELD)
    pipe.time()
    *rows, (secs, micros) = pipe.execute()
    held = holding(client if log is None else log) if work and names else {}
    now = dt.datetime.now(dt.UTC)
    server_ms = int(secs) * 1000 + int(micros) // 1000
    out = []
    prefix = Worker.redis_worker_namespace_prefix
    for key, (host, pid, state, queues, beat, beat_ms, kind, slots) in zip(names, rows,
                                                                            strict=True):
        if state is None and beat is None:
            continue  # its hash expired: gone
        name = key[len(prefix):] if key.startswith(prefix) else key
        age = _server_age(beat_ms, server_ms) if beat_ms else _age(beat, now)
        text = [v.decode(errors="replace") if v else None
                for v in (host, pid, state, queues, kind, slots)]
        out.append(WorkerInfo(
            name, text[0], _int(text[1]),
            "busy" if name in held else (text[2] or "?"), held.get(name),
            tuple(q for q in (text[3] or "").split(",") if q), age, text[4], _int(text[5])))
    return out


def _int(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def _server_age(beat_ms: bytes, server_ms: int) -> float | None:
    try:
        return max(0.0, (server_ms - int(beat_ms)) / 1000)
    except ValueError:
        return None


def _age(beat: bytes | None, now: dt.datetime) -> float | None:
    if not beat:
        return None
    try:
        at = utcparse(beat.decode()).replace(tzinfo=dt.UTC)
    except ValueError:
        return None
    return max(0.0, (now - at).total_seconds())


def holding(client: Any, names: SagaKeys | None = None) -> dict[str, str]:
    """What each worker holds a saga's lease for, by worker name: ``step of <saga>``
    or ``unwind of <saga>``, and ``(+N more)`` for an asyncio worker holding several
    (one GET per saga in flight, pipelined)."""
    names = names or names_of(client)
    sagas = in_flight(client, names)
    pipe = client.pipeline(transaction=False)
    for sid in sagas:
        pipe.get(names.lease(sid))
    held: dict[str, list[str]] = {}
    for sid, token in zip(sagas, pipe.execute(), strict=True):
        m = _TOKEN.match(token.decode(errors="replace")) if token else None
        if m:
            held.setdefault(m["name"], []).append(
                f"{'unwind' if m['comp'] else 'step'} of {sid}")
    return {name: jobs[0] + (f" (+{len(jobs) - 1} more)" if len(jobs) > 1 else "")
            for name, jobs in held.items()}


def serving(client: Any, queue: str = jobs.STEP_QUEUE, log: Any = None) -> list[WorkerInfo]:
    """The live workers that take jobs from ``queue`` (the leases, on ``log``, are
    read only if no registered worker beats)."""
    found = registered(client, queue, work=False)
    if found and not any(w.live for w in found):
        found = registered(client, queue, log=log)
    return [w for w in found if w.live]


def queue_lengths(client: Any, queues: tuple[str, ...] = QUEUES) -> dict[str, int]:
    pipe = client.pipeline(transaction=False)
    for q in queues:
        pipe.llen(jobs.queue_key(q))
    return dict(zip(queues, map(int, pipe.execute()), strict=True))
