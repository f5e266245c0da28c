"""MCP tasks through the gateway: a task-augmented ``tools/call`` reaches the
server as one (with the client's ``params.task``), the client gets the server's
task at once and polls it itself, and the step's outcome in the log is the
task's result. Run against the npm reference server ``server-everything``,
whose ``simulate-research-query`` tool works only as a task."""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest

from saga_store.protocol.state import Status
from saga_store.verify.checker import Verifier
from tests.npm import reference_server

from .test_mcp_gateway import RawGateway, _sagas, gw

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
__all__ = ["gw"]


def test_a_task_augmented_call_is_a_step_whose_outcome_is_the_tasks_result(
        gw: dict[str, Any]) -> None:
    server = [*reference_server("server-everything"), "stdio"]
    store = gw["store"]
    client = RawGateway(gw, protocol="2025-11-25",
                        argv=[sys.executable, *gw["args"], "--", *server])
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


def test_a_gateway_killed_while_a_task_runs_leaves_it_in_doubt_for_the_next(
        gw: dict[str, Any]) -> None:
    """Between the task's creation (answered to the client) and its result's outcome
    in the log is a window: a gateway SIGKILLed there leaves a started step, which
    the next gateway for the server settles as in doubt (the tool has no undo: the
    saga ends needing a person), never as succeeded or silently dropped."""
    server = [*reference_server("server-everything"), "stdio"]
    store = gw["store"]
    argv = [sys.executable, *gw["args"], "--", *server]
    killed = RawGateway(gw, protocol="2025-11-25", argv=argv)
    made = killed.ask(2, "tools/call", {"name": "simulate-research-query",
                                        "arguments": {"topic": "sagas"},
                                        "task": {"ttl": 60000}})
    assert made["result"]["task"]["status"] == "working"
    killed.kill()  # with its server: the task's result is never logged
    [left] = _sagas(store)
    assert left.steps[0].status == "started"
    nxt = RawGateway(gw, protocol="2025-11-25", argv=argv)  # recovers before serving
    nxt.ask(3, "tools/list", {})
    assert nxt.close() == 0
    st = store.state(left.saga_id)
    assert st.status is Status.NEEDS_ATTENTION
    assert st.steps[0].status == "in_doubt"
    assert Verifier(store.events.log).verify().ok
