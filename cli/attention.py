"""``saga attention``: sagas that ended needing a person, and acknowledging them."""

from __future__ import annotations

import click

from saga_store.approval.attention import acknowledge, needing_attention

from .common import Context, emit_json, errors_to_exit, operator, pass_ctx


@click.command("attention")
@click.option("--ack", "ack", default=None, metavar="SAGA_ID",
              help="Acknowledge this saga: a person has dealt with it.")
@click.option("--by", default=None, envvar="SAGA_OPERATOR",
              help="Who acknowledges (default: the login name).")
@click.option("--note", default="", help="What was done (kept in the audit stream).")
@click.option("--json", "as_json", is_flag=True, envvar="SAGA_JSON",
              help="Machine-readable output.")
@pass_ctx
def attention(ctx: Context, ack: str | None, by: str | None, note: str,
              as_json: bool) -> None:
    """List sagas that ended needing a person (what could not be undone), or
    acknowledge one. An acknowledgement takes the saga off the list (and off the
    saga_sagas{state="needs_attention"} gauge) and is recorded, with who and
    why, in the ss:attention:acks stream; the saga's own chain is closed and
    stays as it is."""
    with errors_to_exit():
        store = ctx.store()
        if ack is not None:
            who = operator(by)
            acknowledge(store.redis, ack, who, note)
            click.echo(f"saga {ack}: acknowledged by {who}")
            return
        rows = [row.to_dict() for row in needing_attention(store.log)]
        if as_json:
            emit_json(rows)
            return
        if not rows:
            click.echo("no saga needs attention")
        for row in rows:
            click.echo(f"{row['saga_id']} ({row['agent_id']}): could not undo "
                       f"{', '.join(row['needs_attention']) or 'see saga show'}")


COMMANDS = [attention]
