"""A client driver: ``python -m examples.shop_client``.

It submits a plan file (examples/plans/order.json) and waits for it, then
drives a second order call by call from code, as an agent loop would, and
shows what the agent's history says once the declined charge has rolled the
reservation back. No Redis needed (the embedded store); with SAGA_REDIS_URL
it runs there, with a worker process.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from saga_store import SagaStore, StepError
from saga_store.client.context import rebuild_history

from .agent_runtime import saga_store
from .shop_tools import DECLINED_CARD

TOOLS = "examples.shop_tools"
PLANS = Path(__file__).resolve().parent / "plans"


def submit_plan(store: SagaStore) -> str:
    plan = orjson.loads((PLANS / "order.json").read_bytes())
    sid = store.submit(plan["steps"], agent_id=plan["agent_id"],
                       conversation_id=plan["conversation_id"])
    state = store.wait(sid, timeout=60)
    print(f"plan order.json: saga {sid} is {state.status}")
    return sid


def drive_by_hand(store: SagaStore) -> str:
    with store.saga(agent_id="shop-bot", conversation_id="order-1002") as saga:
        held = saga.call("reserve_inventory", {"sku": "LAPTOP-15", "qty": 5},
                         tool_call_id="call_reserve")
        print(f"reserved: {held['reservation_id']}")
        try:
            saga.call("charge_payment", {"amount_cents": 649_500,
                                         "card_token": DECLINED_CARD},
                      tool_call_id="call_charge")
        except StepError as exc:
            print(f"charge failed: {exc}")
        sid = saga.saga_id
    state = store.wait(sid, timeout=60)
    print(f"by hand: saga {sid} is {state.status}")
    for saga_view in rebuild_history([state], "plain"):
        for call in saga_view["calls"]:
            print(f"  the agent sees {call['tool']}: {call['status']}")
    return sid


def main() -> None:
    with saga_store(TOOLS) as store:
        submit_plan(store)
        drive_by_hand(store)


if __name__ == "__main__":
    main()
