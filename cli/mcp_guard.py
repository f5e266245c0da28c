"""``saga mcp-guard``: serve MCP on stdio in front of a downstream MCP server,
turning every tools/call into a logged, gated, compensable saga step."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import stat
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import click

from saga_store.client.api import SagaStore
from saga_store.errors import InvalidInput
from saga_store.tools.registry import Registry

from .common import Context, errors_to_exit, pass_ctx


@click.command("mcp-guard", context_settings={"allow_interspersed_args": False})
@click.option("--policy", "policy_file", default=None, envvar="SAGA_POLICY_FILE",
              type=click.Path(dir_okay=False, exists=True),
              help="Approval policy (TOML, or YAML if named .yaml/.yml). Default: the safe "
                   "built-in policy (irreversible and unclassified tools need approval).")
@click.option("--tools-map", "tools_map_file", default=None, envvar="SAGA_TOOLS_MAP",
              type=click.Path(dir_okay=False, exists=True),
              help="Local classification of the downstream's tools (TOML or YAML); it wins.")
@click.option("--url", default=None, help="Downstream Streamable-HTTP MCP endpoint, instead "
                                          "of a command.")
@click.option("--gateway-id", "gateway_name", default=None, envvar="SAGA_GATEWAY_ID",
              help="Which gateways front the same data and finish each other's "
                   "sessions. Default: a digest of the command, its working directory "
                   "and the environment the server gets (or of the URL); give each host "
                   "its own when the same command reaches different data there.")
@click.option("--agent", "agent_id", default="mcp-client", show_default=True,
              envvar="SAGA_AGENT_ID", help="Agent id the sagas are recorded under.")
@click.option("--log-level", default="WARNING", envvar="SAGA_LOG_LEVEL", show_default=True)
@click.option("--init-tools-map", "init_tools_map", default=None,
              type=click.Path(dir_okay=False),
              help="Do not serve: ask the server for its tools and write a starter tools "
                   "map (TOML) to this file, then exit. Read its CHECK and DECIDE comments.")
@click.option("--force", is_flag=True, help="With --init-tools-map: replace an existing file.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@pass_ctx
def mcp_guard(ctx: Context, policy_file: str | None, tools_map_file: str | None,
              url: str | None, gateway_name: str | None, agent_id: str, log_level: str,
              init_tools_map: str | None, force: bool, command: tuple[str, ...]) -> None:
    """Put Saga Store in front of an MCP server: saga mcp-guard -- COMMAND ARGS...

    Serves MCP on stdio to the client. Each tools/call is logged in a saga (one per
    client session, or per saga_begin/saga_commit), gated by the policy,
    deduplicated, and when a mutating call fails, earlier calls are compensated
    last first through the server's own compensation tools. Approve gated calls
    from another terminal with 'saga approvals' and 'saga approve'.

    With --init-tools-map FILE it serves nothing: it lists the server's tools, writes
    a starter tools map to FILE and exits.
    """
    logging.basicConfig(level=log_level, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")
    with errors_to_exit():
        if init_tools_map is not None:
            # options that only shape serving would be dropped without a word
            given = [f"--{n.replace('_file', '').replace('_', '-')}" for n in (
                "policy_file", "tools_map_file") if click.get_current_context()
                .get_parameter_source(n) is click.core.ParameterSource.COMMANDLINE]
            if given:
                raise InvalidInput(f"--init-tools-map writes a new map from what the server "
                                   f"declares and serves nothing, so {' and '.join(given)} "
                                   "would have no effect; leave them out, then serve with "
                                   f"--tools-map {init_tools_map}")
            _init_tools_map(init_tools_map, command, url, force)
            return
        if force:
            raise InvalidInput("--force goes with --init-tools-map FILE")
        for fd, name in ((0, "stdin"), (1, "stdout")):
            if stat.S_ISREG(os.fstat(fd).st_mode):
                raise InvalidInput(f"saga mcp-guard speaks MCP over pipes; its {name} is a "
                                   "file. Start it from an MCP client's configuration")
        _need_downstream(command, url, "the MCP gateway")
        import anyio

        from saga_store.approval.policy import Policy
        from saga_store.mcp.classify import load_tools_map
        from saga_store.mcp.gateway import gateway_id
        policy = Policy.load(policy_file) if policy_file else Policy.safe()
        tools_map = load_tools_map(tools_map_file) if tools_map_file else {}
        store = ctx.saga_store(Registry(), policy=policy)
        from saga_store.mcp.downstream import downstream_env
        # what the server is started in: the same command elsewhere reaches other data
        gid = gateway_id(list(command) or None, url, gateway_name, cwd=os.getcwd(),
                         env=downstream_env(os.environ))
        logging.getLogger("saga_store.gateway").info(
            "gateway id %s (%s)", gid, "given" if gateway_name else
            "from the URL" if url else "from the command, its directory and environment")
        anyio.run(_serve, store, policy, tools_map, gid, agent_id, list(command), url)


def _need_downstream(command: tuple[str, ...], url: str | None, what: str) -> None:
    """One downstream, named one way, and the mcp package to speak to it."""
    if bool(command) == bool(url):
        raise InvalidInput("give the downstream server as -- COMMAND ARGS... or --url URL, "
                           "not both or neither")
    try:
        import mcp  # noqa: F401  # imported only to check it is installed
    except ImportError:
        raise InvalidInput(f"{what} needs the mcp package: "
                           "pip install 'saga-store[mcp]'") from None


def _init_tools_map(path: str, command: tuple[str, ...], url: str | None,
                    force: bool) -> None:
    """--init-tools-map: list the server's tools, write the starter map, exit."""
    _need_downstream(command, url, "--init-tools-map")
    from saga_store.mcp.init_map import init_tools_map
    made = init_tools_map(path, command, url, force=force)
    decide = sum(1 for e in made if e.source in ("guess", "undecided"))
    click.echo(f"wrote {path}: {len(made)} tools, {decide} for a person to decide; read its "
               "CHECK and DECIDE comments, then: saga mcp-guard --tools-map "
               f"{path} -- ...", err=True)


@asynccontextmanager
async def _downstream(command: list[str], url: str | None) -> AsyncIterator[Any]:
    from saga_store.mcp.downstream import PipeDownstream, SdkDownstream
    if url:
        from mcp.client.streamable_http import streamable_http_client
        async with streamable_http_client(url) as streams:
            yield SdkDownstream(streams[0], streams[1])
        return
    down = await PipeDownstream.start(command)
    try:
        yield down
    finally:
        await down.close()


async def _serve(store: SagaStore, policy: Any, tools_map: Any, gid: str, agent_id: str,
                 command: list[str], url: str | None) -> None:
    from saga_store.mcp.gateway import CallFn, Gateway
    from saga_store.mcp.relay import ClientPipe, Relay

    def gateway(call: CallFn) -> Gateway:
        return Gateway(store, policy, tools_map, call, gid, agent_id=agent_id,
                       dedupe_ttl_s=store.settings.dedupe_ttl_s)

    # the client's pipes, read and written on the event loop itself
    loop = asyncio.get_running_loop()
    pipe = ClientPipe()
    await loop.connect_read_pipe(lambda: pipe, sys.stdin.buffer)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin,
                                                        sys.stdout.buffer)
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    # SIGTERM ends the session as the client's leaving would: its saga is closed
    loop.add_signal_handler(signal.SIGTERM, pipe.end)

    async def to_client(data: bytes) -> None:
        writer.write(data)
        await writer.drain()

    async with _downstream(command, url) as down:
        relay = Relay(gateway, down, to_client)
        pipe.now = relay.take_now
        await relay.serve(pipe.lines())


COMMANDS = [mcp_guard]
