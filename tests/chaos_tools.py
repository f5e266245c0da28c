"""Tools for the chaos soak. Each records what it did in the soak's own SQLite
ledger ($SAGA_TEST_LEDGER): ``effects`` holds one row per (kind, key), as a
service honouring idempotency keys would; ``runs`` holds one row per time a
tool body ran, so re-runs after kills are visible too; ``tries`` one row per
try of the slow retrying tool (pid, start, end), so two bodies of one step
running at once are visible."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from typing import Any

from saga_store import RetryableError, RetryPolicy, Reversibility, StepContext, tool

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
            "CREATE TABLE IF NOT EXISTS runs (kind TEXT, key TEXT)",
            "CREATE TABLE IF NOT EXISTS tries (key TEXT, pid INTEGER, start REAL, "
            "end REAL)"], timeout=60)
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


def happened(kind: str, ctx: StepContext) -> bool:
    """Whether the ledger holds the effect ``kind`` under this call's key (a probe)."""
    return db().execute("SELECT 1 FROM effects WHERE kind = ? AND key = ?",
                        (kind, ctx.idempotency_key)).fetchone() is not None


@tool(reversibility=Reversibility.READONLY)
def crm_probe(customer: str, ctx: StepContext) -> dict[str, Any]:
    return {"customer": customer} if happened("crm", ctx) else {"happened": False}


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


@tool
def unbook(slot: str, ctx: StepContext) -> dict[str, Any]:
    effect("unbook", ctx)
    return {"unbooked": slot}


BOOK_TRIES = 4  # the last one books; each asks for a retry before it


@tool(compensation=unbook, mapping={"slot": "$.input.slot"}, timeout=1,
      retry=RetryPolicy(max_attempts=BOOK_TRIES, backoff_s=0.2, max_backoff_s=0.4))
def book(slot: str, seconds: float, ctx: StepContext) -> dict[str, Any]:
    """A busy service: each try takes ``seconds`` and the first ones ask for a
    retry, so the step (tries and back-offs) outlasts the soak's lease."""
    c = db()
    n = 1 + c.execute("SELECT COUNT(*) FROM tries WHERE key = ?",
                      (ctx.idempotency_key,)).fetchone()[0]
    started = time.time()
    time.sleep(seconds)
    c.execute("INSERT INTO tries (key, pid, start, end) VALUES (?, ?, ?, ?)",
              (ctx.idempotency_key, os.getpid(), started, time.time()))
    if n < BOOK_TRIES:
        raise RetryableError(f"try {n}: the service is busy")
    effect("book", ctx)
    return {"slot": slot}


class Doom(BaseException):
    """A BaseException of a tool's own."""


RAISED = ("SystemExit", "KeyboardInterrupt", "GeneratorExit", "Doom")


@tool
def unhold(slot: str, ctx: StepContext) -> dict[str, Any]:
    effect("unhold", ctx)
    return {"unheld": slot}


@tool(reversibility=Reversibility.READONLY)
def hold_probe(slot: str, ctx: StepContext) -> dict[str, Any]:
    return {"slot": slot} if happened("hold", ctx) else {"happened": False}


@tool(compensation=unhold, mapping={"slot": "$.input.slot"}, probe=hold_probe, timeout=2,
      retry=RetryPolicy(after_crash="in_doubt"))
def hold(slot: str, raises: str, ctx: StepContext) -> dict[str, Any]:
    """Takes effect, then raises what only a process's end should: in doubt after
    this one run (a kill inside it: in doubt too, never run again blind)."""
    effect("hold", ctx)
    made: dict[str, BaseException] = {"SystemExit": SystemExit(2),
                                      "KeyboardInterrupt": KeyboardInterrupt(),
                                      "GeneratorExit": GeneratorExit(), "Doom": Doom()}
    raise made[raises]


FORWARD = {"reserve": "release", "charge": "refund", "crm": "unlink_crm", "book": "unbook",
           "hold": "unhold"}
