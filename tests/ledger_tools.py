"""Tools for the execution tests. Every effect goes to the test's own ledger
(SQLite at $SAGA_TEST_LEDGER), never inferred from Saga Store's log. Tools
that honour their idempotency key record an effect at most once per key."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import time
from typing import Any

from saga_store import RetryableError, RetryPolicy, Reversibility, StepContext, tool
from saga_store.faults import fault

from .sqlite_ledger import connect


def _db() -> sqlite3.Connection:
    return connect(os.environ["SAGA_TEST_LEDGER"], [
        "CREATE TABLE IF NOT EXISTS effects (n INTEGER PRIMARY KEY AUTOINCREMENT, "
        "kind TEXT, key TEXT, detail TEXT, UNIQUE(kind, key))"])


def effect(kind: str, key: str, detail: str = "") -> bool:
    """Record one effect under ``key``; False if that key already had it (honoured)."""
    with _db() as db:
        cur = db.execute("INSERT OR IGNORE INTO effects (kind, key, detail) VALUES (?, ?, ?)",
                         (kind, key, detail))
        return cur.rowcount == 1


def effects(kind: str | None = None) -> list[tuple[str, str, str]]:
    with _db() as db:
        if kind is None:
            return list(db.execute("SELECT kind, key, detail FROM effects ORDER BY n"))
        return list(db.execute("SELECT kind, key, detail FROM effects WHERE kind = ? "
                               "ORDER BY n", (kind,)))


@tool(reversibility=Reversibility.READONLY)
def noop(n: int = 0) -> dict[str, Any]:
    return {"n": n}


@tool
def release_inventory(reservation_id: str, ctx: StepContext) -> dict[str, Any]:
    effect("release", ctx.idempotency_key, reservation_id)
    fault("in_comp_tool")
    if os.path.exists(os.environ["SAGA_TEST_LEDGER"] + ".release-fails"):
        raise RuntimeError("inventory service unavailable")
    return {"released": reservation_id}


@tool(compensation=release_inventory, mapping={"reservation_id": "$.output.reservation_id"},
      timeout=2)
def reserve_inventory(sku: str, qty: int, ctx: StepContext) -> dict[str, Any]:
    effect("reserve", ctx.idempotency_key, f"{sku}x{qty}")
    fault("in_tool")
    return {"reservation_id": f"r-{ctx.idempotency_key[:8]}"}


@tool
def refund_payment(charge_id: str, ctx: StepContext) -> dict[str, Any]:
    effect("refund", ctx.idempotency_key, charge_id)
    return {"refunded": charge_id}


@tool(compensation=refund_payment, mapping={"charge_id": "$.output.charge_id"},
      secret=["card_number"], timeout=2)
def charge_payment(amount_cents: int, card_number: str, ctx: StepContext) -> dict[str, Any]:
    if not card_number.startswith("4"):
        raise ValueError(f"card {card_number} declined")
    effect("charge", ctx.idempotency_key, str(amount_cents))
    return {"charge_id": f"ch-{ctx.idempotency_key[:8]}", "amount_cents": amount_cents,
            "status": "payment confirmed"}


@tool(compensation=refund_payment, mapping={"charge_id": "$.output.charge_id"}, timeout=2)
def bill(amount_cents: int, ctx: StepContext) -> dict[str, Any]:
    """A charge that records every run of its body, whatever its key: a test counts
    executions with it, not the effects a key-honouring provider would keep."""
    effect("bill", f"{ctx.idempotency_key}/{os.urandom(8).hex()}", str(amount_cents))
    return {"charge_id": f"ch-{ctx.idempotency_key[:8]}", "amount_cents": amount_cents}


@tool(timeout=0.3, reversibility=Reversibility.IRREVERSIBLE)
def update_crm(note: str) -> dict[str, Any]:
    if note == "slow":
        time.sleep(5)
    return {"noted": note}


@tool(reversibility=Reversibility.IRREVERSIBLE)
def send_email(to: str, ctx: StepContext) -> dict[str, Any]:
    effect("email", ctx.idempotency_key, to)
    return {"sent": to}


@tool(reversibility=Reversibility.READONLY,
      retry=RetryPolicy(max_attempts=3, backoff_s=0.01))
def flaky(fail_times: int, ctx: StepContext) -> dict[str, Any]:
    if ctx.attempt == 1 and effect("flaky-try", f"{ctx.idempotency_key}:{time.time_ns()}") \
            and len(effects("flaky-try")) <= fail_times:
        raise RetryableError("try again")
    return {"ok": True}


@tool(reversibility=Reversibility.READONLY)
def fail_always(why: str = "boom") -> dict[str, Any]:
    raise RuntimeError(why)


@tool(reversibility=Reversibility.READONLY, timeout=2)
def kill_my_worker() -> dict[str, Any]:
    os.kill(os.getpid(), signal.SIGKILL)
    return {}


@tool
def unbook_slot(slot: str, ctx: StepContext) -> dict[str, Any]:
    effect("unbook", ctx.idempotency_key, slot)
    return {"unbooked": slot}


@tool(compensation=unbook_slot, mapping={"slot": "$.input.slot"}, timeout=2)
def book_then_kill_my_worker(slot: str, ctx: StepContext) -> dict[str, Any]:
    """Books (once per key, as a real API honouring it would), then its worker dies."""
    effect("book", ctx.idempotency_key, slot)
    os.kill(os.getpid(), signal.SIGKILL)
    return {}


@tool(reversibility=Reversibility.READONLY)
async def async_echo(x: int) -> dict[str, Any]:
    await asyncio.sleep(0.001)
    return {"x": x}


@tool(reversibility=Reversibility.READONLY)
def bad_result() -> Any:
    return ["not", "an", "object"]


@tool(reversibility=Reversibility.READONLY, timeout=3)
def slow_noop(seconds: float) -> dict[str, Any]:
    time.sleep(seconds)
    return {"slept": seconds}


@tool
def revert_crm(customer: str, ctx: StepContext) -> dict[str, Any]:
    """Tolerates 'it never happened': reverting nothing is a success."""
    effect("crm-revert", ctx.idempotency_key, customer)
    return {"reverted": customer}


@tool(reversibility=Reversibility.READONLY)
def crm_probe(customer: str, ctx: StepContext) -> dict[str, Any]:
    """Did the CRM update with this step's idempotency key happen?"""
    done = [e for e in effects("crm") if e[1] == ctx.idempotency_key]
    return {"customer": customer, "noted": True} if done else {"happened": False}


@tool(compensation=revert_crm, mapping={"customer": "$.input.customer"}, probe=crm_probe,
      timeout=0.3)
def update_crm_record(customer: str, note: str, ctx: StepContext) -> dict[str, Any]:
    if note == "slow":
        time.sleep(5)  # the CRM hangs: the call times out before it records anything
    effect("crm", ctx.idempotency_key, customer)
    return {"customer": customer, "noted": True}


@tool(reversibility=Reversibility.IRREVERSIBLE)
def send_notification(to: str, ctx: StepContext) -> dict[str, Any]:
    effect("notify", ctx.idempotency_key, to)
    return {"sent": to}


@tool(reversibility=Reversibility.IRREVERSIBLE)
def emit_webhook(event: str, ctx: StepContext) -> dict[str, Any]:
    effect("webhook", ctx.idempotency_key, event)
    return {"emitted": event}


@tool(compensation=release_inventory, mapping={"reservation_id": "$.output.reservation_id"})
def reserve_forgetful(sku: str, ctx: StepContext) -> dict[str, Any]:
    """Reserves, but returns no reservation id: its compensation's mapping cannot resolve."""
    effect("reserve", ctx.idempotency_key, sku)
    return {"held": sku}


@tool(compensation=revert_crm, mapping={"customer": "$.input.customer"})
def crm_export(customer: str, ctx: StepContext) -> dict[str, Any]:
    """Writes to the CRM, then returns far more than an event may hold."""
    effect("crm", ctx.idempotency_key, customer)
    return {"customer": customer, "dump": "x" * 300_000}
