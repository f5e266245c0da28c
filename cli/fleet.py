"""``saga workers``, and the warning ``saga run --wait`` gives when nobody works."""

from __future__ import annotations

import time
from typing import Any

import click
import redis

from saga_store.execution import jobs
from saga_store.execution.enqueue import in_flight
from saga_store.ops import fleet

from .common import Context, emit_json, errors_to_exit, pass_ctx


class NoWorkerWarning:
    """Called while waiting: warns once on stderr when no live worker takes jobs
    from the steps queue (see :mod:`saga_store.ops.fleet`), twice in a row about a
    second apart (a worker started together with the run has registered by then)."""

    def __init__(self, client: Any, queue: str = jobs.STEP_QUEUE, every_s: float = 1.0,
                 log: Any = None) -> None:
        """``client``: RQ's Redis; ``log``: the log's (default: the same)."""
        self.client, self.queue, self.every_s, self.log = client, queue, every_s, log
        self.misses, self.warned, self._last = 0, False, -every_s

    def __call__(self) -> None:
        now = time.monotonic()
        if self.warned or now - self._last < self.every_s:
            return
        self._last = now
        try:
            if fleet.serving(self.client, self.queue, self.log):
                self.misses = 0
                return
            found = fleet.registered(self.client, self.queue, work=False)
        except redis.RedisError:  # a user without rights to RQ's keys: no opinion
            return
        self.misses += 1
        if self.misses < 2:
            return
        self.warned = True
        ages = [w.heartbeat_age_s for w in found if w.heartbeat_age_s is not None]
        why = (f"the last one was heard from {min(ages):.0f} s ago" if ages
               else "none is registered")
        click.echo(f"WARNING: no worker is taking jobs from {self.queue} ({why}); the saga "
                   "waits until one runs: saga worker --tools MODULE", err=True)


@click.command("workers")
@click.option("--json", "as_json", is_flag=True, envvar="SAGA_JSON",
              help="Machine-readable output.")
@click.option("--all", "show_all", is_flag=True, envvar="SAGA_WORKERS_ALL",
              help="Also workers taken for gone: registered, but no heartbeat for 20 s "
                   "and no saga's lease held (killed, most likely).")
@pass_ctx
def workers_command(ctx: Context, as_json: bool, show_all: bool) -> None:
    """Live workers (host, pid, kind/concurrency, state, current job), queue lengths,
    sagas in flight."""
    with errors_to_exit():
        log, client = ctx.store().redis, ctx.queues()
        found = [w for w in fleet.registered(client, log=log) if show_all or w.live]
        queues = fleet.queue_lengths(client)
        flying = len(in_flight(log))
        if as_json:
            emit_json({"workers": [w.to_dict() for w in found], "queues": queues,
                       "sagas_in_flight": flying})
            return
        if not found:
            click.echo("no live workers (start one: saga worker --tools MODULE)")
        else:
            click.echo(f"{'WORKER':<34} {'HOST/PID':<24} {'KIND':<10} {'STATE':<10} {'BEAT':>6}"
                       "  CURRENT JOB")
        for w in found:
            where = f"{w.hostname or '?'}/{w.pid or '?'}"
            beat = "-" if w.heartbeat_age_s is None else f"{w.heartbeat_age_s:.0f}s"
            kind = f"{w.kind or '?'}/{w.concurrency or '?'}"
            click.echo(f"{w.name:<34} {where:<24} {kind:<10} {w.state if w.live else 'gone':<10} "
                       f"{beat:>6}  {w.current_job or '-'}")
        click.echo("")
        for q, n in queues.items():
            click.echo(f"queue {q}: {n} waiting")
        click.echo(f"sagas with work in flight: {flying}")


COMMANDS = [workers_command]
