"""Running a store's queued steps and unwinds in the caller's own process.

The embedded store (``make demo``, the offline examples) has no worker
processes: :class:`InlineRunner` pops its jobs and hands them to the same
drivers the workers use (:class:`~saga_store.workers.step.StepRunner`,
:class:`~saga_store.workers.compensator.Compensator`), so the log, dedupe,
leases and compensation are the workers' own.
"""

from __future__ import annotations

from saga_store.client.api import SagaStore
from saga_store.execution import jobs
from saga_store.log.stream import command

from .compensator import Compensator
from .invoke import Invoker
from .step import StepRunner

QUEUES = (jobs.STEP_QUEUE, jobs.COMPENSATION_QUEUE)


class InlineRunner:
    """Pops jobs off the step queue, then the compensation queue, and runs them here.

    This is the user's own process: a KeyboardInterrupt (Ctrl+C) or SystemExit
    raised inside a tool leaves its step in doubt, as on any worker, and is then
    raised to the caller; nothing after it runs here (no next step, no unwind:
    those go to the queue, for a worker or the next ``recover()``)."""

    def __init__(self, store: SagaStore, name: str = "inline") -> None:
        self.store = store
        invoker = Invoker(passes_on=True)
        self.steps = StepRunner(store, name, keep_going=lambda: invoker.interrupted is None,
                                invoker=invoker)
        self.unwinds = Compensator(store, name, invoker)

    def run_one(self) -> bool:
        """Run the next queued job, if any; False when both queues are empty."""
        r = self.store.redis
        raw = next((got for q in QUEUES
                    if (got := command(r, "LPOP", jobs.queue_key(q))) is not None), None)
        if raw is None:
            return False
        job_id = raw.decode(errors="replace")
        decoded = jobs.decode(command(r, "HGET", jobs.job_key(job_id), "data"))
        if decoded is None or not jobs.named_by(job_id, *decoded):
            return True  # not one of ours: refused, as a worker refuses it
        func, args = decoded
        if func == jobs.STEP_FUNC:
            self.steps.run(str(args[0]), int(args[1]), int(args[2]))
        else:
            self.unwinds.run(str(args[0]))
        return True

    def drain(self) -> int:
        """Run jobs until none is queued (a job may queue the next); returns how many."""
        n = 0
        while self.run_one():
            n += 1
        return n
