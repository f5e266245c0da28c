"""What MCP says of a call stays true through the gateway: a cancelled request is
stopped and never answered, a server's JSON-RPC error is that error, a tool error
comes back whole, and a call answered once is never answered again from the log
unless the client gives the same idempotency key."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

from saga_store import SagaStore
from saga_store.approval import requests as approvals
from saga_store.log.events import EventKind as K
from saga_store.protocol.state import Status
from saga_store.testing import assert_eventually
from saga_store.verify.checker import Verifier
from tests.npm import reference_server

from .test_approval_wait import _saga
from .test_mcp_gateway import ROOT, SERVER, RawGateway, _effects, _run, _sagas, _session, _text, gw

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
__all__ = ["gw"]  # the fixture, shared with the gateway's main tests
ROLLBACK = "dev.saga-store/rollback"


def _kinds(store: SagaStore, sid: str) -> list[str]:
    return [e["kind"] for e in store.events.log.bodies(sid)]


# -- cancellation --------------------------------------------------------------

def test_a_call_cancelled_while_it_waits_for_approval_is_withdrawn_at_once(
        gw: dict[str, Any]) -> None:
    """The SDK client gives up on a gated call (a cancel scope: it sends
    notifications/cancelled): the approval is withdrawn by the gateway at once, a
    later 'saga approve' is refused, and the call never runs."""
    store: SagaStore = gw["store"]

    async def go() -> Any:
        async with _session(gw) as s:
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(s.call_tool, "wire_funds", {"amount_cents": 5, "to": "a"})
                    await anyio.to_thread.run_sync(lambda: assert_eventually(
                        lambda: approvals.pending(store), timeout=30,
                        what="an approval request"))
                    scope.cancel()  # the client abandons the call

            def withdrawn() -> Any:
                [st] = _sagas(store)
                return st.steps[0].approval == "denied" and st
            # the client is still connected: the cancellation withdrew it, not a close
            st = await anyio.to_thread.run_sync(lambda: assert_eventually(
                withdrawn, timeout=5, what="the approval withdrawn"))
            after = await s.call_tool("create_record", {"name": "next"})
            return st, after
    st, after = _run(go)
    decision = st.steps[0].approval_data["decision"]
    assert decision["by"] == "gateway"
    assert decision["reason"] == "cancelled by the client"
    assert decision["withdrawn"] is True
    assert not after.is_error  # the session goes on
    late = _saga("approve", st.saga_id, "0", "--by", "bob", env=gw["env"])
    assert late.returncode == 2
    assert "withdrawn: cancelled by the client" in late.stderr
    assert [k for _, k, _ in _effects(gw["ledger"])] == ["create"]  # no wire
    assert not approvals.pending(store)
    assert Verifier(store.events.log).verify().ok


def test_the_in_process_guard_withdraws_the_approval_of_a_call_its_caller_cancels(
        gw: dict[str, Any]) -> None:
    """GuardedSession: the agent cancels its call_tool while the call waits for a
    person; the approval is withdrawn as cancelled, and the call never runs."""
    from saga_store.approval.policy import Policy
    from saga_store.mcp.classify import load_tools_map
    from saga_store.mcp.guarded import GuardedSession
    store: SagaStore = gw["store"]

    async def go() -> Any:
        params = StdioServerParameters(command=SERVER[0], args=SERVER[1:], env=gw["env"])
        async with stdio_client(params) as (r, w), ClientSession(r, w) as raw:
            await raw.initialize()
            async with GuardedSession(raw, store, policy=Policy.load(gw["tmp"] / "policy.toml"),
                                      tools_map=load_tools_map(gw["tmp"] / "tools.toml"),
                                      ) as s:
                with anyio.CancelScope() as scope:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(s.call_tool, "wire_funds", {"amount_cents": 5, "to": "a"})
                        await anyio.to_thread.run_sync(lambda: assert_eventually(
                            lambda: approvals.pending(store), timeout=30,
                            what="an approval request"))
                        scope.cancel()
                return await anyio.to_thread.run_sync(lambda: assert_eventually(
                    lambda: _sagas(store)[0].steps[0].approval == "denied" and _sagas(store)[0],
                    timeout=5, what="the approval withdrawn"))
    st = _run(go)
    decision = st.steps[0].approval_data["decision"]
    assert (decision["by"], decision["reason"]) == ("gateway", "cancelled by the client")
    assert not _effects(gw["ledger"])


def test_a_call_cancelled_while_it_runs_is_cancelled_downstream_and_settled_in_doubt(
        gw: dict[str, Any]) -> None:
    """A client cancels a compensable call the server is running: the server hears
    the cancellation (it says so in the ledger), the step is in doubt and undone by
    its compensation, and the client gets no answer for the request it gave up."""
    store: SagaStore = gw["store"]
    flag = gw["tmp"] / "never"
    raw = RawGateway(gw)
    try:
        raw.call(5, "slow_create", {"id": "r-1", "path": str(flag)})
        assert_eventually(lambda: [k for _, k, _ in _effects(gw["ledger"])] == ["create"],
                          timeout=30, what="the server to start the call")
        raw.send({"jsonrpc": "2.0", "method": "notifications/cancelled",
                  "params": {"requestId": 5, "reason": "user hit stop"}})

        def settled() -> Any:
            [st] = _sagas(store)
            return st.final and st
        st = assert_eventually(settled, timeout=30, what="the session rolled back")
        assert [k for _, k, _ in _effects(gw["ledger"])] == ["create", "cancelled", "delete"]
        heard = []
        raw.send({"jsonrpc": "2.0", "id": 6, "method": "ping"})
        while (msg := raw.receive()).get("id") != 6:
            heard.append(msg)
        assert [m for m in heard if m.get("id") == 5] == []  # never answered
    finally:
        assert raw.close() == 0
    assert st.status is Status.COMPENSATED
    assert st.steps[0].status == "in_doubt"
    assert st.steps[0].compensation == "succeeded"
    assert Verifier(store.events.log).verify().ok


def test_the_in_process_guard_cancels_a_running_call_downstream_and_settles_it(
        gw: dict[str, Any]) -> None:
    """GuardedSession: the agent cancels its call_tool while the server runs the call;
    the server hears the cancellation, and the step is in doubt and compensated at
    once, not when the session ends."""
    from saga_store.approval.policy import Policy
    from saga_store.mcp.guarded import GuardedSession
    store: SagaStore = gw["store"]

    async def go() -> None:
        params = StdioServerParameters(command=SERVER[0], args=SERVER[1:], env=gw["env"])
        async with stdio_client(params) as (r, w), ClientSession(r, w) as raw:
            await raw.initialize()
            async with GuardedSession(raw, store, policy=Policy.load(gw["tmp"] / "policy.toml"),
                                      ) as s:
                with anyio.CancelScope() as scope:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(s.call_tool, "slow_create",
                                      {"id": "r-2", "path": str(gw["tmp"] / "never")})
                        await anyio.to_thread.run_sync(lambda: assert_eventually(
                            lambda: _effects(gw["ledger"]), timeout=30,
                            what="the server to start the call"))
                        scope.cancel()
                await anyio.to_thread.run_sync(lambda: assert_eventually(
                    lambda: _sagas(store)[0].final, timeout=10,
                    what="the session rolled back while it is open"))
    _run(go)
    assert [k for _, k, _ in _effects(gw["ledger"])] == ["create", "cancelled", "delete"]
    [st] = _sagas(store)
    assert st.status is Status.COMPENSATED
    assert st.steps[0].status == "in_doubt"


def test_a_cancelled_read_fails_alone_and_the_session_goes_on(gw: dict[str, Any]) -> None:
    """A read the client cancels while it runs changed nothing: it is recorded as
    failed, nothing is rolled back, and the session commits."""
    store: SagaStore = gw["store"]

    async def go() -> None:
        async with _session(gw) as s:
            await s.call_tool("create_record", {"name": "kept"})
            with anyio.move_on_after(0.5):
                await s.call_tool("wait_for", {"path": str(gw["tmp"] / "never")})
            await anyio.to_thread.run_sync(lambda: assert_eventually(
                lambda: _sagas(store)[0].steps[1].finished, timeout=10,
                what="the read settled"))
    _run(go)
    [st] = _sagas(store)
    assert st.status is Status.COMMITTED
    assert st.steps[1].status == "failed"
    assert "cancelled by the client" in str(st.steps[1].error)
    assert [k for _, k, _ in _effects(gw["ledger"])] == ["create"]


TS_CANCEL = r"""
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
const [command, ...args] = JSON.parse(process.env.GATEWAY_ARGV);
const transport = new StdioClientTransport({ command, args, env: process.env, stderr: "ignore" });
const client = new Client({ name: "ts-test", version: "1" });
await client.connect(transport);
try {
  await client.callTool({ name: "wire_funds", arguments: { amount_cents: 5, to: "a" } },
                        undefined, { timeout: 1000 });
  console.log(JSON.stringify({ answered: true }));
} catch (e) {
  console.log(JSON.stringify({ error: String(e.message || e) }));
}
// the client stays connected until the test has seen the withdrawal
while (!(await import("node:fs")).existsSync(process.env.RELEASE)) {
  await new Promise((r) => setTimeout(r, 20));
}
await client.close();
"""


def test_the_typescript_clients_timeout_withdraws_the_approval_it_waited_for(
        gw: dict[str, Any]) -> None:
    """The TypeScript SDK client times out a gated call (1 s here, 60 s by default) and
    sends notifications/cancelled: the approval is withdrawn as cancelled while the
    client is still connected."""
    import subprocess
    import sys

    from tests.npm import installed
    npm = installed("sdk").parents[2]
    (npm / "cancel.mjs").write_text(TS_CANCEL)
    store: SagaStore = gw["store"]
    release = gw["tmp"] / "release"
    env = {**gw["env"], "RELEASE": str(release),
           "GATEWAY_ARGV": json.dumps([sys.executable, *gw["args"], "--", *SERVER])}
    client = subprocess.Popen(["node", str(npm / "cancel.mjs")], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        def withdrawn() -> Any:
            sagas = _sagas(store)
            return sagas and sagas[0].steps.get(0) and \
                sagas[0].steps[0].approval == "denied" and sagas[0]
        st = assert_eventually(withdrawn, timeout=30, what="the approval withdrawn")
        assert client.poll() is None  # still connected: the cancellation did it
        release.touch()
        out, _ = client.communicate(timeout=30)
    finally:
        if client.poll() is None:
            client.kill()
    assert "timed out" in json.loads(out.strip().splitlines()[-1])["error"].lower()
    assert st.steps[0].approval_data["decision"]["reason"] == "cancelled by the client"
    assert not [k for _, k, _ in _effects(gw["ledger"])]


# -- errors and results as the server gave them ---------------------------------

def test_a_servers_json_rpc_error_reaches_the_client_as_that_error(
        gw: dict[str, Any]) -> None:
    """A server's JSON-RPC error (its code, message and data) reaches the SDK client
    as that error, and is the step's failure in the log; after a rollback the code
    and data are the same and the message says what was undone."""
    store: SagaStore = gw["store"]

    async def go() -> tuple[MCPError, MCPError]:
        errors = []
        async with _session(gw) as s:
            with pytest.raises(MCPError) as first:
                await s.call_tool("refuse_order", {"order": "o-1"})
            errors.append(first.value)
            await s.call_tool("create_record", {"name": "undone"})
            with pytest.raises(MCPError) as second:
                await s.call_tool("refuse_order", {"order": "o-2"})
            errors.append(second.value)
        return errors[0], errors[1]
    alone, after = _run(go)
    assert (alone.code, alone.message, alone.data) == (
        -32042, "custom rpc error", {"order": "o-1", "retry_after_s": 3})
    assert (after.code, after.data) == (-32042, {"order": "o-2", "retry_after_s": 3})
    assert after.message.startswith("custom rpc error\n\n[saga ")
    assert "undone, last first: create_record (step 0)" in after.message
    first, second = _sagas(store)
    assert first.steps[0].status == "failed"
    assert "-32042" in str(first.steps[0].error)
    assert second.status is Status.COMPENSATED
    assert [k for _, k, _ in _effects(gw["ledger"])] == ["create", "delete"]


def test_a_tool_error_comes_back_whole_and_a_rollback_only_adds_to_it(
        gw: dict[str, Any]) -> None:
    """An isError result with text and image blocks, structured content and _meta is
    the client's as the server gave it; when the gateway rolled something back, the
    note is one more text block and one more _meta entry, the rest unchanged."""
    async def go() -> tuple[Any, Any, Any]:
        async with _session(gw) as s:
            alone = await s.call_tool("reject_upload", {"name": "a.png"})
            await s.call_tool("create_record", {"name": "undone"})
            after = await s.call_tool("reject_upload", {"name": "a.png"})
        async with stdio_client(StdioServerParameters(
                command=SERVER[0], args=SERVER[1:], env=gw["env"])) as (r, w), \
                ClientSession(r, w) as direct:
            await direct.initialize()
            server = await direct.call_tool("reject_upload", {"name": "a.png"})
        return server, alone, after
    server, alone, after = _run(go)
    want = server.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert [c["type"] for c in want["content"]] == ["text", "image"]
    assert alone.model_dump(mode="json", by_alias=True, exclude_none=True) == want
    got = after.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert got["isError"] is True
    assert got["content"][:2] == want["content"]
    [note] = got["content"][2:]
    assert note["type"] == "text"
    assert "undone, last first: create_record (step 0)" in note["text"]
    assert got["structuredContent"] == want["structuredContent"]
    assert got["_meta"] == {**want["_meta"], ROLLBACK: note["text"]}


def test_an_unclassified_call_that_stands_is_named_unclassified(gw: dict[str, Any]) -> None:
    """A call of a tool nobody classified is not undone by a rollback, and the answer
    says it stands because it is unclassified (not that its undo failed)."""
    raw = RawGateway(gw)
    try:
        raw.call(2, "update_crm", {"note": "kept"})
        assert not raw.receive()["result"]["isError"]
        raw.call(3, "update_crm", {"note": "fail"})
        text = raw.receive()["result"]["content"][-1]["text"]
    finally:
        raw.close()
    assert "update_crm (step 0, unclassified, not undoable)" in text
    [st] = _sagas(gw["store"])
    assert st.steps[0].reversibility == "unknown"


# -- what is replayed ----------------------------------------------------------

def test_calls_answered_once_reach_the_server_again_with_default_settings(
        gw: dict[str, Any]) -> None:
    """No tools map, the npm memory server: read_graph, create_entities, read_graph.
    The second read is the server's answer, with the entity made in between; and a
    write made twice is made twice. Nothing is answered from the log."""
    gw["env"]["MEMORY_FILE_PATH"] = str(gw["tmp"] / "memory.jsonl")
    gw["args"] = gw["args"][:5]  # no tools map; the policy lets unclassified calls run
    entity = {"name": "alice", "entityType": "person", "observations": ["a"]}

    async def go() -> list[Any]:
        async with _session(gw, reference_server("server-memory")) as s:
            return [await s.call_tool("read_graph", {}),
                    await s.call_tool("create_entities", {"entities": [entity]}),
                    await s.call_tool("read_graph", {}),
                    await s.call_tool("add_observations", {"observations": [
                        {"entityName": "alice", "contents": ["b"]}]}),
                    await s.call_tool("add_observations", {"observations": [
                        {"entityName": "alice", "contents": ["b"]}]})]
    before, _, after, first, again = _run(go)
    assert "alice" not in _text(before)
    assert "alice" in _text(after)
    assert not (after.meta or {}).get("dev.chronomcp/replayed")
    # the server's second answer differs: nothing new was added the second time
    assert _text(first) != _text(again)
    [st] = _sagas(gw["store"])
    assert len(st.steps) == 5
    assert K.STEP_DUPLICATE_SUPPRESSED not in _kinds(gw["store"], st.saga_id)


def test_a_call_whose_answer_never_left_is_replayed_once(
        gw: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The gateway fails after a call's outcome is logged and before its answer goes
    out (the append's reply is lost): the client's retry in the same session gets
    the logged answer, marked as a replay, and the server ran the call once; a
    third call of the same is the client's own and runs."""
    from saga_store.approval.policy import Policy
    from saga_store.mcp.classify import load_tools_map
    from saga_store.mcp.guarded import GuardedSession
    store: SagaStore = gw["store"]

    async def go() -> tuple[Any, Any]:
        params = StdioServerParameters(command=SERVER[0], args=SERVER[1:], env=gw["env"])
        async with stdio_client(params) as (r, w), ClientSession(r, w) as raw:
            await raw.initialize()
            async with GuardedSession(raw, store, policy=Policy.load(gw["tmp"] / "policy.toml"),
                                      tools_map=load_tools_map(gw["tmp"] / "tools.toml"),
                                      ) as s:
                add = s.gateway._add
                lost = []

                def add_then_lose_the_reply(writer: Any, items: Any, **kw: Any) -> None:
                    add(writer, items, **kw)
                    if not lost and items[0][0] == K.STEP_SUCCEEDED:
                        lost.append(True)
                        raise ConnectionError("the reply to the append was lost")
                monkeypatch.setattr(s.gateway, "_add", add_then_lose_the_reply)
                with pytest.raises(ConnectionError):
                    await s.call_tool("create_record", {"name": "once"})
                retried = await s.call_tool("create_record", {"name": "once"})
                third = await s.call_tool("create_record", {"name": "once"})
                return retried, third
    retried, third = _run(go)
    assert retried.meta == {"dev.chronomcp/replayed": True}
    assert not third.meta
    assert retried.structured_content != third.structured_content
    assert [k for _, k, _ in _effects(gw["ledger"])] == ["create", "create"]
    [st] = _sagas(store)
    assert _kinds(store, st.saga_id).count(K.STEP_DUPLICATE_SUPPRESSED) == 1


# -- the example tools map ------------------------------------------------------

def test_the_example_tools_map_undoes_only_the_relations_a_call_made(
        gw: dict[str, Any]) -> None:
    """examples/tools-map.toml in front of the npm memory server: create_relations
    asked for a relation that was there before the session and a new one; the
    rollback deletes only the new one."""
    memory = gw["tmp"] / "memory.jsonl"
    old = {"from": "alice", "to": "bob", "relationType": "knows"}
    new = {"from": "alice", "to": "bob", "relationType": "trusts"}
    memory.write_text("".join(json.dumps(r) + "\n" for r in [
        {"type": "entity", "name": "alice", "entityType": "person", "observations": []},
        {"type": "entity", "name": "bob", "entityType": "person", "observations": []},
        {"type": "relation", **old}]))
    gw["env"]["MEMORY_FILE_PATH"] = str(memory)
    gw["args"] = [*gw["args"][:5], "--tools-map", str(ROOT / "examples" / "tools-map.toml")]

    async def go() -> Any:
        async with _session(gw, reference_server("server-memory")) as s:
            made = await s.call_tool("create_relations", {"relations": [old, new]})
            assert not made.is_error, _text(made)
            return await s.call_tool("add_observations", {"observations": [
                {"entityName": "nobody", "contents": ["x"]}]})
    bad = _run(go)
    assert "undone, last first: create_relations (step 0)" in _text(bad)
    rows = [json.loads(line) for line in memory.read_text().splitlines() if line.strip()]
    assert [r["relationType"] for r in rows if r.get("type") == "relation"] == ["knows"]
