"""The gateway's unwind is the workers' unwind: a probe settles an in-doubt call,
a failing compensation is retried with backoff before the saga is stuck. The
downstream server is a function recording what it was asked (a unit test of the
driver; the end-to-end gateway tests run real servers), the log a real Redis."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from saga_store import Registry, SagaStore, Settings, Status
from saga_store.approval.policy import Policy
from saga_store.log.events import EventKind as K
from saga_store.mcp.classify import Classification, Compensation
from saga_store.mcp.gateway import CallOutcome, Gateway
from saga_store.verify.checker import Verifier

pytestmark = pytest.mark.real_redis
TOOLS = {
    "create_record": Classification("compensable", Compensation(
        "delete_record", {"id": "$.output.structuredContent.id"}), "tools-map"),
    "charge": Classification("compensable", Compensation(
        "refund", {"charge_id": "$.output.structuredContent.charge_id"}), "tools-map",
        probe=Compensation("find_charge", {"amount_cents": "$.input.amount_cents"})),
    "update_crm": Classification("irreversible", None, "tools-map"),
}


class Downstream:
    """A server that records each call; ``answers`` says how it answers a tool."""

    def __init__(self, **answers: Any) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.answers = answers

    async def __call__(self, name: str, args: dict[str, Any],
                       meta: dict[str, Any]) -> CallOutcome:
        self.calls.append((name, args))
        answer = self.answers.get(name, {"ok": True})
        if callable(answer):
            answer = answer(len([c for c in self.calls if c[0] == name]))
        if answer == "die":
            raise ConnectionError("the server went away mid-call")
        if answer == "fail":
            return CallOutcome(False, None, f"{name} failed")
        return CallOutcome(True, answer, str(answer))


def run(saga_store: SagaStore, down: Downstream, *calls: tuple[str, dict[str, Any]]) -> str:
    gw = Gateway(saga_store, Policy.permissive(), TOOLS, down, "gw-unit")

    async def go() -> None:
        for name, args in calls:
            await gw.handle(name, args, None)
    anyio.run(go)
    return saga_store.events.saga_ids()[-1]  # the session's first saga


@pytest.fixture
def store(client: Any) -> SagaStore:
    return SagaStore(client, Registry(), Settings(lease_ms=2000))


def test_a_probe_that_says_the_call_never_happened_spares_its_compensation(
        store: SagaStore) -> None:
    down = Downstream(create_record={"id": "r1"}, charge="die",
                      find_charge={"happened": False})
    sid = run(store, down, ("create_record", {"name": "a"}), ("charge", {"amount_cents": 5}))
    assert [c[0] for c in down.calls] == ["create_record", "charge", "find_charge",
                                          "delete_record"]
    assert down.calls[2][1] == {"amount_cents": 5}
    st = store.state(sid)
    assert st.status is Status.COMPENSATED
    assert st.steps[1].status == "failed"  # settled by the probe
    assert Verifier(store.events.log).verify().ok


def test_a_probe_that_finds_the_call_gives_its_result_to_the_compensation(
        store: SagaStore) -> None:
    down = Downstream(charge="die", find_charge={"charge_id": "ch_9"})
    sid = run(store, down, ("charge", {"amount_cents": 5}))
    assert down.calls[1:] == [("find_charge", {"amount_cents": 5}),
                              ("refund", {"charge_id": "ch_9"})]
    assert store.state(sid).status is Status.COMPENSATED


def test_a_failing_compensation_is_retried_with_backoff_then_succeeds(
        store: SagaStore) -> None:
    down = Downstream(create_record={"id": "r1"}, update_crm="fail",
                      delete_record=lambda n: "fail" if n < 3 else {"ok": True})
    sid = run(store, down, ("create_record", {"name": "a"}), ("update_crm", {"note": "x"}))
    assert [c[0] for c in down.calls].count("delete_record") == 3
    events = store.events.log.events(sid)
    assert [e["attempt"] for e in events if e["kind"] == K.COMPENSATION_INTENT] == [1, 2, 3]
    assert store.state(sid).status is Status.COMPENSATED


def test_a_compensation_that_keeps_failing_leaves_the_saga_stuck_after_its_tries(
        store: SagaStore) -> None:
    down = Downstream(create_record={"id": "r1"}, update_crm="fail", delete_record="fail")
    sid = run(store, down, ("create_record", {"name": "a"}), ("update_crm", {"note": "x"}))
    assert [c[0] for c in down.calls].count("delete_record") == 3
    st = store.state(sid)
    assert st.status is Status.STUCK
    assert "restart the gateway" in st.reason["hint"]
    assert Verifier(store.events.log).verify().ok
