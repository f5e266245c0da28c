"""The compensator and the gateway unwind a saga the same way: the same failing
saga, run through each driver, logs the same unwind (kinds, steps, keys,
compensation arguments), makes the same probe and compensation calls (tools,
arguments, keys) and waits the same jittered back-offs between tries.

The workers' saga runs on the inline executor (the compensator's own code,
in this process), the gateway's session against a downstream that answers as
the registry's tools do. Both record every call in the test's ledger."""

from __future__ import annotations

import contextlib
import os
import random
from dataclasses import dataclass
from typing import Any

import anyio
import pytest
from saga_store.workers.invoke import Invoker

from saga_store import Registry, Reversibility, SagaStore, Settings, StepContext, tool
from saga_store.approval.policy import Policy
from saga_store.errors import SagaError
from saga_store.execution.idempotency import compensation_key
from saga_store.log.events import EventKind as K
from saga_store.mcp.classify import Classification, Compensation
from saga_store.mcp.gateway import META_IDEMPOTENCY, CallOutcome, Gateway
from tests.sqlite_ledger import connect

pytestmark = pytest.mark.real_redis
JITTER = 0.25  # what random.random() says in these tests: the back-off times 0.75
SLEEP = anyio.sleep


def _db() -> Any:
    return connect(os.environ["SAGA_TEST_LEDGER"], [
        "CREATE TABLE IF NOT EXISTS calls (n INTEGER PRIMARY KEY AUTOINCREMENT, "
        "driver TEXT, tool TEXT, args TEXT, key TEXT)"])


def record(driver: str, name: str, args: dict[str, Any], key: str) -> None:
    with _db() as db:
        db.execute("INSERT INTO calls (driver, tool, args, key) VALUES (?, ?, ?, ?)",
                   (driver, name, repr(sorted(args.items())), key))


def calls(driver: str) -> list[tuple[str, str, str]]:
    with _db() as db:
        return list(db.execute("SELECT tool, args, key FROM calls WHERE driver = ? "
                               "ORDER BY n", (driver,)))


# how each tool answers its n-th call (1-based): a result, "fail" or "doubt"
ANSWERS: dict[str, Any] = {}


def answer(name: str) -> Any:
    with _db() as db:
        n = db.execute("SELECT COUNT(*) FROM calls WHERE tool = ?", (name,)).fetchone()[0]
    how = ANSWERS.get(name, {"ok": True})
    return how(n) if callable(how) else how


def run_tool(name: str, args: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    """A registry tool's body: recorded, then answering as ``ANSWERS`` says."""
    record("workers", name, args, ctx.idempotency_key)
    said = answer(name)
    if said == "fail":
        raise RuntimeError(f"{name} failed")
    if said == "doubt":  # returned something no log can keep: its effect is unknown
        return {"n": float("nan")}
    return dict(said)


@tool
def release(reservation_id: str, ctx: StepContext) -> dict[str, Any]:
    return run_tool("release", {"reservation_id": reservation_id}, ctx)


@tool(compensation=release, mapping={"reservation_id": "$.output.reservation_id"})
def reserve(sku: str, ctx: StepContext) -> dict[str, Any]:
    return run_tool("reserve", {"sku": sku}, ctx)


@tool
def refund(charge_id: str, ctx: StepContext) -> dict[str, Any]:
    return run_tool("refund", {"charge_id": charge_id}, ctx)


@tool(reversibility=Reversibility.READONLY)
def find_charge(amount_cents: int, ctx: StepContext) -> dict[str, Any]:
    return run_tool("find_charge", {"amount_cents": amount_cents}, ctx)


@tool(compensation=refund, mapping={"charge_id": "$.output.charge_id"}, probe=find_charge)
def charge(amount_cents: int, note: str, ctx: StepContext) -> dict[str, Any]:
    return run_tool("charge", {"amount_cents": amount_cents, "note": note}, ctx)


@tool(reversibility=Reversibility.READONLY)
def lookup(q: str, ctx: StepContext) -> dict[str, Any]:
    return run_tool("lookup", {"q": q}, ctx)


@tool(reversibility=Reversibility.IRREVERSIBLE)
def notify(text: str, ctx: StepContext) -> dict[str, Any]:
    return run_tool("notify", {"text": text}, ctx)


REGISTRY = [release, reserve, refund, find_charge, charge, lookup, notify]
# the same tools as the gateway knows them from its tools-map
TOOLS_MAP = {
    "reserve": Classification("compensable", Compensation(
        "release", {"reservation_id": "$.output.structuredContent.reservation_id"}),
        "tools-map"),
    "charge": Classification("compensable", Compensation(
        "refund", {"charge_id": "$.output.structuredContent.charge_id"}), "tools-map",
        probe=Compensation("find_charge", {"amount_cents": "$.input.amount_cents"})),
    "lookup": Classification("readonly", None, "tools-map"),
    "find_charge": Classification("readonly", None, "tools-map"),
    "notify": Classification("irreversible", None, "tools-map"),
}


async def downstream(name: str, args: dict[str, Any], meta: dict[str, Any]) -> CallOutcome:
    """The gateway's server: the registry's tools, answering as ``ANSWERS`` says."""
    record("gateway", name, args, meta[META_IDEMPOTENCY])
    said = answer(name)
    if said == "doubt":
        raise ConnectionError("the server went away mid-call")
    if said == "fail":
        return CallOutcome(False, None, f"{name} failed")
    return CallOutcome(True, said, str(said))


@dataclass(frozen=True)
class Case:
    calls: list[tuple[str, dict[str, Any]]]
    answers: dict[str, Any]


CASES = {
    "a failing compensation is retried with jittered backoff, then succeeds": Case(
        [("reserve", {"sku": "a"}), ("notify", {"text": "hi"})],
        {"reserve": {"reservation_id": "r1"}, "notify": "fail",
         "release": lambda n: "fail" if n < 3 else {"released": "r1"}}),
    "a compensation that keeps failing leaves the saga stuck after its tries": Case(
        [("reserve", {"sku": "a"}), ("notify", {"text": "hi"})],
        {"reserve": {"reservation_id": "r1"}, "notify": "fail", "release": "fail"}),
    "an in-doubt call is probed with its arguments and key, then compensated": Case(
        [("reserve", {"sku": "a"}), ("charge", {"amount_cents": 5, "note": "x"})],
        {"reserve": {"reservation_id": "r1"}, "charge": "doubt",
         "find_charge": {"charge_id": "ch9"}}),
    "a probe that says the call never happened spares its compensation": Case(
        [("reserve", {"sku": "a"}), ("charge", {"amount_cents": 5, "note": "x"})],
        {"reserve": {"reservation_id": "r1"}, "charge": "doubt",
         "find_charge": {"happened": False}}),
    "a read in doubt unwinds the saga, and nothing is undone for the read": Case(
        [("reserve", {"sku": "a"}), ("lookup", {"q": "z"})],
        {"reserve": {"reservation_id": "r1"}, "lookup": "doubt"}),
}


class Paused:
    """The back-offs each driver asked for, in seconds, none of them slept."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seconds: list[float] = []

        def pause(invoker: Invoker, seconds: float, lease: Any) -> None:
            self.seconds.append(round(seconds, 6))

        async def sleep(seconds: float) -> None:
            self.seconds.append(round(seconds, 6))
            await SLEEP(0)

        monkeypatch.setattr(Invoker, "pause", pause)
        monkeypatch.setattr(anyio, "sleep", sleep)


def unwind_of(store: SagaStore, saga_id: str) -> list[tuple[Any, ...]]:
    """The saga's log as the comparison sees it: kind, step, attempt, key (named for
    the step it derives from) and compensation arguments; from the first intent on
    (a saga's opening says which driver opened it)."""
    events = store.events.log.events(saga_id)
    names: dict[str, str] = {}
    for e in events:
        if e["kind"] == K.STEP_INTENT:
            names[e["idem_key"]] = f"K{e['step']}"
            names[compensation_key(e["idem_key"])] = f"comp(K{e['step']})"
    out = []
    for e in events[1:]:
        data = e.get("data") or {}
        args = data.get("args") if e["kind"] == K.COMPENSATION_INTENT else None
        out.append((e["kind"], e.get("step"), e.get("attempt"),
                    names.get(e.get("idem_key") or "", e.get("idem_key")), args))
    return out


def named_calls(store: SagaStore, saga_id: str, driver: str) -> list[tuple[str, str, str]]:
    """The calls a driver made, each key named for the step it derives from."""
    names: dict[str, str] = {}
    for e in store.events.log.events(saga_id):
        if e["kind"] == K.STEP_INTENT:
            k, n = e["idem_key"], e["step"]
            names |= {k: f"K{n}", f"{k}:probe": f"K{n}:probe",
                      compensation_key(k): f"comp(K{n})"}
    return [(t, a, names.get(k, k)) for t, a, k in calls(driver)]


def through_workers(store: SagaStore, case: Case) -> str:
    # the failing call raises (a rolled-back one may not: its result stands as probed)
    with contextlib.suppress(SagaError), store.saga("wk", executor="inline") as saga:
        for name, args in case.calls:
            saga.call(name, args)
    return saga.saga_id


def through_gateway(store: SagaStore, case: Case) -> str:
    gw = Gateway(store, Policy.permissive(), TOOLS_MAP, downstream, "gw-one-loop",
                 agent_id="gw")

    async def go() -> None:
        for name, args in case.calls:
            await gw.handle(name, args, None)
    anyio.run(go)
    return next(s for s in store.events.saga_ids() if s.startswith("gw"))


@pytest.mark.parametrize("name", list(CASES))
def test_the_compensator_and_the_gateway_unwind_a_failing_saga_alike(
        client: Any, ledger: Any, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The same failing saga, through the compensator and through the gateway, logs
    the same unwind, makes the same calls and waits the same back-offs."""
    case = CASES[name]
    monkeypatch.setattr(random, "random", lambda: JITTER)
    monkeypatch.setattr("tests.compensation.test_one_unwind.ANSWERS", case.answers)
    store = SagaStore(client, Registry(REGISTRY), Settings(lease_ms=2000))
    seen = {}
    for driver, run in (("workers", through_workers), ("gateway", through_gateway)):
        paused = Paused(monkeypatch)
        with _db() as db:  # each driver's calls count from the first
            db.execute("DELETE FROM calls")
        sid = run(store, case)
        seen[driver] = (unwind_of(store, sid), named_calls(store, sid, driver),
                        paused.seconds, str(store.state(sid).status))
    assert seen["gateway"] == seen["workers"]
