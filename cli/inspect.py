"""Read commands: ``saga show`` and ``saga context`` (``saga ls`` is in listing.py)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import click
import orjson

from saga_store.client.context import FORMATS, agent_states, rebuild_history
from saga_store.ids import check_id
from saga_store.log.events import TERMINAL_KINDS
from saga_store.log.store import EventStore
from saga_store.protocol.state import Status

from .common import Context, emit_json, errors_to_exit, pass_ctx


@click.command("show")
@click.argument("saga_id")
@click.option("--follow", "-f", "follow", is_flag=True, envvar="SAGA_SHOW_FOLLOW",
              help="Then print each event as it lands, until the saga ends (Ctrl-C stops).")
@click.option("--json", "as_json", is_flag=True, envvar="SAGA_JSON",
              help="Machine-readable output (with --follow: one event per line).")
@pass_ctx
def show(ctx: Context, saga_id: str, follow: bool, as_json: bool) -> None:
    """Show one saga's timeline and folded state."""
    with errors_to_exit():
        store = ctx.store()
        store.require(saga_id)
        events = store.log.events(saga_id)
        state = store.state(saga_id)
        if follow:
            for ev in events:
                click.echo(orjson.dumps(ev).decode() if as_json else timeline_line(ev))
            _follow(store, saga_id, events[-1] if events else None, as_json)
            return
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


def _follow(store: EventStore, saga_id: str, last: dict[str, Any] | None,
            as_json: bool) -> None:
    """Print the saga's events as they land (XREAD BLOCK) until its closing event
    or Ctrl-C; both end with exit 0."""
    seq = last["seq"] if last else -1
    if last is not None and last["kind"] in TERMINAL_KINDS:
        return
    try:
        while True:
            for entry in store.log.wait(saga_id, seq, 1000):
                ev = {**orjson.loads(entry.body), "hash": entry.hash.hex()}
                seq = ev["seq"]
                click.echo(orjson.dumps(ev).decode() if as_json else timeline_line(ev))
                if ev["kind"] in TERMINAL_KINDS:
                    return
    except KeyboardInterrupt:
        return


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


COMMANDS = [show, context]
