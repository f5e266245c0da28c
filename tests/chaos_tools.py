"""Tools for the chaos soak. Each records what it did in the soak's own SQLite
ledger ($SAGA_TEST_LEDGER): ``effects`` holds one row per (kind, key), as a
service honouring idempotency keys would; ``runs`` holds one row per time a
tool body ran, so re-runs after kills are visible too."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from typing import Any

from saga_store import Reversibility, StepContext, tool

from .sqlite_ledger import connect

_local = threading.local()


def db() -> sqlite3.Connection:
    """One connection per process, thread and ledger (a fork gets its own; an
    asyncio worker runs tools on many threads, and sqlite3 refuses to share one;
    a second soak in one test process has a ledger of its own)."""
    path = os.environ["SAGA_TEST_LEDGER"]
    conn: tuple[tuple[int, str], sqlite3.Connection] | None = getattr(_local, "conn", None)
    if conn is None or conn[0] != (os.getpid(), path):
        c = connect(path, [
            "CREATE TABLE IF NOT EXISTS effects (n INTEGER PRIMARY KEY AUTOINCREMENT, "
            "kind TEXT, key TEXT, saga TEXT, step INTEGER, UNIQUE(kind, key))",
            "CREATE TABLE IF NOT EXISTS runs (kind TEXT, key TEXT)"], timeout=60)
        c.execute("PRAGMA synchronous=NORMAL")
        conn = _local.conn = ((os.getpid(), path), c)
    return conn[1]


def effect(kind: str, ctx: StepContext) -> None:
    c = db()
    c.execute("INSERT INTO runs (kind, key) VALUES (?, ?)", (kind, ctx.idempotency_key))
    c.execute("INSERT OR IGNORE INTO effects (kind, key, saga, step) VALUES (?, ?, ?, ?)",
              (kind, ctx.idempotency_key, ctx.saga_id, ctx.step))


@tool
def release(sku: str, ctx: StepContext) -> dict[str, Any]:
    effect("release", ctx)
    return {"released": sku}


@tool(compensation=release, mapping={"sku": "$.input.sku"}, timeout=5)
def reserve(sku: str, ctx: StepContext) -> dict[str, Any]:
    effect("reserve", ctx)
    return {"sku": sku}


@tool
def refund(charge_id: str, ctx: StepContext) -> dict[str, Any]:
    effect("refund", ctx)
    return {"refunded": charge_id}


@tool(compensation=refund, mapping={"charge_id": "$.output.charge_id"}, secret=["card"],
      timeout=5)
def charge(amount_cents: int, card: str, ctx: StepContext) -> dict[str, Any]:
    effect("charge", ctx)
    return {"charge_id": f"ch-{ctx.idempotency_key[:12]}", "amount_cents": amount_cents}


@tool
def unlink_crm(customer: str, ctx: StepContext) -> dict[str, Any]:
    effect("unlink_crm", ctx)
    return {"unlinked": customer}


@tool(reversibility=Reversibility.READONLY)
def crm_probe(customer: str, ctx: StepContext) -> dict[str, Any]:
    row = db().execute("SELECT 1 FROM effects WHERE kind = 'crm' AND key = ?",
                       (ctx.idempotency_key,)).fetchone()
    return {"customer": customer} if row else {"happened": False}


@tool(compensation=unlink_crm, mapping={"customer": "$.input.customer"}, probe=crm_probe,
      timeout=0.3)
def crm(customer: str, hang: bool, ctx: StepContext) -> dict[str, Any]:
    if hang:
        time.sleep(3)  # the CRM hangs: the call times out, in doubt, before any effect
    effect("crm", ctx)
    return {"customer": customer}


@tool(reversibility=Reversibility.IRREVERSIBLE, timeout=5)
def ship(order: str, ctx: StepContext) -> dict[str, Any]:
    effect("ship", ctx)
    return {"shipped": order}


@tool(reversibility=Reversibility.READONLY)
def check_fraud(score: int) -> dict[str, Any]:
    if score > 50:
        raise RuntimeError(f"fraud score {score} is over the limit")
    return {"score": score}


FORWARD = {"reserve": "release", "charge": "refund", "crm": "unlink_crm"}
