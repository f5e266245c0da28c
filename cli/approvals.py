"""Approval commands: ``saga approvals``, ``saga approve``, ``saga deny``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import click

from saga_store.approval import requests as approvals
from saga_store.client.api import SagaStore
from saga_store.errors import InvalidInput
from saga_store.protocol.state import SagaState
from saga_store.tools.registry import Registry

from .common import Context, emit_json, errors_to_exit, operator, pass_ctx


def _store(ctx: Context) -> SagaStore:
    return ctx.saga_store(Registry())


def describe(p: dict[str, Any]) -> str:
    """A pending approval, readable in a terminal."""
    flag = "  PRODUCTION" if p.get("production") else ""
    comp = p.get("compensation")
    undo = (f"undo: {comp['tool']}({', '.join(f'{k}={v}' for k, v in comp['mapping'].items())})"
            if comp else "undo: none (cannot be undone)")
    args = ", ".join(f"{k}={v!r}" for k, v in (p.get("args") or {}).items())
    lines = [f"{p['saga_id']} step {p['step']}: {p['tool']}({args}){flag}",
             f"    {p.get('reversibility')}; {undo}",
             f"    why: {p.get('reason')}"]
    if p.get("side_effect_scope"):
        lines.append(f"    touches: {', '.join(p['side_effect_scope'])} (the server says)")
    if p.get("notes"):
        lines.append(f"    server's notes: {p['notes']}")
    if p.get("expires_ms"):
        left = max(0, p["expires_ms"] / 1000 - time.time())
        lines.append(f"    denied automatically in {left:.0f} s")
    return "\n".join(lines)


@click.command("approvals")
@click.option("--json", "as_json", is_flag=True, envvar="SAGA_JSON",
              help="Machine-readable output.")
@click.option("--interactive", "--approve-interactively", "interactive", is_flag=True,
              help="Keep watching, and ask at the terminal about each approval as it "
                   "comes, from workers and MCP gateways alike (Ctrl-C to stop).")
@click.option("--by", default=None, envvar="SAGA_OPERATOR",
              help="Who decides, with --interactive (default: the login name).")
@pass_ctx
def approvals_command(ctx: Context, as_json: bool, interactive: bool, by: str | None) -> None:
    """List steps waiting for a person to approve or deny them."""
    with errors_to_exit():
        if interactive:
            if as_json:
                raise InvalidInput("--interactive asks at the terminal; leave out --json")
            watch(_store(ctx), operator(by))
            return
        items = [p.to_dict() for p in approvals.pending(_store(ctx))]
        if as_json:
            emit_json(items)
            return
        if not items:
            click.echo("no approvals pending")
        for p in items:
            click.echo(describe(p))


@click.command("approve")
@click.argument("saga_id")
@click.argument("step", type=int)
@click.option("--by", default=None, envvar="SAGA_OPERATOR",
              help="Who approves (default: the login name).")
@pass_ctx
def approve(ctx: Context, saga_id: str, step: int, by: str | None) -> None:
    """Approve a gated step: it is recorded in the chain and the step runs."""
    with errors_to_exit():
        approvals.decide(_store(ctx), saga_id, step, grant=True, by=operator(by))
        click.echo(f"saga {saga_id} step {step}: approved")


@click.command("deny")
@click.argument("saga_id")
@click.argument("step", type=int)
@click.option("--reason", required=True, help="Why (recorded in the chain).")
@click.option("--by", default=None, envvar="SAGA_OPERATOR",
              help="Who denies (default: the login name).")
@pass_ctx
def deny(ctx: Context, saga_id: str, step: int, reason: str, by: str | None) -> None:
    """Deny a gated step: it never runs, the saga fails and compensates."""
    with errors_to_exit():
        approvals.decide(_store(ctx), saga_id, step, grant=False, by=operator(by),
                         reason=reason)
        click.echo(f"saga {saga_id} step {step}: denied; the saga will compensate")


def ask(store: SagaStore, pending: dict[str, Any], by: str) -> None:
    """Show one pending approval and record the terminal user's answer. One decided
    meanwhile (by someone else, or its deadline) is reported, not decided again."""
    click.echo(describe(pending), err=True)
    saga_id, step = pending["saga_id"], pending["step"]
    try:
        if click.confirm("Approve this step?", default=False, err=True):
            approvals.decide(store, saga_id, step, grant=True, by=by)
            click.echo(f"saga {saga_id} step {step}: approved", err=True)
        else:
            reason = click.prompt("Reason", default="denied at the terminal", err=True)
            approvals.decide(store, saga_id, step, grant=False, by=by, reason=reason)
            click.echo(f"saga {saga_id} step {step}: denied", err=True)
    except InvalidInput as exc:
        click.echo(f"saga {saga_id} step {step}: not recorded ({exc})", err=True)


def watch(store: SagaStore, by: str, poll_s: float = 0.25) -> None:
    """Ask about each pending approval once, as it comes, until Ctrl-C (or the end of
    the input when it asks)."""
    asked: set[tuple[str, int]] = set()
    click.echo("watching for approvals (Ctrl-C to stop)", err=True)
    try:
        while True:
            for p in approvals.pending(store):
                if (p.saga_id, p.step) not in asked:
                    asked.add((p.saga_id, p.step))
                    ask(store, p.to_dict(), by)
            time.sleep(poll_s)
    except (KeyboardInterrupt, click.Abort):  # Ctrl-C, or the input ended
        click.echo("stopped watching", err=True)


def wait_interactively(store: SagaStore, saga_id: str, timeout: float,
                       tick: Callable[[], None] = lambda: None) -> SagaState:
    """Wait for the saga, asking the terminal user about each gated step; ``tick``
    is called on every round."""
    deadline = time.monotonic() + timeout
    asked: set[int] = set()
    while True:
        st = store.state(saga_id)
        if st.final:
            return st
        for n in st.pending_approvals:
            if n in asked:
                continue
            asked.add(n)
            data = dict(st.steps[n].approval_data or {})
            ask(store, {"saga_id": saga_id, "step": n, **data}, operator(None))
        if time.monotonic() > deadline:
            return st
        tick()
        time.sleep(0.1)


COMMANDS = [approvals_command, approve, deny]
