"""The gateway in front of a server that declares its tools only in the
mcp-compensate extension's form, with no tools map: the declarations are read
as their authors wrote them. Real gateway process, real server process, the
official SDK client; effects are counted in the server's own ledger."""

from __future__ import annotations

import os
import sqlite3
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from cli.approvals import describe
from saga_store import Registry, SagaStore
from saga_store.approval import requests as approvals
from saga_store.protocol.state import Status
from saga_store.testing import assert_eventually
from saga_store.verify.checker import Verifier
from tests.console_helpers import console
from tests.gateway.test_mcp_gateway import RawGateway

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
ROOT = Path(__file__).resolve().parents[2]
SERVER = [sys.executable, str(ROOT / "tests" / "mcp_compensate_server.py")]
TRUSTING = """
[defaults]
trust_server_hints = true
"""


@pytest.fixture
def gw(redis_url: str, client: redis.Redis, tmp_path: Path) -> dict[str, Any]:
    ledger = tmp_path / "items.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ITEMS_LEDGER": str(ledger),
           "SAGA_REDIS_URL": redis_url}
    return {"env": env, "args": ["-m", "saga_store.cli.main", "mcp-guard"], "ledger": ledger,
            "store": SagaStore(client, Registry()), "tmp": tmp_path}


@asynccontextmanager
async def _session(gw: dict[str, Any], extra: list[str] | None = None,
                   env: dict[str, str] | None = None) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=sys.executable,
                                   args=[*gw["args"], *(extra or []), "--", *SERVER],
                                   env=env or gw["env"], cwd=str(ROOT))
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        yield s


def _trusting(gw: dict[str, Any]) -> list[str]:
    (gw["tmp"] / "policy.toml").write_text(TRUSTING)
    return ["--policy", str(gw["tmp"] / "policy.toml")]


def _effects(ledger: Path) -> list[tuple[str, str]]:
    if not ledger.exists():
        return []
    with sqlite3.connect(ledger) as db:
        return list(db.execute("SELECT kind, key FROM effects ORDER BY n"))


def _text(result: Any) -> str:
    return "\n".join(getattr(c, "text", "") for c in result.content)


def _sagas(store: SagaStore) -> list[Any]:
    return [store.state(sid) for sid in reversed(store.events.saga_ids())]


async def _pending(store: SagaStore) -> list[approvals.Pending]:
    return await anyio.to_thread.run_sync(lambda: assert_eventually(
        lambda: approvals.pending(store), timeout=30, what="an approval request"))


def test_a_declared_compensation_undoes_a_call_when_a_later_one_fails(
        gw: dict[str, Any]) -> None:
    """add_item, then a declined payment: add_item is undone by the remove_item its
    declaration names, with the id mapped from its output. The server's readonly
    claim does not beat the safe policy: count_items waits for a person."""
    store: SagaStore = gw["store"]

    async def go() -> tuple[dict[str, str], Any, Any, list[approvals.Pending]]:
        async with _session(gw) as s:
            listed = {t.name: t.description or "" for t in (await s.list_tools()).tools}
            added = await s.call_tool("add_item", {"name": "lamp"})
            async with anyio.create_task_group() as tg:
                tg.start_soon(s.call_tool, "count_items", {})
                pending = await _pending(store)
                approvals.decide(store, pending[0].saga_id, pending[0].step, grant=True,
                                 by="alice")
            declined = await s.call_tool("take_payment", {"amount_cents": 0})
            return listed, added, declined, pending
    listed, added, declined, pending = anyio.run(go)
    assert "undone by remove_item" in listed["add_item"]
    assert "read-only (server's claim)" in listed["count_items"]
    assert "IRREVERSIBLE" in listed["send_email"]
    assert pending[0].preview["tool"] == "count_items"
    assert not added.is_error
    assert declined.is_error
    assert "add_item (step 0)" in _text(declined)
    iid = added.structured_content["id"]
    assert _effects(gw["ledger"]) == [("add", iid), ("remove", iid)]
    [st] = _sagas(store)
    assert st.status is Status.COMPENSATED
    assert st.steps[0].compensation == "succeeded"
    assert Verifier(store.events.log).verify().ok


def test_declared_readonly_and_irreversible_tools_are_taken_at_their_word(
        gw: dict[str, Any]) -> None:
    """With trust_server_hints, a declared read-only tool runs ungated and its failure
    rolls nothing back; a declared irreversible one waits for a person, who sees the
    declaration's sideEffectScope and notes."""
    store: SagaStore = gw["store"]

    shown: list[str] = []

    async def go() -> tuple[Any, Any, list[approvals.Pending]]:
        async with _session(gw, _trusting(gw)) as s:
            await s.call_tool("add_item", {"name": "lamp"})
            read = await s.call_tool("count_items", {"fail": True})
            out: list[Any] = []

            async def send() -> None:
                out.append(await s.call_tool("send_email", {"to": "ann@example.com"}))
            async with anyio.create_task_group() as tg:
                tg.start_soon(send)
                pending = await _pending(store)
                shown.append(describe(pending[0].to_dict()))  # saga approvals
                shown.append(await anyio.to_thread.run_sync(  # the console's inbox
                    lambda: console(store).get("/approvals").text))
                approvals.decide(store, pending[0].saga_id, pending[0].step, grant=True,
                                 by="alice")
            return read, out[0], pending
    read, sent, pending = anyio.run(go)
    for text in shown:
        assert "email" in text
        assert "customers" in text
        assert "A sent email cannot be recalled." in text
    assert read.is_error
    assert "rolled back" not in _text(read)
    assert not sent.is_error
    preview = pending[0].preview
    assert (preview["tool"], preview["reversibility"]) == ("send_email", "irreversible")
    assert preview["side_effect_scope"] == ["email", "customers"]
    assert preview["notes"] == "A sent email cannot be recalled."
    assert [k for k, _ in _effects(gw["ledger"])] == ["add", "email"]
    [st] = _sagas(store)
    assert st.status is Status.COMMITTED


def _killed_after_one_call(gw: dict[str, Any], env: dict[str, str]) -> str:
    """A gateway SIGKILLed (with its server) after one add_item: its session's saga."""
    proc = RawGateway(gw, env=env, argv=[sys.executable, *gw["args"], "--", *SERVER])
    proc.call(1, "add_item", {"name": "left"})
    assert not proc.receive()["result"]["isError"]
    proc.kill()
    [left] = _sagas(gw["store"])
    assert left.status is Status.RUNNING
    return str(left.saga_id)


def test_gateways_whose_servers_differ_in_one_variable_never_recover_each_other(
        gw: dict[str, Any]) -> None:
    """Same command, same directory, another ITEMS_SHELF: other data, so the session a
    killed gateway left on shelf a is not settled by a gateway for shelf b; the next
    gateway for shelf a settles it."""
    store: SagaStore = gw["store"]
    shelf_a, shelf_b = {**gw["env"], "ITEMS_SHELF": "a"}, {**gw["env"], "ITEMS_SHELF": "b"}
    left = _killed_after_one_call(gw, shelf_a)

    async def visit(env: dict[str, str]) -> None:
        async with _session(gw, env=env) as s:
            await s.list_tools()
    anyio.run(visit, shelf_b)
    assert store.state(left).status is Status.RUNNING
    anyio.run(visit, shelf_a)
    assert store.state(left).status is Status.COMMITTED
    with sqlite3.connect(gw["ledger"]) as db:
        assert list(db.execute("SELECT shelf, kind FROM effects")) == [("a", "add")]
    assert Verifier(store.events.log).verify().ok


def test_the_clients_meta_reaches_the_server_and_its_progress_reaches_the_client(
        gw: dict[str, Any]) -> None:
    """The client's _meta goes on whole (its progressToken and its own keys) with the
    idempotency key added; the server's notifications/progress come back to it."""
    seen: list[tuple[float, float | None, str | None]] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        seen.append((done, total, message))

    async def go() -> Any:
        async with _session(gw, _trusting(gw)) as s:
            return await s.call_tool("slow_count", {"steps": 3}, progress_callback=progress,
                                     meta={"example.com/trace": "t-1"})
    result = anyio.run(go)
    assert not result.is_error, _text(result)
    # the server's SDK names progressToken in Python's way
    assert {"progress_token", "example.com/trace", "dev.chronomcp/idempotency_key"} <= set(
        result.structured_content["meta_keys"])
    assert seen == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]


def test_the_in_process_guard_passes_progress_on_and_says_how_to_approve(
        gw: dict[str, Any], client: redis.Redis) -> None:
    """GuardedSession.call_tool takes a progress callback, as ClientSession's does:
    while the call waits for approval it hears the gateway, then the server."""
    from saga_store.approval.policy import Policy
    from saga_store.mcp.guarded import GuardedSession
    from saga_store.settings import Settings
    (gw["tmp"] / "gated.toml").write_text('[[rules]]\ntool = "slow_count"\n'
                                          'decision = "require_approval"\n')
    store = SagaStore(client, Registry(), Settings(approval_progress_s=0.1))
    seen: list[tuple[float, float | None, str | None]] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        seen.append((done, total, message))

    async def go() -> Any:
        params = StdioServerParameters(command=SERVER[0], args=SERVER[1:], env=gw["env"])
        async with stdio_client(params) as (r, w), ClientSession(r, w) as raw:
            await raw.initialize()
            async with GuardedSession(raw, store, policy=Policy.load(gw["tmp"] / "gated.toml"),
                                      ) as s, anyio.create_task_group() as tg:
                out: list[Any] = []

                async def count() -> None:
                    out.append(await s.call_tool("slow_count", {"steps": 2},
                                                 progress_callback=progress))
                tg.start_soon(count)
                await anyio.to_thread.run_sync(lambda: assert_eventually(
                    lambda: len(seen) >= 2, timeout=30, what="two notes that the call waits"))
                [p] = approvals.pending(store)
                approvals.decide(store, p.saga_id, p.step, grant=True, by="alice")
            return out[0], p
    result, p = anyio.run(go)
    assert not result.is_error, _text(result)
    waiting = [m for _, _, m in seen if m and "approv" in m]
    assert len(waiting) >= 2
    assert f"saga approve {p.saga_id} {p.step}" in waiting[0]
    assert seen[-2:] == [(1, 2, "step 1"), (2, 2, "step 2")]  # then the server's own


def test_reads_always_reach_the_server_and_a_repeat_gets_every_recorded_block(
        gw: dict[str, Any]) -> None:
    """A read made twice is made twice (its answer may have changed); a write made
    twice under one idempotency key runs once, and the repeat gets the first answer
    whole: text, image and resource blocks and the structured content."""
    (gw["tmp"] / "tools.toml").write_text('[tools.count_items]\nreversibility = "readonly"\n'
                                          '[tools.print_label]\nreversibility = "compensable"\n'
                                          'compensation = { tool = "remove_item", args = '
                                          '{ item_id = "$.input.name" } }\n')
    extra = ["--tools-map", str(gw["tmp"] / "tools.toml")]

    async def go() -> tuple[Any, ...]:
        async with _session(gw, extra) as s:
            before = await s.call_tool("count_items", {})
            await s.call_tool("add_item", {"name": "lamp"})
            after = await s.call_tool("count_items", {})
            key = {"dev.chronomcp/idempotency_key": "label-lamp"}
            first = await s.call_tool("print_label", {"name": "lamp"}, meta=key)
            again = await s.call_tool("print_label", {"name": "lamp"}, meta=key)
            return before, after, first, again
    before, after, first, again = anyio.run(go)
    assert (before.structured_content, after.structured_content) == ({"count": 0},
                                                                     {"count": 1})
    assert [k for k, _ in _effects(gw["ledger"])] == ["add", "label"]
    assert [c.type for c in first.content] == ["text", "image", "resource"]
    assert again.content == first.content
    assert again.structured_content == first.structured_content == {"printed": "lamp"}
    assert not again.is_error
    [st] = _sagas(gw["store"])
    assert st.status is Status.COMMITTED
    assert len(st.steps) == 4  # both reads are steps of their own; the repeat is not


def test_after_a_denial_the_client_is_told_what_was_undone_and_what_still_stands(
        gw: dict[str, Any]) -> None:
    """An approved email went out, then a label is denied: the rollback undoes
    add_item, and the answer says the email still stands, not that every earlier
    result is gone."""
    store: SagaStore = gw["store"]

    async def go() -> Any:
        async with _session(gw, _trusting(gw)) as s:
            await s.call_tool("add_item", {"name": "lamp"})
            out: list[Any] = []
            for tool, args, grant in (("send_email", {"to": "ann@example.com"}, True),
                                      ("print_label", {"name": "lamp"}, False)):
                async with anyio.create_task_group() as tg:
                    async def call(t: str = tool, a: dict[str, Any] = args) -> None:
                        out.append(await s.call_tool(t, a))
                    tg.start_soon(call)
                    [p] = await _pending(store)
                    approvals.decide(store, p.saga_id, p.step, grant=grant, by="alice",
                                     reason="no")
            return out[1]
    denied = anyio.run(go)
    assert denied.is_error
    text = _text(denied)
    assert "undone, last first: add_item (step 0)" in text
    assert "Still standing, not undone: send_email (step 1, irreversible)" in text
    assert "Earlier results of this session no longer hold" not in text
    assert [k for k, _ in _effects(gw["ledger"])] == ["add", "email", "remove"]


def test_after_a_stuck_unwind_the_next_call_opens_a_new_saga(gw: dict[str, Any]) -> None:
    """reserve_slot's declared undo fails (once, as maxRetries = 0 says), so the unwind
    is stuck for a person; the client is told so, and its next call runs in a new
    saga (no talk of another gateway: there is none)."""
    store: SagaStore = gw["store"]

    async def go() -> tuple[Any, Any]:
        async with _session(gw) as s:
            await s.call_tool("reserve_slot", {"slot": "9am"})
            failed = await s.call_tool("take_payment", {"amount_cents": 0})
            later = await s.call_tool("add_item", {"name": "lamp"})
            return failed, later
    failed, later = anyio.run(go)
    assert "stuck" in _text(failed)
    assert "Still standing, not undone: reserve_slot (step 0" in _text(failed)
    assert not later.is_error, _text(later)
    assert "another gateway" not in _text(later)
    states = sorted(st.status for st in _sagas(store))
    assert states == sorted([Status.STUCK, Status.COMMITTED])
    assert [k for k, _ in _effects(gw["ledger"])] == ["reserve", "add"]
    [stuck] = [st for st in _sagas(store) if st.status is Status.STUCK]
    assert stuck.steps[0].compensation_attempts == 1


def test_a_compensation_that_overruns_its_timeout_is_tried_max_retries_more_times(
        gw: dict[str, Any]) -> None:
    """cancel_room never answers; its declaration says timeoutMs 300 and maxRetries 1:
    two tries of 0.3 s each, then the unwind is stuck for a person, and the client
    hears of it within seconds rather than never."""
    store: SagaStore = gw["store"]

    async def go() -> Any:
        async with _session(gw) as s:
            await s.call_tool("book_room", {"room": "blue"})
            with anyio.fail_after(30):
                return await s.call_tool("take_payment", {"amount_cents": 0})
    failed = anyio.run(go)
    assert "stuck" in _text(failed)
    assert [k for k, _ in _effects(gw["ledger"])] == ["book", "cancel-tried", "cancel-tried"]
    [st] = _sagas(store)
    assert st.status is Status.STUCK
    assert st.steps[0].compensation_attempts == 2
