"""Notifications: a local HTTP receiver gets a JSON POST from real workers when a
step waits for approval and when a saga ends needing attention; failed posts
are retried with backoff; a receiver that hangs, trickles, redirects or fails
never holds up the sender or the notifications after its own."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import orjson
import pytest
import redis
from prometheus_client import CollectorRegistry

from saga_store import Registry, SagaStore, Status
from saga_store.approval import requests as approvals
from saga_store.approval.notify import Notifier, payload
from saga_store.ops.metrics import Metrics
from saga_store.testing import assert_eventually
from saga_store.testing.workers import workers

from ..gateway.test_mcp_gateway import POLICY, ROOT, TOOLS_MAP, _session


class Receiver:
    """An HTTP server on loopback recording every JSON body posted to it; the first
    ``fail_first`` requests get 503, and with ``hang`` it answers none until that
    event is set."""

    def __init__(self, fail_first: int = 0, hang: threading.Event | None = None) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                outer.requests += 1
                if hang is not None:  # then answers, once released
                    hang.wait(30)
                body = self.rfile.read(int(self.headers["content-length"]))
                if outer.requests <= fail_first:
                    self.send_response(503)
                    self.end_headers()
                    return
                outer.bodies.append(orjson.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/T000/secret-path"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.mark.real_redis
def test_workers_notify_approvals_and_attention(saga_store: SagaStore,
                                                worker_env: dict[str, str], ledger: Path,
                                                tmp_path: Path, receiver: Receiver) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text("")
    env = {**worker_env, "SAGA_POLICY_FILE": str(policy), "SAGA_NOTIFY_URL": receiver.url,
           "SAGA_CONSOLE_URL": "http://console.internal:8765/"}
    plan = [{"tool": "charge_payment", "args": {"amount_cents": 500,
                                                "card_number": "4111222233334444"}},
            {"tool": "send_email", "args": {"to": "ceo@example.com"}},
            {"tool": "fail_always", "args": {"why": "the CRM is down"}}]
    with workers(env, "tests.ledger_tools"):
        sid = saga_store.submit(plan, agent_id="agent-n")
        asked = assert_eventually(lambda: [b for b in receiver.bodies
                                           if b["event"] == "approval_requested"],
                                  timeout=30, what="the approval notification")
        assert asked[0] == {
            "event": "approval_requested", "saga_id": sid, "step": 1, "tool": "send_email",
            "agent_id": "agent-n", "reason": asked[0]["reason"],
            "console_url": f"http://console.internal:8765/sagas/{sid}",
            "text": asked[0]["text"]}
        assert "irreversible" in asked[0]["reason"]
        assert sid in asked[0]["text"]
        assert "waits for approval" in asked[0]["text"]
        approvals.decide(saga_store, sid, 1, grant=True, by="olivia")
        st = saga_store.wait(sid, timeout=30)
        assert st.status is Status.NEEDS_ATTENTION
        ended = assert_eventually(lambda: [b for b in receiver.bodies
                                           if b["event"] == "needs_attention"],
                                  timeout=30, what="the attention notification")
    assert ended[0]["saga_id"] == sid
    assert ended[0]["agent_id"] == "agent-n"
    assert "step 1 (send_email)" in ended[0]["reason"]
    assert ended[0]["console_url"].endswith(f"/sagas/{sid}")
    raw = orjson.dumps(receiver.bodies).decode()
    assert "4111222233334444" not in raw
    assert "ceo@example.com" not in raw  # arguments never travel
    assert len(receiver.bodies) == 2


def test_a_failing_receiver_is_retried_with_backoff() -> None:
    flaky = Receiver(fail_first=2)
    try:
        n = Notifier(flaky.url, backoff_s=0.05)
        assert n.send(payload("needs_attention", "S1", step=None, tool=None, agent_id="a",
                              reason="could not undo step 0 (wire)"))
        assert n.flush(10)
        assert (flaky.requests, n.sent, n.failed) == (3, 1, 0)
        assert flaky.bodies[0]["text"].startswith("Saga S1 ended needing a person")
    finally:
        flaky.close()
    gone = Notifier(flaky.url, attempts=3, backoff_s=0.01)  # nobody listens there now
    gone.send(payload("needs_attention", "S2", step=None, tool=None, agent_id=None,
                      reason="x"))
    assert gone.flush(10)
    assert (gone.sent, gone.failed) == (0, 1)


class Misbehaving:
    """A receiver that treats each notification by its ``n``: ``trickle`` sends
    its headers then a body of 100 kB, a byte every 0.1 s; ``drip`` sends its
    status line and then its headers a byte at a time; ``hang`` never answers;
    ``redirect`` answers 302 to ``elsewhere``; ``error`` answers 500; the rest
    get 200 and are recorded, with when they arrived."""

    def __init__(self, plan: dict[int, str], elsewhere: str = "") -> None:
        self.delivered: dict[int, float] = {}
        self.hits: list[int] = []
        self.stop = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = orjson.loads(self.rfile.read(int(self.headers["content-length"])))
                n = body["n"]
                outer.hits.append(n)
                # OSError: the notifier hung up on us, which is what a deadline is for
                with contextlib.suppress(OSError):
                    getattr(outer, "_" + plan.get(n, "ok"))(self, n)

            def log_message(self, *args: Any) -> None:
                pass

        self.elsewhere = elsewhere
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _ok(self, h: BaseHTTPRequestHandler, n: int) -> None:
        h.send_response(200)
        h.send_header("content-length", "0")
        h.end_headers()
        self.delivered[n] = time.monotonic()

    def _trickle(self, h: BaseHTTPRequestHandler, n: int) -> None:
        h.send_response(200)
        h.send_header("content-length", "100000")
        h.end_headers()
        h.wfile.flush()
        while not self.stop.wait(0.1):
            h.wfile.write(b"x")
            h.wfile.flush()

    def _drip(self, h: BaseHTTPRequestHandler, n: int) -> None:
        h.wfile.write(b"HTTP/1.1 200 OK\r\n")
        while not self.stop.wait(0.1):
            h.wfile.write(b"X-Pad: x\r\n")
            h.wfile.flush()

    def _hang(self, h: BaseHTTPRequestHandler, n: int) -> None:
        self.stop.wait(60)

    def _redirect(self, h: BaseHTTPRequestHandler, n: int) -> None:
        h.send_response(302)
        h.send_header("location", self.elsewhere)
        h.send_header("content-length", "0")
        h.end_headers()

    def _error(self, h: BaseHTTPRequestHandler, n: int) -> None:
        h.send_response(500)
        h.send_header("content-length", "0")
        h.end_headers()

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def test_a_receiver_that_stalls_or_redirects_never_silences_later_notifications() -> None:
    """Seven notifications to one receiver: the first trickles its body after a
    200 (delivered: the body is never read), the second trickles its headers,
    the third hangs, the fourth is redirected to another local port, the fifth
    gets 500. Sending never waits; each stalled attempt ends at its deadline,
    the redirect is not followed (the other port sees no request), and the last
    two arrive within the deadlines of those before."""
    elsewhere = Receiver()
    bad = Misbehaving({0: "trickle", 1: "drip", 2: "hang", 3: "redirect", 4: "error"},
                      elsewhere=elsewhere.url)
    deadline_s = 1.0
    n = Notifier(bad.url, timeout_s=deadline_s, attempts=2, backoff_s=0.05)
    try:
        began = time.monotonic()
        assert all(n.send({"event": "approval_requested", "n": i}) for i in range(7))
        assert time.monotonic() - began < 0.5
        # three attempts run out their deadline ahead of them; allow as much again
        assert_eventually(lambda: {5, 6} <= set(bad.delivered), timeout=6 * deadline_s,
                          what="the notifications after the bad ones")
        assert max(bad.delivered.values()) - began < 6 * deadline_s
        assert n.flush(20)
        assert (n.sent, n.failed, n.dropped) == (3, 4, 0)
        assert sorted(bad.hits) == [0, 1, 1, 2, 2, 3, 4, 4, 5, 6]  # one try for a redirect
        assert elsewhere.requests == 0
    finally:
        n.close()
        bad.close()
        elsewhere.close()


def test_a_full_queue_drops_the_oldest_and_counts_it(caplog: pytest.LogCaptureFixture) -> None:
    """A receiver that holds every request: sending never waits; with room for
    four, the oldest waiting are dropped, each counted in
    saga_notifications_dropped_total and logged; once it answers, the one it
    held and the newest four arrive."""
    release = threading.Event()
    stuck = Receiver(hang=release)
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    n = Notifier(stuck.url, timeout_s=30, queue_size=4,
                 on_drop=metrics.notifications_dropped.inc)
    try:
        n.send({"event": "approval_requested", "saga_id": "S0", "n": 0})
        assert_eventually(lambda: stuck.requests == 1, timeout=10, what="the first post")
        began = time.monotonic()
        results = [n.send({"event": "approval_requested", "saga_id": f"S{i}", "n": i})
                   for i in range(1, 20)]
        assert time.monotonic() - began < 0.5
        assert results == [True] * 4 + [False] * 15
        assert n.dropped == 15
        assert registry.get_sample_value("saga_notifications_dropped_total") == 15
        dropped = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
        assert len(dropped) == 15
        assert "S1 dropped" in dropped[0]
        release.set()
        assert n.flush(20)
    finally:
        release.set()
        n.close()
        stuck.close()
    # the one in flight when the queue filled, and the newest four
    assert sorted(b["n"] for b in stuck.bodies) == [0, 16, 17, 18, 19]


@pytest.mark.real_redis
def test_the_gateway_notifies_when_a_call_waits_for_approval(
        redis_url: str, client: redis.Redis, tmp_path: Path, receiver: Receiver) -> None:
    (tmp_path / "tools.toml").write_text(TOOLS_MAP)
    (tmp_path / "policy.toml").write_text(POLICY)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RECORDS_LEDGER": str(tmp_path / "l.db"),
           "SAGA_REDIS_URL": redis_url, "SAGA_NOTIFY_URL": receiver.url}
    gw = {"env": env, "args": ["-m", "saga_store.cli.main", "mcp-guard", "--policy",
                               str(tmp_path / "policy.toml"), "--tools-map",
                               str(tmp_path / "tools.toml")]}
    store = SagaStore(client, Registry())

    def asked() -> list[dict[str, Any]]:
        return [b for b in receiver.bodies if b["event"] == "approval_requested"]

    async def go() -> Any:
        async with _session(gw) as s, anyio.create_task_group() as tg:
            out: list[Any] = []

            async def wire() -> None:
                out.append(await s.call_tool("wire_funds", {"amount_cents": 5, "to": "a"}))
            tg.start_soon(wire)
            got = await anyio.to_thread.run_sync(lambda: assert_eventually(
                asked, timeout=30, what="the gateway's approval notification"))
            approvals.decide(store, got[0]["saga_id"], got[0]["step"], grant=False, by="bob",
                             reason="not now")
        return out[0]

    assert anyio.run(go).is_error
    [body] = asked()
    assert (body["tool"], body["agent_id"], body["step"]) == ("wire_funds", "mcp-client", 0)
    assert '"to"' not in orjson.dumps(body).decode()  # no arguments
