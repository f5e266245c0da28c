"""The RQ worker that runs steps (and compensations), without RQ's per-job
bookkeeping: the saga log already records what RQ would (status, result,
timing), so only RQ's queues, worker model, pool and signals are used.

Per job RQ's stock loop writes worker state twice, heartbeats twice, checks
for suspension, and around the job adds registries, status and result
writes. Here heartbeats and the suspension check are throttled, state writes
happen only on change, and a job is acknowledged in the same round trip as
its outcome. Jobs naming any function but ours are refused and counted.

Beside the sweeper, RQ's maintenance hook re-reads whether Redis still
persists every write (``Settings.durability_check_s``), and logs when that changes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, cast

import redis
from rq.exceptions import NoSuchJobError, StopRequested
from rq.intermediate_queue import IntermediateQueue
from rq.job import Job
from rq.queue import Queue
from rq.serializers import JSONSerializer
from rq.utils import now
from rq.worker import SimpleWorker, WorkerStatus

from saga_store.approval import notify
from saga_store.client.api import SagaStore
from saga_store.errors import StoreUnavailable
from saga_store.execution import jobs
from saga_store.faults import fault
from saga_store.ids import valid_id
from saga_store.keys import SagaKeys
from saga_store.log.pipeline import lean
from saga_store.log.scripts import HEARTBEAT
from saga_store.ops import fleet
from saga_store.ops.connection import connect
from saga_store.ops.durability import DurabilityWatch
from saga_store.settings import Settings
from saga_store.tools.registry import Registry

from .invoke import Work, drive
from .step import StepRunner, queue_reads
from .stopping import process_stopping
from .sweeper import Sweeper

log = logging.getLogger("saga_store.worker")
HEARTBEAT_EVERY_S = 5.0
SUSPENSION_CHECK_EVERY_S = 1.0


# the job ids RQ takes (its own rule, from rq 2.8): these characters, before any ':'
JOB_ID = re.compile(rb"[A-Za-z0-9_-]+")


def usable(job_id: bytes) -> bool:
    """Whether RQ can make a job of an id popped off a queue. Anyone who may push
    onto a queue (an agent's user may) can push one it cannot: not UTF-8, or with
    a space, a dot, a NUL... RQ's dequeue raises on it, and its worker quits."""
    try:
        job_id.decode()  # all of it, the part after a ':' too
    except UnicodeDecodeError:
        return False
    return JOB_ID.fullmatch(job_id.split(b":", 1)[0]) is not None


def drop_unusable(connection: Any, queue_key: bytes | str, job_id: bytes,
                  intermediate: str | None) -> None:
    """Log and forget a job id RQ cannot take (see :func:`usable`), taking it off
    ``intermediate`` too when the pop moved it there."""
    if intermediate is not None:
        connection.lrem(intermediate, 1, job_id)
    key = queue_key.decode(errors="replace") if isinstance(queue_key, bytes) else queue_key
    log.error("%s held a job id RQ cannot take (%r); dropped it", key, job_id[:80])


class SagaIntermediateQueue(IntermediateQueue):
    """RQ's intermediate list, whose clean-up passes over (and drops) job ids RQ
    cannot take: RQ's own reads each one as a job and raises, which ends the
    worker."""

    def get_job_ids(self) -> list[str]:
        out = []
        # a connection made without decode_responses: ids come as bytes
        listed = cast(list[bytes], self.connection.lrange(self.key, 0, -1))
        for job_id in listed:
            if usable(job_id):
                out.append(job_id.decode())
            else:
                drop_unusable(self.connection, self.key, job_id, self.key)
        return out


class SagaQueue(Queue):
    """RQ's queue, whose pops and intermediate list pass over job ids RQ cannot
    take (dropped, with a log line) instead of raising in the worker."""

    @property
    def intermediate_queue(self) -> IntermediateQueue:
        return SagaIntermediateQueue(self.key, connection=self.connection)

    @classmethod
    def lpop(cls, queue_keys: Sequence[str], timeout: int | None,
             connection: Any = None) -> Any:
        while True:
            got = super().lpop(queue_keys, timeout, connection=connection)
            if got is None or usable(got[1]):
                return got
            drop_unusable(connection, got[0], got[1], None)

    @classmethod
    def lmove(cls, connection: Any, queue_key: str, timeout: int | None) -> Any:
        while True:
            got = super().lmove(connection, queue_key, timeout)
            if got is None or usable(got[1]):
                return got
            fault("junk_moved")  # on the intermediate list, not yet dropped
            drop_unusable(connection, queue_key, got[1], cls.from_queue_key(
                queue_key, connection=connection).intermediate_queue_key)


class StepJob(Job):
    """RQ's job model, fetched lightly: a saga job needs only its ``data`` (ids),
    so the worker reads that one field instead of parsing the whole hash."""

    prefetched: Any = None
    names: ClassVar[SagaKeys | None] = None  # the log's key names (set per worker)

    def refresh(self) -> None:
        """Fetch ``data``; for a step job, read the log in the same round trip (the
        reads are only used if ``data`` then proves to be one of our jobs)."""
        pipe = lean(self.connection)
        take = self.fetch_on(pipe)
        if not take(pipe.execute()):
            raise NoSuchJobError(f"no such job: {self.key}")

    def fetch_on(self, pipe: Any) -> Callable[[list[Any]], bool]:
        """Queue this job's fetch on ``pipe`` (its ``data``; for a step job, the log's
        reads too); returns what takes the pipeline's replies from where this job's
        start (the first one taken off the list): it sets ``data`` and the reads,
        and says False when the job's hash is gone, or raises a reply's error."""
        at = len(pipe)
        pipe.hmget(self.key, "data", "description")
        ids = self._step_ids()
        if ids is not None and self.names is not None:
            queue_reads(pipe, self.names, *ids)
        n = len(pipe) - at

        def take(replies: list[Any]) -> bool:
            fields, *reads = replies[:n]
            del replies[:n]
            if isinstance(fields, Exception):
                raise fields
            data, description = fields
            # what RQ's log line says of the job: its saga, step and tool
            self.description = description.decode("utf-8", "replace") if description else None
            if ids is not None and not any(isinstance(r, Exception) for r in reads):
                self.prefetched = (ids, reads)
            if data is None:
                return False
            self.data = data  # jobs.decode inflates and parses it, as JSON only
            return True
        return take

    def _step_ids(self) -> tuple[str, int] | None:
        """The step job's saga and intent seq when its log can be read with it."""
        ids = jobs.parse_step_job_id(self.id)
        if ids is None or not valid_id(ids[0]) or self.names is None:
            return None
        return ids


class QueueJob(StepJob):
    """A job whose queue is not on the log's Redis: its ``data`` only, the log is
    read apart (one round trip cannot span two servers)."""

    def _step_ids(self) -> tuple[str, int] | None:
        return None


class StepWorker(SimpleWorker):
    """Runs saga steps. Configure with :func:`configured` (the pool forks it).
    RQ's connection holds the queues; the log is on ``log_url`` when that is set
    (a Redis Cluster, say), else on the queues' Redis."""

    tools_modules: ClassVar[tuple[str, ...]] = ()
    log_url: ClassVar[str | None] = None
    settings: ClassVar[Settings] = Settings()
    sweep_interval_s: ClassVar[float] = 1.0
    # RQ backs off 1, 2, 4 ... s between reconnects, up to 60 s by default: an
    # outage would leave workers idle up to a minute after Redis is back
    max_connection_wait_time = 5.0

    def __init__(self, queues: Any, *args: Any, **kwargs: Any) -> None:
        # the namespace's prefix on its name: its ACL user is granted its own
        # rq:worker:<name> and rq:pubsub:<name> only (saga_store/ops/acl.py)
        name, args = (args[0], args[1:]) if args else (kwargs.pop("name", None), args)
        name = str(name or uuid.uuid4().hex)  # RQ's default
        kwargs["name"] = name if name.startswith(jobs.WORKER_PREFIX) else \
            jobs.WORKER_PREFIX + name
        kwargs["serializer"] = JSONSerializer
        kwargs["job_class"] = StepJob if self.log_url is None else QueueJob
        # queues by name, so RQ makes them of queue_class (RQ's pool hands in its own)
        kwargs["queue_class"] = SagaQueue
        one = isinstance(queues, str | Queue)
        queues = [q.name if isinstance(q, Queue) else q for q in ([queues] if one else queues)]
        super().__init__(queues, *args, **kwargs)
        registry = Registry.from_modules(*self.tools_modules)
        from prometheus_client import CollectorRegistry

        from saga_store.ops.metrics import Metrics
        self.metrics = Metrics(CollectorRegistry())  # multiprocess files when enabled
        self.metrics.prime(registry)  # every panel has its series from the first scrape
        notify.count_drops(self.metrics.notifications_dropped.inc)
        # a worker outlives any outage: it backs off (capped, jittered) and carries on
        log_client = self.connection if self.log_url is None else \
            connect(self.log_url, retry_s=None)
        self.saga_store = SagaStore(log_client, registry, self.settings,
                                    metrics=self.metrics, queues=self.connection)
        if self.job_class is StepJob:  # its reads name the log's keys, by its layout
            self.job_class = cast(type[StepJob], type(
                "StepJob", (StepJob,), {"names": self.saga_store.events.keys}))
        # closing entries wait for a batch: this worker's sweeper chains them
        self.saga_store.events.ledger.deferred = True
        self.runner = StepRunner(self.saga_store, self.name,
                                 keep_going=lambda: not self._stop_requested)
        self.refused = 0
        self._last_beat = 0.0
        self._last_suspension_check = 0.0
        self._state_written: str | None = None
        self.sweeper = Sweeper(self.saga_store, self.name, self.sweep_interval_s)
        self.durability = DurabilityWatch(log_client, self.settings.durability_check_s,
                                          log)

    def work(self, *args: Any, **kwargs: Any) -> bool:
        # nothing of ours is scheduled through RQ (the sweeper redelivers from the
        # log), and RQ's scheduler registers under a name no namespace owns
        # (rq:scheduler:<uuid>), which a namespace's ACL user is not granted
        kwargs["with_scheduler"] = False
        return bool(super().work(*args, **kwargs))

    def subscribe(self) -> None:
        """RQ's, with the pubsub thread's wait at 1 s instead of 60: stopping the
        worker joins that thread, which could otherwise sit out a whole wait after
        the unsubscribe (a burst worker took up to a minute to exit)."""
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(
            sleep_time=1, daemon=True,  # type: ignore[assignment]  # RQ types it None
            exception_handler=self._pubsub_exception_handler)

    # -- the job path ------------------------------------------------------

    def execute_job(self, job: Any, queue: Queue) -> None:
        # RQ's warm shutdown waits for a BUSY worker; the state is kept here only,
        # since the log, not the worker hash, tells what a step is doing
        self._state = WorkerStatus.BUSY
        try:
            self.run_job(job, queue, self.runner)
        finally:
            self._state = WorkerStatus.IDLE

    def run_job(self, job: Any, queue: Queue, runner: StepRunner) -> None:
        """Run one dequeued job with ``runner`` on this thread, or refuse it: any job
        that is not one of ours is acknowledged, counted and never run."""
        drive(self.job_work(job, queue, runner), runner.invoker)

    def job_work(self, job: Any, queue: Queue, runner: StepRunner) -> Work[None]:
        """:meth:`run_job` as work that yields its tool calls (the asyncio worker
        runs many at once on its loop; ``runner`` is the job's own)."""
        decoded = jobs.decode(job._data)  # raw bytes: never RQ's deserializer
        ack = _acker(queue, job.id)
        if decoded is None or not jobs.named_by(job.id, *decoded):
            self.refused += 1
            self.metrics.refused_jobs.inc()
            log.warning("refused job %s on %s: not a saga job, or its data names another "
                        "saga than its id (only %s run here)", job.id, queue.name,
                        ", ".join(sorted(jobs.OUR_FUNCS)))
            pipe = lean(self.connection)
            ack(pipe)
            pipe.execute()
            return
        func, args = decoded
        try:
            if func == jobs.STEP_FUNC:
                saga_id, step, intent_seq = args
                pre = job.prefetched
                reads = pre[1] if pre and pre[0] == (saga_id, intent_seq) else None
                yield from runner.work(str(saga_id), int(step), int(intent_seq), ack, reads)
            else:
                from .compensator import Compensator
                yield from Compensator(self.saga_store, self.name, runner.invoker).work(
                    str(args[0]), ack)
        except StopRequested:
            raise
        except (redis.ConnectionError, redis.TimeoutError, StoreUnavailable) as exc:
            # leave the job unacknowledged: the log keeps the step's state, the
            # sweeper redelivers it, and RQ's dequeue backs off until Redis is back
            log.error("Redis unreachable during job %s (%s); it will be redelivered", job.id,
                      exc)
        except Exception:
            # the log keeps the step's state; the sweeper redelivers it later
            log.exception("job %s (%s%s) raised; it will be redelivered", job.id, func, args)
            pipe = lean(self.connection)
            ack(pipe)
            pipe.execute()

    # -- stopping -------------------------------------------------------------

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        # the thread that ends a stop stuck on Redis, started before any signal can
        # come (a thread started in a signal handler could wait on a lock for ever)
        stopping = process_stopping()
        stopping.watch_exit(self._unfinished)
        super().bootstrap(*args, **kwargs)

    def _unfinished(self) -> int:
        return 1 if self._state == WorkerStatus.BUSY else 0

    def request_stop(self, signum: int, frame: Any) -> None:
        """SIGTERM or SIGINT: RQ's warm shutdown (the step under way finishes, then
        the worker exits), with every wait of the step giving way: a back-off hands
        its step back, and a stop that is left waiting on Redis ends the process
        (see :mod:`.stopping`)."""
        process_stopping().request()
        super().request_stop(signum, frame)  # type: ignore[no-untyped-call]

    def _shutdown(self) -> None:
        # RQ's writes the request's date to Redis here, in the signal handler: with
        # Redis unreachable that write would hold the handler (and the tool call it
        # interrupted) in the outage's retries for ever
        if self.get_state() == WorkerStatus.BUSY:
            self._stop_requested = True
            log.info("Worker %s: stopping once the step under way is done (signal again "
                     "to exit at once)", self.name)
        else:
            raise StopRequested

    def request_force_stop(self, signum: int, frame: Any) -> None:
        """The second signal: exit at once. RQ's raises SystemExit wherever the
        worker is, inside a tool call too, where it would read as the tool's own;
        the log keeps what the step did and the sweeper redelivers the rest, as
        after SIGKILL."""
        requested = self._shutdown_requested_date
        if requested is not None and (now() - requested).total_seconds() < 1:
            return  # the pool and the terminal both passed on one Ctrl+C
        log.warning("Worker %s: cold shut down; the sweeper redelivers what was in flight",
                    self.name)
        os._exit(1)

    # -- the sweeper rides on RQ's maintenance hook --------------------------

    @property
    def dequeue_timeout(self) -> int:
        # wake at least every sweep interval even when idle (RQ's default is minutes)
        return max(1, int(self.sweep_interval_s))

    @property
    def should_run_maintenance_tasks(self) -> bool:
        return (self.sweeper.due() or self.durability.due()
                or super().should_run_maintenance_tasks)

    def run_maintenance_tasks(self) -> None:
        if self.sweeper.due():
            try:
                self.metrics.redeliveries.inc(self.sweeper.sweep())
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.error("sweeper: Redis unreachable (%s); next sweep later", exc)
            except StopRequested:
                raise  # RQ's warm shutdown, raised wherever SIGTERM found the worker
            except Exception:  # whatever is in Redis, a sweep never stops the worker
                log.exception("sweeper: this sweep failed; next sweep later")
        if self.durability.due():
            # unreachable: the sweeper has said so; the next read is a period away
            with contextlib.suppress(redis.RedisError):
                self.durability.check()
        if super().should_run_maintenance_tasks:
            # no-untyped-call: the library leaves it untyped
            super().run_maintenance_tasks()  # type: ignore[no-untyped-call]

    # -- RQ bookkeeping, throttled ----------------------------------------

    def registered_as(self) -> tuple[str, int]:
        """The kind and concurrency ``saga workers`` and the console show."""
        return "rq", 1

    def register_birth(self) -> None:
        super().register_birth()  # type: ignore[no-untyped-call]
        # beside RQ's fields, so it expires and is deleted with the registration
        kind, slots = self.registered_as()
        self.connection.hset(self.key, mapping={fleet.KIND_FIELD: kind,
                                                fleet.CONCURRENCY_FIELD: str(slots)})

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        now = time.monotonic()
        if pipeline is None and now - self._last_beat < HEARTBEAT_EVERY_S:
            return
        self._last_beat = now
        super().heartbeat(timeout, pipeline)
        # RQ's beat is in this host's time; readers on other hosts compare Redis's
        (pipeline if pipeline is not None else self.connection).eval(
            HEARTBEAT, 1, self.key, fleet.BEAT_FIELD)

    def set_state(self, state: str, pipeline: Any = None) -> None:
        self._state = state
        if state != self._state_written or pipeline is not None:
            self._state_written = state
            super().set_state(state, pipeline)

    def check_for_suspension(self, burst: bool) -> None:
        now = time.monotonic()
        if now - self._last_suspension_check >= SUSPENSION_CHECK_EVERY_S:
            self._last_suspension_check = now
            super().check_for_suspension(burst)


def _acker(queue: Queue, job_id: str) -> Any:
    """Acknowledge a job on a pipeline: off the intermediate list; its hash is left
    to expire soon, not deleted, so a duplicate copy still reaches a worker and
    is recorded in the log as suppressed instead of vanishing inside RQ."""
    def ack(pipe: Any) -> None:
        pipe.lrem(queue.intermediate_queue_key, 1, job_id)
        pipe.expire(jobs.job_key(job_id), jobs.ACKED_JOB_TTL_S)
    return ack


def configured(tools: tuple[str, ...], settings: Settings,
               log_url: str | None = None) -> type[StepWorker]:
    """A StepWorker class bound to these tools modules and settings, with the log on
    ``log_url`` (None: on the Redis of RQ's queues)."""
    return type("StepWorker", (StepWorker,), {"tools_modules": tools, "settings": settings,
                                              "log_url": log_url, "__module__": __name__})
