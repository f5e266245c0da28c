"""saga_registry: a framework's own tools (plain functions, LangChain @tool),
with compensations declared beside them, run inline as saga steps: validated,
logged, compensated once each and last first when a later step fails; what it
cannot take is refused in one sentence saying what to pass instead."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from agents import function_tool
from langchain_core.tools import StructuredTool
from langchain_core.tools import tool as lc_tool
from pydantic_ai import RunContext, Tool

from saga_store import InvalidInput, Registry, SagaStore, Settings, Status
from saga_store.errors import InvalidToolCall, StepError
from saga_store.integrations import saga_registry
from saga_store.integrations._session import SagaSession

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(60)]

RESERVATION = {"reservation_id": "$.output.reservation_id"}


class Ledger:
    """The test's own record of every effect, in order."""

    def __init__(self) -> None:
        self.effects: list[tuple[str, str]] = []

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.effects]


def plain_tools(ledger: Ledger) -> tuple[Any, ...]:
    def reserve(sku: str, qty: int) -> dict[str, Any]:
        """Reserve stock."""
        ledger.effects.append(("reserve", f"{sku}x{qty}"))
        return {"reservation_id": f"r-{sku}"}

    def release(reservation_id: str) -> dict[str, Any]:
        """Release a reservation."""
        ledger.effects.append(("release", reservation_id))
        return {"released": reservation_id}

    def charge(cents: int) -> dict[str, Any]:
        """Charge the card."""
        ledger.effects.append(("charge", str(cents)))
        return {"charge_id": f"ch-{cents}"}

    def refund(charge_id: str) -> dict[str, Any]:
        """Refund a charge."""
        ledger.effects.append(("refund", charge_id))
        return {"refunded": charge_id}

    def ship(address: str) -> dict[str, Any]:
        """Ship the order."""
        ledger.effects.append(("ship", address))
        raise RuntimeError("carrier unavailable")

    return reserve, release, charge, refund, ship


def langchain_tools(ledger: Ledger) -> tuple[StructuredTool, ...]:
    @lc_tool("reserve_stock")
    def reserve(sku: str, qty: int) -> dict[str, Any]:
        """Reserve stock."""
        ledger.effects.append(("reserve", f"{sku}x{qty}"))
        return {"reservation_id": f"r-{sku}"}

    @lc_tool
    async def release(reservation_id: str) -> dict[str, Any]:
        """Release a reservation."""
        ledger.effects.append(("release", reservation_id))
        return {"released": reservation_id}

    @lc_tool
    def ship(address: str) -> dict[str, Any]:
        """Ship the order."""
        ledger.effects.append(("ship", address))
        raise RuntimeError("carrier unavailable")

    return reserve, release, ship


def inline_store(client: redis.Redis, registry: Registry) -> SagaStore:
    return SagaStore(client, registry, Settings(lease_ms=1000))


def test_plain_functions_run_inline_and_a_later_failure_unwinds_them_last_first(
        client: redis.Redis) -> None:
    """Two compensable plain functions and a failing third: each is undone once,
    the charge before the reservation; a repeated call is answered from the log
    and a bad argument refused, as for @tool."""
    ledger = Ledger()
    reserve, release, charge, refund, ship = plain_tools(ledger)
    registry = saga_registry([reserve, charge, ship], compensations={
        "reserve": (release, RESERVATION),
        "charge": (refund, {"charge_id": "$.output.charge_id"})})
    store = inline_store(client, registry)
    saga = store.saga("shop", executor="inline")
    assert saga.call("reserve", {"sku": "A", "qty": 1}) == {"reservation_id": "r-A"}
    # the same call again is answered from the log, not run twice
    assert saga.call("reserve", {"sku": "A", "qty": 1}) == {"reservation_id": "r-A"}
    with pytest.raises(InvalidToolCall):
        saga.call("charge", {"cents": "lots"})
    saga.call("charge", {"cents": 500})
    with pytest.raises(StepError, match="carrier unavailable"):
        saga.call("ship", {"address": "Main St"})
    sid = saga.saga_id
    assert ledger.kinds() == ["reserve", "charge", "ship", "refund", "release"]
    assert ("release", "r-A") in ledger.effects
    assert store.wait(sid, timeout=10).status is Status.COMPENSATED


def test_langchain_tools_run_inline_through_a_session_and_are_compensated_once(
        client: redis.Redis) -> None:
    """LangChain @tool objects as the agent has them, under their own names: a later
    failure rolls back the reservation once, and the session refuses the next call."""
    ledger = Ledger()
    reserve, release, ship = langchain_tools(ledger)
    assert isinstance(reserve, StructuredTool)
    registry = saga_registry([reserve, ship], compensations={
        "reserve_stock": (release, RESERVATION)})
    assert registry.get("reserve_stock").description == "Reserve stock."
    store = inline_store(client, registry)
    with SagaSession(store, "shop", executor="inline") as session:
        assert session.calls("c1").run("reserve_stock", {"sku": "B", "qty": 2}, "c1").ok
        assert not session.calls("c2").run("ship", {"address": "Elm St"}, "c2").ok
        assert not session.calls("c3").run("reserve_stock", {"sku": "B", "qty": 2}, "c3").ok
        sid = session.saga_id
    assert sid is not None
    assert ledger.effects == [("reserve", "Bx2"), ("ship", "Elm St"), ("release", "r-B")]
    assert store.wait(sid, timeout=10).status is Status.COMPENSATED


def test_a_compensation_for_a_tool_not_given_is_refused() -> None:
    """Compensations are keyed by the tools given: another name is a mistake."""
    reserve, release, *_ = plain_tools(Ledger())
    with pytest.raises(InvalidInput, match=r"compensations name \['reserv'\], which are "
                       "not among the tools given"):
        saga_registry([reserve], compensations={"reserv": (release, RESERVATION)})


def test_a_mapping_that_cannot_resolve_is_refused_as_tool_refuses_it() -> None:
    """An input field the tool lacks, and a name the compensation does not take."""
    reserve, release, *_ = plain_tools(Ledger())
    with pytest.raises(InvalidInput, match="names no parameter of reserve"):
        saga_registry([reserve], compensations={
            "reserve": (release, {"reservation_id": "$.input.order"})})
    with pytest.raises(InvalidInput, match="which compensation release does not take"):
        saga_registry([reserve], compensations={
            "reserve": (release, {"reservation": "$.output.reservation_id"})})
    with pytest.raises(InvalidInput, match=r"must be \(compensation, mapping\)"):
        saga_registry([reserve], compensations={"reserve": release})  # type: ignore[dict-item]


def test_an_object_with_no_reachable_function_is_refused_with_what_to_pass() -> None:
    """An OpenAI Agents FunctionTool hides its function; other objects are no tool."""
    def reserve(sku: str) -> dict[str, str]:
        return {"reservation_id": sku}

    with pytest.raises(InvalidInput,
                       match="pass the function you decorated with @function_tool instead"):
        saga_registry([function_tool(reserve)])
    with pytest.raises(InvalidInput, match="pass a plain function, a LangChain @tool"):
        saga_registry([42])


def test_a_pydantic_ai_tool_is_taken_unless_it_needs_the_run_context() -> None:
    """A plain Pydantic AI Tool runs as a step; one taking RunContext cannot."""

    def quote(sku: str) -> dict[str, int]:
        return {"cents": 100}

    registry = saga_registry([Tool(quote)], reversibility={"quote": "readonly"})
    assert registry.get("quote").params == ("sku",)
    with pytest.raises(InvalidInput, match="parameter ctx is a Pydantic AI RunContext"):
        saga_registry([Tool(priced, takes_ctx=True)])


def priced(ctx: RunContext[None], sku: str) -> dict[str, int]:
    return {"cents": 100}


def test_a_session_on_workers_is_refused_with_what_to_do_instead(
        client: redis.Redis) -> None:
    """No worker can import these tools: the session says to run inline, or to
    declare them in a module the workers import."""
    reserve, release, *_ = plain_tools(Ledger())
    store = inline_store(client, saga_registry([reserve], compensations={
        "reserve": (release, RESERVATION)}))
    with pytest.raises(InvalidInput, match="open the saga with executor='inline', or"):
        SagaSession(store, "shop")


def test_declared_tools_are_held_beside_them_and_their_registry_left_as_it_was() -> None:
    """``declared=``: @tool tools of a module next to the native ones, copied."""
    declared = Registry.from_modules("tests.ledger_tools")
    *_, ship = plain_tools(Ledger())
    registry = saga_registry([ship], declared=declared)
    assert "reserve_inventory" in registry
    assert "ship" in registry
    assert "ship" not in declared


def test_a_saga_or_a_plan_on_workers_is_refused_without_an_adapter(
        client: redis.Redis) -> None:
    """The store itself refuses a saga on workers and a plan (plans always run on
    workers) over tools only this process has, before anything is written."""
    reserve, release, *_ = plain_tools(Ledger())
    store = inline_store(client, saga_registry([reserve], compensations={
        "reserve": (release, RESERVATION)}))
    before = client.dbsize()
    with pytest.raises(InvalidInput, match="executor='inline'"):
        store.saga(agent_id="shop")
    with pytest.raises(InvalidInput, match="plans always are"):
        store.submit([{"tool": "reserve", "args": {"sku": "A", "qty": 1}}], agent_id="shop")
    assert client.dbsize() == before
