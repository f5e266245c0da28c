"""Continuing a saga from the framework's own persisted state: ``store.attach``
takes over the client lease and fences off the handle before it, and a call sent
again with its ``tool_call_id`` answers from the log and never runs twice."""

from __future__ import annotations

import asyncio

import pytest
import redis

from saga_store import InvalidInput, KeyReuseError, SagaStore, Status, StepError
from saga_store.errors import SagaTakenOver, StepRolledBack

from ..integration_support import CHARGE, CRM_FAILS, RESERVE, final, saga_store_for
from ..ledger_tools import effects

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]


def kinds() -> list[str]:
    return [k for k, _, _ in effects()]


def test_attach_takes_over_and_the_old_handle_is_refused(
        store: SagaStore, client: redis.Redis, running: None) -> None:
    """The attached handle answers a logged call from the log and goes on; the
    opener's next call and its commit are refused, and its exit aborts nothing."""
    old = store.saga(agent_id="shop")
    held = old.call(*RESERVE, tool_call_id="call_1")
    with pytest.raises(InvalidInput, match="already exists"):
        store.saga(agent_id="shop", saga_id=old.saga_id)
    other = saga_store_for(redis.Redis(connection_pool=client.connection_pool))
    new = other.attach(old.saga_id)
    assert new.call(*RESERVE, tool_call_id="call_1") == held
    with pytest.raises(SagaTakenOver, match="attach"):
        old.call(*CHARGE, tool_call_id="call_2")
    with pytest.raises(SagaTakenOver), old:
        old.commit()
    new.call(*CHARGE, tool_call_id="call_2")
    again = other.attach(old.saga_id)  # a second takeover fences the first attach
    with pytest.raises(SagaTakenOver):
        new.commit()
    again.commit()
    assert final(store, old.saga_id).status is Status.COMMITTED
    assert kinds() == ["reserve", "charge"]


def test_a_call_sent_again_after_a_rollback_says_so_and_never_runs(
        store: SagaStore, running: None) -> None:
    with store.saga(agent_id="shop") as saga:
        saga.call(*RESERVE, tool_call_id="call_1")
        with pytest.raises(StepError):
            saga.call(*CRM_FAILS, tool_call_id="call_2")
        sid = saga.saga_id
    assert final(store, sid).status is Status.COMPENSATED
    resumed = store.attach(sid)
    with pytest.raises(StepRolledBack, match="rolled back since; it is not run again"):
        resumed.call(*RESERVE, tool_call_id="call_1")
    with pytest.raises(StepError, match="CRM unavailable"):
        resumed.call(*CRM_FAILS, tool_call_id="call_2")
    with pytest.raises(KeyReuseError, match="other arguments"):
        resumed.call("reserve_inventory", {"sku": "OTHER", "qty": 1}, tool_call_id="call_1")
    assert kinds() == ["reserve", "release"]


def test_asyncio_attach(store: SagaStore, running: None) -> None:
    async def go() -> str:
        async with store.asaga(agent_id="shop") as first:
            await first.call(*RESERVE, tool_call_id="call_1")
            sid = first.saga_id
            async with await store.aattach(sid) as saga:
                await saga.call(*RESERVE, tool_call_id="call_1")
                await saga.call(*CHARGE, tool_call_id="call_2")
            return sid

    sid = asyncio.run(go())
    assert final(store, sid).status is Status.COMMITTED
    assert kinds() == ["reserve", "charge"]
