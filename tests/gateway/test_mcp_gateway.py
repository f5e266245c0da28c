"""The MCP gateway (``saga mcp-guard``) in front of real MCP servers: a small one
written for these tests, and the npm reference server ``server-memory`` run
with Node. The client is the official MCP SDK; effects are counted in the test
server's own ledger."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from saga_store import Registry, SagaStore, keys
from saga_store.approval import requests as approvals
from saga_store.errors import InvalidInput
from saga_store.execution.idempotency import args_digest, explicit_key
from saga_store.log.events import EventKind as K
from saga_store.protocol.state import Status
from saga_store.testing import assert_eventually, ctrl_c_reaches_it
from saga_store.verify.checker import Verifier
from tests.npm import reference_server

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
ROOT = Path(__file__).resolve().parents[2]
SERVER = [sys.executable, str(ROOT / "tests" / "mcp_records_server.py")]
TOOLS_MAP = """
[tools.charge]
reversibility = "compensable"
compensation = { tool = "refund", args = { charge_id = "$.output.structuredContent.charge_id" } }

[tools.delete_record]
reversibility = "irreversible"

[tools.set_password]
compensation = { tool = "clear_password", args = { user = "$.input.user" } }
secret = ["password"]

[tools.refund]
reversibility = "irreversible"

[tools.wait_for]
reversibility = "readonly"
"""
POLICY = """
[defaults]
unknown = "allow"
irreversible = "require_approval"

[[rules]]
tool = "drop_*"
decision = "deny"
name = "never-drop"
"""


def _effects(ledger: Path) -> list[tuple[int, str, str]]:
    if not ledger.exists():
        return []
    with sqlite3.connect(ledger) as db:
        try:
            return list(db.execute("SELECT n, kind, key FROM effects ORDER BY n"))
        except sqlite3.OperationalError:
            return []


@pytest.fixture
def gw(redis_url: str, client: redis.Redis, queues: redis.Redis, worker_env: dict[str, str],
       tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "tools.toml").write_text(TOOLS_MAP)
    (tmp_path / "policy.toml").write_text(POLICY)
    ledger = tmp_path / "ledger.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RECORDS_LEDGER": str(ledger),
           "SAGA_REDIS_URL": redis_url}
    env.pop("SAGA_QUEUE_URL", None)
    if "SAGA_QUEUE_URL" in worker_env:  # the log on a cluster: the queues apart
        env["SAGA_QUEUE_URL"] = worker_env["SAGA_QUEUE_URL"]
    args = ["-m", "saga_store.cli.main", "mcp-guard", "--policy", str(tmp_path / "policy.toml"),
            "--tools-map", str(tmp_path / "tools.toml")]
    store = SagaStore(client, Registry(), queues=queues)
    return {"env": env, "args": args, "ledger": ledger, "store": store, "tmp": tmp_path}


@asynccontextmanager
async def _session(gw: dict[str, Any], downstream: list[str] = SERVER,
                   extra: list[str] | None = None) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=sys.executable,
                                   args=[*gw["args"], *(extra or []), "--", *downstream],
                                   env=gw["env"], cwd=str(ROOT))
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        yield s


async def _gated(s: Any, store: SagaStore, decide: Callable[[Any], None],
                 name: str = "wire_funds", args: dict[str, Any] | None = None,
                 **call: Any) -> tuple[Any, Any]:
    """Call ``name`` (one the policy gates) on session ``s``, ``decide`` its approval
    request once it is pending (in a thread: the event loop goes on meanwhile), and
    return the call's result and the request."""
    async with anyio.create_task_group() as tg:
        out: list[Any] = []

        async def gated() -> None:
            out.append(await s.call_tool(name, args or {"amount_cents": 5, "to": "a"},
                                         **call))
        tg.start_soon(gated)
        [pending] = await anyio.to_thread.run_sync(lambda: assert_eventually(
            lambda: approvals.pending(store), timeout=30, what="an approval request"))
        await anyio.to_thread.run_sync(decide, pending)
    return out[0], pending


def _run(fn: Callable[[], Any]) -> Any:
    return anyio.run(fn)


def _sagas(store: SagaStore) -> list[Any]:
    return [store.state(sid) for sid in reversed(store.events.saga_ids())]


def _text(result: Any) -> str:
    return "\n".join(getattr(c, "text", "") for c in result.content)


class RawGateway:
    """``saga mcp-guard`` as a process spoken to in raw JSON-RPC lines (batches,
    kills), initialized; in its own process group, so a kill takes its server too."""

    def __init__(self, gw: dict[str, Any], env: dict[str, str] | None = None,
                 protocol: str = "2025-06-18", argv: list[str] | None = None) -> None:
        """``argv``: the gateway's whole command (default: this file's, in front of
        the records server)."""
        argv = argv or [sys.executable, *gw["args"], "--", *SERVER]
        self.proc = subprocess.Popen(argv, cwd=ROOT,
                                     env=env or gw["env"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, start_new_session=True)
        self.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": protocol, "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}})
        assert self.receive()["id"] == 0
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, msg: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()

    def call(self, i: int, name: str, arguments: dict[str, Any]) -> None:
        self.send({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                   "params": {"name": name, "arguments": arguments}})

    def receive(self) -> Any:
        assert self.proc.stdout is not None
        return json.loads(self.proc.stdout.readline())

    def ask(self, rid: int, method: str, params: dict[str, Any]) -> Any:
        """Send a request; its answer (notifications in between are skipped)."""
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        while True:
            msg = self.receive()
            if msg.get("id") == rid and "method" not in msg:
                return msg

    def close(self) -> int:
        """End the session as a client leaving does; the gateway's exit status."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=30)

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=10)


def _left_by_a_killed_gateway(gw: dict[str, Any], env: dict[str, str]) -> Any:
    """The session a gateway left open when it was SIGKILLed after one call."""
    dead = RawGateway(gw, env)
    dead.call(2, "create_record", {"name": "left"})
    assert not dead.receive()["result"]["isError"]
    dead.kill()
    [left] = _sagas(gw["store"])
    assert left.status is Status.RUNNING
    return left


def _next_gateway(gw: dict[str, Any]) -> None:
    """Start a gateway for the same downstream (it recovers before serving)."""
    async def go() -> None:
        async with _session(gw) as s:
            await s.list_tools()
    _run(go)


@pytest.mark.cluster
def test_a_failure_after_two_compensable_calls_undoes_both_last_first(
        gw: dict[str, Any]) -> None:
    async def go() -> tuple[Any, Any, Any]:
        async with _session(gw) as s:
            a = await s.call_tool("create_record", {"name": "a"})
            c = await s.call_tool("charge", {"amount_cents": 1200})
            bad = await s.call_tool("update_crm", {"note": "fail"})
            return a, c, bad
    a, c, bad = _run(go)
    assert not a.is_error
    assert not c.is_error
    assert bad.is_error
    assert "rolled back" in _text(bad)
    assert "charge (step 1), create_record (step 0)" in _text(bad)
    rid, cid = a.structured_content["id"], c.structured_content["charge_id"]
    kinds = [(k, key) for _, k, key in _effects(gw["ledger"])]
    assert kinds == [("create", rid), ("charge", cid), ("refund", cid), ("delete", rid)]
    [st] = _sagas(gw["store"])
    assert st.status is Status.COMPENSATED
    assert [n for n in (1, 0) if st.steps[n].compensation == "succeeded"] == [1, 0]
    ctx = gw["store"].redis.xrange(keys.agent_ctx("mcp-client"))
    assert any(b"retracted" in v[b"e"] or b"rolled" in v[b"e"] for _, v in ctx), \
        "the agent's context stream says what was rolled back"
    assert Verifier(gw["store"].events.log).verify().ok


@pytest.mark.cluster
def test_an_irreversible_call_waits_for_approval_and_a_denial_leaves_it_unexecuted(
        gw: dict[str, Any]) -> None:
    store: SagaStore = gw["store"]

    async def go() -> Any:
        async with _session(gw) as s:
            await s.call_tool("create_record", {"name": "a"})
            async with anyio.create_task_group() as tg:
                out: list[Any] = []

                async def wire() -> None:
                    out.append(await s.call_tool("wire_funds",
                                                 {"amount_cents": 5000, "to": "acct-9"}))
                tg.start_soon(wire)
                pending = await anyio.to_thread.run_sync(lambda: assert_eventually(
                    lambda: approvals.pending(store), timeout=30, what="an approval request"))
                assert pending[0].preview["tool"] == "wire_funds"
                assert pending[0].preview["reversibility"] == "irreversible"
                assert not [e for e in _effects(gw["ledger"]) if e[1] == "wire"]
                approvals.decide(store, pending[0].saga_id, pending[0].step, grant=False,
                                 by="bob", reason="wrong account")
            return out[0]
    result = _run(go)
    assert result.is_error
    assert "denied by bob: wrong account" in _text(result)
    kinds = [k for _, k, _ in _effects(gw["ledger"])]
    assert kinds == ["create", "delete"]  # no wire; the earlier call was compensated
    [st] = _sagas(store)
    assert st.status is Status.COMPENSATED
    assert st.steps[1].approval == "denied"
    assert Verifier(store.events.log).verify().ok


def test_an_approved_irreversible_call_runs_once(gw: dict[str, Any]) -> None:
    store: SagaStore = gw["store"]

    async def go() -> Any:
        async with _session(gw) as s:
            return (await _gated(s, store, lambda p: approvals.decide(
                store, p.saga_id, p.step, grant=True, by="alice")))[0]
    assert not _run(go).is_error
    assert [k for _, k, _ in _effects(gw["ledger"])] == ["wire"]
    [st] = _sagas(store)
    assert st.status is Status.COMMITTED  # the session ended: its calls stand


def test_a_read_failure_bad_arguments_or_a_typo_roll_nothing_back(gw: dict[str, Any]) -> None:
    """A read that fails, arguments the tool's schema rejects (refused unsent) and a
    tool the server does not list (sent: the client gets what the server itself
    says, the same answer as a direct call): nothing is rolled back; the session
    goes on."""
    async def go() -> tuple[Any, ...]:
        params = StdioServerParameters(command=SERVER[0], args=SERVER[1:], env=gw["env"])
        async with stdio_client(params) as (r, w), ClientSession(r, w) as direct:
            await direct.initialize()
            said = (await direct.call_tool("create_recrod", {"name": "c"}),)
        async with _session(gw) as s:
            await s.call_tool("create_record", {"name": "a"})
            missing = await s.call_tool("get_record", {"id": "nope"})
            invalid = await s.call_tool("create_record", {"name": 123})
            typo = await s.call_tool("create_recrod", {"name": "c"})
            await s.call_tool("enable_archive", {})  # a tool added since the listing
            archived = await s.call_tool("archive_record", {"id": "x"})
            assert not archived.is_error, _text(archived)
            later = await s.call_tool("create_record", {"name": "b"})
            return missing, invalid, typo, later, *said
    missing, invalid, typo, later, direct_typo = _run(go)
    assert missing.is_error
    assert "rolled back" not in _text(missing)
    assert invalid.is_error
    assert "invalid arguments" in _text(invalid)
    assert typo.is_error
    assert typo.content == direct_typo.content  # the server's own words
    assert "rolled back" not in _text(invalid) + _text(typo)
    assert not later.is_error
    assert [k for _, k, _ in _effects(gw["ledger"])] == ["create", "archive", "create"]
    [st] = _sagas(gw["store"])
    assert st.status is Status.COMMITTED
    assert st.steps[1].status == "failed"  # the read that failed stays in the record
    # the call of a tool the server does not list is in the record too, refused
    refused = [e["data"]["refused"] for e in gw["store"].events.log.bodies(st.saga_id)
               if e["kind"] == K.STEP_FAILED and "refused" in e["data"]]
    assert refused == ["this server has no tool named 'create_recrod'; tools/list shows "
                       "the tools it has"]
    assert Verifier(gw["store"].events.log).verify().ok


def test_a_servers_read_only_claim_does_not_beat_local_policy(gw: dict[str, Any]) -> None:
    async def go() -> Any:
        async with _session(gw) as s:
            listed = {t.name: t.description for t in (await s.list_tools()).tools}
            assert "server's claim" in listed["drop_everything"]
            assert "IRREVERSIBLE" in listed["wire_funds"]
            assert "undone by delete_record" in listed["create_record"]
            assert {"saga_begin", "saga_commit", "saga_abort"} <= set(listed)
            return await s.call_tool("drop_everything", {})
    result = _run(go)
    assert result.is_error
    assert "denied by policy (policy rule never-drop)" in _text(result)
    assert not _effects(gw["ledger"])


@pytest.mark.cluster
def test_only_a_repeat_under_the_same_key_is_answered_from_the_log(gw: dict[str, Any]) -> None:
    """A call made again without a key is the client's new call: it runs. Under the
    same explicit key, in the session or a later one, it is answered from the log."""
    async def go() -> tuple[Any, Any, Any]:
        async with _session(gw) as s:
            first = await s.call_tool("create_record", {"name": "same"})
            again = await s.call_tool("create_record", {"name": "same"})
            keyed = await s.call_tool("charge", {"amount_cents": 7},
                                      meta={"dev.chronomcp/idempotency_key": "order-1"})
            return first, again, keyed
    first, again, keyed = _run(go)

    async def later() -> Any:  # a new session, the same explicit key
        async with _session(gw) as s:
            return await s.call_tool("charge", {"amount_cents": 7},
                                     meta={"dev.chronomcp/idempotency_key": "order-1"})
    repeat = _run(later)
    assert again.structured_content != first.structured_content
    assert repeat.structured_content == keyed.structured_content
    assert repeat.meta == {"dev.chronomcp/replayed": True}
    assert [k for _, k, _ in _effects(gw["ledger"])] == ["create", "create", "charge"]
    kinds = [e["kind"] for st in _sagas(gw["store"])
             for e in gw["store"].events.log.bodies(st.saga_id)]
    # the later session's repeat is answered from the key's record, not its own saga
    assert K.STEP_DUPLICATE_SUPPRESSED not in kinds


def test_reads_of_one_session_run_beside_each_other(gw: dict[str, Any]) -> None:
    """A read held open by the server does not hold up a later read of the same
    session (before, every call waited for the one before it)."""
    first, second = gw["tmp"] / "first", gw["tmp"] / "second"

    async def go() -> list[str]:
        done: list[str] = []
        async with _session(gw) as s:
            async def read(flag: Path) -> None:
                await s.call_tool("wait_for", {"path": str(flag)})
                done.append(flag.name)

            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(read, first)
                    await anyio.sleep(0.2)  # the first read is in flight
                    tg.start_soon(read, second)
                    second.touch()  # only the second may answer
                    while not done:
                        await anyio.sleep(0.01)
                    first.touch()
        return done
    assert _run(go) == ["second", "first"]
    [st] = _sagas(gw["store"])
    assert st.status is Status.COMMITTED
    assert len(st.steps) == 2
    assert Verifier(gw["store"].events.log).verify().ok


def test_a_keyed_call_whose_claim_never_became_a_step_runs_on_retry(
        gw: dict[str, Any]) -> None:
    """A caller claimed the key, then died before logging the call: while its saga
    could still log it, a retry is told to wait (nothing runs, no recorded answer
    made up); once that saga was rolled back, the retry takes the key and runs."""
    store = gw["store"]
    holder = store.saga(agent_id="mcp-client")  # an earlier session of the same agent
    digest = args_digest("charge", {"amount_cents": 9})
    key = explicit_key("order-9")
    assert store.dedupe.claim("mcp-client", key, digest, holder.saga_id, 0).status == "new"

    async def call() -> Any:
        async with _session(gw) as s:
            return await s.call_tool("charge", {"amount_cents": 9},
                                     meta={"dev.chronomcp/idempotency_key": "order-9"})
    waiting = _run(call)
    assert waiting.is_error
    assert "in progress" in _text(waiting)
    assert not [k for _, k, _ in _effects(gw["ledger"]) if k == "charge"]
    assert store.abort(holder.saga_id)
    ran = _run(call)
    assert not ran.is_error, _text(ran)
    assert [k for _, k, _ in _effects(gw["ledger"]) if k == "charge"] == ["charge"]


def test_session_tools_begin_commit_abort(gw: dict[str, Any]) -> None:
    async def go() -> Any:
        async with _session(gw) as s:
            await s.call_tool("saga_begin", {})
            await s.call_tool("create_record", {"name": "kept"})
            await s.call_tool("saga_commit", {})
            await s.call_tool("saga_begin", {})
            await s.call_tool("create_record", {"name": "dropped"})
            return await s.call_tool("saga_abort", {"reason": "changed my mind"})
    aborted = _run(go)
    assert "compensated" in _text(aborted)
    assert [k for _, k, _ in _effects(gw["ledger"])] == ["create", "create", "delete"]
    assert [st.status for st in _sagas(gw["store"])] == [Status.COMMITTED, Status.COMPENSATED]


def test_a_batch_gets_the_same_treatment_as_single_calls(gw: dict[str, Any]) -> None:
    """A JSON-RPC batch of tools/call is split: each call meets the gate and the log
    exactly as a single one would, and the answers come back as one batch."""
    raw = RawGateway(gw, protocol="2025-03-26")  # batches were still in that version
    store: SagaStore = gw["store"]
    try:
        raw.send([{"jsonrpc": "2.0", "id": 2, "method": "tools/call",
               "params": {"name": "create_record", "arguments": {"name": "in-batch"}}},
              {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
               "params": {"name": "wire_funds", "arguments": {"amount_cents": 1, "to": "x"}}},
              {"jsonrpc": "2.0", "id": 4, "method": "tools/call",
               "params": {"name": "drop_everything", "arguments": {}}}])
        pending = assert_eventually(lambda: approvals.pending(store), timeout=30,
                                    what="the batched wire_funds to wait for approval")
        assert pending[0].preview["tool"] == "wire_funds"
        assert not [e for e in _effects(gw["ledger"]) if e[1] in ("wire", "drop")]
        approvals.decide(store, pending[0].saga_id, pending[0].step, grant=False, by="bob",
                         reason="not in a batch")
        answers = raw.receive()
    finally:
        raw.stop()
    assert isinstance(answers, list)
    by_id = {a["id"]: a["result"] for a in answers}
    assert sorted(by_id) == [2, 3, 4]
    assert not by_id[2]["isError"]
    assert by_id[3]["isError"]
    assert "denied by bob" in by_id[3]["content"][0]["text"]
    assert by_id[4]["isError"]
    assert "denied by policy" in by_id[4]["content"][0]["text"]
    kinds = [k for _, k, _ in _effects(gw["ledger"])]
    assert "wire" not in kinds
    assert "drop" not in kinds
    report = Verifier(store.events.log).verify()
    assert report.ok, [(c.reason, c.detail) for c in report.chains if not c.ok]


def test_what_is_not_a_tool_call_passes_through_and_sigterm_closes_the_session(
        gw: dict[str, Any]) -> None:
    """Pings, prompts and resources are the server's own business: they reach it and
    its answers come back unchanged. A line that is not JSON, or is over the line
    limit, gets a parse error.
    SIGTERM ends the session as the client leaving would: its saga is committed."""
    raw = RawGateway(gw)
    raw.send({"jsonrpc": "2.0", "id": "p", "method": "ping"})
    assert raw.receive() == {"jsonrpc": "2.0", "id": "p", "result": {}}
    # an id shaped like the gateway's own is still the client's
    raw.send({"jsonrpc": "2.0", "id": "saga-guard-1", "method": "ping"})
    assert raw.receive() == {"jsonrpc": "2.0", "id": "saga-guard-1", "result": {}}
    raw.send({"jsonrpc": "2.0", "id": 7, "method": "prompts/list"})
    assert raw.receive() == {"jsonrpc": "2.0", "id": 7, "result": {"prompts": []}}
    raw.send({"jsonrpc": "2.0", "id": 8, "method": "no/such/method"})
    assert raw.receive()["error"]["code"] == -32601  # the server's own answer
    assert raw.proc.stdin is not None
    raw.proc.stdin.write("{not json\n")
    raw.proc.stdin.flush()
    assert raw.receive()["error"]["code"] == -32700
    # a message over the 64 MiB line limit: skipped and answered, the session goes on
    raw.send({"jsonrpc": "2.0", "id": 11, "method": "ping", "params": {"x": "x" * 2**26}})
    too_big = raw.receive()
    assert (too_big["id"], too_big["error"]["code"]) == (None, -32700), too_big
    raw.call(9, "create_record", {"name": "kept"})
    assert not raw.receive()["result"]["isError"]
    # the gateway's own settings (the Redis URL and its password) stay with it
    assert "SAGA_REDIS_URL" in gw["env"]
    raw.call(10, "saga_settings_seen", {})
    assert raw.receive()["result"]["structuredContent"] == {"names": []}
    raw.stop()
    assert raw.proc.returncode == 0
    store: SagaStore = gw["store"]
    [st] = _sagas(store)
    assert st.status is Status.COMMITTED
    assert [k for _, k, _ in _effects(gw["ledger"])] == ["create"]
    assert Verifier(store.events.log).verify().ok


def test_a_downstream_that_dies_mid_call_leaves_the_unwind_to_the_next_gateway(
        gw: dict[str, Any]) -> None:
    """The server dies after a call's effect, before answering: the call is in doubt,
    the client is told, the gateway ends its session; the next gateway undoes what
    can be undone and flags the rest for a person."""
    raw = RawGateway(gw)
    raw.call(2, "create_record", {"name": "a"})
    assert not raw.receive()["result"]["isError"]
    raw.call(3, "update_crm", {"note": "die"})
    answer = raw.receive()["result"]
    assert answer["isError"]
    assert "rolled back" in answer["content"][0]["text"]
    assert raw.proc.wait(timeout=30) == 0  # no downstream, no session: the gateway ends
    store: SagaStore = gw["store"]
    [st] = _sagas(store)
    assert st.status is Status.STUCK  # the compensation had no server to go to
    assert st.steps[1].status == "in_doubt"
    with pytest.raises(InvalidInput, match="start 'saga mcp-guard' for its server again"):
        store.resume(st.saga_id)  # workers cannot undo a gateway's calls
    _next_gateway(gw)
    [st] = _sagas(store)
    assert st.status is Status.NEEDS_ATTENTION  # update_crm cannot be undone
    assert [k for _, k, _ in _effects(gw["ledger"])] == ["create", "crm", "delete"]
    assert Verifier(store.events.log).verify().ok


def test_a_batch_mixing_calls_and_other_requests_is_answered_as_one_batch(
        gw: dict[str, Any]) -> None:
    """The batch's ping and tools/list go to the server, its call through the saga;
    the three answers come back together, the listing with the session tools."""
    raw = RawGateway(gw, protocol="2025-03-26")
    try:
        raw.send([{"jsonrpc": "2.0", "id": "a", "method": "ping"},
                  {"jsonrpc": "2.0", "method": "notifications/progress",
                   "params": {"progressToken": "t", "progress": 1}},
                  {"jsonrpc": "2.0", "id": "b", "method": "tools/call",
                   "params": {"name": "create_record", "arguments": {"name": "x"}}},
                  {"jsonrpc": "2.0", "id": "c", "method": "tools/list"},
                  "not a message"])
        answers = raw.receive()
    finally:
        raw.stop()
    assert isinstance(answers, list)
    assert len(answers) == 4  # three requests and the element that is not a message
    by_id = {a["id"]: a for a in answers}
    assert by_id["a"]["result"] == {}
    assert not by_id["b"]["result"]["isError"]
    names = [t["name"] for t in by_id["c"]["result"]["tools"]]
    assert "create_record" in names
    assert names[-3:] == ["saga_begin", "saga_commit", "saga_abort"]
    assert by_id[None]["error"]["code"] == -32600
    assert [k for _, k, _ in _effects(gw["ledger"])] == ["create"]


def test_a_downstream_that_cannot_start_or_dies_at_once_is_reported(gw: dict[str, Any],
                                                                     tmp_path: Path) -> None:
    missing = subprocess.run([sys.executable, *gw["args"], "--", str(tmp_path / "nope")],
                             cwd=ROOT, env=gw["env"], stdin=subprocess.PIPE,
                             capture_output=True, text=True, timeout=60, check=False)
    assert missing.returncode == 2
    assert "cannot start the downstream server" in missing.stderr
    assert "Check the command after --" in missing.stderr
    init = json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}})
    dies = subprocess.Popen([sys.executable, *gw["args"], "--", sys.executable, "-c",
                             "import sys; sys.exit(3)"], cwd=ROOT, env=gw["env"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert dies.stdin is not None
    dies.stdin.write(init + "\n")
    dies.stdin.flush()  # and the client stays: the gateway ends because the server did
    dies.wait(timeout=60)
    assert dies.stdout is not None
    assert dies.stderr is not None
    out, err = dies.stdout.read(), dies.stderr.read()
    dies.stdin.close()
    assert out == ""  # nobody answered the initialize, and nothing pretended to
    assert "the downstream server exited with code 3" in err


def test_a_gateway_killed_mid_unwind_is_finished_by_the_next(gw: dict[str, Any]) -> None:
    """The compensation hangs, the gateway is SIGKILLed; the next gateway for the same
    downstream finishes the unwind before serving, and nothing is undone twice."""
    hang = gw["tmp"] / "hang"
    hang.touch()
    gw["env"]["RECORDS_HANG_ON_DELETE"] = str(hang)  # the next gateway's server too
    raw = RawGateway(gw)
    raw.call(2, "create_record", {"name": "a"})
    raw.receive()
    raw.call(3, "update_crm", {"note": "fail"})
    store: SagaStore = gw["store"]
    assert_eventually(lambda: any(st.steps[0].compensation == "intent"
                                  for st in _sagas(store)), timeout=30,
                      what="the unwind to reach the hanging compensation")
    raw.kill()
    hang.unlink()
    _next_gateway(gw)
    [st] = _sagas(store)
    assert st.status is Status.COMPENSATED
    assert [k for _, k, _ in _effects(gw["ledger"])] == ["create", "delete"]
    assert Verifier(store.events.log).verify().ok


def test_in_front_of_the_npm_reference_memory_server(gw: dict[str, Any]) -> None:
    """create_relations is compensable by delete_relations (declared in the tools map);
    a failing add_observations rolls it back through the server itself."""
    server = reference_server("server-memory")
    (gw["tmp"] / "memory.toml").write_text("""
[tools.create_relations]
reversibility = "compensable"
compensation = { tool = "delete_relations", args = { relations = "$.input.relations" } }

[tools.read_graph]
reversibility = "readonly"
""")
    memory = gw["tmp"] / "memory.jsonl"
    gw["env"]["MEMORY_FILE_PATH"] = str(memory)
    extra = ["--tools-map", str(gw["tmp"] / "memory.toml")]
    relation = {"from": "alice", "to": "bob", "relationType": "knows"}

    async def go() -> tuple[Any, Any, Any]:
        async with _session(gw, server, extra) as s:
            # entities made outside any saga's undo: a setup the test keeps
            await s.call_tool("saga_begin", {})
            await s.call_tool("create_entities", {"entities": [
                {"name": "alice", "entityType": "person", "observations": []},
                {"name": "bob", "entityType": "person", "observations": []}]})
            await s.call_tool("saga_commit", {})
            rel = await s.call_tool("create_relations", {"relations": [relation]})
            bad = await s.call_tool("add_observations", {"observations": [
                {"entityName": "nobody", "contents": ["x"]}]})
            graph = await s.call_tool("read_graph", {})
            return rel, bad, graph
    rel, bad, graph = _run(go)
    assert not rel.is_error
    assert bad.is_error
    assert "rolled back" in _text(bad)
    text = _text(graph)
    assert "alice" in text
    assert "knows" not in text  # the relation was deleted by the server's own tool
    states = [st.status for st in _sagas(gw["store"])]
    # setup committed; the relation's saga rolled back; the read after it opened a new one
    assert states == [Status.COMMITTED, Status.COMPENSATED, Status.COMMITTED]
    assert Verifier(gw["store"].events.log).verify().ok


def test_the_guard_in_the_agents_own_process(gw: dict[str, Any]) -> None:
    """GuardedSession wraps the agent's own ClientSession: same logging, gating and
    rollback, no extra process."""
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
                listed = {t.name: t.description for t in (await s.list_tools()).tools}
                assert "IRREVERSIBLE" in listed["wire_funds"]
                assert "saga_begin" in listed
                a = await s.call_tool("create_record", {"name": "a"})
                bad = await s.call_tool("update_crm", {"note": "fail"})
                return a, bad
    a, bad = _run(go)
    assert not a.is_error
    assert bad.is_error
    assert "rolled back" in _text(bad)
    assert [k for _, k, _ in _effects(gw["ledger"])] == ["create", "delete"]
    [st] = _sagas(store)
    assert st.status is Status.COMPENSATED
    assert Verifier(store.events.log).verify().ok


def test_the_agent_hears_of_calls_on_later_appends_and_of_everything_at_a_failure(
        gw: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls' results go to the agent's context stream riding on a later append (no
    round trip of their own): here every 4 events; a failed read, and the session's
    close, tell all at once."""
    from saga_store.approval.policy import Policy
    from saga_store.client.context import Subscriber
    from saga_store.mcp import gateway
    from saga_store.mcp.guarded import GuardedSession
    monkeypatch.setattr(gateway, "TELL_AFTER_EVENTS", 4)
    monkeypatch.setattr(gateway, "TELL_AFTER_S", 3600.0)
    store: SagaStore = gw["store"]
    sub = Subscriber(store.redis, "ctx-agent", last_id="0", block_ms=10)
    heard: list[list[str]] = []

    def kinds() -> list[str]:
        return [e["kind"] for e in sub.poll()]

    async def go() -> None:
        params = StdioServerParameters(command=SERVER[0], args=SERVER[1:], env=gw["env"])
        async with stdio_client(params) as (r, w), ClientSession(r, w) as raw:
            await raw.initialize()
            async with GuardedSession(raw, store, agent_id="ctx-agent",
                                      policy=Policy.load(gw["tmp"] / "policy.toml")) as s:
                for name in "abc":
                    await s.call_tool("create_record", {"name": name})
                    heard.append(kinds())
                await s.call_tool("get_record", {"id": "nope"})  # a read that fails
                heard.append(kinds())
        heard.append(kinds())
    _run(go)
    # a's result (3 events) went out with b's outcome (the 5th untold event); b's and
    # c's at the failure; the close at the end
    assert heard == [[], ["observed"], [], ["observed", "observed"], ["saga_closed"]]
    assert Verifier(store.events.log).verify().ok


def test_a_streamable_http_downstream(gw: dict[str, Any]) -> None:
    """--url: the same saga logic in front of a server reached over Streamable HTTP."""
    import socket

    from saga_store.testing import free_port
    port = free_port()
    server = subprocess.Popen([*SERVER, "--http", str(port)], env=gw["env"], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def up() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0
        assert_eventually(up, timeout=30, what="the HTTP MCP server to listen")
        gw["args"] = [*gw["args"], "--url", f"http://127.0.0.1:{port}/mcp"]

        async def go() -> tuple[Any, Any]:
            params = StdioServerParameters(command=sys.executable, args=gw["args"],
                                           env=gw["env"], cwd=str(ROOT))
            async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
                await s.initialize()
                a = await s.call_tool("create_record", {"name": "a"})
                bad = await s.call_tool("update_crm", {"note": "fail"})
                return a, bad
        a, bad = _run(go)
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert not a.is_error
    assert "rolled back" in _text(bad)
    assert [k for _, k, _ in _effects(gw["ledger"])] == ["create", "delete"]


def test_secret_arguments_never_reach_the_log(gw: dict[str, Any]) -> None:
    """tools-map secret = [...]: the log keeps a salted digest; the server's echo of
    the value in a result or an error is blanked before it is logged."""
    async def go() -> tuple[Any, Any]:
        async with _session(gw) as s:
            ok = await s.call_tool("set_password", {"user": "u1", "password": "hunter2-real"})
            bad = await s.call_tool("set_password", {"user": "u2", "password": "weak-hunter2"})
            return ok, bad
    ok, bad = _run(go)
    assert not ok.is_error
    assert bad.is_error
    assert [k for _, k, _ in _effects(gw["ledger"])] == ["password", "clear"]
    from ..execution.test_hardening import _dump
    r: redis.Redis = gw["store"].redis
    everything = "".join(_dump(r, k) for k in r.scan_iter(count=1000))
    assert "u1" in everything  # the scan does see the log
    assert "hunter2" not in everything
    [st] = _sagas(gw["store"])
    assert "$secret" in st.steps[0].args["password"]


def test_a_tools_map_may_not_copy_a_secret_into_a_compensation(tmp_path: Path) -> None:
    from saga_store.errors import InvalidInput
    from saga_store.mcp.classify import load_tools_map
    bad = tmp_path / "bad.toml"
    bad.write_text('[tools.t]\nsecret = ["pw"]\n'
                   'compensation = { tool = "u", args = { pw = "$.input.pw" } }\n')
    with pytest.raises(InvalidInput, match="would copy a secret"):
        load_tools_map(bad)


def test_a_yaml_tools_map_reads_as_the_same_toml_one(tmp_path: Path) -> None:
    from saga_store.mcp.classify import load_tools_map
    (tmp_path / "tools.toml").write_text(TOOLS_MAP)
    (tmp_path / "tools.yml").write_text("""
tools:
  charge:
    reversibility: compensable
    compensation: {tool: refund, args: {charge_id: "$.output.structuredContent.charge_id"}}
  delete_record: {reversibility: irreversible}
  set_password:
    compensation: {tool: clear_password, args: {user: "$.input.user"}}
    secret: [password]
  refund: {reversibility: irreversible}
  wait_for: {reversibility: readonly}
""")
    yaml = load_tools_map(tmp_path / "tools.yml")
    assert yaml == load_tools_map(tmp_path / "tools.toml")
    assert yaml["charge"].compensation is not None
    assert yaml["set_password"].secret == frozenset({"password"})


def test_the_gateway_runs_as_the_worker_acl_user(gw: dict[str, Any], tmp_path: Path) -> None:
    """The gateway needs no right the worker ACL user lacks (no DEL, no CONFIG)."""
    from saga_store.ops import acl
    from saga_store.testing import RedisServer
    with RedisServer() as srv:
        admin = redis.Redis.from_url(srv.url)
        admin.execute_command("ACL", "SETUSER", *acl.setuser_args(
            "saga-worker", acl.worker_rules()), ">w-pass")
        gw["env"]["SAGA_REDIS_URL"] = f"redis://saga-worker:w-pass@127.0.0.1:{srv.port}/0"
        gw["env"]["SAGA_LEASE_MS"] = "600"
        store = SagaStore(admin, Registry())
        gw["store"] = store
        left = _left_by_a_killed_gateway(gw, gw["env"])  # its lease is taken over

        async def go() -> Any:
            async with _session(gw) as s:
                await s.call_tool("create_record", {"name": "a"})
                [mine] = [st for st in _sagas(store) if st.saga_id != left.saga_id]
                lease = store.events.keys.lease(mine.saga_id)
                ttls = [admin.pttl(lease)]

                def renewed() -> bool:  # while idle, only the keeper can raise its TTL
                    ttls.append(admin.pttl(lease))
                    return ttls[-1] > ttls[-2] > 0
                await anyio.to_thread.run_sync(lambda: assert_eventually(
                    renewed, timeout=30, what="the idle session's lease to be renewed"))
                return await s.call_tool("update_crm", {"note": "fail"})
        bad = _run(go)
        assert "rolled back" in _text(bad)
        assert [k for _, k, _ in _effects(gw["ledger"])] == ["create", "create", "delete"]
        assert [st.status for st in _sagas(store)] == [Status.COMMITTED, Status.COMPENSATED]
        assert Verifier(store.events.log).verify().ok


def test_a_forgotten_approval_becomes_a_denial(gw: dict[str, Any]) -> None:
    (gw["tmp"] / "policy.toml").write_text(POLICY.replace(
        'irreversible = "require_approval"',
        'irreversible = "require_approval"\napproval_timeout_s = 1'))

    async def go() -> Any:
        async with _session(gw) as s:
            await s.call_tool("create_record", {"name": "a"})
            return await s.call_tool("wire_funds", {"amount_cents": 5, "to": "a"})
    result = _run(go)
    assert result.is_error
    assert "denied by timeout" in _text(result)
    assert [k for _, k, _ in _effects(gw["ledger"])] == ["create", "delete"]
    [st] = _sagas(gw["store"])
    assert st.status is Status.COMPENSATED
    assert st.steps[1].approval == "denied"


def test_a_session_left_open_by_a_killed_gateway_is_committed_by_the_next(
        gw: dict[str, Any]) -> None:
    """Every call of the dead gateway's session had an outcome: it stands."""
    raw = RawGateway(gw)
    raw.call(2, "create_record", {"name": "kept"})
    assert raw.receive()["id"] == 2
    raw.kill()
    store: SagaStore = gw["store"]
    [st] = _sagas(store)
    assert st.status is Status.RUNNING  # nobody closed it
    _next_gateway(gw)
    [st] = _sagas(store)
    assert st.status is Status.COMMITTED
    assert [k for _, k, _ in _effects(gw["ledger"])] == ["create"]
    assert Verifier(store.events.log).verify().ok


def test_a_second_gateway_for_the_same_server_leaves_a_running_ones_session_alone(
        gw: dict[str, Any]) -> None:
    """Two clients, each with its own gateway in front of the same server command:
    the second one's start-up recovery must not settle the first's open session."""
    first = RawGateway(gw)
    first.call(2, "create_record", {"name": "first"})
    assert not first.receive()["result"]["isError"]
    _next_gateway(gw)  # starts, recovers what is not leased, serves, ends
    store: SagaStore = gw["store"]
    mine = [st for st in _sagas(store) if st.steps and st.steps[0].tool == "create_record"]
    assert [st.status for st in mine] == [Status.RUNNING]  # still the first one's
    with pytest.raises(InvalidInput, match="saga_abort"):
        store.abort(mine[0].saga_id)
    first.call(3, "create_record", {"name": "second"})
    assert not first.receive()["result"]["isError"]
    first.stop()
    [st] = [st for st in _sagas(store) if st.saga_id == mine[0].saga_id]
    assert st.status is Status.COMMITTED
    assert len(st.steps) == 2
    assert [k for _, k, _ in _effects(gw["ledger"])] == ["create", "create"]
    assert Verifier(store.events.log).verify().ok


def _stalled_past_its_lease(gw: dict[str, Any]) -> tuple[RawGateway, Any]:
    """A gateway that made one call, then was stopped (SIGSTOP) until its lease
    lapsed and the next gateway settled its session, then let go on (SIGCONT)."""
    env = {**gw["env"], "SAGA_LEASE_MS": "600"}
    stalled = RawGateway(gw, env)
    stalled.call(2, "create_record", {"name": "a"})
    assert not stalled.receive()["result"]["isError"]
    store: SagaStore = gw["store"]
    [first] = _sagas(store)
    os.killpg(stalled.proc.pid, signal.SIGSTOP)
    lease = store.events.keys.lease(first.saga_id)
    try:
        assert_eventually(lambda: not store.events.redis.exists(lease),
                          timeout=30, what="the stalled gateway's lease to lapse")
        _next_gateway({**gw, "env": env})
        assert store.state(first.saga_id).status is Status.COMMITTED  # its one call stands
    finally:
        os.killpg(stalled.proc.pid, signal.SIGCONT)
    return stalled, first


def test_a_gateway_stalled_past_its_lease_is_fenced_off(gw: dict[str, Any]) -> None:
    """A gateway stopped (SIGSTOP) longer than its lease: the next gateway takes the
    session over and settles it; when the first wakes up, it writes nothing more to
    that saga, tells its client so, and carries on in a new saga."""
    stalled, first = _stalled_past_its_lease(gw)
    store: SagaStore = gw["store"]
    stalled.call(3, "create_record", {"name": "b"})
    answer = stalled.receive()["result"]
    assert answer["isError"]
    assert f"no longer holds saga {first.saga_id}: " in answer["content"][0]["text"]
    assert [k for _, k, _ in _effects(gw["ledger"])] == ["create"]  # b never ran
    stalled.call(4, "create_record", {"name": "c"})
    assert not stalled.receive()["result"]["isError"]
    stalled.stop()
    assert store.state(first.saga_id).status is Status.COMMITTED
    assert [len(st.steps) for st in _sagas(store)] == [1, 1]
    assert [k for _, k, _ in _effects(gw["ledger"])] == ["create", "create"]
    assert Verifier(store.events.log).verify().ok


def test_a_terminal_user_answers_approvals_as_they_come(gw: dict[str, Any]) -> None:
    """``saga approvals --interactive`` asks about each gated call as it arrives: a yes
    lets it run, a no (with a reason) fails it; both recorded under the user's name."""
    watcher = subprocess.Popen(
        [sys.executable, "-m", "saga_store.cli.main", "approvals", "--approve-interactively"],
        cwd=ROOT, env={**gw["env"], "SAGA_OPERATOR": "carol"}, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=ctrl_c_reaches_it)
    assert watcher.stdin is not None
    raw = RawGateway(gw)
    try:
        watcher.stdin.write("y\nn\nwrong account\n")  # read only when it asks
        watcher.stdin.flush()
        raw.call(2, "wire_funds", {"amount_cents": 5, "to": "a"})
        assert not raw.receive()["result"]["isError"]
        raw.call(3, "saga_commit", {})
        raw.receive()
        raw.call(4, "wire_funds", {"amount_cents": 7, "to": "b"})
        answer = raw.receive()["result"]
        assert answer["isError"]
        assert "denied by carol: wrong account" in answer["content"][0]["text"]
    finally:
        raw.stop()
        watcher.send_signal(signal.SIGINT)  # Ctrl-C
        _, err = watcher.communicate(timeout=30)
    assert watcher.returncode == 0, err
    assert err.count("Approve this step?") == 2
    assert [k for _, k, _ in _effects(gw["ledger"])] == ["wire"]  # the approved one only
    store: SagaStore = gw["store"]
    first, second = _sagas(store)
    assert (first.status, first.steps[0].approval) == (Status.COMMITTED, "granted")
    assert (second.status, second.steps[0].approval) == (Status.COMPENSATED, "denied")
    decisions = [e["data"] for sid in (first.saga_id, second.saga_id)
                 for e in store.events.log.bodies(sid)
                 if e["kind"] in (K.APPROVAL_GRANTED, K.APPROVAL_DENIED)]
    assert [d["by"] for d in decisions] == ["carol", "carol"]
    assert Verifier(store.events.log).verify().ok


def test_a_session_left_on_another_host_is_finished_once_its_lease_lapses(
        gw: dict[str, Any]) -> None:
    """A gateway elsewhere dies holding its session's lease: nobody here can tell it
    died, so the running gateway serves at once and takes the session over only
    when the lease lapses, without a restart."""
    env = {**gw["env"], "SAGA_LEASE_MS": "900"}
    left = _left_by_a_killed_gateway(gw, env)
    store: SagaStore = gw["store"]
    r = store.events.redis
    lease = store.events.keys.lease(left.saga_id)
    # held far longer than the gateway takes to start on a loaded machine; lapsed by
    # hand below, as the other gateway's would once it stopped renewing
    r.set(lease, "mcp-gateway/elsewhere/4026531836/7/00", px=120_000)
    serving = RawGateway(gw, env)
    serving.call(2, "create_record", {"name": "new"})
    assert not serving.receive()["result"]["isError"]
    assert store.state(left.saga_id).status is Status.RUNNING  # still leased elsewhere
    r.pexpire(lease, 300)
    assert_eventually(lambda: store.state(left.saga_id).status is Status.COMMITTED,
                      timeout=30, what="the running gateway to take the session over")
    serving.call(3, "create_record", {"name": "more"})
    assert not serving.receive()["result"]["isError"]
    serving.stop()
    assert [st.status for st in _sagas(store)] == [Status.COMMITTED, Status.COMMITTED]
    assert [len(st.steps) for st in _sagas(store)] == [1, 2]
    assert [k for _, k, _ in _effects(gw["ledger"])] == ["create"] * 3
    assert Verifier(store.events.log).verify().ok


def test_gateway_ids_say_which_gateways_finish_each_others_sessions(
        gw: dict[str, Any]) -> None:
    """The same command may reach different data on different hosts: a gateway with
    another --gateway-id leaves a dead one's session alone; one with its id finishes it."""
    here = {**gw["env"], "SAGA_GATEWAY_ID": "host-a"}
    left = _left_by_a_killed_gateway(gw, here)
    store: SagaStore = gw["store"]
    elsewhere = RawGateway(gw, {**gw["env"], "SAGA_GATEWAY_ID": "host-b"})
    elsewhere.call(2, "create_record", {"name": "b"})
    assert not elsewhere.receive()["result"]["isError"]
    elsewhere.stop()
    assert store.state(left.saga_id).status is Status.RUNNING
    _next_gateway({**gw, "env": here})
    assert store.state(left.saga_id).status is Status.COMMITTED
    from saga_store.mcp.gateway import gateway_id
    with pytest.raises(InvalidInput, match="--gateway-id"):
        gateway_id(None, None, "two\nlines")


def test_a_stalled_gateway_that_wakes_only_to_close_leaves_the_saga_to_the_other(
        gw: dict[str, Any]) -> None:
    """Stopped past its lease, then told to stop (SIGTERM): its session was settled
    by the next gateway; it closes nothing twice and exits cleanly."""
    stalled, st = _stalled_past_its_lease(gw)
    store: SagaStore = gw["store"]
    stalled.stop()
    assert stalled.proc.returncode == 0
    kinds = [e["kind"] for e in store.events.log.bodies(st.saga_id)]
    assert kinds.count(K.SAGA_COMMITTED) == 1
    assert store.state(st.saga_id).status is Status.COMMITTED
    assert Verifier(store.events.log).verify().ok
