"""A tools module to start from: ``saga worker --tools examples.shop_tools``.

Stock, payment and a receipt, each declared with how it is undone (or that it
cannot be). The "external systems" are simulated; each tool passes its
idempotency key on as a real integration would, so a retried delivery never
charges twice.

The simulated bank declines by card, not by amount: how much may be charged
without a person is the policy's call (examples/policy.toml: charges of
$10,000 and more wait for approval), and a charge the policy lets through is
declined only for a card the bank refuses, as a real bank would.
"""

from __future__ import annotations

from typing import Any

from saga_store import Reversibility, StepContext, StepError, tool

DECLINED_CARD = "tok_chargeDeclined"  # the simulated bank refuses this card (Stripe's test token)


@tool(reversibility=Reversibility.READONLY)
def get_price(sku: str) -> dict[str, Any]:
    """Look a price up (read-only: nothing to undo)."""
    return {"sku": sku, "price_cents": 129_900}


@tool
def release_inventory(reservation_id: str) -> dict[str, Any]:
    """Release a stock reservation (a no-op if it never existed)."""
    return {"released": reservation_id}


@tool(compensation=release_inventory, mapping={"reservation_id": "$.output.reservation_id"},
      timeout=5)
def reserve_inventory(sku: str, qty: int, ctx: StepContext) -> dict[str, Any]:
    """Reserve stock for an order."""
    return {"reservation_id": f"res_{ctx.idempotency_key[:12]}", "sku": sku, "qty": qty}


@tool
def refund_payment(charge_id: str) -> dict[str, Any]:
    """Refund a charge in full."""
    return {"refunded": charge_id}


@tool(compensation=refund_payment, mapping={"charge_id": "$.output.charge_id"},
      secret=["card_token"], timeout=10)
def charge_payment(amount_cents: int, card_token: str, ctx: StepContext) -> dict[str, Any]:
    """Charge a card; the token never reaches the log (``secret``)."""
    if card_token == DECLINED_CARD:
        raise StepError(f"card declined: the bank refused the card for {amount_cents} cents")
    return {"charge_id": f"ch_{ctx.idempotency_key[:12]}", "amount_cents": amount_cents}


@tool(reversibility=Reversibility.IRREVERSIBLE)
def send_receipt(to: str, order: str) -> dict[str, Any]:
    """Email a receipt: once sent it cannot be unsent, so it goes last."""
    return {"sent_to": to, "order": order}
