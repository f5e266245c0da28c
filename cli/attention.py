"""``saga attention``: sagas that ended needing a person, and acknowledging them."""

from __future__ import annotations

import time
from typing import Any

import click

from saga_store import keys
from saga_store.errors import InvalidInput
from saga_store.state import Status, fold

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
        r = store.redis
        if ack is not None:
            store.require(ack)
            if not r.sismember(keys.NEEDS_ATTENTION, ack):
                raise InvalidInput(f"saga {ack} is not waiting for attention; "
                                   "'saga attention' lists those that are")
            who = operator(by)
            pipe = r.pipeline(transaction=True)
            pipe.xadd(keys.ATTENTION_ACKS, {"saga_id": ack, "by": who, "note": note[:2000],
                                            "at_ms": str(int(time.time() * 1000))})
            pipe.srem(keys.NEEDS_ATTENTION, ack)
            pipe.execute()
            click.echo(f"saga {ack}: acknowledged by {who}")
            return
        members: set[bytes] = r.smembers(keys.NEEDS_ATTENTION)  # type: ignore[assignment]
        rows: list[dict[str, Any]] = []
        for sid in sorted(m.decode() for m in members):
            st = fold(sid, store.log.bodies(sid))
            if st.status is not Status.NEEDS_ATTENTION:
                continue
            reason = st.reason if isinstance(st.reason, dict) else {}
            rows.append({"saga_id": sid, "agent_id": st.agent_id,
                         "needs_attention": reason.get("needs_attention") or [],
                         "updated_ts": st.updated_ts})
        if as_json:
            emit_json(rows)
            return
        if not rows:
            click.echo("no saga needs attention")
        for row in rows:
            click.echo(f"{row['saga_id']} ({row['agent_id']}): could not undo "
                       f"{', '.join(row['needs_attention']) or 'see saga show'}")


COMMANDS = [attention]
