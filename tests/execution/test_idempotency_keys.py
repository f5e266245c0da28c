"""An explicit idempotency key names one call: the same key with another tool or
other arguments is refused (KeyReuseError, nothing runs), in the same saga as
across sagas; the same call again gets the recorded answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from saga_store import KeyReuseError
from saga_store.client.api import SagaStore
from saga_store.testing.workers import workers

from ..ledger_tools import effects

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
TOOLS = "tests.ledger_tools"


def test_a_key_reused_in_the_same_saga_for_another_call_is_refused(
        saga_store: SagaStore, worker_env: dict[str, str], ledger: Path) -> None:
    with workers(worker_env, TOOLS), saga_store.saga(agent_id="agent-k") as saga:
        first = saga.call("reserve_inventory", {"sku": "K3", "qty": 1},
                          idempotency_key="order-3-book")
        again = saga.call("reserve_inventory", {"sku": "K3", "qty": 1},
                          idempotency_key="order-3-book")
        assert again == first  # the same call: its recorded answer
        with pytest.raises(KeyReuseError, match="other arguments"):
            saga.call("reserve_inventory", {"sku": "K4", "qty": 1},
                      idempotency_key="order-3-book")
        with pytest.raises(KeyReuseError):
            saga.call("noop", {"n": 1}, idempotency_key="order-3-book")
    assert [e[2] for e in effects("reserve")] == ["K3x1"]
    st = saga_store.state(saga.saga_id)
    assert len(st.steps) == 1  # the refused calls left no event
