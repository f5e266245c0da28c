"""A minimal in-memory MCP server for the gateway benchmark: no I/O of its own, so
the side-by-side figures show the gateway's cost, not the tool's."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer

server = MCPServer("kv")
DATA: dict[str, str] = {}


@server.tool(meta={"dev.chronomcp/compensate": {
    "tool": "delete", "args": {"key": "$.input.key"}}})
def put(key: str, value: str) -> dict[str, Any]:
    """Set a key."""
    DATA[key] = value
    return {"key": key}


@server.tool()
def delete(key: str) -> dict[str, Any]:
    """Remove a key."""
    DATA.pop(key, None)
    return {"key": key}


if __name__ == "__main__":
    server.run()
