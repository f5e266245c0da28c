"""Read commands: ``saga ls`` and ``saga show``."""

from __future__ import annotations

import datetime as dt
from typing import Any

import click
import orjson

from saga_store.client.context import FORMATS, agent_states, rebuild_history
from saga_store.ids import check_id
from saga_store.protocol.state import Status

from .common import Context, emit_json, errors_to_exit, pass_ctx

STATES = [s.value for s in Status]


@click.command("ls")
@click.option("--state", "state", type=click.Choice(STATES), envvar="SAGA_LS_STATE",
              help="Only sagas in this state.")
@click.option("--limit", type=int, default=100, show_default=True, envvar="SAGA_LS_LIMIT",
              help="At most this many, newest first (0: all).")
@click.option("--json", "as_json", is_flag=True, envvar="SAGA_JSON",
              help="Machine-readable output.")
@pass_ctx
def ls(ctx: Context, state: str | None, limit: int, as_json: bool) -> None:
    """List sagas, newest first, with their state."""
    with errors_to_exit():
        store = ctx.store()
        rows: list[dict[str, Any]] = []
        for sid in store.saga_ids():
            meta = store.meta(sid)
            if state and meta.get("state") != state:
                continue
            rows.append({"saga_id": sid, "state": meta.get("state"),
                         "agent_id": meta.get("agent_id"), "seq": int(meta.get("seq", -1))})
            if limit and len(rows) >= limit:
                break
        if as_json:
            emit_json(rows)
            return
        for r in rows:
            click.echo(f"{r['saga_id']}  {r['state'] or '?':<16} {r['agent_id'] or '':<20} "
                       f"{r['seq'] + 1} events")


@click.command("show")
@click.argument("saga_id")
@click.option("--json", "as_json", is_flag=True, envvar="SAGA_JSON",
              help="Machine-readable output.")
@pass_ctx
def show(ctx: Context, saga_id: str, as_json: bool) -> None:
    """Show one saga's timeline and folded state."""
    with errors_to_exit():
        store = ctx.store()
        store.require(saga_id)
        events = store.log.events(saga_id)
        state = store.state(saga_id)
        if as_json:
            emit_json({"saga_id": saga_id, "state": state.status, "agent_id": state.agent_id,
                       "events": events})
            return
        click.echo(f"saga {saga_id}  agent {state.agent_id}  state {state.status}")
        if state.status is Status.STUCK and isinstance(state.reason, dict):
            click.echo(f"  stuck at step {state.reason.get('step')}: "
                       f"{state.reason.get('error')}")
            click.echo(f"  next: {state.reason.get('hint')}")
        for ev in events:
            click.echo(timeline_line(ev))


def timeline_line(ev: dict[str, Any]) -> str:
    t = dt.datetime.fromtimestamp(ev["ts"] / 1000, dt.UTC).strftime("%H:%M:%S.%f")[:-3]
    step = f"#{ev['step']}" if ev.get("step") is not None else "  "
    tool = ev.get("tool") or ""
    data = ev.get("data")
    text = orjson.dumps(data).decode() if data is not None else ""
    if len(text) > 70:
        text = text[:67] + "..."
    return f"{ev['seq']:>5} {t} {step:>4} {ev['kind']:<26} {tool:<18} {text}"


@click.command("context")
@click.option("--saga", "saga_id", envvar="SAGA_CONTEXT_SAGA", help="One saga's calls.")
@click.option("--agent", "agent_id", envvar="SAGA_CONTEXT_AGENT",
              help="Every saga of this agent, oldest first.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="openai",
              show_default=True, envvar="SAGA_CONTEXT_FORMAT")
@click.option("--json", "as_json", is_flag=True, envvar="SAGA_JSON",
              help="Machine-readable output (the default for openai and anthropic).")
@pass_ctx
def context(ctx: Context, saga_id: str | None, agent_id: str | None, fmt: str,
            as_json: bool) -> None:
    """Rebuild an agent's message history from the log (rolled-back calls marked)."""
    with errors_to_exit():
        if bool(saga_id) == bool(agent_id):
            click.echo("error: give exactly one of --saga or --agent", err=True)
            raise SystemExit(2)
        store = ctx.store()
        if saga_id:
            store.require(saga_id)
            states = [store.state(saga_id)]
        else:
            states = agent_states(store, check_id(agent_id, "agent_id"))
        messages = rebuild_history(states, fmt)
        if as_json or fmt != "plain":
            emit_json(messages)
            return
        for saga in messages:
            click.echo(f"saga {saga['saga_id']} ({saga['state']})")
            for call in saga["calls"]:
                click.echo(f"  {call['status']:<10} {call['tool']}: {call['result']}")
            if saga["note"]:
                click.echo(f"  note: {saga['note']}")


COMMANDS = [ls, show, context]
