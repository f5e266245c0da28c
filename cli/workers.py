"""Execution commands: ``saga worker``, ``saga run``, ``saga resume``, ``saga abort``."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import click
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from saga_store.errors import InvalidInput, StepPending
from saga_store.execution import jobs
from saga_store.ids import check_saga_id
from saga_store.log.canonical import check_json, loads
from saga_store.protocol.vocab import Status
from saga_store.tools.registry import Registry

from .common import (
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    Context,
    emit_json,
    errors_to_exit,
    fail,
    operator,
    pass_ctx,
)
from .fleet import NoWorkerWarning
from .waiting import WaitReporter, remaining, waiting_for

QUEUES = [jobs.STEP_QUEUE, jobs.COMPENSATION_QUEUE]


class PlanStep(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    tool_call_id: str | None = None


class Plan(BaseModel):
    """A plan file (contract)."""

    model_config = ConfigDict(extra="forbid")
    agent_id: str
    conversation_id: str | None = None
    steps: list[PlanStep] = Field(min_length=1)


@click.command("worker")
@click.option("--tools", "tools", multiple=True, required=True, envvar="SAGA_TOOLS",
              help="Python module(s) whose @tool functions this worker may run.")
@click.option("-n", "--processes", "n", type=click.IntRange(1, 256), default=1,
              show_default=True, envvar="SAGA_WORKERS", help="Worker processes to run.")
@click.option("--burst", is_flag=True, envvar="SAGA_BURST",
              help="Quit when the queues are empty.")
@click.option("--async", "use_async", is_flag=True, envvar="SAGA_WORKER_ASYNC",
              help="Run an asyncio worker: each process runs up to --concurrency steps "
                   "at once, async tools on its event loop, sync tools on its threads.")
@click.option("--concurrency", type=click.IntRange(min=1, max=1024), default=None,
              envvar="SAGA_CONCURRENCY",
              help="With --async: steps (and unwinds) in flight per process (default 8).")
@click.option("--queues", "queues", multiple=True, envvar="SAGA_QUEUES",
              type=click.Choice(QUEUES), help="Queues to serve (default: steps and compensations).")
@click.option("--log-level", default="INFO", envvar="SAGA_LOG_LEVEL", show_default=True)
@click.option("--metrics-port", type=int, default=None, envvar="SAGA_METRICS_PORT",
              help="Serve /metrics for all worker processes (and the Redis gauges) here.")
@click.option("--metrics-host", default="127.0.0.1", show_default=True,
              envvar="SAGA_METRICS_HOST")
@click.option("--strict", is_flag=True, envvar="SAGA_STRICT",
              help="Refuse to start when Redis does not persist every write (AOF).")
@click.option("--policy", "policy_file", default=None, envvar="SAGA_POLICY_FILE",
              type=click.Path(dir_okay=False, exists=True),
              help="Approval policy (TOML, or YAML if named .yaml/.yml). Without one, every "
                   "call is allowed unless its tool asks for approval itself.")
@pass_ctx
def worker(ctx: Context, tools: tuple[str, ...], n: int, burst: bool, use_async: bool,
           concurrency: int | None, queues: tuple[str, ...], log_level: str,
           metrics_port: int | None, metrics_host: str, strict: bool,
           policy_file: str | None) -> None:
    """Run worker processes for steps and compensations.

    SIGTERM or SIGINT: each worker finishes its current step (with --async, every
    step it has in flight), then exits; a second signal exits at once. With
    --metrics-port, workers record into prometheus_client's multiprocess files
    and this process serves one /metrics endpoint for all of them.
    """
    if concurrency is not None and not use_async:
        raise click.UsageError("--concurrency applies to asyncio workers only; add --async "
                               "(RQ workers run one step at a time: scale them with -n)")
    if metrics_port is not None and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        # must be set before prometheus_client is first imported, in every worker
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="saga-metrics-")
    from saga_store.workers.worker import configured
    with errors_to_exit():
        Registry.from_modules(*tools)  # fail here, not in every forked worker
        if policy_file:
            import dataclasses

            from saga_store.approval.policy import Policy
            Policy.load(policy_file)  # a bad policy is a usage error now, not in each worker
            ctx.settings = dataclasses.replace(ctx.settings, policy_file=policy_file)
        store = ctx.store()
        from saga_store.ops.doctor import examine, persistent
        findings = examine(store.redis, store.settings.wait_replicas)
        for f in findings:  # too few replicas: every append waits, then is not confirmed
            if f.setting.endswith("wait_replicas") and not f.ok:
                click.echo(f"WARNING: {f.setting}={f.value}: {f.advice}", err=True)
        if not persistent(findings):
            for f in findings:
                if not f.ok:
                    click.echo(f"WARNING: Redis {f.setting}={f.value}: {f.advice}", err=True)
            if strict:
                click.echo("error: refusing to start without durable Redis (--strict); "
                           "see 'saga doctor'", err=True)
                sys.exit(EXIT_UNAVAILABLE)
        # a worker outlives any outage: it backs off (capped, jittered) and carries on
        from saga_store.ops.connection import redact, set_retry_window
        set_retry_window(store.redis, None)
        rq_redis = ctx.queues()  # RQ's connection; the log's too unless that is elsewhere
        set_retry_window(rq_redis, None)
        worker_class = configured(tools, ctx.settings,
                                  log_url=None if rq_redis is store.redis else ctx.log_url)
        if use_async:
            from saga_store.workers import aio
            worker_class = aio.configured(worker_class, concurrency or aio.DEFAULT_CONCURRENCY)
        names = list(queues) or QUEUES
        logging.basicConfig(level=log_level, format="%(asctime)s %(name)s %(message)s")
        logging.getLogger("saga_store.worker").info(
            "saga worker: %d %s process%s on %s%s, queues %s, tools %s, policy %s",
            n, "asyncio" if use_async else "RQ", "" if n == 1 else "es", redact(ctx.log_url),
            "" if rq_redis is store.redis else f" (queues on {redact(ctx.queue_url or '')})",
            ", ".join(names), ", ".join(tools), policy_file or
            "none (every call allowed unless its tool asks for approval)")
        if metrics_port is not None:
            serve_metrics(store.redis, metrics_port, metrics_host, multiprocess=True,
                          check_s=ctx.settings.durability_check_s, rq_redis=rq_redis)
        if n == 1:
            from rq.queue import Queue
            w = worker_class([Queue(q, connection=rq_redis) for q in names],
                             connection=rq_redis)
            w.work(burst=burst, logging_level=log_level)
            return
        from rq.worker_pool import WorkerPool
        pool = WorkerPool(names, connection=rq_redis, num_workers=n,
                          worker_class=worker_class)
        pool.start(burst=burst, logging_level=log_level)


def serve_metrics(client: Any, port: int, host: str, *, multiprocess: bool,
                  check_s: float, rq_redis: Any = None) -> None:
    """Serve /metrics in a background thread: the Redis gauges, plus every worker
    process's counters when ``multiprocess``. Durability is re-read every
    ``check_s`` seconds; the exporter logs its changes only when it runs alone
    (beside workers, each worker logs them)."""
    from prometheus_client import CollectorRegistry, start_http_server

    from saga_store.ops.connection import fail_fast
    from saga_store.ops.durability import DurabilityWatch
    from saga_store.ops.metrics import RedisCollector
    client = fail_fast(client)  # a scrape answers now, also while Redis is down
    rq_redis = client if rq_redis is None else fail_fast(rq_redis)
    registry = CollectorRegistry()
    if multiprocess:
        from saga_store.ops.metrics import WorkerFilesCollector
        registry.register(WorkerFilesCollector(os.environ["PROMETHEUS_MULTIPROC_DIR"]))
    log = None if multiprocess else logging.getLogger("saga_store.metrics")
    watch = DurabilityWatch(client, check_s, log)
    registry.register(RedisCollector(client, durability=watch, rq_redis=rq_redis))
    start_http_server(port, addr=host, registry=registry)


@click.command("metrics")
@click.option("--port", type=int, default=9464, show_default=True, envvar="SAGA_METRICS_PORT")
@click.option("--host", default="127.0.0.1", show_default=True, envvar="SAGA_METRICS_HOST")
@click.option("--once", is_flag=True, help="Print the metrics once and exit.")
@pass_ctx
def metrics(ctx: Context, port: int, host: str, once: bool) -> None:
    """A standalone exporter for the Redis-derived gauges (sagas by state, queues)."""
    with errors_to_exit():
        store = ctx.store()
        if once:
            from prometheus_client import CollectorRegistry, generate_latest

            from saga_store.ops.metrics import RedisCollector
            registry = CollectorRegistry()
            registry.register(RedisCollector(store.redis, rq_redis=ctx.queues()))
            click.echo(generate_latest(registry).decode(), nl=False)
            return
        logging.basicConfig(level="INFO", format="%(asctime)s %(name)s %(message)s")
        serve_metrics(store.redis, port, host, multiprocess=False,
                      check_s=ctx.settings.durability_check_s, rq_redis=ctx.queues())
        click.echo(f"serving /metrics on http://{host}:{port}/metrics", err=True)
        import threading
        threading.Event().wait()


# saga run --wait: the saga's end in the exit code (1-3 mean what they mean everywhere)
EXIT_COMPENSATED, EXIT_NEEDS_ATTENTION, EXIT_STUCK, EXIT_WAIT_TIMEOUT = 4, 5, 6, 7
RUN_EXIT = {Status.COMMITTED: 0, Status.COMPENSATED: EXIT_COMPENSATED,
            Status.NEEDS_ATTENTION: EXIT_NEEDS_ATTENTION, Status.STUCK: EXIT_STUCK}


@click.command("run")
@click.argument("plan_file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--tools", "tools", multiple=True, required=True, envvar="SAGA_TOOLS",
              help="Tools module(s), to validate the plan before anything is written.")
@click.option("--wait", is_flag=True, envvar="SAGA_RUN_WAIT", help="Wait for the final state.")
@click.option("--timeout", type=float, default=300.0, envvar="SAGA_RUN_TIMEOUT",
              show_default=True, help="With --wait: give up after this many seconds.")
@click.option("--json", "as_json", is_flag=True, envvar="SAGA_JSON",
              help="Machine-readable output.")
@click.option("--approve-interactively", "interactive", is_flag=True,
              help="With --wait: ask here about each step the policy gates.")
@pass_ctx
def run(ctx: Context, plan_file: str, tools: tuple[str, ...], wait: bool, timeout: float,
        as_json: bool, interactive: bool) -> None:
    """Submit a plan file; workers drive it to the end.

    With --wait, the exit code says how it ended: 0 committed, 4 compensated,
    5 needs attention, 6 stuck, 7 not done when --timeout ran out (it goes on);
    1-3 as for every command.
    """
    with errors_to_exit():
        plan = _read_plan(plan_file, ctx.settings.max_depth)
        registry = Registry.from_modules(*tools)  # a broken module: before Redis is asked
        store = ctx.saga_store(registry)
        sid = store.submit([s.model_dump() for s in plan.steps], agent_id=plan.agent_id,
                           conversation_id=plan.conversation_id)
        if not wait:
            emit_json({"saga_id": sid, "state": "running"}) if as_json else click.echo(sid)
            return
        warn = NoWorkerWarning(store.queues, log=store.redis)
        state = store.state(sid)
        try:
            if interactive:  # its prompts say what the saga waits for
                from .approvals import wait_interactively
                state = wait_interactively(store, sid, remaining(ctx.started, timeout), tick=warn)
            else:
                state = store.follow(state, _settled, remaining(ctx.started, timeout),
                                     tick=WaitReporter(state, then=warn))
        except StepPending:
            held = waiting_for(state)
            why = f"it waits: {held}" if held else "is 'saga worker' running?"
            fail(f"saga {sid} is not done after {timeout:g} s ({why}); it goes on; "
                 f"'saga show {sid}' follows it", EXIT_WAIT_TIMEOUT)
        steps = [{"step": s.step, "tool": s.tool, "status": s.status,
                  "compensation": s.compensation,
                  **({"error": s.error} if s.error else {})} for s in state.steps.values()]
        code = RUN_EXIT.get(state.status, EXIT_WAIT_TIMEOUT)
        if as_json:
            emit_json({"saga_id": sid, "state": str(state.status), "steps": steps})
            sys.exit(code)
        click.echo(f"{sid} {state.status}")
        for s in steps:
            comp = f", compensation {s['compensation']}" if s["compensation"] else ""
            why = f": {str(s['error'])[:200]}" if s.get("error") else ""
            click.echo(f"  #{s['step']} {s['tool']}: {s['status']}{comp}{why}")
        sys.exit(code)


def _settled(state: Any) -> bool:
    return bool(state.final or state.status is Status.STUCK)


def _read_plan(path: str, max_depth: int) -> Plan:
    try:
        raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        click.echo(f"error: cannot read {path}: {exc.strerror}", err=True)
        sys.exit(EXIT_USAGE)
    try:
        # the whole plan goes into the log: checked before pydantic reads it, which
        # would take any number and recurse into any depth
        data = check_json(loads(raw, "plan"), "plan", max_depth)
    except InvalidInput as exc:
        raise InvalidInput(f"{path}: {exc}; see the plan format in the README") from None
    try:
        return Plan.model_validate(data)
    except ValidationError as exc:
        where = "; ".join(_plan_error(e) for e in exc.errors())
        raise InvalidInput(f"{path} is not a plan: {where}; see the plan format in the "
                           "README") from None


_PLAN_SHAPE = ('a plan is a JSON object: {"agent_id": ..., "steps": [{"tool": ..., "args": '
               '{...}}, ...]}')
_SAYS = {"missing": "is missing", "dict_type": "must be a JSON object",
         "list_type": "must be a list", "string_type": "must be a string",
         "too_short": "must hold at least one step",
         "extra_forbidden": "is not a plan field (a plan has agent_id, conversation_id and "
                            "steps; a step has tool, args and tool_call_id)"}


def _plan_error(err: Any) -> str:
    """One pydantic error in the plan's terms: where (steps[0].args) and what."""
    loc = err["loc"]
    if not loc:
        return _PLAN_SHAPE
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    says = _SAYS.get(err["type"])
    if says is None:  # pydantic's own wording, without its vocabulary
        says = str(err["msg"]).replace("Input should be", "must be")
    return f"{where} {says}"


@click.command("resume")
@click.argument("saga_id")
@click.option("--by", default=None, envvar="SAGA_OPERATOR",
              help="Who resumes it (default: the login name). Env: SAGA_OPERATOR.")
@click.option("--note", default=None, envvar="SAGA_RESUME_NOTE",
              help="What was fixed, for the audit trail. Env: SAGA_RESUME_NOTE.")
@pass_ctx
def resume(ctx: Context, saga_id: str, by: str | None, note: str | None) -> None:
    """Retry the unwind of a stuck saga after fixing its cause; who did it (and the
    note) are recorded in the saga_resumed event."""
    with errors_to_exit():
        check_saga_id(saga_id)
        store = ctx.saga_store(Registry())
        if not store.resume(saga_id, by=operator(by), note=note):
            click.echo(f"error: saga {saga_id} is {store.state(saga_id).status}, not stuck",
                       err=True)
            sys.exit(EXIT_USAGE)
        click.echo(f"saga {saga_id}: unwind queued again (if it gets stuck again, a person "
                   f"can undo the step by hand and record it: 'saga resolve {saga_id} STEP "
                   "--note ...')")


@click.command("resolve")
@click.argument("saga_id")
@click.argument("step", type=int)
@click.option("--by", default=None, envvar="SAGA_OPERATOR",
              help="Who settled it (default: the login name). Env: SAGA_OPERATOR.")
@click.option("--note", required=True, help="What was done by hand, for the audit trail.")
@pass_ctx
def resolve(ctx: Context, saga_id: str, step: int, by: str | None, note: str) -> None:
    """Record that a person undid a stuck step by hand; the unwind then goes on and
    the saga ends needing attention (acknowledge it with 'saga attention --ack')."""
    with errors_to_exit():
        store = ctx.saga_store(Registry())
        who = operator(by)
        store.resolve(saga_id, step, by=who, note=note)
        click.echo(f"saga {saga_id}: step {step} settled by {who}; the unwind goes on")


@click.command("abort")
@click.argument("saga_id")
@click.option("--reason", default="aborted by an operator", envvar="SAGA_ABORT_REASON")
@pass_ctx
def abort(ctx: Context, saga_id: str, reason: str) -> None:
    """Stop a saga going forward and compensate what it did."""
    with errors_to_exit():
        check_saga_id(saga_id)
        store = ctx.saga_store(Registry())
        if not store.abort(saga_id, reason):
            click.echo(f"error: saga {saga_id} is not going forward "
                       f"({store.state(saga_id).status})", err=True)
            sys.exit(EXIT_USAGE)
        click.echo(f"saga {saga_id}: unwinding")


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, envvar="SAGA_JSON",
              help="Machine-readable output.")
@pass_ctx
def doctor(ctx: Context, as_json: bool) -> None:
    """Report the Redis settings that decide whether the log survives a crash.

    A setting this Redis user may not read (a worker's ACL user has no CONFIG) is
    reported as skip, with how to check it by hand. Exit codes: 0 nothing it could
    check needs a change, 1 something to change, 3 Redis unreachable.
    """
    from saga_store.ops.doctor import examine
    with errors_to_exit():
        store = ctx.store()
        findings = examine(store.redis, store.settings.wait_replicas)
        if as_json:
            emit_json([f.to_dict() for f in findings])
        else:
            for f in findings:
                mark = "ok  " if f.ok else "skip" if f.skipped else "FIX "
                click.echo(f"{mark} {f.setting} = {f.value}" + (f": {f.advice}" if f.advice
                                                                  else ""))
        sys.exit(0 if all(f.ok or f.skipped for f in findings) else 1)


COMMANDS = [worker, run, resume, resolve, abort, metrics, doctor]
