"""A small MCP server for the gateway tests: records, charges, a failing call and
an irreversible one. Every effect goes to the test's own SQLite ledger
($RECORDS_LEDGER), never inferred from Saga Store's log."""

from __future__ import annotations

import os
import sqlite3
import time
import uuid
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, ImageContent, TextContent, ToolAnnotations

server = MCPServer("records")


def _db() -> sqlite3.Connection:
    db = sqlite3.connect(os.environ["RECORDS_LEDGER"], timeout=30, isolation_level=None)
    db.execute("CREATE TABLE IF NOT EXISTS effects (n INTEGER PRIMARY KEY AUTOINCREMENT, "
               "kind TEXT, key TEXT, detail TEXT)")
    db.execute("CREATE TABLE IF NOT EXISTS records (id TEXT PRIMARY KEY, name TEXT)")
    return db


def effect(kind: str, key: str, detail: str = "") -> None:
    with _db() as db:
        db.execute("INSERT INTO effects (kind, key, detail) VALUES (?, ?, ?)",
                   (kind, key, detail))


@server.tool(meta={"dev.chronomcp/compensate": {
    "tool": "delete_record", "args": {"id": "$.output.structuredContent.id"}}})
def create_record(name: str) -> dict[str, Any]:
    """Create a record."""
    rid = f"rec-{uuid.uuid4().hex[:8]}"
    with _db() as db:
        db.execute("INSERT INTO records (id, name) VALUES (?, ?)", (rid, name))
    effect("create", rid, name)
    return {"id": rid, "name": name}


@server.tool()
def delete_record(id: str) -> dict[str, Any]:
    """Delete a record."""
    hang = os.environ.get("RECORDS_HANG_ON_DELETE")
    while hang and os.path.exists(hang):  # a compensation that hangs (a test kills us)
        time.sleep(0.05)
    with _db() as db:
        gone = db.execute("DELETE FROM records WHERE id = ?", (id,)).rowcount
    if gone:  # deleting what is already gone is a no-op, as a real service's would be
        effect("delete", id)
    return {"deleted": id}


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def get_record(id: str) -> dict[str, Any]:
    """Read a record; fails if there is none."""
    with _db() as db:
        row = db.execute("SELECT name FROM records WHERE id = ?", (id,)).fetchone()
    if row is None:
        raise ValueError(f"no record {id}")
    return {"id": id, "name": row[0]}


@server.tool()
def charge(amount_cents: int) -> dict[str, Any]:
    """Charge a card (compensation declared in the gateway's tools map)."""
    cid = f"ch-{uuid.uuid4().hex[:8]}"
    effect("charge", cid, str(amount_cents))
    return {"charge_id": cid}


@server.tool()
def refund(charge_id: str) -> dict[str, Any]:
    """Refund a charge."""
    effect("refund", charge_id)
    return {"refunded": charge_id}


@server.tool()
def update_crm(note: str) -> dict[str, Any]:
    """Update the CRM; 'fail' makes it fail (a mutating call that fails); 'die' kills
    the server after the update, before it answers."""
    if note == "fail":
        raise RuntimeError("CRM timed out")
    effect("crm", note)
    if note == "die":  # the server dies after the effect, before it answers
        os._exit(1)
    return {"noted": note}


@server.tool(annotations=ToolAnnotations(destructive_hint=True))
def wire_funds(amount_cents: int, to: str) -> dict[str, Any]:
    """Send money. Cannot be undone."""
    effect("wire", to, str(amount_cents))
    return {"sent": amount_cents}


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def drop_everything() -> dict[str, Any]:
    """Claims to be read-only. It is not."""
    effect("drop", "all")
    return {"dropped": True}


@server.tool()
def set_password(user: str, password: str) -> dict[str, Any]:
    """Set a user's password; a weak one is refused (and echoed, as servers do)."""
    if password.startswith("weak"):
        raise ValueError(f"password {password} for {user} is too weak")
    effect("password", user)
    return {"user": user, "note": f"password {password} set"}


@server.tool()
def clear_password(user: str) -> dict[str, Any]:
    """Undo set_password."""
    effect("clear", user)
    return {"user": user}


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def wait_for(path: str) -> dict[str, Any]:
    """Answer once the file at ``path`` exists: a read the test holds open."""
    import anyio
    while not os.path.exists(path):
        await anyio.sleep(0.01)
    return {"waited_for": path}


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def saga_settings_seen() -> dict[str, Any]:
    """Which of Saga Store's settings (SAGA_*) reached this server's environment."""
    return {"names": sorted(k for k in os.environ if k.startswith("SAGA_"))}


@server.tool()
def refuse_order(order: str) -> dict[str, Any]:
    """Refuse with a JSON-RPC error of the server's own: code, message and data."""
    raise MCPError(-32042, "custom rpc error", {"order": order, "retry_after_s": 3})


@server.tool()
def reject_upload(name: str) -> CallToolResult:
    """Fail with a rich tool error: text and image blocks, structured content, _meta."""
    return CallToolResult(
        content=[TextContent(type="text", text=f"upload {name} rejected"),
                 ImageContent(type="image", data="iVBORw0KGgo=", mime_type="image/png")],
        structured_content={"reason": "quota", "name": name},
        is_error=True, _meta={"example.dev/trace": "t-42"})


@server.tool(meta={"dev.chronomcp/compensate": {
    "tool": "delete_record", "args": {"id": "$.input.id"}}})
async def slow_create(id: str, path: str) -> dict[str, Any]:
    """Create record ``id``, then answer once the file at ``path`` exists. Told of a
    cancellation, it stops and says so in the ledger."""
    import anyio
    with _db() as db:
        db.execute("INSERT INTO records (id, name) VALUES (?, ?)", (id, id))
    effect("create", id)
    try:
        while not os.path.exists(path):
            await anyio.sleep(0.01)
    except anyio.get_cancelled_exc_class():
        effect("cancelled", id)
        raise
    return {"id": id}


def archive_record(id: str) -> dict[str, Any]:
    """Archive a record (a tool that exists only after enable_archive)."""
    effect("archive", id)
    return {"archived": id}


@server.tool()
async def enable_archive(ctx: Context) -> dict[str, Any]:
    """Add the archive_record tool, and tell the client the tool list changed."""
    server.add_tool(archive_record)
    await ctx.session.send_tool_list_changed()
    return {"enabled": "archive_record"}


if __name__ == "__main__":
    import sys
    if len(sys.argv) > 2 and sys.argv[1] == "--http":  # Streamable HTTP on this port
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
