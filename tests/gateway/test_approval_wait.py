"""A call that waits for a person's approval, as MCP clients see it: progress
notifications that say how to approve (so a client's request timeout, reset on
progress, does not end the call), and a session that closes while it waits
withdraws the request, in the chain, at once."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import pytest

from saga_store import SagaStore
from saga_store.approval import requests as approvals
from saga_store.log.events import EventKind as K
from saga_store.protocol.state import Status
from saga_store.testing import assert_eventually
from saga_store.verify.checker import Verifier
from tests.npm import installed

from .test_mcp_gateway import ROOT, RawGateway, _effects, _gated, _run, _session, _text, gw

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(180)]
__all__ = ["gw"]  # the fixture, shared with the gateway's main tests


def _saga(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "saga_store.cli.main", *args], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)


def test_a_waiting_call_tells_the_client_how_to_approve_it(gw: dict[str, Any]) -> None:
    gw["env"]["SAGA_APPROVAL_PROGRESS_S"] = "0.2"
    store: SagaStore = gw["store"]
    seen: list[tuple[float, str | None]] = []

    async def go() -> Any:
        async def heard(progress: float, total: float | None, message: str | None) -> None:
            seen.append((progress, message))

        def decide(p: Any) -> None:  # once three notes that the call waits came
            assert_eventually(lambda: len(seen) >= 3, timeout=30,
                              what="three progress notifications")
            approvals.decide(store, p.saga_id, p.step, grant=True, by="alice")

        async with _session(gw) as s:
            return await _gated(s, store, decide, progress_callback=heard)
    result, p = _run(go)
    assert not result.is_error
    assert [k for _, k, _ in _effects(gw["ledger"])] == ["wire"]
    assert f"saga approve {p.saga_id} {p.step}" in (seen[0][1] or "")
    progress = [v for v, _ in seen]
    assert progress == sorted(set(progress))  # it only goes up


def test_without_a_progress_token_the_wait_sends_nothing(gw: dict[str, Any]) -> None:
    """No progressToken, no notifications: a client that asked for none gets none."""
    gw["env"]["SAGA_APPROVAL_PROGRESS_S"] = "0.1"
    store: SagaStore = gw["store"]
    raw = RawGateway(gw)
    try:
        raw.call(2, "wire_funds", {"amount_cents": 5, "to": "a"})
        [p] = assert_eventually(lambda: approvals.pending(store), timeout=30,
                                what="an approval request")
        time.sleep(0.5)  # five progress periods: none may come
        approvals.decide(store, p.saga_id, p.step, grant=True, by="alice")
        answer = raw.receive()
        assert answer["id"] == 2  # the answer is the first line: no notification before it
        assert not answer["result"]["isError"]
    finally:
        raw.stop()


def test_closing_the_session_withdraws_a_pending_approval(gw: dict[str, Any]) -> None:
    store: SagaStore = gw["store"]
    raw = RawGateway(gw)
    raw.call(2, "create_record", {"name": "first"})
    assert not raw.receive()["result"]["isError"]
    raw.call(3, "wire_funds", {"amount_cents": 5, "to": "a"})
    [p] = assert_eventually(lambda: approvals.pending(store), timeout=30,
                            what="an approval request")
    assert raw.proc.stdin is not None
    closed = time.monotonic()
    raw.proc.stdin.close()  # the client leaves, as an SDK client's close does

    def withdrawn() -> bool:
        st = store.state(p.saga_id)
        return st.steps[p.step].approval == "denied"
    assert_eventually(withdrawn, timeout=10, what="the approval withdrawn")
    took = time.monotonic() - closed
    assert took < 2.0, f"withdrawn {took:.2f} s after the client closed"
    assert raw.proc.wait(timeout=10) == 0
    st = store.state(p.saga_id)
    decision = st.steps[p.step].approval_data["decision"]
    assert decision["withdrawn"] is True
    assert decision["by"] == "gateway"
    assert st.status is Status.COMPENSATED  # the earlier call was undone
    assert [k for _, k, _ in _effects(gw["ledger"])] == ["create", "delete"]  # no wire
    assert not approvals.pending(store)
    kinds = [e["kind"] for e in store.events.log.bodies(p.saga_id)]
    assert K.APPROVAL_DENIED in kinds
    assert Verifier(store.events.log).verify().ok
    late = _saga("approve", p.saga_id, str(p.step), "--by", "bob", env=gw["env"])
    assert late.returncode != 0
    assert "withdrawn" in late.stderr
    assert [k for _, k, _ in _effects(gw["ledger"])] == ["create", "delete"]


TS_CLIENT = r"""
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
const [command, ...args] = JSON.parse(process.env.GATEWAY_ARGV);
const transport = new StdioClientTransport({ command, args, env: process.env, stderr: "ignore" });
const client = new Client({ name: "ts-test", version: "1" });
await client.connect(transport);
const options = { timeout: Number(process.env.CLIENT_TIMEOUT_MS) };
let heard = 0;
if (process.env.WITH_PROGRESS === "1") {
  options.onprogress = () => { heard += 1; };
  options.resetTimeoutOnProgress = true;
}
const started = Date.now();
try {
  const result = await client.callTool({ name: "wire_funds",
    arguments: { amount_cents: 5, to: "a" } }, undefined, options);
  console.log(JSON.stringify({ ok: !result.isError, heard, ms: Date.now() - started }));
} catch (e) {
  console.log(JSON.stringify({ error: String(e.message || e), code: e.code, heard,
    ms: Date.now() - started }));
}
await client.close();
"""


@pytest.mark.parametrize("progress", [True, False], ids=["with-progress", "without"])
def test_a_typescript_client_outlives_its_request_timeout_while_a_person_decides(
        gw: dict[str, Any], progress: bool) -> None:
    """The TypeScript SDK client's request timeout (1.5 s here; 60 s by default) resets
    on each progress notification: a call approved after three timeouts' worth of
    waiting completes. Without progress the same client gives up (the control)."""
    npm = installed("sdk").parents[2]
    (npm / "client.mjs").write_text(TS_CLIENT)
    store: SagaStore = gw["store"]
    env = {**gw["env"], "SAGA_APPROVAL_PROGRESS_S": "0.4", "CLIENT_TIMEOUT_MS": "1500",
           "WITH_PROGRESS": "1" if progress else "0",
           "GATEWAY_ARGV": json.dumps([sys.executable, *gw["args"], "--",
                                                     sys.executable,
                                                     str(ROOT / "tests" /
                                                         "mcp_records_server.py")])}
    client = subprocess.Popen(["node", str(npm / "client.mjs")], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        [p] = assert_eventually(lambda: approvals.pending(store), timeout=30,
                                what="an approval request")
        asked = time.monotonic()
        if progress:
            # three client timeouts go by while the approval is pending
            assert client.poll() is None
            assert_eventually(lambda: time.monotonic() - asked > 4.5, timeout=15,
                              interval=0.1, what="three client timeouts of waiting")
            assert client.poll() is None, "the client gave up while a person decided"
            done = _saga("approve", p.saga_id, str(p.step), "--by", "alice", env=env)
            assert done.returncode == 0, done.stderr
        out, _ = client.communicate(timeout=60)
    finally:
        if client.poll() is None:
            client.kill()
    said = json.loads(out.strip().splitlines()[-1])
    if progress:
        assert said.get("ok") is True, said
        assert said["heard"] >= 9  # one every 0.4 s
        assert said["ms"] > 4500
        assert [k for _, k, _ in _effects(gw["ledger"])] == ["wire"]
    else:
        assert "timed out" in said.get("error", "").lower(), said
        assert said["ms"] < 4500
        assert not [k for _, k, _ in _effects(gw["ledger"])]
        # the client closed its session: the request it left is withdrawn
        assert_eventually(lambda: not approvals.pending(store), timeout=10,
                          what="the abandoned approval withdrawn")
    assert Verifier(store.events.log).verify().ok


def test_a_denied_or_withdrawn_approval_is_not_decided_again(gw: dict[str, Any]) -> None:
    """What 'saga approve' says of a step decided already: by whom, or that its request
    was withdrawn; both exit non-zero and write nothing."""
    store: SagaStore = gw["store"]

    async def go() -> Any:
        async with _session(gw) as s:
            return await _gated(s, store, lambda p: approvals.decide(
                store, p.saga_id, p.step, grant=False, by="bob", reason="no"))
    result, p = _run(go)
    assert "denied by bob: no" in _text(result)
    seq = store.state(p.saga_id).seq
    again = _saga("approve", p.saga_id, str(p.step), "--by", "carol", env=gw["env"])
    assert again.returncode == 2
    assert "already denied by bob" in again.stderr
    assert store.state(p.saga_id).seq == seq
