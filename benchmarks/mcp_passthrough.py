"""A bare MCP proxy on the same SDK (server on stdio, client to the downstream),
forwarding tools/list and tools/call with no logging at all: the floor any
SDK-based gateway pays for the extra hop, measured beside the real one."""

from __future__ import annotations

import sys
from typing import Any

import anyio
import mcp_types as types
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server


async def main(command: list[str]) -> None:
    params = StdioServerParameters(command=command[0], args=command[1:])
    async with stdio_client(params) as (r, w), ClientSession(r, w) as down:
        await down.initialize()

        async def on_list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
            return await down.list_tools()

        async def on_call_tool(ctx: Any, params: types.CallToolRequestParams) -> Any:
            return await down.call_tool(params.name, params.arguments or {})

        server: Server[Any] = Server("passthrough", on_list_tools=on_list_tools,
                                     on_call_tool=on_call_tool)
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main, sys.argv[1:])
