"""A small MCP server that declares its tools only in the mcp-compensate
extension's own form (``_meta["dev.chronomcp/compensate"]`` with
``reversibility``, ``compensation.toolName``, ``parameterMapping``, ...), for
gateways run with no tools map. Every effect goes to the test's SQLite ledger
($ITEMS_LEDGER); the ledger's items are per $ITEMS_SHELF, so two gateways whose
servers differ only in that variable reach different data."""

from __future__ import annotations

import os
import sqlite3
import uuid
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import (
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    TextContent,
    TextResourceContents,
)

server = MCPServer("items")
EXT = "dev.chronomcp/compensate"


def _db() -> sqlite3.Connection:
    db = sqlite3.connect(os.environ["ITEMS_LEDGER"], timeout=30, isolation_level=None)
    db.execute("CREATE TABLE IF NOT EXISTS effects (n INTEGER PRIMARY KEY AUTOINCREMENT, "
               "shelf TEXT, kind TEXT, key TEXT)")
    return db


def effect(kind: str, key: str) -> None:
    with _db() as db:
        db.execute("INSERT INTO effects (shelf, kind, key) VALUES (?, ?, ?)",
                   (os.environ.get("ITEMS_SHELF", ""), kind, key))


@server.tool(meta={EXT: {
    "reversibility": "compensable",
    "compensation": {"toolName": "remove_item",
                     "parameterMapping": {"item_id": "$.output.structuredContent.id"},
                     "timeoutMs": 5000, "maxRetries": 1},
    "sideEffectScope": ["items"]}})
def add_item(name: str) -> dict[str, Any]:
    """Add an item to the shelf."""
    iid = f"it-{uuid.uuid4().hex[:8]}"
    effect("add", iid)
    return {"id": iid, "name": name}


@server.tool()
def remove_item(item_id: str) -> dict[str, Any]:
    """Remove an item (undoes add_item)."""
    effect("remove", item_id)
    return {"removed": item_id}


@server.tool(meta={EXT: {
    "reversibility": "compensable",
    "compensation": {"toolName": "refund_payment",
                     "parameterMapping": {"payment_id": "$.output.structuredContent.id"}},
    "sideEffectScope": ["payments"]}})
def take_payment(amount_cents: int) -> dict[str, Any]:
    """Take a payment; 0 or less is declined."""
    if amount_cents <= 0:
        raise ValueError("card declined")
    pid = f"pay-{uuid.uuid4().hex[:8]}"
    effect("pay", pid)
    return {"id": pid}


@server.tool()
def refund_payment(payment_id: str) -> dict[str, Any]:
    """Refund a payment (undoes take_payment)."""
    effect("refund", payment_id)
    return {"refunded": payment_id}


@server.tool(meta={EXT: {"reversibility": "readonly", "sideEffectScope": []}})
def count_items(fail: bool = False) -> dict[str, Any]:
    """How many items were added; fail=True makes it fail."""
    if fail:
        raise RuntimeError("count unavailable")
    with _db() as db:
        n = db.execute("SELECT COUNT(*) FROM effects WHERE kind = 'add'").fetchone()[0]
    return {"count": n}


@server.tool(meta={EXT: {
    "reversibility": "irreversible", "sideEffectScope": ["email", "customers"],
    "notes": "A sent email cannot be recalled."}})
def send_email(to: str) -> dict[str, Any]:
    """Send an email."""
    effect("email", to)
    return {"sent": to}


@server.tool(meta={EXT: {"reversibility": "compensable", "compensation": {
    "toolName": "remove_item", "parameterMapping": {"item_id": "$.input.no_such_field"}}}})
def tag_item(tag: str) -> dict[str, Any]:
    """Tag something; its declared compensation can never be built."""
    effect("tag", tag)
    return {"tagged": tag}


@server.tool(meta={EXT: {"reversibility": "compensable", "compensation": {
    "toolName": "release_slot", "parameterMapping": {"slot": "$.input.slot"},
    "maxRetries": 0}}})
def reserve_slot(slot: str) -> dict[str, Any]:
    """Reserve a slot; its undo, release_slot, always fails."""
    effect("reserve", slot)
    return {"reserved": slot}


@server.tool()
def release_slot(slot: str) -> dict[str, Any]:
    """Release a slot: the booking system is down."""
    raise RuntimeError(f"cannot release {slot}: booking system down")


@server.tool(meta={EXT: {"reversibility": "compensable", "compensation": {
    "toolName": "cancel_room", "parameterMapping": {"room": "$.input.room"},
    "timeoutMs": 300, "maxRetries": 1}}})
def book_room(room: str) -> dict[str, Any]:
    """Book a room; its undo, cancel_room, hangs."""
    effect("book", room)
    return {"booked": room}


@server.tool()
async def cancel_room(room: str) -> dict[str, Any]:
    """Cancel a booking: the booking system never answers."""
    effect("cancel-tried", room)
    await anyio.sleep(3600)
    return {"cancelled": room}


@server.tool(meta={EXT: {"reversibility": "readonly"}})
async def slow_count(steps: int, ctx: Context) -> dict[str, Any]:
    """Count to ``steps``, reporting progress, and say which _meta keys arrived."""
    for i in range(steps):
        await ctx.report_progress(i + 1, steps, f"step {i + 1}")
    meta = ctx.request_context.meta or {}
    return {"counted": steps, "meta_keys": sorted(meta)}


@server.tool(meta={EXT: {"reversibility": "irreversible"}})
def print_label(name: str) -> CallToolResult:
    """Print a label: its answer has a text, an image and a resource block."""
    effect("label", name)
    return CallToolResult(content=[
        TextContent(type="text", text=f"label {name} printed"),
        ImageContent(type="image", data="iVBORw0KGgo=", mime_type="image/png"),
        EmbeddedResource(type="resource", resource=TextResourceContents(
            uri=f"label://{name}", text=f"LABEL {name}", mime_type="text/plain"))],
        structured_content={"printed": name})


if __name__ == "__main__":
    server.run()
