"""What the framework adapter tests share: the order story's calls, the checks
on the test's own ledger, and the chain's record of approvals."""

from __future__ import annotations

from typing import Any

import redis

from saga_store import Registry, SagaState, SagaStore
from saga_store.log.events import EventKind as K
from saga_store.settings import Settings
from saga_store.verify.checker import Verifier

from .ledger_tools import effects

TOOLS = "tests.integration_tools"
CARD = "4111111111111111"
RESERVE = ("reserve_inventory", {"sku": "LAPTOP-15", "qty": 1})
CHARGE = ("charge_payment", {"amount_cents": 120000, "card_number": CARD})
CRM_FAILS = ("update_crm", {"customer": "ana", "note": "fail"})
INVOICE = ("send_invoice", {"to": "ana@example.com", "amount_cents": 120000})


def saga_store_for(client: redis.Redis) -> SagaStore:
    return SagaStore(client, Registry.from_modules(TOOLS), Settings(lease_ms=1000))


def kinds() -> list[str]:
    return [kind for kind, _, _ in effects()]


def assert_order_unwound() -> None:
    """Reserve and charge happened once; the refund, then the release, once each."""
    assert kinds() == ["reserve", "charge", "refund", "release"], effects()
    assert not effects("crm")


def decisions(store: SagaStore, saga_id: str) -> list[tuple[str, Any, Any]]:
    """``(kind, step, by)`` of every approval decision in the saga's chain."""
    return [(e["kind"], e.get("step"), (e.get("data") or {}).get("by"))
            for e in store.events.log.bodies(saga_id)
            if e["kind"] in (K.APPROVAL_GRANTED, K.APPROVAL_DENIED)]


def assert_verified(store: SagaStore) -> None:
    store.events.ledger.flush()
    assert Verifier(store.events.log).verify().ok


def final(store: SagaStore, saga_id: str) -> SagaState:
    return store.wait(saga_id, timeout=30)
