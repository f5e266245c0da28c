"""MCP tasks through the gateway: a task-augmented ``tools/call`` reaches the
server as one (with the client's ``params.task``), the client gets the server's
task at once and polls it itself, and the step's outcome in the log is the
task's result. Run against the npm reference server ``server-everything``,
whose ``simulate-research-query`` tool works only as a task."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import pytest

from saga_store.protocol.state import Status
from saga_store.verify.checker import Verifier
from tests.npm import reference_server

from .test_mcp_gateway import ROOT, _sagas, gw

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
__all__ = ["gw"]


class Lines:
    """A client speaking raw JSON-RPC lines to ``saga mcp-guard``."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True)
        self.ask(0, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                   "clientInfo": {"name": "raw", "version": "1"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, msg: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()

    def ask(self, rid: int, method: str, params: dict[str, Any]) -> Any:
        """Send a request; its answer (notifications in between are skipped)."""
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        assert self.proc.stdout is not None
        while True:
            msg = json.loads(self.proc.stdout.readline())
            if msg.get("id") == rid and "method" not in msg:
                return msg

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=30)


def test_a_task_augmented_call_is_a_step_whose_outcome_is_the_tasks_result(
        gw: dict[str, Any]) -> None:
    server = [*reference_server("server-everything"), "stdio"]
    store = gw["store"]
    client = Lines([sys.executable, *gw["args"], "--", *server], gw["env"])
    try:
        made = client.ask(2, "tools/call", {"name": "simulate-research-query",
                                            "arguments": {"topic": "sagas"},
                                            "task": {"ttl": 60000}})
        assert "error" not in made, made
        task = made["result"]["task"]
        assert task["status"] == "working"
        [st] = _sagas(store)
        assert st.steps[0].status == "started"  # the task runs; no outcome yet
        rid, status = 3, task["status"]
        deadline = time.monotonic() + 60
        while status not in ("completed", "failed", "cancelled"):
            assert time.monotonic() < deadline, "the task never ended"
            status = client.ask(rid, "tasks/get", {"taskId": task["taskId"]})["result"][
                "status"]
            rid += 1
            time.sleep(0.2)  # the client polls, as a task's client does
        got = client.ask(rid, "tasks/result", {"taskId": task["taskId"]})["result"]
        assert status == "completed"
        assert "sagas" in got["content"][0]["text"]
        assert client.close() == 0
    finally:
        if client.proc.poll() is None:
            client.proc.kill()
    [st] = _sagas(store)
    assert st.status is Status.COMMITTED  # nothing rolled back
    assert st.steps[0].status == "succeeded"
    assert st.steps[0].result["content"] == got["content"]  # the task's result, every block
    assert Verifier(store.events.log).verify().ok
