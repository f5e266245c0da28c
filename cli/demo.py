"""``saga demo``: write a small saga to the log, show it, verify it."""

from __future__ import annotations

import sys

import click

from saga_store.events import EventKind as K
from saga_store.verify import Verifier

from .common import Context, errors_to_exit, pass_ctx
from .inspect import timeline_line


@click.command("demo")
@pass_ctx
def demo(ctx: Context) -> None:
    """Write a small order saga, print its timeline, verify the chain."""
    with errors_to_exit():
        store, embedded = ctx.store_or_embedded()
        where = "embedded store" if embedded else "Redis"
        w = store.open("demo-agent", conversation_id="demo-conversation")
        steps = [("reserve_inventory", {"sku": "LAPTOP-15", "qty": 1}, {"reservation": "r-1"}),
                 ("charge_payment", {"amount_cents": 1_200_000, "currency": "USD"},
                  {"charge": "ch-1"})]
        for n, (tool, args, result) in enumerate(steps):
            w.append(K.STEP_INTENT, step=n, tool=tool, tool_call_id=f"call-{n}",
                     data={"args": args, "reversibility": "compensable"})
            w.append(K.STEP_STARTED, step=n, attempt=1)
            w.append(K.STEP_SUCCEEDED, step=n, data={"result": result})
        w.append(K.SAGA_COMMITTED)
        click.echo(f"saga {w.saga_id} written to the {where}:")
        for ev in store.log.events(w.saga_id):
            click.echo(timeline_line(ev))
        verdict = Verifier(store.log).verify(w.saga_id)
        click.echo(f"verify: {'intact' if verdict.ok else 'FAILED'} "
                   f"({verdict.events} events in {len(verdict.chains)} chains)")
        sys.exit(0 if verdict.ok else 1)


COMMANDS = [demo]
