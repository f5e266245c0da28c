"""The asyncio worker: one process runs up to N steps (and unwinds) at once.

It is a :class:`StepWorker` with another main loop. One dequeuing thread takes
jobs off RQ's queues through RQ's own ``Queue.dequeue_any`` (one queue: BLMOVE
onto the queue's intermediate list; several: BLPOP, as RQ's worker does), with
the same job class, so the intermediate list, RQ's registries and ``rq info``
see what they see for any RQ worker, and the worker registers, beats and dies
as RQ's do. It takes a job only while fewer than N are in flight, and hands
each to the event loop.

On the loop each job is a task that drives its work (:meth:`StepWorker.job_work`:
the same refusal rules, acknowledgement, drivers and metrics as the RQ worker,
with a :class:`StepRunner` of its own) with :func:`.invoke.adrive`. The work's
Redis round trips run on the loop's thread, between two tool calls; an async
tool is awaited on the loop, so a step waiting on its tool holds no thread; a
sync tool runs on a pool of N threads, where it cannot be stopped at its
timeout and the process's watchdog keeps its lease (see :mod:`.watchdog`).
With no thread per step, N steps in flight cost N tasks, not N threads
competing for the interpreter: a thread per slot cost the workers about twice
the CPU per workflow at 256 slots (benchmarks/RESULTS.md).

The sweeper, the durability check, RQ's maintenance, the heartbeat and the
suspension check run on a thread of their own every :data:`CHORES_EVERY_S`, so
a worker with every slot busy still beats and still sweeps.

Stopping: the first SIGTERM or SIGINT stops dequeuing and stops taking a plan's
next step in-process; the jobs in flight finish and the process exits 0. A
second signal, a second or more later, exits at once with status 1: the log
keeps what each step did and the sweeper redelivers the rest, as after SIGKILL.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import redis
from rq.exceptions import DequeueTimeout
from rq.queue import Queue
from rq.suspension import is_suspended
from rq.worker import WorkerStatus

from saga_store.log.pipeline import lean

from .invoke import Invoker, Sends, adrive
from .step import StepRunner
from .worker import SUSPENSION_CHECK_EVERY_S, StepWorker, drop_unusable, usable

log = logging.getLogger("saga_store.worker")
DEFAULT_CONCURRENCY = 8
# the most jobs one dequeue takes when more are queued and slots are free
DEQUEUE_BATCH = 32
# pop up to ARGV[1] job ids off the queues KEYS (in order), as RQ's dequeue would:
# onto the intermediate list (the last key) when ARGV[2] is 1 (one queue)
DEQUEUE_MORE = """
local n, one = tonumber(ARGV[1]), ARGV[2] == '1'
local out, last = {}, #KEYS - (one and 1 or 0)
for i = 1, last do
  while #out < 2 * n do
    local id
    if one then id = redis.call('LMOVE', KEYS[i], KEYS[#KEYS], 'LEFT', 'RIGHT')
    else id = redis.call('LPOP', KEYS[i]) end
    if not id then break end
    out[#out + 1] = KEYS[i]
    out[#out + 1] = id
  end
end
return out
"""
CHORES_EVERY_S = 0.25
# the pool and the terminal may both pass on one Ctrl+C: a second signal this soon
# after the first is the same request
SAME_SIGNAL_S = 1.0


class AsyncWorker(StepWorker):
    """Runs up to ``concurrency`` jobs at once in one process. Configure with
    :func:`configured`; ``work()`` serves until asked to stop (or, with
    ``burst``, until the queues are empty and nothing is in flight)."""

    concurrency: ClassVar[int] = DEFAULT_CONCURRENCY

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # a sync tool's thread may check connections out (a lease renewal, the tool's
        # own use of the store); redis-py refuses a 101st connection by default ("Too
        # many connections") (a cluster's node pools have no such limit)
        log_client = self.saga_store.redis
        for client in {id(c): c for c in (self.connection, log_client)}.values():
            pool = getattr(client, "connection_pool", None)
            if pool is not None:
                pool.max_connections = max(pool.max_connections,
                                           connections_for(self.concurrency))
        self._count = threading.Lock()  # guards the counts
        self._free = threading.Semaphore(self.concurrency)  # slots: taken by the dequeuer
        self._invoker = Invoker()
        self._tools = ThreadPoolExecutor(self.concurrency, thread_name_prefix="saga-tool")
        self._runners: list[StepRunner] = []  # idle runners, kept for their metric children
        pool = getattr(log_client, "connection_pool", None)
        # the round trips of the steps ready in one turn of the loop go out together
        # (group commit; SAGA_GROUP_COMMIT=0: each alone; a cluster: each alone)
        self._sends = Sends(pool) if pool is not None and \
            os.environ.get("SAGA_GROUP_COMMIT", "1") != "0" else None
        self._in_flight = 0
        self._suspended = False
        self._stop_at = 0.0
        self._connection_wait = 0.5
        self.completed = 0

    def registered_as(self) -> tuple[str, int]:
        return "asyncio", self.concurrency

    def work(self, burst: bool = False, logging_level: str | None = "INFO",
             *_rq_args: Any, **_rq_options: Any) -> bool:
        """Serve the queues; returns whether any job was run. RQ's other options
        (``with_scheduler``, which the pool passes) do not apply here."""
        self.bootstrap(logging_level)
        log.info("Worker %s: asyncio, up to %d jobs at once", self.name, self.concurrency)
        try:
            asyncio.run(self._serve(burst))
        finally:
            self.teardown()  # type: ignore[no-untyped-call]  # the library leaves it untyped
        return self.completed > 0

    # -- the loop -----------------------------------------------------------

    async def _serve(self, burst: bool) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            # not the loop's handler: the loop may be held up waiting for Redis to
            # come back, and a second signal must still exit at once
            signal.signal(sig, lambda signum, _frame: self._on_signal(signum))
        chores = asyncio.create_task(self._chores())
        dequeuer_done = asyncio.Event()
        tasks: set[asyncio.Task[None]] = set()

        def start(got: tuple[Any, Queue]) -> None:
            task = loop.create_task(self._drive(*got))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        def dequeuer() -> None:
            try:
                self._dequeue_loop(burst, lambda got: loop.call_soon_threadsafe(start, got))
            except BaseException:  # never a reason for the process to stop serving
                log.exception("Worker %s: the dequeuing thread failed", self.name)
            finally:
                loop.call_soon_threadsafe(dequeuer_done.set)

        thread = threading.Thread(target=dequeuer, name="saga-dequeue", daemon=True)
        try:
            thread.start()
            await dequeuer_done.wait()
            while tasks:  # what is in flight finishes
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            chores.cancel()
            self._tools.shutdown(wait=False)
        sends = self._sends
        if sends is not None and sends.rounds:
            log.info("Worker %s: group commit sent %d round trips in %d rounds (%.1f a "
                     "round; most in flight at once: %d)", self.name, sends.batches,
                     sends.rounds, sends.batches / sends.rounds, sends.deepest)
        log.info("Worker %s: stopped", self.name)

    def _dequeue_loop(self, burst: bool, hand_over: Callable[[tuple[Any, Queue]], Any]) -> None:
        """The dequeuing thread: a job off the queues whenever a slot is free, handed
        to the loop, until asked to stop (or, in burst mode, until nothing is queued
        or in flight)."""
        while not self._stop_requested:
            if not self._free.acquire(timeout=SUSPENSION_CHECK_EVERY_S):
                continue  # every slot busy: look at the stop request again
            got = self._next_job(burst)
            if got is None:
                self._free.release()
                if burst and not self._busy():
                    return
                continue
            more = self._take_free_slots()
            extra: list[tuple[Any, Queue]] = []
            try:
                extra = self._dequeue_more(more)
            except Exception:  # what it popped is redelivered from the log
                log.exception("Worker %s: could not take more jobs at once; going on",
                              self.name)
            finally:
                for _ in range(more - len(extra)):
                    self._free.release()
            with self._count:
                self._in_flight += 1 + len(extra)
            for one in (got, *extra):
                hand_over(one)

    async def _drive(self, job: Any, queue: Queue) -> None:
        """One job, as a task on the loop. Whatever it raises stays here: the log
        keeps the step's state and the sweeper redelivers what is owed."""
        runner = self._runners.pop() if self._runners else StepRunner(
            self.saga_store, self.name, keep_going=lambda: not self._stop_requested,
            invoker=self._invoker)
        try:
            await adrive(self.job_work(job, queue, runner), self._invoker, self._tools,
                         self._sends)
        except asyncio.CancelledError:
            raise
        except BaseException:  # SystemExit from a tool, say: never the end of the worker
            log.exception("job %s could not be finished; it will be redelivered", job.id)
        finally:
            runner.reset()
            self._runners.append(runner)  # a runner carries nothing past its job's end
            self._free.release()
            with self._count:
                self._in_flight -= 1
                self.completed += 1
                if self._stop_requested and not self._in_flight:
                    log.info("Worker %s: the jobs in flight are done", self.name)

    def _take_free_slots(self) -> int:
        """How many more slots are free now (at most :data:`DEQUEUE_BATCH` - 1),
        taken."""
        n = 0
        while n < DEQUEUE_BATCH - 1 and self._free.acquire(blocking=False):
            n += 1
        return n

    def _dequeue_more(self, n: int) -> list[tuple[Any, Queue]]:
        """Up to ``n`` more jobs already queued, in one round trip to pop them and one
        to read them: RQ's own moves (LPOP in the queues' order; LMOVE onto the
        intermediate list when the worker serves one queue, as RQ's dequeue does),
        made by one script, and each job's ``data`` (with a step's log reads, as
        :class:`StepJob` fetches them). A burst of queued sagas otherwise waits on
        two round trips per job in this one thread."""
        if n <= 0 or self._stop_requested:
            return []
        queues = self._ordered_queues
        one = len(queues) == 1
        keys = [q.key for q in queues] + ([queues[0].intermediate_queue_key] if one else [])
        popped = self.connection.eval(DEQUEUE_MORE, len(keys), *keys, n, int(one))
        if not popped:
            return []
        by_key = {q.key: q for q in queues}
        pipe = lean(self.connection)
        wanted = []
        for queue_key, job_id in zip(popped[::2], popped[1::2], strict=True):
            if not usable(job_id):
                drop_unusable(self.connection, queue_key, job_id,
                                queues[0].intermediate_queue_key if one else None)
                continue
            job: Any = self.job_class(job_id.decode(), connection=self.connection,
                                      serializer=self.serializer)
            wanted.append((job, by_key[queue_key.decode()], job.fetch_on(pipe)))
        replies = pipe.execute(raise_on_error=False)
        out = []
        for job, queue, take in wanted:
            try:
                if take(replies):  # else gone meanwhile: RQ's dequeue passes over it too
                    out.append((job, queue))
            except redis.RedisError as exc:  # a job hash of the wrong type, say
                log.error("Worker %s: job %s could not be read (%s); dropped", self.name,
                          job.id, exc)
        return out

    def _busy(self) -> bool:
        with self._count:
            return self._in_flight > 0

    def _next_job(self, burst: bool) -> tuple[Any, Queue] | None:
        """One job off the queues, or None: none came within the dequeue timeout
        (at once, in burst mode), suspended, stopping, or Redis unreachable (after
        backing off)."""
        if self._suspended or self._stop_requested:
            time.sleep(SUSPENSION_CHECK_EVERY_S / 2)
            return None
        timeout = None if burst else self.dequeue_timeout
        try:
            got = self._dequeue(timeout)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            wait = self._connection_wait = min(self._connection_wait * 2,
                                               self.max_connection_wait_time)
            log.error("Worker %s: could not reach Redis to dequeue (%s); again in %.0f s",
                      self.name, exc, wait)
            time.sleep(wait)
            return None
        except Exception:  # a job hash of the wrong type, say: never the end of the worker
            log.exception("Worker %s: dequeue failed; going on", self.name)
            time.sleep(SUSPENSION_CHECK_EVERY_S)
            return None
        self._connection_wait = 0.5
        if got is not None and self._stop_requested:  # asked to stop while it waited
            self._give_back(*got)
            return None
        if got is None and burst and self._busy():
            time.sleep(0.02)  # what is in flight may still queue more
        return got

    def _dequeue(self, timeout: int | None) -> tuple[Any, Queue] | None:
        try:
            return self.queue_class.dequeue_any(
                self._ordered_queues, timeout, connection=self.connection,
                job_class=self.job_class, serializer=self.serializer)
        except DequeueTimeout:
            return None

    def _give_back(self, job: Any, queue: Queue) -> None:
        """Put a job taken after the stop request back at the head of its queue
        (and off the intermediate list), for another worker to take."""
        pipe = self.connection.pipeline(transaction=True)
        pipe.lpush(queue.key, job.id)
        pipe.lrem(queue.intermediate_queue_key, 1, job.id)
        pipe.execute()

    # -- beside the jobs ------------------------------------------------------

    async def _chores(self) -> None:
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(1, thread_name_prefix="saga-chores") as thread:
            while True:
                await loop.run_in_executor(thread, self._chores_once)
                await asyncio.sleep(CHORES_EVERY_S)

    def _chores_once(self) -> None:
        try:
            self.heartbeat()  # throttled
            self.set_state(WorkerStatus.BUSY if self._in_flight else WorkerStatus.IDLE)
            now = time.monotonic()
            if now - self._last_suspension_check >= SUSPENSION_CHECK_EVERY_S:
                self._last_suspension_check = now
                suspended = bool(is_suspended(self.connection, self))
                if suspended != self._suspended:
                    log.info("Worker %s: %s", self.name, "suspended, run `rq resume` to resume"
                             if suspended else "resumed")
                self._suspended = suspended
            if self.should_run_maintenance_tasks:
                self.run_maintenance_tasks()
        except redis.RedisError as exc:  # the outage is logged once by the client
            log.debug("Worker %s: chores skipped (%s)", self.name, exc)
        except Exception:
            log.exception("Worker %s: chores failed; again in %.2f s", self.name,
                          CHORES_EVERY_S)

    def _unfinished(self) -> int:
        return self._in_flight

    def _on_signal(self, signum: int) -> None:
        now = time.monotonic()
        if not self._stop_requested:
            self._stop_requested, self._stop_at = True, now
            self._invoker.stopping.request()  # every wait of the steps gives way
            log.warning("Worker %s: %s: no more jobs taken; the %d in flight finish, then "
                        "it exits (signal again to exit at once)", self.name,
                        signal.Signals(signum).name, self._in_flight)
            return
        if now - self._stop_at < SAME_SIGNAL_S:
            return
        log.warning("Worker %s: cold shut down with %d job(s) in flight; the sweeper "
                    "redelivers them", self.name, self._in_flight)
        os._exit(1)


def connections_for(concurrency: int) -> int:
    """Redis connections a worker running ``concurrency`` jobs may hold at once: a
    few per sync-tool thread (a lease renewal, the tool's own use of the store), and
    a few for the loop, the dequeuing thread, the chores (sweeper included) and RQ's
    pubsub."""
    return 3 * concurrency + 16


def configured(base: type[StepWorker], concurrency: int) -> type[AsyncWorker]:
    """An AsyncWorker class with the tools, settings and log of ``base`` (a class from
    :func:`workers.worker.configured`), running up to ``concurrency`` jobs."""
    return type("AsyncWorker", (AsyncWorker,), {
        "tools_modules": base.tools_modules, "settings": base.settings,
        "log_url": base.log_url, "concurrency": concurrency, "__module__": __name__})
