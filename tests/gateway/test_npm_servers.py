"""The MCP gateway (``saga mcp-guard``, a real process) in front of the npm
reference servers ``server-everything`` and ``server-filesystem``, run with Node,
spoken to with the official MCP SDK client. What is compared is what the
servers answer (directly and through the gateway) and what is on disk."""

from __future__ import annotations

import json
import os
import subprocess
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

from saga_store import Registry, SagaStore
from saga_store.log.events import EventKind as K
from saga_store.protocol.vocab import FINAL
from saga_store.testing import assert_eventually
from tests.npm import reference_server

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(180)]
ROOT = Path(__file__).resolve().parents[2]
GUARD = ["-m", "saga_store.cli.main", "mcp-guard"]


@pytest.fixture
def gw(redis_url: str, client: redis.Redis, tmp_path: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SAGA_REDIS_URL": redis_url}
    return {"env": env, "store": SagaStore(client, Registry()), "tmp": tmp_path,
            "redis_url": redis_url}


@asynccontextmanager
async def _direct(server: list[str]) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=server[0], args=server[1:], cwd=str(ROOT))
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        yield s


@asynccontextmanager
async def _guarded(gw: dict[str, Any], server: list[str],
                   args: list[str]) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=sys.executable,
                                   args=[*GUARD, *args, "--", *server], env=gw["env"],
                                   cwd=str(ROOT))
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        yield s


def _files(gw: dict[str, Any], name: str, text: str) -> str:
    path = gw["tmp"] / name
    path.write_text(text)
    return str(path)


def _blocks(result: Any) -> list[dict[str, Any]]:
    return [c.model_dump(by_alias=True, mode="json", exclude_none=True) for c in result.content]


def _steady(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Blocks without what the server makes anew for each call: the contents of a
    dynamic resource (server-everything's say when they were created)."""
    out = []
    for b in blocks:
        if b["type"] == "resource" and "/dynamic/" in b["resource"]["uri"]:
            b = {**b, "resource": {k: v for k, v in b["resource"].items()
                                   if k not in ("text", "blob")}}
        out.append(b)
    return out


def _text(result: Any) -> str:
    return "\n".join(getattr(c, "text", "") for c in result.content)


def _kinds(store: SagaStore) -> list[str]:
    return [e["kind"] for sid in store.events.saga_ids() for e in store.events.log.bodies(sid)]


# -- server-everything ----------------------------------------------------------

EVERYTHING_MAP = """
[tools.trigger-long-running-operation]
reversibility = "readonly"

[tools.toggle-simulated-logging]
reversibility = "readonly"   # a read whose answer says whether it was reached

[tools.get-tiny-image]
reversibility = "irreversible"   # treated as mutating: a repeat is answered from the log

[tools.get-annotated-message]
reversibility = "irreversible"

[tools.get-resource-reference]
reversibility = "irreversible"

[tools.get-resource-links]
reversibility = "irreversible"

[tools.get-structured-content]
reversibility = "irreversible"
"""
ALLOW_IRREVERSIBLE = """
[defaults]
irreversible = "allow"
"""


def _everything(gw: dict[str, Any]) -> tuple[list[str], list[str]]:
    server = [*reference_server("server-everything"), "stdio"]
    args = ["--tools-map", _files(gw, "everything.toml", EVERYTHING_MAP),
            "--policy", _files(gw, "policy.toml", ALLOW_IRREVERSIBLE)]
    return server, args


def test_progress_notifications_pass_through_unchanged(gw: dict[str, Any]) -> None:
    """trigger-long-running-operation reports each step: the client sees the same
    notifications through the gateway as directly (count, values, totals, messages)."""
    server, args = _everything(gw)
    op = {"duration": 1, "steps": 5}

    async def run(session: Any) -> tuple[list[tuple[float, float | None, str | None]], str]:
        seen: list[tuple[float, float | None, str | None]] = []

        async def progress(done: float, total: float | None, message: str | None) -> None:
            seen.append((done, total, message))
        result = await session.call_tool("trigger-long-running-operation", op,
                                         progress_callback=progress)
        assert not result.is_error, _text(result)
        return seen, _text(result)

    async def go() -> tuple[Any, Any]:
        async with _direct(server) as s:
            direct = await run(s)
        async with _guarded(gw, server, args) as s:
            guarded = await run(s)
        return direct, guarded
    (direct, direct_text), (guarded, guarded_text) = anyio.run(go)
    assert direct == [(float(i), 5.0, None) for i in range(1, 6)]
    assert guarded == direct
    assert guarded_text == direct_text


def test_progress_of_reads_side_by_side_goes_to_each_its_own_caller(
        gw: dict[str, Any]) -> None:
    """Two long-running reads at once in one session, of 3 and 5 steps: each caller
    hears its own call's progress and nothing of the other's, as directly."""
    server, args = _everything(gw)

    async def both(session: Any) -> dict[int, list[Any]]:
        seen: dict[int, list[Any]] = {3: [], 5: []}

        async def one(steps: int) -> None:
            async def progress(done: float, total: float | None, message: str | None) -> None:
                seen[steps].append((done, total, message))
            result = await session.call_tool("trigger-long-running-operation",
                                             {"duration": 1, "steps": steps},
                                             progress_callback=progress)
            assert not result.is_error, _text(result)
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(one, 3)
                tg.start_soon(one, 5)
        return seen

    async def go() -> tuple[Any, Any]:
        async with _direct(server) as s:
            direct = await both(s)
        async with _guarded(gw, server, args) as s:
            guarded = await both(s)
        return direct, guarded
    direct, guarded = anyio.run(go)
    assert direct == {n: [(float(i), float(n), None) for i in range(1, n + 1)] for n in (3, 5)}
    assert guarded == direct


def test_repeated_reads_reach_the_server_every_time(gw: dict[str, Any]) -> None:
    """toggle-simulated-logging, read-only by the tools map, answers Started and
    Stopped in turn: four identical calls get four answers from the server."""
    server, args = _everything(gw)

    async def go() -> list[str]:
        async with _guarded(gw, server, args) as s:
            return [_text(await s.call_tool("toggle-simulated-logging", {}))
                    for _ in range(4)]
    answers = anyio.run(go)
    assert [a.split()[0] for a in answers] == ["Started", "Stopped", "Started", "Stopped"]
    assert K.STEP_DUPLICATE_SUPPRESSED not in _kinds(gw["store"])


def test_reads_by_the_servers_annotations_are_each_a_call_of_their_own(
        gw: dict[str, Any]) -> None:
    """get-sum, read-only by its annotations alone (a policy that trusts server hints,
    no tools map): three identical calls are three calls the server answered, each
    its own step in the log, none answered from it."""
    server = [*reference_server("server-everything"), "stdio"]
    args = ["--policy", _files(gw, "trusting.toml", "[defaults]\ntrust_server_hints = true\n")]

    async def go() -> tuple[list[str], str]:
        async with _guarded(gw, server, args) as s:
            listed = {t.name: t.description or "" for t in (await s.list_tools()).tools}
            with anyio.fail_after(30):  # no approval to wait for
                return [_text(await s.call_tool("get-sum", {"a": 2, "b": 3}))
                        for _ in range(3)], listed["get-sum"]
    answers, label = anyio.run(go)
    assert "read-only (server's claim)" in label
    assert answers == ["The sum of 2 and 3 is 5."] * 3
    kinds = _kinds(gw["store"])
    assert kinds.count(K.STEP_STARTED) == kinds.count(K.STEP_SUCCEEDED) == 3
    assert K.STEP_DUPLICATE_SUPPRESSED not in kinds


def test_a_replayed_mutating_call_returns_every_content_block(gw: dict[str, Any]) -> None:
    """Tools treated as mutating, answering with an image (get-tiny-image: text, image,
    text), annotated blocks, an embedded blob resource, resource links, and structured
    content: a repeat under the same idempotency key is answered from the log, and
    both answers are, block by block, what the server gives a direct call."""
    server, args = _everything(gw)
    calls = [("get-tiny-image", {}, ["text", "image", "text"]),
             ("get-annotated-message", {"messageType": "error", "includeImage": True},
              ["text", "image"]),
             ("get-resource-reference", {"resourceType": "Blob", "resourceId": 2},
              ["text", "resource", "text"]),
             ("get-resource-links", {"count": 2}, ["text", "resource_link", "resource_link"]),
             ("get-structured-content", {"location": "Chicago"}, ["text"])]

    async def go() -> tuple[list[Any], list[Any], list[Any]]:
        async with _direct(server) as s:
            direct = [await s.call_tool(n, a) for n, a, _ in calls]
        async with _guarded(gw, server, args) as s:
            first = [await s.call_tool(n, a, meta={"dev.chronomcp/idempotency_key": n})
                     for n, a, _ in calls]
            again = [await s.call_tool(n, a, meta={"dev.chronomcp/idempotency_key": n})
                     for n, a, _ in calls]
        return direct, first, again
    direct, first, again = anyio.run(go)
    for (name, _, types), d, f, a in zip(calls, direct, first, again, strict=True):
        assert not d.is_error, (name, _text(d))
        assert [b["type"] for b in _blocks(d)] == types, name
        assert _steady(_blocks(f)) == _steady(_blocks(d)), name
        assert _blocks(a) == _blocks(f), name  # the replay: exactly what the call gave
        assert (f.is_error, a.is_error) == (d.is_error, d.is_error), name
        assert f.structured_content == a.structured_content == d.structured_content, name
    assert direct[-1].structured_content is not None  # the structured one has some
    assert _kinds(gw["store"]).count(K.STEP_DUPLICATE_SUPPRESSED) == len(calls)


def test_the_servers_requests_to_the_client_pass_through(gw: dict[str, Any]) -> None:
    """The server asks the client: sampling/createMessage (trigger-sampling-request) and
    roots/list (get-roots-list), tools the server offers only to a client that says
    it can answer. Through the gateway the client is asked and the server gets its
    answers, as directly."""
    server, args = _everything(gw)
    (gw["tmp"] / "asks.toml").write_text(EVERYTHING_MAP + """
[tools.trigger-sampling-request]
reversibility = "readonly"

[tools.get-roots-list]
reversibility = "readonly"
""")
    args[1] = str(gw["tmp"] / "asks.toml")
    import mcp_types as types

    async def go(guarded: bool) -> tuple[list[str], list[str]]:
        asked: list[str] = []

        async def sampling(ctx: Any, params: Any) -> Any:
            asked.append(f"sampling:{params.messages[0].content.text}")
            return types.CreateMessageResult(role="assistant", model="test-model",
                                             content=types.TextContent(type="text",
                                                                       text="SAMPLED-42"))

        async def roots(ctx: Any) -> Any:
            asked.append("roots")
            return types.ListRootsResult(roots=[types.Root(uri="file:///srv/r1", name="r1")])
        if guarded:
            params = StdioServerParameters(command=sys.executable,
                                           args=[*GUARD, *args, "--", *server],
                                           env=gw["env"], cwd=str(ROOT))
        else:
            params = StdioServerParameters(command=server[0], args=server[1:], cwd=str(ROOT))
        async with stdio_client(params) as (r, w), ClientSession(
                r, w, sampling_callback=sampling, list_roots_callback=roots) as s:
            await s.initialize()
            with anyio.fail_after(30):
                sampled = await s.call_tool("trigger-sampling-request",
                                            {"prompt": "hello", "maxTokens": 5})
                rooted = await s.call_tool("get-roots-list", {})
        assert not sampled.is_error, _text(sampled)
        assert not rooted.is_error, _text(rooted)
        return [_text(sampled), _text(rooted)], asked
    direct = anyio.run(go, False)
    guarded = anyio.run(go, True)
    assert "SAMPLED-42" in direct[0][0]
    assert "file:///srv/r1" in direct[0][1]
    assert guarded[0] == direct[0]  # the same answers, through the gateway
    # the same requests reached the client; how often the server asks for the roots
    # depends on timing (it asks once when the session is initialized, and again for
    # the tool if that first answer has not reached it yet), so not the count
    assert sorted(set(guarded[1])) == sorted(set(direct[1]))
    assert any(a.startswith("sampling:") and a.endswith("hello") for a in guarded[1])
    assert "roots" in guarded[1]


def test_over_streamable_http_progress_reads_and_replays_hold_too(gw: dict[str, Any]) -> None:
    """server-everything over Streamable HTTP, the gateway in front with --url: the
    same progress as a direct HTTP client sees, toggles reaching the server each
    time, and a replayed image answer block for block."""
    import socket

    from mcp.client.streamable_http import streamable_http_client

    from saga_store.testing import free_port
    everything, args = _everything(gw)
    node = everything[:2]
    port = free_port()
    server = subprocess.Popen([*node, "streamableHttp"], env={**os.environ, "PORT": str(port)},
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/mcp"

    async def exercise(s: Any) -> tuple[list[Any], list[str], list[Any]]:
        seen: list[Any] = []

        async def progress(done: float, total: float | None, message: str | None) -> None:
            seen.append((done, total, message))
        with anyio.fail_after(60):
            await s.call_tool("trigger-long-running-operation", {"duration": 1, "steps": 4},
                              progress_callback=progress)
            toggles = [_text(await s.call_tool("toggle-simulated-logging", {})).split()[0]
                       for _ in range(2)]
            images = [_blocks(await s.call_tool("get-tiny-image", {}, meta={
                "dev.chronomcp/idempotency_key": "img"})) for _ in range(2)]
        return seen, toggles, images

    async def go() -> tuple[Any, Any]:
        async with streamable_http_client(url) as streams, ClientSession(
                streams[0], streams[1]) as s:
            await s.initialize()
            direct = await exercise(s)
        params = StdioServerParameters(command=sys.executable,
                                       args=[*GUARD, *args, "--url", url], env=gw["env"],
                                       cwd=str(ROOT))
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            guarded = await exercise(s)
        return direct, guarded
    try:
        def up() -> bool:
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", port)) == 0
        assert_eventually(up, timeout=30, what="the HTTP server to listen")
        direct, guarded = anyio.run(go)
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert direct[0] == [(float(i), 4.0, None) for i in range(1, 5)]
    assert guarded[0] == direct[0]
    assert direct[1] == guarded[1] == ["Started", "Stopped"]
    assert guarded[2][0] == guarded[2][1] == direct[2][0]
    assert _kinds(gw["store"]).count(K.STEP_DUPLICATE_SUPPRESSED) == 1


# -- server-filesystem ----------------------------------------------------------

PRODUCTION_POLICY = """
[defaults]
production = "allow"   # only the rule below holds PRODUCTION calls

[[rules]]
tool = "write_file"
args = { path = "/PRODUCTION/" }
decision = "require_approval"
name = "production-writes"

[[rules]]
tool = "write_file"
decision = "allow"
name = "other-writes"
"""


def _saga(gw: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    """The real ``saga`` CLI against the test's Redis."""
    return subprocess.run([sys.executable, "-m", "saga_store.cli.main", *args], cwd=ROOT,
                          env=gw["env"], capture_output=True, text=True, timeout=60,
                          check=False)


def _pending_cli(gw: dict[str, Any]) -> list[dict[str, Any]]:
    listed = _saga(gw, "approvals", "--json")
    assert listed.returncode == 0, listed.stderr
    items: list[dict[str, Any]] = json.loads(listed.stdout)
    return items


def _filesystem(gw: dict[str, Any]) -> tuple[list[str], list[str], Path]:
    root = gw["tmp"] / "root"
    (root / "PRODUCTION").mkdir(parents=True)
    (root / "staging").mkdir()
    server = [*reference_server("server-filesystem"), str(root)]
    return server, ["--policy", _files(gw, "policy.toml", PRODUCTION_POLICY)], root


def test_a_production_write_waits_and_runs_once_when_approved_at_the_cli(
        gw: dict[str, Any]) -> None:
    server, args, root = _filesystem(gw)
    target, other = root / "PRODUCTION" / "x", root / "staging" / "y"

    async def go() -> tuple[Any, Any, Any, list[dict[str, Any]]]:
        async with _guarded(gw, server, args) as s:
            with anyio.fail_after(30):  # elsewhere: no approval to wait for
                staged = await s.call_tool("write_file", {"path": str(other), "content": "s1"})
            assert other.read_text() == "s1"
            async with anyio.create_task_group() as tg:
                got: list[Any] = []

                async def write() -> None:
                    got.append(await s.call_tool("write_file",
                                                 {"path": str(target), "content": "v1"},
                                                 meta={"dev.chronomcp/idempotency_key": "w-1"}))
                tg.start_soon(write)
                pending = await anyio.to_thread.run_sync(lambda: assert_eventually(
                    lambda: _pending_cli(gw), timeout=30, what="the write to wait"))
                assert not target.exists()  # it waits: nothing written yet
                approved = await anyio.to_thread.run_sync(lambda: _saga(
                    gw, "approve", pending[0]["saga_id"], str(pending[0]["step"]),
                    "--by", "alice"))
                assert approved.returncode == 0, approved.stderr
            assert target.read_text() == "v1"
            target.write_text("changed since")  # a second run would write v1 again
            again = await s.call_tool("write_file", {"path": str(target), "content": "v1"},
                                      meta={"dev.chronomcp/idempotency_key": "w-1"})
            return staged, got[0], again, pending
    staged, written, again, pending = anyio.run(go)
    assert not staged.is_error, _text(staged)
    assert [(p["tool"], p["args"]["path"], p["reason"]) for p in pending] == [
        ("write_file", str(target), "policy rule production-writes")]
    assert pending[0]["production"] is True
    assert pending[0]["reversibility"] == "irreversible"  # the server's destructiveHint
    assert not written.is_error, _text(written)
    assert not again.is_error
    assert _text(again) == _text(written)  # the repeat under its key: from the log
    assert target.read_text() == "changed since"  # it ran once
    assert other.read_text() == "s1"
    twice = _saga(gw, "approve", pending[0]["saga_id"], str(pending[0]["step"]), "--by", "bob")
    assert twice.returncode != 0  # a decided step is not decided again
    assert target.read_text() == "changed since"
    assert _pending_cli(gw) == []


def test_a_denied_production_write_leaves_the_file_unwritten(gw: dict[str, Any]) -> None:
    server, args, root = _filesystem(gw)
    target = root / "PRODUCTION" / "x"

    async def go() -> Any:
        async with _guarded(gw, server, args) as s, anyio.create_task_group() as tg:
            got: list[Any] = []

            async def write() -> None:
                got.append(await s.call_tool("write_file",
                                             {"path": str(target), "content": "v1"}))
            tg.start_soon(write)
            pending = await anyio.to_thread.run_sync(lambda: assert_eventually(
                lambda: _pending_cli(gw), timeout=30, what="the write to wait"))
            denied = await anyio.to_thread.run_sync(lambda: _saga(
                gw, "deny", pending[0]["saga_id"], str(pending[0]["step"]), "--by", "bob",
                "--reason", "freeze"))
            assert denied.returncode == 0, denied.stderr
        return got[0]
    result = anyio.run(go)
    assert result.is_error
    assert "denied by bob: freeze" in _text(result)
    assert not target.exists()
    assert list((root / "PRODUCTION").iterdir()) == []


MOVE_MAP = """
[tools.move_file]   # a move is undone by the move back
reversibility = "compensable"
[tools.move_file.compensation]
tool = "move_file"
args = { source = "$.input.destination", destination = "$.input.source" }
"""


def test_a_move_is_moved_back_when_a_later_write_fails(gw: dict[str, Any]) -> None:
    """move_file, compensable by the move back (tools map); then a write the server
    refuses (outside its allowed directory): the file is where it was, on disk."""
    server, args, root = _filesystem(gw)
    args += ["--tools-map", _files(gw, "move.toml", MOVE_MAP)]
    start, moved_to = root / "staging" / "a.txt", root / "staging" / "b.txt"
    start.write_text("contents")
    outside = gw["tmp"] / "outside.txt"

    async def go() -> tuple[Any, Any]:
        async with _guarded(gw, server, args) as s:
            moved = await s.call_tool("move_file", {"source": str(start),
                                                    "destination": str(moved_to)})
            assert moved_to.read_text() == "contents"
            assert not start.exists()
            refused = await s.call_tool("write_file", {"path": str(outside), "content": "x"})
            return moved, refused
    moved, refused = anyio.run(go)
    assert not moved.is_error, _text(moved)
    assert refused.is_error
    assert "rolled back" in _text(refused)
    assert "move_file (step 0)" in _text(refused)
    assert start.read_text() == "contents"
    assert not moved_to.exists()
    assert not outside.exists()


def _left_waiting(gw: dict[str, Any], server: list[str], args: list[str],
                  target: Path) -> dict[str, Any]:
    """A session whose client (the official SDK's) leaves while its write waits for a
    person; the pending approval, as ``saga approvals`` showed it."""
    async def leave() -> list[dict[str, Any]]:
        async with _guarded(gw, server, args) as s, anyio.create_task_group() as tg:
            tg.start_soon(s.call_tool, "write_file", {"path": str(target), "content": "v1"})
            pending = await anyio.to_thread.run_sync(lambda: assert_eventually(
                lambda: _pending_cli(gw), timeout=30, what="the write to wait"))
            tg.cancel_scope.cancel()  # the client gives up and leaves
        return pending
    [pending] = anyio.run(leave)
    return pending


def test_a_write_left_waiting_by_a_client_that_left_never_runs(gw: dict[str, Any]) -> None:
    """The client goes while its PRODUCTION write waits. The SDK's stdio client
    SIGTERMs the gateway 2 s after closing its stdin and SIGKILLs it 2 s later; the
    gateway closes the session before that (no next gateway needed) and withdraws the
    request: an approval tried afterwards at the CLI is refused (exit 2), runs
    nothing, and nor does the next gateway for the server."""
    server, args, root = _filesystem(gw)
    target = root / "PRODUCTION" / "x"
    pending = _left_waiting(gw, server, args, target)
    store: SagaStore = gw["store"]
    assert_eventually(lambda: store.state(pending["saga_id"]).status in FINAL, timeout=12,
                      what="the left session's saga to be closed")
    late = _saga(gw, "approve", pending["saga_id"], str(pending["step"]), "--by", "alice")
    assert late.returncode == 2, late.stdout + late.stderr
    assert "withdrawn" in late.stderr

    async def next_gateway() -> None:
        async with _guarded(gw, server, args) as s:
            await s.list_tools()
    anyio.run(next_gateway)
    st = store.state(pending["saga_id"])
    assert st.status in FINAL
    assert st.steps[pending["step"]].status != "succeeded"
    assert not target.exists()
    assert _pending_cli(gw) == []


async def _approve_in_turn(gw: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """Approve ``n`` waiting calls at the CLI as they come, each alone in the list."""
    asked: list[dict[str, Any]] = []

    def waiting() -> list[dict[str, Any]]:
        seen = {(p["saga_id"], p["step"]) for p in asked}
        return [p for p in _pending_cli(gw) if (p["saga_id"], p["step"]) not in seen]

    def approve(p: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return _saga(gw, "approve", p["saga_id"], str(p["step"]), "--by", "alice")
    for _ in range(n):
        pending = await anyio.to_thread.run_sync(lambda: assert_eventually(
            waiting, timeout=30, what="the next write to wait"))
        assert len(pending) == 1, pending  # one at a time
        asked.append(pending[0])
        done = await anyio.to_thread.run_sync(approve, pending[0])
        assert done.returncode == 0, done.stderr
    return asked


def test_two_production_writes_at_once_wait_in_turn_and_each_runs_once(
        gw: dict[str, Any]) -> None:
    """Two PRODUCTION writes sent at once in one session: mutating calls go one at a
    time, so a person is asked about one, then the other; each approved write is on
    disk with its own content, and a repeat of either under its key runs nothing."""
    server, args, root = _filesystem(gw)
    a, b = root / "PRODUCTION" / "a", root / "PRODUCTION" / "b"
    writes = ((a, "A"), (b, "B"))

    async def go() -> tuple[list[Any], list[dict[str, Any]], list[Any]]:
        got: list[Any] = []
        async with _guarded(gw, server, args) as s:
            async def write(path: Path, content: str) -> None:
                got.append(await s.call_tool("write_file", {"path": str(path),
                                                            "content": content},
                                             meta={"dev.chronomcp/idempotency_key": content}))
            async with anyio.create_task_group() as tg:
                for path, content in writes:
                    tg.start_soon(write, path, content)
                asked = await _approve_in_turn(gw, 2)
            assert (a.read_text(), b.read_text()) == ("A", "B")
            a.write_text("changed")  # a second run of either would write it again
            b.write_text("changed")
            with anyio.fail_after(30):  # repeats: answered from the log, no person asked
                again = [await s.call_tool("write_file", {"path": str(p), "content": c},
                                           meta={"dev.chronomcp/idempotency_key": c})
                         for p, c in writes]
        return got, asked, again
    got, asked, again = anyio.run(go)
    assert all(not r.is_error for r in got + again), [_text(r) for r in got + again]
    assert sorted(p["args"]["path"] for p in asked) == [str(a), str(b)]
    assert (a.read_text(), b.read_text()) == ("changed", "changed")
    assert _kinds(gw["store"]).count(K.STEP_DUPLICATE_SUPPRESSED) == 2
    assert _pending_cli(gw) == []
