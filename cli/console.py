"""``saga console``: the operator web console (needs the ``console`` extra)."""

from __future__ import annotations

import click

from saga_store import InvalidInput, Registry

from .common import Context, errors_to_exit, operator, pass_ctx


@click.command("console")
@click.option("--host", default="127.0.0.1", show_default=True, envvar="SAGA_CONSOLE_HOST",
              help="Address to listen on. Anything but loopback needs SAGA_CONSOLE_TOKEN "
                   "or SAGA_CONSOLE_USER_HEADER.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535),
              envvar="SAGA_CONSOLE_PORT", help="Port to listen on.")
@click.option("--by", default=None, envvar="SAGA_OPERATOR",
              help="Who decides, when no token name or proxy header names the person "
                   "(default: the login name).")
@click.option("--anchor", "anchor_file", default=None, envvar="SAGA_ANCHOR",
              type=click.Path(dir_okay=False),
              help="An anchor file (saga anchor --out) the verify page checks the ledger "
                   "against.")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME[:PORT]",
              help="A Host name the console answers to besides loopback and its bind "
                   "address (repeatable; SAGA_CONSOLE_ALLOWED_HOSTS takes a comma-separated "
                   "list): the name a reverse proxy or DNS gives it.")
@click.option("--tools", "tools", multiple=True, envvar="SAGA_TOOLS",
              help="Tools module(s), as the workers run them (optional): their declared "
                   "retry limits let a retrying step read 'attempt 2 of 3'.")
@pass_ctx
def console(ctx: Context, host: str, port: int, by: str | None,
            anchor_file: str | None, allowed_hosts: tuple[str, ...],
            tools: tuple[str, ...]) -> None:
    """Serve the operator console: sagas, live timelines, approvals, attention,
    an overview, workers and queues, search and verification, in a browser;
    approve, deny, abort, resume, resolve and acknowledge from a saga's page,
    each confirmed and recorded as the CLI records it.

    Security: it binds 127.0.0.1 by default, where whoever reaches the port acts
    as --by. SAGA_CONSOLE_TOKEN (a token, or name:token pairs separated by
    commas) asks for a bearer token or a sign-in; SAGA_CONSOLE_READONLY_TOKEN
    (the same form) signs in people who see every page and whose every action
    is refused with 403; SAGA_CONSOLE_USER_HEADER
    trusts a reverse proxy's header naming the user. Every form carries a CSRF
    token. Requests naming any other Host than localhost, 127.0.0.1, [::1], the
    bind address or an --allowed-host get 400 (so a web page cannot reach it by
    DNS rebinding).
    """
    with errors_to_exit():
        try:
            import uvicorn

            from saga_store.console import ConsoleConfig, create_app
        except ImportError as exc:
            raise InvalidInput(f"saga console needs the console extra ({exc.name} is "
                               "missing): pip install 'saga-store[console]'") from None
        import dataclasses

        config = ConsoleConfig.from_env(host, port, operator(by),
                                        allowed_hosts=allowed_hosts)
        if anchor_file:
            config = dataclasses.replace(config, anchor_file=anchor_file)
        store = ctx.saga_store(Registry.from_modules(*tools) if tools else Registry())
        app = create_app(store, config)
        auth = ("a token" if config.token_login else
                f"the {config.user_header} header" if config.user_header else
                f"no sign-in (acting as {config.operator})")
        click.echo(f"saga console on http://{host}:{port}/ ({auth})", err=True)
        uvicorn.run(app, host=host, port=port, log_level="warning",
                    timeout_graceful_shutdown=3, proxy_headers=bool(config.user_header))


COMMANDS = [console]
