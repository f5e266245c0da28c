"""``saga``: run, inspect and verify sagas."""

from __future__ import annotations

import atexit
import gc
import time

import click

from saga_store.log.chain import load_key
from saga_store.settings import Settings

from . import (
    acl,
    approvals,
    archive,
    attention,
    console,
    demo,
    dev_redis,
    fleet,
    inspect,
    listing,
    mcp_guard,
    verify,
    workers,
)
from .common import Context, errors_to_exit
from .waiting import process_started


@click.group(context_settings={"auto_envvar_prefix": "SAGA", "help_option_names": ["-h", "--help"]})
@click.version_option(package_name="saga-store", prog_name="saga")
@click.option("--redis-url", envvar="SAGA_REDIS_URL", default=None, metavar="URL",
              help="Redis for the log (redis://, rediss://, unix://; "
                   "redis+cluster://host:port[,host:port...] for a Redis Cluster).")
@click.option("--queue-url", envvar="SAGA_QUEUE_URL", default=None, metavar="URL",
              help="Redis for RQ's queues (redis://, rediss://, unix://; default: the "
                   "log's Redis; required when the log is on a cluster).")
@click.option("--hmac-key-file", envvar="SAGA_HMAC_KEY_FILE", default=None, metavar="FILE",
              help="Chain with HMAC-SHA256 using this key (kept outside Redis); "
                   "SAGA_HMAC_KEY holds the key itself.")
@click.pass_context
def cli(ctx: click.Context, redis_url: str | None, queue_url: str | None,
        hmac_key_file: str | None) -> None:
    """Durable, verifiable sagas for AI agent tool calls."""
    with errors_to_exit():
        import os
        import sys
        # --tools names modules as python -m does: the current folder first (rq does too)
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        key = load_key(os.environ.get("SAGA_HMAC_KEY"), hmac_key_file)
        started = ctx.obj if isinstance(ctx.obj, float) else time.monotonic()  # see main()
        ctx.obj = Context(redis_url, Settings.from_env(hmac_key=key), queue_url=queue_url,
                          started=started)


for module in (acl, approvals, archive, attention, console, demo, fleet, inspect, listing,
               mcp_guard, verify, workers):
    for command in module.COMMANDS:
        cli.add_command(command)
cli.add_command(dev_redis.dev_redis)


def _show_envvars(command: click.Command) -> None:
    """Every option's --help names its environment variable (the README promises
    each option has one: SAGA_<OPTION>, or SAGA_<COMMAND>_<OPTION> by default)."""
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden and not param.is_eager:
            param.show_envvar = True
    for sub in getattr(command, "commands", {}).values():
        _show_envvars(sub)


_show_envvars(cli)


def main() -> None:
    # the interpreter's last collection walks every object the imports made: half a
    # second on a busy machine, after a --timeout already ran out. Nothing here needs
    # a finalizer run by it (sockets and files close with the process)
    atexit.register(gc.freeze)
    cli(prog_name="saga", obj=process_started())


if __name__ == "__main__":
    main()
