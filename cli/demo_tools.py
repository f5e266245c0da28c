"""The order workflow of the demo: inventory, payment, CRM, notification, webhook.

The "external systems" here are simulated, but each tool passes its
idempotency key downstream as a real integration would, and each compensable
tool declares how it is undone.
"""

from __future__ import annotations

import time
from typing import Any

from saga_store import Reversibility, StepContext, tool


@tool
def release_inventory(reservation_id: str) -> dict[str, Any]:
    """Release a stock reservation (a no-op if it never existed)."""
    return {"released": reservation_id}


@tool(compensation=release_inventory, mapping={"reservation_id": "$.output.reservation_id"},
      timeout=5)
def reserve_inventory(sku: str, qty: int, ctx: StepContext) -> dict[str, Any]:
    """Reserve stock for an order."""
    return {"reservation_id": f"res_{ctx.idempotency_key[:10]}", "sku": sku, "qty": qty}


@tool
def refund_payment(charge_id: str, amount_cents: int) -> dict[str, Any]:
    """Refund a charge in full."""
    return {"refund_id": f"re_{charge_id[3:]}", "amount_cents": amount_cents}


@tool(compensation=refund_payment,
      mapping={"charge_id": "$.output.charge_id", "amount_cents": "$.input.amount_cents"},
      secret=["card_token"], timeout=5)
def charge_payment(amount_cents: int, card_token: str, ctx: StepContext) -> dict[str, Any]:
    """Charge the customer's card."""
    return {"charge_id": f"ch_{ctx.idempotency_key[:10]}", "status": "payment confirmed",
            "amount_cents": amount_cents}


@tool
def revert_crm(customer: str) -> dict[str, Any]:
    """Undo a CRM update (tolerates one that never happened)."""
    return {"reverted": customer}


@tool(reversibility=Reversibility.READONLY)
def crm_lookup(customer: str, note: str) -> dict[str, Any]:
    """Probe: did the CRM record the note? The demo's CRM never commits a write
    that timed out."""
    return {"happened": False}


@tool(compensation=revert_crm, mapping={"customer": "$.input.customer"}, probe=crm_lookup,
      timeout=0.5)
def update_crm(customer: str, note: str) -> dict[str, Any]:
    """Record the order on the customer's CRM record."""
    if note.startswith("slow"):
        time.sleep(3)  # the CRM hangs
    return {"customer": customer, "noted": note}


@tool(reversibility=Reversibility.IRREVERSIBLE)
def send_notification(to: str, text: str) -> dict[str, Any]:
    """Email the customer (cannot be unsent)."""
    return {"sent_to": to}


@tool(reversibility=Reversibility.IRREVERSIBLE)
def emit_webhook(event: str) -> dict[str, Any]:
    """Tell downstream systems (cannot be taken back)."""
    return {"emitted": event}
