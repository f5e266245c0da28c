"""``saga demo``: the order story, end to end, with real workers."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import click
import orjson

from saga_store import keys
from saga_store.client.api import SagaStore
from saga_store.client.context import rebuild_history
from saga_store.protocol.state import SagaState
from saga_store.tools.registry import Registry
from saga_store.verify.checker import Verifier

from .common import Context, errors_to_exit, pass_ctx, saga_argv

TOOLS = "saga_store.cli.demo_tools"
DEMO_NAMESPACE = "saga-demo"


def order(customer: str, crm_note: str) -> list[dict[str, Any]]:
    return [
        {"tool": "reserve_inventory", "args": {"sku": "LAPTOP-15", "qty": 1},
         "tool_call_id": "call_reserve"},
        {"tool": "charge_payment",
         "args": {"amount_cents": 1_200_000, "card_token": "tok_visa_4242"},
         "tool_call_id": "call_charge"},
        {"tool": "update_crm", "args": {"customer": customer, "note": crm_note},
         "tool_call_id": "call_crm"},
        {"tool": "send_notification", "args": {"to": f"{customer}@example.com",
                                               "text": "Your laptop is on its way"},
         "tool_call_id": "call_notify"},
        {"tool": "emit_webhook", "args": {"event": "order.placed"}, "tool_call_id": "call_hook"},
    ]


@click.command("demo")
@click.option("--workers", "n", type=int, default=2, show_default=True, envvar="SAGA_DEMO_WORKERS",
              help="Worker processes to start (against a real Redis).")
@pass_ctx
def demo(ctx: Context, n: int) -> None:
    """The order story: a $12,000 order whose CRM call times out is rolled back,
    a second one commits, and the chain is verified."""
    if ctx.redis_url and not os.environ.get("SAGA_NAMESPACE"):
        # on a real Redis, the demo keeps to a namespace of its own, so its sagas,
        # ledger and queues never mix with a deployment's (keys are named at import)
        args = ["--redis-url", ctx.redis_url,
                *(["--queue-url", ctx.queue_url] if ctx.queue_url else []),
                "demo", "--workers", str(n)]
        done = subprocess.run(saga_argv(*args),  # noqa: S603  # our own argv, no shell
                              env={**os.environ, "SAGA_NAMESPACE": DEMO_NAMESPACE}, check=False)
        sys.exit(done.returncode)
    with errors_to_exit():
        began = time.monotonic()
        base, embedded = ctx.store_or_embedded()
        store = SagaStore(base.redis, Registry.from_modules(TOOLS), ctx.settings,
                          queues=None if embedded else ctx.queues())
        procs = [] if embedded else _start_workers(ctx, n)
        try:
            click.echo(f"Saga Store demo on the {'embedded store' if embedded else 'Redis'}"
                       f"{'' if embedded else f' with {n} worker processes'}"
                       f"{'' if embedded else f', keys under {keys.PREFIX}:'}\n")
            first = _run(store, embedded, "Order 1: the CRM hangs", order("ana", "slow order"))
            _believe(first)
            second = _run(store, embedded, "Order 2: everything answers",
                          order("ben", "order placed"))
            _believe(second)
        finally:
            _stop_workers(procs)
        store.events.ledger.flush()  # as `saga verify` does: chain what is pending first
        verdict = Verifier(store.events.log).verify()
        click.echo(f"saga verify: {'intact' if verdict.ok else 'INTEGRITY FAILURE'} "
                   f"({verdict.events} events in {verdict.chain_count} chains, "
                   f"ledger included) in {time.monotonic() - began:.1f} s")
        sys.exit(0 if verdict.ok else 1)


def _start_workers(ctx: Context, n: int) -> list[subprocess.Popen[bytes]]:
    """Worker processes, each in a process group of its own (with the job it forks)."""
    env = {**os.environ, "SAGA_REDIS_URL": ctx.redis_url or "redis://127.0.0.1:6379/0",
           **({"SAGA_QUEUE_URL": ctx.queue_url} if ctx.queue_url else {})}
    cmd = saga_argv("worker", "--tools", TOOLS, "--log-level", "WARNING")
    return [subprocess.Popen(cmd, env=env, start_new_session=True,  # noqa: S603  # our argv
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(n)]


def _stop_workers(procs: list[subprocess.Popen[bytes]], grace_s: float = 10) -> None:
    """SIGTERM lets a worker finish its step; one still busy after the grace is killed
    with what it forked, so the demo never leaves a worker behind."""
    for p in procs:
        p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _run(store: SagaStore, embedded: bool, title: str, steps: list[dict[str, Any]]) -> SagaState:
    click.echo(click.style(title, bold=True))
    sid = store.submit(steps, agent_id="shop-agent", conversation_id="demo")
    if embedded:
        _drain(store)
    state = store.wait(sid, timeout=60)
    for ev in store.events.log.bodies(sid):
        line = _describe(ev)
        if line:
            click.echo(f"  {line}")
    click.echo(f"  => saga {sid} is {click.style(str(state.status), bold=True)}\n")
    return state


def _drain(store: SagaStore) -> None:
    """The embedded store lives in this process: run its jobs here, in order."""
    from saga_store.workers.inline import InlineRunner
    InlineRunner(store, "demo").drain()


def _describe(ev: dict[str, Any]) -> str | None:
    kind, data, tool = ev["kind"], ev.get("data") or {}, ev.get("tool")
    n = ev.get("step")
    if kind == "step_intent":
        args = {k: ("***" if isinstance(v, dict) else v) for k, v in data["args"].items()}
        return f"#{n} {tool}({orjson.dumps(args).decode()})  [{data['reversibility']}]"
    if kind == "step_succeeded":
        how = " (settled by its probe)" if data.get("resolved_by") else ""
        return f"   ok  {orjson.dumps(data.get('result')).decode()}{how}"
    if kind == "step_in_doubt":
        return f"   ??  in doubt: {data.get('error')}"
    if kind == "step_failed":
        return f"   xx  {data.get('error')}"
    if kind == "saga_failed":
        return f"-- unwinding: {data.get('reason')}"
    if kind == "compensation_succeeded":
        return (f"   undo #{n} {data.get('undid')} by {tool}: "
                f"{orjson.dumps(data.get('result')).decode()}")
    if kind == "step_not_compensable":
        return f"   !!  #{n} cannot be undone: {data.get('reason')}"
    return None


def _believe(state: SagaState) -> None:
    click.echo("  What the agent now believes (its rebuilt history):")
    view = rebuild_history([state], "plain")[0]
    for call in view["calls"]:
        text = call["result"]
        if call["status"] == "retracted":
            text = "rolled back; its earlier result no longer holds"
        click.echo(f"    {call['tool_call_id']:<13} {call['status']:<10} {text[:80]}")
    if view["note"]:
        for line in textwrap.wrap(f"note: {view['note']}", 96):
            click.echo(f"    {line}")
    click.echo("")


COMMANDS = [demo]
