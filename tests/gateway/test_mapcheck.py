"""Compensation mappings are checked against the listed tools' schemas when the
tools are listed: what can never make a valid call is said at start-up and in
tools/list, and such a tool's calls count as not undoable from the start. A list
projection (``[*]``) undoes a batch call through the npm reference server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
import redis
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from saga_store import Registry, SagaStore
from saga_store.approval import requests as approvals
from saga_store.mcp.declared import Compensation
from saga_store.mcp.mapcheck import mapping_problem
from saga_store.protocol.state import Status
from saga_store.testing import assert_eventually
from saga_store.verify.checker import Verifier
from tests.gateway.test_mcp_gateway import RawGateway
from tests.npm import reference_server

ROOT = Path(__file__).resolve().parents[2]
ITEMS = [sys.executable, str(ROOT / "tests" / "mcp_compensate_server.py")]


def _tool(name: str, props: dict[str, Any], required: list[str] | None = None,
          out: dict[str, Any] | None = None, **schema: Any) -> Any:
    return types.Tool(name=name, input_schema={"type": "object", "properties": props,
                                               "required": required or [], **schema},
                      output_schema={"type": "object", "properties": out} if out else None)


CREATE = _tool("create", {"name": {"type": "string"}, "tags": {"type": "array"}},
               out={"id": {"type": "string"}})
DELETE = _tool("delete", {"id": {"type": "string"}}, ["id"], additionalProperties=False)
TOOLS = {"create": CREATE, "delete": DELETE}


@pytest.mark.parametrize(("args", "tool", "says"), [
    ({"id": "$.output.structuredContent.id"}, "delete", None),
    ({"id": "$.output.structuredContent.id"}, "remove", "'remove' is not among"),
    ({}, "delete", "delete requires ['id']"),
    ({"id": "$.input.name", "force": "$.input.name"}, "delete", "takes no argument"),
    ({"id": "$.input.nmae"}, "delete", "'nmae' is not an argument of create"),
    ({"id": "$.output.structuredContent.ident"}, "delete", "not a field of create's output"),
    ({"id": "$.input.tags"}, "delete", "gives array but delete's id takes string"),
    ({"id": "$.input.tags[*].x"}, "delete", "gives array"),
])
def test_a_mapping_is_checked_against_both_tools_schemas(
        args: dict[str, str], tool: str, says: str | None) -> None:
    problem = mapping_problem(CREATE, Compensation(tool, args), TOOLS)
    assert problem is None if says is None else says in (problem or "")


@pytest.mark.real_redis
@pytest.mark.timeout(120)
def test_a_mapping_that_cannot_work_is_reported_at_start_up_and_in_the_listing(
        redis_url: str, tmp_path: Path) -> None:
    """tag_item's declared undo maps from an argument it does not have: the gateway
    says so in its log as it starts and in tag_item's description, and counts the
    tool as unclassified (the safe policy then asks a person before it runs)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ITEMS_LEDGER": str(tmp_path / "i.db"),
           "SAGA_REDIS_URL": redis_url}
    gateway = subprocess.Popen(
        [sys.executable, "-m", "saga_store.cli.main", "mcp-guard", "--", *ITEMS], cwd=ROOT,
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    assert gateway.stdin is not None
    assert gateway.stdout is not None
    for m in ({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                  "protocolVersion": "2025-06-18", "capabilities": {},
                  "clientInfo": {"name": "raw", "version": "1"}}},
              {"jsonrpc": "2.0", "method": "notifications/initialized"},
              {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
              {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}):
        gateway.stdin.write(json.dumps(m) + "\n")
        gateway.stdin.flush()
    answers = [json.loads(gateway.stdout.readline()) for _ in range(3)]
    _, err = gateway.communicate(timeout=60)
    listed = {t["name"]: t["description"] for t in answers[2]["result"]["tools"]}
    assert "NOT UNDOABLE" in listed["tag_item"]
    assert "'no_such_field' is not an argument of tag_item" in listed["tag_item"]
    assert "undone by remove_item" in listed["add_item"]
    assert "tool tag_item (_meta): its compensation cannot make a valid call" in err
    assert err.count("cannot make a valid call") == 1  # once, not per listing


@pytest.mark.real_redis
@pytest.mark.timeout(120)
def test_a_list_projection_undoes_a_batch_through_the_reference_server(
        redis_url: str, client: redis.Redis, tmp_path: Path) -> None:
    """create_entities is undone by delete_entities(entityNames = $.input.entities[*].name)
    when a later call fails; the server's graph no longer has them."""
    server = reference_server("server-memory")
    (tmp_path / "memory.toml").write_text("""
[tools.create_entities]
compensation = { tool = "delete_entities", args = { entityNames = "$.input.entities[*].name" } }

[tools.read_graph]
reversibility = "readonly"
""")
    (tmp_path / "policy.toml").write_text('[defaults]\nunknown = "allow"\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SAGA_REDIS_URL": redis_url,
           "MEMORY_FILE_PATH": str(tmp_path / "memory.jsonl")}
    params = StdioServerParameters(command=sys.executable, args=[
        "-m", "saga_store.cli.main", "mcp-guard", "--tools-map", str(tmp_path / "memory.toml"),
        "--policy", str(tmp_path / "policy.toml"), "--", *server], env=env, cwd=str(ROOT))

    async def go() -> tuple[Any, Any, Any]:
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            listed = {t.name: t.description or "" for t in (await s.list_tools()).tools}
            assert "undone by delete_entities" in listed["create_entities"]
            made = await s.call_tool("create_entities", {"entities": [
                {"name": "carol", "entityType": "person", "observations": []},
                {"name": "dave", "entityType": "person", "observations": []}]})
            bad = await s.call_tool("add_observations", {"observations": [
                {"entityName": "nobody", "contents": ["x"]}]})
            graph = await s.call_tool("read_graph", {})
            return made, bad, graph
    made, bad, graph = anyio.run(go)
    assert not made.is_error
    assert bad.is_error
    text = "\n".join(getattr(c, "text", "") for c in bad.content)
    assert "undone, last first: create_entities (step 0)" in text
    graph_text = "\n".join(getattr(c, "text", "") for c in graph.content)
    assert "carol" not in graph_text
    assert "dave" not in graph_text
    store = SagaStore(client, Registry())
    states = [store.state(sid).status for sid in reversed(store.events.saga_ids())]
    assert states == [Status.COMPENSATED, Status.COMMITTED]
    assert Verifier(store.events.log).verify().ok


def _memory_file(path: Path) -> set[str]:
    """The entity names in a server-memory file (its own store, read directly)."""
    if not path.exists():
        return set()
    return {json.loads(line)["name"] for line in path.read_text().splitlines()
            if line.strip() and json.loads(line).get("type") == "entity"}


@pytest.mark.real_redis
@pytest.mark.timeout(120)
def test_a_gateway_for_other_data_never_undoes_a_killed_ones_calls(
        redis_url: str, client: redis.Redis, tmp_path: Path) -> None:
    """The outsiders' case: a gateway killed mid-session with MEMORY_FILE_PATH=A, then one
    with the same command and MEMORY_FILE_PATH=B, whose file holds an unrelated entity
    of the same name. B's gateway leaves A's session alone (B's entity stands); the next
    gateway for A rolls it back in A."""
    server = reference_server("server-memory")
    (tmp_path / "memory.toml").write_text("""
[tools.create_entities]
compensation = { tool = "delete_entities", args = { entityNames = "$.input.entities[*].name" } }
""")
    (tmp_path / "policy.toml").write_text('[defaults]\nunknown = "allow"\n\n[[rules]]\n'
                                          'tool = "add_observations"\n'
                                          'decision = "require_approval"\n')
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    b.write_text(json.dumps({"type": "entity", "name": "alice", "entityType": "person",
                             "observations": ["B's own alice"]}) + "\n")
    argv = [sys.executable, "-m", "saga_store.cli.main", "mcp-guard", "--tools-map",
            str(tmp_path / "memory.toml"), "--policy", str(tmp_path / "policy.toml"), "--",
            *server]
    base = {**os.environ, "PYTHONPATH": str(ROOT), "SAGA_REDIS_URL": redis_url}
    store = SagaStore(client, Registry())
    killed = RawGateway({}, env={**base, "MEMORY_FILE_PATH": str(a)}, argv=argv)
    killed.call(1, "create_entities", {"entities": [
        {"name": "alice", "entityType": "person", "observations": []}]})
    assert not killed.receive()["result"].get("isError")
    killed.call(2, "add_observations", {"observations": [
        {"entityName": "alice", "contents": ["x"]}]})
    assert_eventually(lambda: approvals.pending(store), timeout=30,
                      what="the second call waiting for approval")
    assert _memory_file(a) == {"alice"}
    killed.kill()  # mid-session, with its server: a call without an outcome

    def visit(path: Path) -> None:
        params = StdioServerParameters(command=argv[0], args=argv[1:], cwd=str(ROOT),
                                       env={**base, "MEMORY_FILE_PATH": str(path)})

        async def go() -> None:
            async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
                await s.initialize()
                await s.list_tools()  # served only once what it must finish is finished
        anyio.run(go)
    [left] = list(store.events.saga_ids())
    visit(b)
    assert store.state(left).status is Status.RUNNING  # not B's to finish
    assert _memory_file(b) == {"alice"}  # B's own alice stands
    visit(a)
    assert store.state(left).status is Status.COMPENSATED
    assert _memory_file(a) == set()  # A's alice was undone, in A
    assert _memory_file(b) == {"alice"}
    assert Verifier(store.events.log).verify().ok
