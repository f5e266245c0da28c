"""A call waiting for a person through the framework's own mechanism parks its
saga: the client lease is suspended for the approval's deadline, and the
decision is taken, and the run resumed, in another process long after the
client lease would have lapsed."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from saga_store import SagaStore, Status
from saga_store.integrations._session import saga_id_for
from saga_store.log.events import EventKind as K
from saga_store.testing.workers import workers

from ..integration_support import TOOLS, decisions, final, kinds

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
CLIENT_LEASE_S = 0.5


@pytest.fixture
def env(worker_env: dict[str, str]) -> Iterator[dict[str, str]]:
    agent_env = {**worker_env, "SAGA_CLIENT_LEASE_S": str(CLIENT_LEASE_S)}
    with workers(agent_env, TOOLS):  # their sweepers abort a saga whose caller is gone
        yield agent_env


def run(module: str, env: dict[str, str], tmp: Path, mode: str, *extra: str,
        where: Path | None = None) -> dict[str, Any]:
    out = tmp / f"{mode}.json"
    subprocess.run([sys.executable, "-m", module, str(where or tmp), mode, str(out), *extra],
                   env=env, check=True, timeout=60)
    return dict(json.loads(out.read_text()))


def test_openai_agents_approval_decided_in_another_process_after_10x_the_lease(
        store: SagaStore, env: dict[str, str], tmp_path: Path) -> None:
    pytest.importorskip("agents")
    module = "tests.integrations.openai_resume"
    first = run(module, env, tmp_path, "first")
    sid = saga_id_for("shop", "order-2", "call_1")
    assert first["interruptions"] == ["call_inv"]
    assert first["sagas"] == [sid]
    assert kinds() == ["reserve"]
    # parked: the caller's lease lasts as long as the approval may take
    assert store.redis.pttl(store.events.keys.driver(sid)) > 100 * CLIENT_LEASE_S * 1000
    time.sleep(10 * CLIENT_LEASE_S)  # the time that passes is the point: 10 leases
    assert store.state(sid).status is Status.RUNNING  # no sweeper took it for gone
    second = run(module, env, tmp_path, "approve")
    assert second["context_saga"] == sid  # the RunState's context named it
    assert second["sagas"] == [sid]
    assert second["final"] == "Invoiced."
    assert final(store, sid).status is Status.COMMITTED
    assert decisions(store, sid) == [(K.APPROVAL_GRANTED, 1, "alice")]
    assert kinds() == ["reserve", "invoice"]


def test_langgraph_interrupt_decided_in_another_process_after_10x_the_lease(
        store: SagaStore, env: dict[str, str], tmp_path: Path) -> None:
    pytest.importorskip("langgraph.checkpoint.sqlite")
    module, db = "tests.integrations.langgraph_resume", tmp_path / "state.db"
    first = run(module, env, tmp_path, "gated", "-", where=db)
    sid = saga_id_for("shop", "order-1", "call_1")
    assert first["interrupts"] == ["call_inv"]
    assert first["sagas"] == [sid]
    assert kinds() == ["reserve"]
    assert store.redis.pttl(store.events.keys.driver(sid)) > 100 * CLIENT_LEASE_S * 1000
    time.sleep(10 * CLIENT_LEASE_S)  # the time that passes is the point: 10 leases
    assert store.state(sid).status is Status.RUNNING
    second = run(module, env, tmp_path, "approve", "Invoiced.", where=db)
    assert second["sagas"] == [sid]
    assert second["last"] == "Invoiced."
    assert final(store, sid).status is Status.COMMITTED
    assert decisions(store, sid) == [(K.APPROVAL_GRANTED, 1, "alice")]
    assert kinds() == ["reserve", "invoice"]


@pytest.mark.parametrize("framework", ["pydantic_ai", "anthropic"])
def test_a_saved_history_decided_in_another_process_after_10x_the_lease(
        store: SagaStore, env: dict[str, str], tmp_path: Path, framework: str) -> None:
    """Pydantic AI's ``DeferredToolRequests``, or an Anthropic loop whose ``approve``
    answers None: the run ends with its history saved; alice decides from another
    process, which resumes the run from that history."""
    pytest.importorskip(framework)
    module, call = f"tests.integrations.{framework}_resume", \
        {"pydantic_ai": "call", "anthropic": "toolu"}[framework]
    first = run(module, env, tmp_path, "gated", "-")
    sid = saga_id_for("shop", "order-1", f"{call}_1")
    assert first["sagas"] == [sid]
    assert first.get("deferred", first.get("parked")) == [f"{call}_inv"]
    assert kinds() == ["reserve"]
    assert store.redis.pttl(store.events.keys.driver(sid)) > 100 * CLIENT_LEASE_S * 1000
    time.sleep(10 * CLIENT_LEASE_S)  # the time that passes is the point: 10 leases
    assert store.state(sid).status is Status.RUNNING
    second = run(module, env, tmp_path, "approve", "Invoiced.")
    assert second["sagas"] == [sid]
    assert second["last"] == "Invoiced."
    assert final(store, sid).status is Status.COMMITTED
    assert decisions(store, sid) == [(K.APPROVAL_GRANTED, 1, "alice")]
    assert kinds() == ["reserve", "invoice"]
