"""``saga acl``: print the Redis ACL users for workers and agents."""

from __future__ import annotations

import click

from saga_store.ops import acl

from .common import errors_to_exit


@click.command("acl")
@click.argument("role", type=click.Choice(["worker", "agent"]))
@click.option("--user", default=None, help="ACL user name (default saga-worker / the agent id).")
@click.option("--agent", "agent_id", default=None,
              help="For 'agent': the agent's id (letters, digits and '-'); it may drive "
                   "only the sagas of its namespace, whose ids start AGENT_.")
def acl_command(role: str, user: str | None, agent_id: str | None) -> None:
    """Print an ACL SETUSER line (Redis 7 or newer); apply it with
    'saga acl worker | redis-cli' (redis-cli reads the quoting as written).

    Neither user can DEL, UNLINK, XDEL, XTRIM, FLUSHALL, CONFIG or SCRIPT FLUSH
    Saga Store's keys; an agent user reads and drives only its own sagas. Set a
    password afterwards: ACL SETUSER NAME >PASSWORD, then connect with
    redis://NAME:PASSWORD@host:6379/0 (or rediss:// for TLS).
    """
    with errors_to_exit():
        if role == "worker":
            click.echo(acl.setuser_line(user or "saga-worker", acl.worker_rules()))
            return
        if not agent_id:
            raise click.UsageError("'saga acl agent' needs --agent AGENT_ID")
        rules = acl.agent_rules(agent_id)
        click.echo(acl.setuser_line(user or agent_id, rules))


COMMANDS = [acl_command]
