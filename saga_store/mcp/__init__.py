"""The MCP gateway: Saga Store in front of any MCP server."""
