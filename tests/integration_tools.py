"""Tools for the framework adapter tests: the order story on the test's own
side-effect ledger (tests.ledger_tools), a CRM that fails, and an invoice a
person must approve."""

from __future__ import annotations

from typing import Any

from saga_store import Reversibility, StepContext, tool

from .ledger_tools import (  # registered with this module: the order's tools
    charge_payment,
    effect,
    refund_payment,
    release_inventory,
    reserve_inventory,
)

__all__ = ["charge_payment", "get_stock", "refund_payment", "release_inventory",
           "reserve_inventory", "send_invoice", "update_crm"]


@tool(reversibility=Reversibility.READONLY)
def get_stock(sku: str) -> dict[str, Any]:
    """How many units of a SKU are in stock."""
    return {"sku": sku, "in_stock": 3}


@tool(reversibility=Reversibility.IRREVERSIBLE)
def update_crm(customer: str, note: str, ctx: StepContext) -> dict[str, Any]:
    """Record the order on the customer's CRM record."""
    if note == "fail":
        raise RuntimeError("CRM unavailable (503)")
    effect("crm", ctx.idempotency_key, customer)
    return {"customer": customer, "noted": note}


@tool(reversibility=Reversibility.IRREVERSIBLE, approval="require_approval")
def send_invoice(to: str, amount_cents: int, ctx: StepContext) -> dict[str, Any]:
    """Email an invoice (cannot be unsent; a person approves each one)."""
    effect("invoice", ctx.idempotency_key, to)
    return {"sent_to": to, "amount_cents": amount_cents}
