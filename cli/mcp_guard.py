"""``saga mcp-guard``: serve MCP on stdio in front of a downstream MCP server,
turning every tools/call into a logged, gated, compensable saga step."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import click
import orjson

from saga_store.client import SagaStore
from saga_store.errors import InvalidInput
from saga_store.registry import Registry

from .common import Context, errors_to_exit, pass_ctx

log = logging.getLogger("saga_store.gateway")


@click.command("mcp-guard", context_settings={"allow_interspersed_args": False})
@click.option("--policy", "policy_file", default=None, envvar="SAGA_POLICY_FILE",
              type=click.Path(dir_okay=False, exists=True),
              help="Approval policy (TOML). Default: the safe built-in policy (irreversible "
                   "and unclassified tools need approval).")
@click.option("--tools-map", "tools_map_file", default=None, envvar="SAGA_TOOLS_MAP",
              type=click.Path(dir_okay=False, exists=True),
              help="Local classification of the downstream's tools (TOML); it wins.")
@click.option("--url", default=None, help="Downstream Streamable-HTTP MCP endpoint, instead "
                                          "of a command.")
@click.option("--agent", "agent_id", default="mcp-client", show_default=True,
              envvar="SAGA_AGENT_ID", help="Agent id the sagas are recorded under.")
@click.option("--log-level", default="WARNING", envvar="SAGA_LOG_LEVEL", show_default=True)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@pass_ctx
def mcp_guard(ctx: Context, policy_file: str | None, tools_map_file: str | None,
              url: str | None, agent_id: str, log_level: str, command: tuple[str, ...]) -> None:
    """Put Saga Store in front of an MCP server: saga mcp-guard -- COMMAND ARGS...

    Serves MCP on stdio to the client. Each tools/call is logged in a saga (one per
    client session, or per saga_begin/saga_commit), gated by the policy,
    deduplicated, and when a mutating call fails, earlier calls are compensated
    last first through the server's own compensation tools. Approve gated calls
    from another terminal with 'saga approvals' and 'saga approve'.
    """
    logging.basicConfig(level=log_level, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")
    with errors_to_exit():
        for fd, name in ((0, "stdin"), (1, "stdout")):
            if stat.S_ISREG(os.fstat(fd).st_mode):
                raise InvalidInput(f"saga mcp-guard speaks MCP over pipes; its {name} is a "
                                   "file. Start it from an MCP client's configuration")
        if bool(command) == bool(url):
            raise InvalidInput("give the downstream server as -- COMMAND ARGS... or --url URL, "
                               "not both or neither")
        try:
            import anyio
            import mcp  # noqa: F401
        except ImportError:
            raise InvalidInput("the MCP gateway needs the mcp package: "
                               "pip install 'saga-store[mcp]'") from None
        from saga_store.gateway import gateway_id, load_tools_map
        from saga_store.policy import Policy
        policy = Policy.load(policy_file) if policy_file else Policy.safe()
        tools_map = load_tools_map(tools_map_file) if tools_map_file else {}
        store = SagaStore(ctx.store().redis, Registry(), ctx.settings, policy=policy)
        gid = gateway_id(list(command) or None, url)
        anyio.run(_serve, store, policy, tools_map, gid, agent_id, list(command), url)


@asynccontextmanager
async def _downstream(command: list[str], url: str | None) -> AsyncIterator[Any]:
    from mcp import ClientSession
    if url:
        from mcp.client.streamable_http import streamable_http_client
        async with streamable_http_client(url) as streams, \
                ClientSession(streams[0], streams[1]) as session:
            yield session
        return
    from mcp.client.stdio import StdioServerParameters, stdio_client
    # the downstream runs in the gateway's environment, as if the client had started it
    params = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        yield session


async def _serve(store: SagaStore, policy: Any, tools_map: Any, gid: str, agent_id: str,
                 command: list[str], url: str | None) -> None:
    import mcp_types as types
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server

    from saga_store.gateway import Gateway, as_result, caller

    async with _downstream(command, url) as session:
        await session.initialize()

        gw = Gateway(store, policy, tools_map, caller(session), gid, agent_id=agent_id,
                     dedupe_ttl_s=store.settings.dedupe_ttl_s)
        gw.set_tools((await session.list_tools()).tools)
        for sid, how in await gw.recover():
            log.warning("finished saga %s left by an earlier gateway: %s", sid, how)

        async def on_list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
            return types.ListToolsResult(tools=gw.listed((await session.list_tools()).tools))

        async def on_call_tool(ctx: Any, params: types.CallToolRequestParams,
                               ) -> types.CallToolResult:
            meta = params.meta if isinstance(params.meta, dict) else (
                params.meta.model_dump(by_alias=True) if params.meta is not None else None)
            out = await gw.handle(params.name, dict(params.arguments or {}), meta)
            return as_result(out)  # type: ignore[no-any-return]

        server: Server[Any] = Server("saga-store-gateway", on_list_tools=on_list_tools,
                                     on_call_tool=on_call_tool)
        wire = BatchSplitter()
        async with stdio_server(stdin=wire, stdout=wire) as (read, write):  # type: ignore[arg-type]
            await server.run(read, write, server.create_initialization_options())
        try:
            closed = gw.commit()  # the client's session ended: its calls stand
        except InvalidInput:
            closed = await gw.abort("the client's session ended with a call unsettled")
        if closed:
            log.info("session ended; saga %s closed", closed)


class BatchSplitter:
    """The client's side of the wire, for the SDK's stdio server. A JSON-RPC batch
    (which the SDK would drop unanswered) is split into its messages, so each is
    handled exactly like a single one: every tools/call in it is gated, logged and
    compensated the same way. Their responses go back together as one batch.

    Pipes are read and written on the event loop itself (not a thread per line, as
    a wrapped file would be): that is a quarter of a gateway hop's latency."""

    def __init__(self) -> None:
        self._batches: list[tuple[set[bytes], dict[bytes, Any]]] = []
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=64 * 1024 * 1024)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                     sys.stdin.buffer)
        transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, sys.stdout.buffer)
        self._reader = reader
        self._writer = asyncio.StreamWriter(transport, protocol, None, loop)

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _read(self) -> AsyncIterator[str]:
        if self._reader is None:
            await self._open()
        assert self._reader is not None
        while raw := await self._reader.readline():
            yield raw.decode("utf-8", errors="replace")

    async def _lines(self) -> AsyncIterator[str]:
        async for line in self._read():
            if not line.lstrip().startswith("["):
                yield line
                continue
            try:
                items = orjson.loads(line)
            except orjson.JSONDecodeError:
                yield line  # the SDK answers a parse error as usual
                continue
            if not items:
                await self._send({"jsonrpc": "2.0", "id": None, "error": {
                    "code": -32600, "message": "empty batch"}})
                continue
            ids = {orjson.dumps(m["id"]) for m in items
                   if isinstance(m, dict) and "method" in m and "id" in m}
            if ids:
                self._batches.append((ids, {}))
            for m in items:
                yield orjson.dumps(m).decode() + "\n"

    async def write(self, text: str) -> None:
        if self._batches:
            msg = orjson.loads(text)
            key = orjson.dumps(msg.get("id")) if "method" not in msg else None
            for i, (ids, got) in enumerate(self._batches):
                if key is not None and key in ids:
                    got[key] = msg
                    if len(got) == len(ids):
                        del self._batches[i]
                        self._put(orjson.dumps(list(got.values())) + b"\n")
                    return
        self._put(text.encode())

    def _put(self, data: bytes) -> None:
        assert self._writer is not None, "a reply before the first request"
        self._writer.write(data)

    async def flush(self) -> None:
        if self._writer is not None:
            await self._writer.drain()

    async def _send(self, msg: Any) -> None:
        self._put(orjson.dumps(msg) + b"\n")
        await self.flush()


COMMANDS = [mcp_guard]
