"""``saga mcp-guard --init-tools-map FILE``: a starter tools map written from what a
real server says of its tools, read back by the gateway's own loader, and a real
gateway run with it. The CLI runs as a process; effects are counted in the test
servers' own ledgers (or the memory server's file)."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from saga_store import Registry, SagaStore
from saga_store.approval import requests as approvals
from saga_store.mcp.classify import load_tools_map
from saga_store.testing import assert_eventually, free_port
from tests.npm import reference_server

pytestmark = [pytest.mark.timeout(180)]
ROOT = Path(__file__).resolve().parents[2]
ITEMS = [sys.executable, str(ROOT / "tests" / "mcp_compensate_server.py")]
RECORDS = [sys.executable, str(ROOT / "tests" / "mcp_records_server.py")]
GUARD = [sys.executable, "-m", "saga_store.cli.main", "mcp-guard"]
# a server that pages its tools/list, two tools a page, with names TOML must quote
PAGED = r'''
import json, sys
TOOLS = [{"name": n, "inputSchema": {"type": "object"}, "annotations": a} for n, a in [
    ("look", {"readOnlyHint": True}), ("weird.name", {"readOnlyHint": True}),
    ('say "hi"', {"destructiveHint": True}), ("tab\there", {}), ("last", {})]]
TOOLS.append({"name": "odd", "inputSchema": "not a schema"})  # read by its name only
pinged, waiting = False, []

def out(msg):
    print(json.dumps(msg), flush=True)

def page(msg):  # answered only once the client answered the server's ping
    start = int(msg.get("params", {}).get("cursor") or 0)
    result = {"tools": TOOLS[start:start + 2]}
    if start + 2 < len(TOOLS):
        result["nextCursor"] = str(start + 2)
    out({"jsonrpc": "2.0", "id": msg["id"], "result": result})

for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("method") == "notifications/initialized":  # the server asks first
        out({"jsonrpc": "2.0", "id": "srv-1", "method": "ping"})
    elif "method" not in msg:
        pinged = msg == {"jsonrpc": "2.0", "id": "srv-1", "result": {}}
        for w in waiting:
            page(w)
    elif msg["method"] == "initialize":
        out({"jsonrpc": "2.0", "id": msg["id"], "result": {
            "protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
            "serverInfo": {"name": "paged", "version": "1"}}})
    elif pinged:
        page(msg)
    else:
        waiting.append(msg)
'''


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "ITEMS_LEDGER": str(tmp / "items.db"),
            "RECORDS_LEDGER": str(tmp / "records.db"), **extra}


def _init(out: Path, server: list[str] | None = None, env: dict[str, str] | None = None,
          extra: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real CLI: saga mcp-guard --init-tools-map OUT [extra] -- SERVER."""
    tail = ["--", *server] if server else []
    return subprocess.run([*GUARD, "--init-tools-map", str(out), *(extra or []), *tail],
                          cwd=ROOT, env=env or _env(out.parent), capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL, check=False)


def _block(text: str, tool: str) -> str:
    """The lines the file has for one tool (its comments, its entry)."""
    blocks = text.split("\n\n")
    [found] = [b for b in blocks if f"[tools.{tool}]" in b]
    return found


def _accept(text: str, tool: str) -> str:
    """What a person does who takes a commented-out compensable entry as it is."""
    block = _block(text, tool)
    lines = []
    for line in block.splitlines():
        if line.startswith("reversibility = "):  # an entry the guess replaces
            continue
        for start in (f"# [tools.{tool}]", '# reversibility = "compensable"',
                      "# compensation = "):
            if line.startswith(start):
                line = line[2:]
        if not line.startswith('# reversibility = "?"'):
            lines.append(line)
    return text.replace(block, "\n".join(lines))


def _effects(ledger: Path) -> list[tuple[str, str]]:
    if not ledger.exists():
        return []
    with sqlite3.connect(ledger) as db:
        return [(r[0], r[1]) for r in db.execute("SELECT kind, key FROM effects ORDER BY n")]


def _text(result: Any) -> str:
    return "\n".join(getattr(c, "text", "") for c in result.content)


@asynccontextmanager
async def _guarded(env: dict[str, str], server: list[str],
                   args: list[str]) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=sys.executable,
                                   args=[*GUARD[1:], *args, "--", *server], env=env,
                                   cwd=str(ROOT))
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        yield s


def test_the_compensate_servers_declarations_become_entries(tmp_path: Path) -> None:
    out = tmp_path / "items.toml"
    done = _init(out, ITEMS)
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}: 13 tools" in done.stderr
    text = out.read_text()
    classes = load_tools_map(out)
    assert classes["take_payment"].reversibility == "compensable"
    assert classes["take_payment"].compensation is not None
    assert classes["take_payment"].compensation.tool == "refund_payment"
    assert dict(classes["take_payment"].compensation.args) == {
        "payment_id": "$.output.structuredContent.id"}
    assert {n: c.reversibility for n, c in classes.items()} == {
        "take_payment": "compensable", "add_item": "compensable", "reserve_slot": "compensable",
        "book_room": "compensable", "count_items": "readonly", "slow_count": "readonly",
        "send_email": "irreversible", "print_label": "irreversible"}
    # the undo's tries and their time limit, as the server declared them (timeoutMs,
    # maxRetries + 1)
    undo = {n: (c.compensation.tool, c.compensation.timeout_s, c.compensation.max_attempts)
            for n, c in classes.items() if c.compensation is not None}
    assert undo["book_room"] == ("cancel_room", 0.3, 2)
    assert undo["add_item"] == ("remove_item", 5.0, 2)
    assert undo["reserve_slot"] == ("release_slot", None, 1)
    assert undo["take_payment"][1:] == (None, 3)
    # what the form has no place for is said in comments
    assert "the server's notes: A sent email cannot be recalled." in _block(text, "send_email")
    assert "the server says it touches: email, customers" in _block(text, "send_email")
    assert "approvers no longer see" in _block(text, "send_email")
    # a declared mapping that can never make a valid call is for a person to fix
    tag = _block(text, "tag_item")
    assert "CHECK" in tag
    assert "'no_such_field' is not an argument of tag_item" in tag
    # the undo tools are a person's call
    assert 'reversibility = "?"' in _block(text, "remove_item")
    assert "DECIDE" in _block(text, "remove_item")
    assert "the undo of add_item, tag_item" in _block(text, "remove_item")
    # a commented-out entry is a valid one once uncommented
    (tmp_path / "accepted.toml").write_text(_accept(text, "add_item"))
    accepted = load_tools_map(tmp_path / "accepted.toml")["add_item"]
    assert accepted.compensation is not None
    assert accepted.compensation.tool == "remove_item"
    assert dict(accepted.compensation.args) == {"item_id": "$.output.structuredContent.id"}


@pytest.mark.real_redis
def test_the_gateway_runs_as_the_written_map_says(tmp_path: Path, redis_url: str,
                                                  client: redis.Redis) -> None:
    """With the starter map and the safe policy: count_items is now read-only on the
    operator's word (no approval wait, where the server's claim alone would wait);
    add_item keeps its declared undo; tag_item is not undoable; a declined payment
    undoes the payment and the item through the server's own tools."""
    out = tmp_path / "items.toml"
    assert _init(out, ITEMS).returncode == 0
    env = {**_env(tmp_path), "SAGA_REDIS_URL": redis_url}
    store = SagaStore(client, Registry())

    async def go() -> tuple[dict[str, str], Any, Any, Any, Any]:
        async with _guarded(env, ITEMS, ["--tools-map", str(out)]) as s:
            listed = {t.name: t.description or "" for t in (await s.list_tools()).tools}
            with anyio.fail_after(30):  # it would wait for approval without the map
                counted = await s.call_tool("count_items", {})
            added = await s.call_tool("add_item", {"name": "lamp"})
            paid = await s.call_tool("take_payment", {"amount_cents": 500})
            declined = await s.call_tool("take_payment", {"amount_cents": 0})
            return listed, counted, added, paid, declined
    listed, counted, added, paid, declined = anyio.run(go)
    assert "[saga: read-only]" in listed["count_items"]
    assert "undone by remove_item" in listed["add_item"]
    assert "undone by refund_payment" in listed["take_payment"]
    assert "NOT UNDOABLE" in listed["tag_item"]
    assert "IRREVERSIBLE" in listed["send_email"]
    assert "unclassified" in listed["remove_item"]
    assert not counted.is_error
    assert counted.structured_content == {"count": 0}
    assert not approvals.pending(store)
    assert not added.is_error
    assert not paid.is_error
    assert declined.is_error
    assert "rolled back" in _text(declined)
    iid, pid = added.structured_content["id"], paid.structured_content["id"]
    assert _effects(tmp_path / "items.db") == [("add", iid), ("pay", pid), ("refund", pid),
                                               ("remove", iid)]


@pytest.mark.real_redis
def test_annotations_become_entries_and_the_gateway_follows_them(
        tmp_path: Path, redis_url: str, client: redis.Redis) -> None:
    """The records server: readOnlyHint gives readonly, destructiveHint irreversible,
    the shorthand declaration a compensation; the rest is for a person. The gateway
    with that map and the safe policy reads without asking and holds wire_funds for a
    person, whose denial leaves the money where it is."""
    out = tmp_path / "records.toml"
    done = _init(out, RECORDS)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    classes = load_tools_map(out)
    expected = {"create_record": "compensable", "get_record": "readonly",
                "wire_funds": "irreversible", "drop_everything": "readonly",
                "saga_settings_seen": "readonly", "slow_create": "compensable"}
    assert {n: classes[n].reversibility for n in expected if n in classes} == expected
    for n, c in classes.items():  # anything else the server has: from its annotations
        assert n in expected or (c.reversibility, c.compensation) == ("readonly", None), n
    assert "slow_create" in classes  # its declaration, like create_record's
    comp = classes["create_record"].compensation
    assert comp is not None
    assert (comp.tool, dict(comp.args)) == ("delete_record",
                                            {"id": "$.output.structuredContent.id"})
    assert "CHECK it changes nothing" in _block(text, "drop_everything")
    assert "CHECK" in _block(text, "wire_funds")
    for undecided in ("charge", "refund", "update_crm", "enable_archive", "clear_password",
                      "refuse_order", "reject_upload"):
        assert "DECIDE" in _block(text, undecided), undecided
    password = _block(text, "set_password")
    assert "perhaps undone by clear_password" in password
    assert 'secret = ["password"]' in password
    env = {**_env(tmp_path), "SAGA_REDIS_URL": redis_url}
    store = SagaStore(client, Registry())

    async def go() -> tuple[Any, Any]:
        async with _guarded(env, RECORDS, ["--tools-map", str(out)]) as s:
            with anyio.fail_after(30):
                made = await s.call_tool("create_record", {"name": "a"})
                read = await s.call_tool("get_record", {"id": made.structured_content["id"]})
            async with anyio.create_task_group() as tg:
                got: list[Any] = []

                async def wire() -> None:
                    got.append(await s.call_tool("wire_funds", {"amount_cents": 5, "to": "x"}))
                tg.start_soon(wire)
                pending = await anyio.to_thread.run_sync(lambda: assert_eventually(
                    lambda: approvals.pending(store), timeout=30, what="an approval request"))
                assert pending[0].preview["tool"] == "wire_funds"
                approvals.decide(store, pending[0].saga_id, pending[0].step, grant=False,
                                 by="bob", reason="no")
            return read, got[0]
    read, wired = anyio.run(go)
    assert read.structured_content["name"] == "a"
    assert wired.is_error
    kinds = [k for k, _ in _effects(tmp_path / "records.db")]
    assert "wire" not in kinds
    assert kinds[0] == "create"


@pytest.mark.real_redis
def test_the_npm_memory_server_and_an_accepted_guess(tmp_path: Path, redis_url: str,
                                                     client: redis.Redis) -> None:
    """The memory server declares nothing but annotations: reads and deletes come from
    them; create_relations gets a guessed undo (delete_relations), commented out.
    Taken as it is, the gateway undoes a relation through it when a later call fails."""
    server = reference_server("server-memory")
    memory = tmp_path / "memory.jsonl"
    env = {**_env(tmp_path), "MEMORY_FILE_PATH": str(memory)}
    out = tmp_path / "memory.toml"
    done = _init(out, server, env)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert {n: c.reversibility for n, c in load_tools_map(out).items()} == {
        "read_graph": "readonly", "search_nodes": "readonly", "open_nodes": "readonly",
        "delete_entities": "irreversible", "delete_observations": "irreversible",
        "delete_relations": "irreversible"}
    assert "perhaps undone by delete_relations" in _block(text, "create_relations")
    # a list of names from the list of what the call made (its output, not its input)
    assert 'entityNames = "$.output.structuredContent.entities[*].name"' in _block(
        text, "create_entities")
    out.write_text(_accept(text, "create_relations"))
    rel = load_tools_map(out)["create_relations"]
    assert rel.compensation is not None
    assert rel.compensation.tool == "delete_relations"
    env["SAGA_REDIS_URL"] = redis_url
    (tmp_path / "policy.toml").write_text('[defaults]\nunknown = "allow"\n')
    relation = {"from": "alice", "to": "bob", "relationType": "knows"}

    async def go() -> tuple[Any, Any]:
        async with _guarded(env, server, ["--tools-map", str(out), "--policy",
                                          str(tmp_path / "policy.toml")]) as s:
            await s.call_tool("saga_begin", {})
            await s.call_tool("create_entities", {"entities": [
                {"name": "alice", "entityType": "person", "observations": []},
                {"name": "bob", "entityType": "person", "observations": []}]})
            await s.call_tool("saga_commit", {})
            made = await s.call_tool("create_relations", {"relations": [relation]})
            assert any('"knows"' in line for line in memory.read_text().splitlines())
            bad = await s.call_tool("add_observations", {"observations": [
                {"entityName": "nobody", "contents": ["x"]}]})
            return made, bad
    made, bad = anyio.run(go)
    assert not made.is_error, _text(made)
    assert bad.is_error
    assert "rolled back" in _text(bad)
    rows = [json.loads(line) for line in memory.read_text().splitlines() if line.strip()]
    assert {r["name"] for r in rows if r.get("type") == "entity"} == {"alice", "bob"}
    assert not [r for r in rows if r.get("type") == "relation"]
    _ = client  # the gateway's store: flushed per test


@pytest.mark.real_redis
def test_the_npm_filesystem_server_and_its_guessed_move_back(tmp_path: Path, redis_url: str,
                                                             client: redis.Redis) -> None:
    """server-filesystem: reads and writes from its annotations; move_file, destructive,
    gets the move back as a guessed undo. Taken, a gateway with the map moves a file
    back when a later write fails."""
    entry = reference_server("server-filesystem")
    root = tmp_path / "root"
    root.mkdir()
    server = [*entry, str(root)]
    out = tmp_path / "fs.toml"
    done = _init(out, server)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    classes = load_tools_map(out)
    assert classes["write_file"].reversibility == "irreversible"
    assert classes["move_file"].reversibility == "irreversible"
    assert classes["read_text_file"].reversibility == "readonly"
    assert "create_directory" not in classes
    assert "DECIDE" in _block(text, "create_directory")
    assert "perhaps undone by move_file" in _block(text, "move_file")
    out.write_text(_accept(text, "move_file"))
    move = load_tools_map(out)["move_file"]
    assert move.compensation is not None
    assert dict(move.compensation.args) == {"source": "$.input.destination",
                                            "destination": "$.input.source"}
    (tmp_path / "policy.toml").write_text('[defaults]\nirreversible = "allow"\n')
    env = {**_env(tmp_path), "SAGA_REDIS_URL": redis_url}
    start, moved_to = root / "a.txt", root / "b.txt"
    start.write_text("contents")

    async def go() -> tuple[Any, Any]:
        async with _guarded(env, server, ["--tools-map", str(out), "--policy",
                                          str(tmp_path / "policy.toml")]) as s:
            moved = await s.call_tool("move_file", {"source": str(start),
                                                    "destination": str(moved_to)})
            assert moved_to.exists()
            refused = await s.call_tool("write_file", {"path": str(tmp_path / "outside"),
                                                       "content": "x"})
            return moved, refused
    moved, refused = anyio.run(go)
    assert not moved.is_error, _text(moved)
    assert "rolled back" in _text(refused)
    assert start.read_text() == "contents"
    assert not moved_to.exists()
    _ = client


def test_an_existing_file_is_kept_unless_forced(tmp_path: Path) -> None:
    out = tmp_path / "tools.toml"
    out.write_text("# mine\n")
    kept = _init(out, RECORDS)
    assert kept.returncode == 2
    assert f"{out} exists; not overwritten (give --force to replace it)" in kept.stderr
    assert out.read_text() == "# mine\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".db") == ["tools.toml"]
    forced = _init(out, RECORDS, extra=["--force"])
    assert forced.returncode == 0, forced.stderr
    assert "create_record" in load_tools_map(out)
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".db") == ["tools.toml"]
    alone = subprocess.run([*GUARD, "--force", "--", *RECORDS], cwd=ROOT, env=_env(tmp_path),
                           capture_output=True, text=True, timeout=60,
                           stdin=subprocess.DEVNULL, check=False)
    assert alone.returncode == 2
    assert "--force goes with --init-tools-map" in alone.stderr
    yaml = _init(tmp_path / "tools.yaml", RECORDS)
    assert yaml.returncode == 2
    assert "TOML" in yaml.stderr
    assert not (tmp_path / "tools.yaml").exists()


def test_serving_options_given_with_it_are_refused_not_dropped(tmp_path: Path) -> None:
    """--tools-map and --policy do nothing when only a map is written: given with
    --init-tools-map they are refused, so nobody believes they took effect."""
    (tmp_path / "mine.toml").write_text("")
    for extra, said in ((["--tools-map", str(tmp_path / "mine.toml")], "--tools-map"),
                        (["--policy", str(tmp_path / "mine.toml")], "--policy")):
        out = tmp_path / "tools.toml"
        done = _init(out, RECORDS, extra=extra)
        assert done.returncode == 2
        assert f"so {said} would have no effect" in done.stderr
        assert not out.exists()


def test_a_server_that_cannot_start_dies_or_cannot_be_reached_is_reported(
        tmp_path: Path) -> None:
    out = tmp_path / "tools.toml"
    missing = _init(out, [str(tmp_path / "nope")])
    assert missing.returncode == 2
    assert "cannot start the downstream server" in missing.stderr
    dies = _init(out, [sys.executable, "-c", "import sys; sys.exit(3)"])
    assert dies.returncode == 2
    assert "ended before it answered initialize" in dies.stderr
    unreachable = _init(out, extra=["--url", f"http://127.0.0.1:{free_port()}/mcp"])
    assert unreachable.returncode == 2
    assert "cannot reach the downstream server" in unreachable.stderr
    neither = _init(out)
    assert neither.returncode == 2
    assert "-- COMMAND ARGS... or --url URL" in neither.stderr
    assert list(tmp_path.iterdir()) == []


def test_every_page_of_the_listing_is_written_and_odd_names_are_quoted(
        tmp_path: Path) -> None:
    out = tmp_path / "paged.toml"
    done = _init(out, [sys.executable, "-c", PAGED])
    assert done.returncode == 0, done.stderr
    assert "6 tools" in done.stderr
    doc = tomllib.loads(out.read_text())
    assert sorted(doc["tools"]) == ["look", 'say "hi"', "weird.name"]
    assert {n: c.reversibility for n, c in load_tools_map(out).items()} == {
        "look": "readonly", "weird.name": "readonly", 'say "hi"': "irreversible"}
    text = out.read_text()
    assert '# [tools."tab\\there"]' in text
    assert "# [tools.last]" in text
    assert "# [tools.odd]" in text
    assert "does not read as an MCP tool" in done.stderr


def test_a_streamable_http_server_gives_the_same_map(tmp_path: Path) -> None:
    port = free_port()
    env = _env(tmp_path)
    server = subprocess.Popen([*RECORDS, "--http", str(port)], env=env, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def up() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0
        assert_eventually(up, timeout=30, what="the HTTP MCP server to listen")
        over_http = _init(tmp_path / "http.toml",
                          extra=["--url", f"http://127.0.0.1:{port}/mcp"])
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert over_http.returncode == 0, over_http.stderr
    assert _init(tmp_path / "stdio.toml", RECORDS).returncode == 0
    assert load_tools_map(tmp_path / "http.toml") == load_tools_map(tmp_path / "stdio.toml")

    def body(p: Path) -> list[str]:
        return [line for line in p.read_text().splitlines() if not line.startswith("# written")]
    assert body(tmp_path / "http.toml") == body(tmp_path / "stdio.toml")


def test_the_npm_everything_server_over_http_gives_the_map_it_gives_on_stdio(
        tmp_path: Path) -> None:
    """server-everything under Node, on stdio and on Streamable HTTP: the same entries
    (reads from readOnlyHint, the toggles for a person)."""
    node = reference_server("server-everything")
    assert _init(tmp_path / "stdio.toml", [*node, "stdio"]).returncode == 0
    port = free_port()
    server = subprocess.Popen([*node, "streamableHttp"], env={**os.environ, "PORT": str(port)},
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def up() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0
        assert_eventually(up, timeout=30, what="the HTTP MCP server to listen")
        done = _init(tmp_path / "http.toml", extra=["--url", f"http://127.0.0.1:{port}/mcp"])
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert done.returncode == 0, done.stderr
    classes = load_tools_map(tmp_path / "http.toml")
    assert classes == load_tools_map(tmp_path / "stdio.toml")
    assert classes["get-sum"].reversibility == "readonly"
    assert classes["trigger-long-running-operation"].reversibility == "readonly"
    text = (tmp_path / "http.toml").read_text()
    assert "DECIDE" in _block(text, "toggle-simulated-logging")
    assert "toggle-simulated-logging" not in classes


@pytest.mark.real_redis
def test_an_accepted_list_projection_undoes_only_what_the_call_made(
        tmp_path: Path, redis_url: str, client: redis.Redis) -> None:
    """The memory server's create_entities skips names it already has and answers with
    the entities it made; the guessed undo maps entityNames from that answer, so a
    rollback deletes dave (made by the call) and leaves alice (there before it)."""
    server = reference_server("server-memory")
    memory = tmp_path / "memory.jsonl"
    memory.write_text(json.dumps({"type": "entity", "name": "alice", "entityType": "person",
                                  "observations": ["there first"]}) + "\n")
    env = {**_env(tmp_path), "MEMORY_FILE_PATH": str(memory), "SAGA_REDIS_URL": redis_url}
    out = tmp_path / "memory.toml"
    assert _init(out, server, env).returncode == 0
    out.write_text(_accept(out.read_text(), "create_entities"))
    (tmp_path / "policy.toml").write_text('[defaults]\nunknown = "allow"\n')

    async def go() -> Any:
        async with _guarded(env, server, ["--tools-map", str(out), "--policy",
                                          str(tmp_path / "policy.toml")]) as s:
            made = await s.call_tool("create_entities", {"entities": [
                {"name": "alice", "entityType": "person", "observations": []},
                {"name": "dave", "entityType": "person", "observations": []}]})
            assert not made.is_error, _text(made)
            return await s.call_tool("add_observations", {"observations": [
                {"entityName": "nobody", "contents": ["x"]}]})
    bad = anyio.run(go)
    assert "undone, last first: create_entities (step 0)" in _text(bad)
    rows = [json.loads(line) for line in memory.read_text().splitlines() if line.strip()]
    assert {r["name"] for r in rows if r.get("type") == "entity"} == {"alice"}
