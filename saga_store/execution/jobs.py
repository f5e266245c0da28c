"""Step and compensation jobs, in RQ's job model.

A job is an ordinary RQ job hash (``rq:job:<id>``, ``data`` = zlib of the JSON
``[func_name, None, args, {}]``) pushed on an RQ queue list, so ``rq info``
and RQ's queues see it. It carries ids only; the worker reads what to do from
the log. Only our two function names are ever accepted, and ``data`` is only
ever parsed as JSON, never unpickled, whatever a job hash claims.

Anyone who can write a job hash can also write a zip bomb into ``data`` (1.4 MB
of zlib can take a worker to 2.9 GB). Our jobs carry ids only, well under
a kilobyte inflated, so ``data`` longer than :data:`MAX_JOB_DATA` before or
after inflating is not ours and is refused without inflating the rest.
"""

from __future__ import annotations

import datetime as dt
import re
import zlib
from typing import Any

import orjson
from rq.job import Job
from rq.queue import Queue

from saga_store.keys import PREFIX, RQ_PREFIX

# the functions a worker runs for a job, by their real import paths (rq info shows
# them); jobs queued before the package took one top-level name carry the old ones
STEP_FUNC = "saga_store.workers.step.run_step"
COMPENSATE_FUNC = "saga_store.workers.compensator.run_compensation"
OUR_FUNCS = frozenset({STEP_FUNC, COMPENSATE_FUNC})
_FORMER = {"workers.step.run_step": STEP_FUNC,
           "workers.compensator.run_compensation": COMPENSATE_FUNC}
STEP_QUEUE = f"{RQ_PREFIX}saga-steps"
COMPENSATION_QUEUE = f"{RQ_PREFIX}saga-compensations"
STEP_JOB = f"{RQ_PREFIX}saga-step-"  # the start of every step job's id, and of a
COMP_JOB = f"{RQ_PREFIX}saga-comp-"  # compensation job's
# the start of every worker's name (rq:worker:<name>, channel rq:pubsub:<name>), so
# a namespace's ACL user is granted its own workers' keys only; '.' never occurs
# in a namespace, so no namespace's prefix covers another's
WORKER_PREFIX = f"{PREFIX}."
JOB_TTL_S = 7 * 24 * 3600  # a job hash outlives a crash long enough to be swept
ACKED_JOB_TTL_S = 600  # after the outcome: long enough to see late duplicates
# the most a job's data may take, compressed or inflated: ids only need a few hundred bytes
MAX_JOB_DATA = 64 * 1024


def queue_key(queue: str) -> str:
    return Queue.redis_queue_namespace_prefix + queue


def job_key(job_id: str) -> str:
    return Job.redis_job_namespace_prefix + job_id


STEP_ID = re.compile(rf"^{re.escape(STEP_JOB)}(.+)-(\d+)-[0-9a-f]{{16}}$")
_FORMER_STEP_ID = re.compile(r"^saga-step-[0-9a-f]{16}-(\d+)-(.+)$")  # queued by older versions


def step_job_id(idem_key: str, intent_seq: int, saga_id: str) -> str:
    """Derived from the step's saga, its intent's place in the log and its
    idempotency key: two jobs with one id always carry the same arguments (one job
    hash serves every copy of a delivery), a worker can start reading the log in
    the same round trip as the job, and the saga id first puts an agent's jobs
    under its own ACL pattern (``saga-step-<agent>_*``)."""
    return f"{STEP_JOB}{saga_id}-{intent_seq}-{idem_key[:16]}"


def parse_step_job_id(job_id: str) -> tuple[str, int] | None:
    """(saga_id, intent_seq) of a step job id; None for any other id."""
    m = _FORMER_STEP_ID.match(job_id)
    if m:
        return m.group(2), int(m.group(1))
    m = STEP_ID.match(job_id)
    return (m.group(1), int(m.group(2))) if m else None


def compensation_job_id(saga_id: str) -> str:
    return f"{COMP_JOB}{saga_id}"


def push(pipe: Any, queue: str, job_id: str, func: str, args: list[Any],
         description: str | None = None) -> None:
    """Queue a job on ``pipe`` (a redis-py pipeline or client). ``description`` is
    what a worker's log line says of it (RQ prints it beside the job id)."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    pipe.hset(job_key(job_id), mapping={
        "data": zlib.compress(orjson.dumps([func, None, args, {}]), 1),
        "created_at": now, "enqueued_at": now, "origin": queue, "status": "queued",
        "description": description or f"{func.rsplit('.', 1)[-1]}({', '.join(map(str, args))})",
    })
    pipe.expire(job_key(job_id), JOB_TTL_S)
    pipe.rpush(queue_key(queue), job_id)


def named_by(job_id: str, func: str, args: list[Any]) -> bool:
    """Whether a job's arguments are the ones its id names: a step job's saga and
    intent seq, a compensation job's saga. A job whose data points elsewhere (an
    agent may write its own jobs' hashes, never another's) is not run."""
    if func == STEP_FUNC:
        return len(args) == 3 and parse_step_job_id(job_id) == (args[0], args[2])
    return len(args) == 1 and job_id == compensation_job_id(str(args[0]))


def decode(data: bytes | None) -> tuple[str, list[Any]] | None:
    """``(func_name, args)`` of one of our jobs, or None for anything else
    (including data over :data:`MAX_JOB_DATA`, compressed or inflated)."""
    if not data or len(data) > MAX_JOB_DATA:
        return None
    raw = _inflate(data)
    if raw is None:
        return None
    try:
        func, _instance, args, kwargs = orjson.loads(raw)
    except (orjson.JSONDecodeError, ValueError, TypeError):
        return None  # not JSON (a pickle, say): never deserialized any other way
    func = _FORMER.get(func, func) if isinstance(func, str) else func
    if func not in OUR_FUNCS or not isinstance(args, list) or kwargs:
        return None
    return str(func), args


def _inflate(data: bytes) -> bytes | None:
    """``data`` inflated, at most :data:`MAX_JOB_DATA` of it (None past that, or
    for a cut stream); ``data`` itself if it is not zlib at all (plain JSON)."""
    inflater = zlib.decompressobj()
    try:
        # one byte over the cap tells "exactly the cap" from "more to come"
        raw = inflater.decompress(data, MAX_JOB_DATA + 1)
    except zlib.error:
        return data
    if len(raw) > MAX_JOB_DATA or not inflater.eof:
        return None
    return raw
