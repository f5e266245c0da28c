"""A framework resumes from its own checkpoint in a new process after the first
was SIGKILLed mid-step: the calls it sends again are answered from the saga's
log (attached, not opened anew), every effect happens once, and the model is
shown what is true now."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from saga_store import SagaStore, Status
from saga_store.integrations._session import saga_id_for
from saga_store.log.events import EventKind as K
from saga_store.protocol.vocab import StepStatus
from saga_store.testing.workers import kill_at, workers

from ..integration_support import TOOLS, final, kinds

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(180)]


def agent_env(worker_env: dict[str, str]) -> dict[str, str]:
    # a long client lease: the test lapses it itself once the step is done
    return {**worker_env, "SAGA_CLIENT_LEASE_S": "60"}


# each: the agent's module (run as a process), what it needs, its first call's id
FRAMEWORKS = {
    "langgraph": ("tests.integrations.langgraph_resume", "langgraph.checkpoint.sqlite",
                  "call_1"),
    "anthropic": ("tests.integrations.anthropic_resume", "anthropic", "toolu_1"),
    "pydantic_ai": ("tests.integrations.pydantic_ai_resume", "pydantic_ai", "call_1"),
    "openai_agents": ("tests.integrations.openai_session_resume", "agents", "call_1"),
}


def agent_argv(framework: str, tmp: Path, mode: str, out: Path, text: str) -> list[str]:
    pytest.importorskip(FRAMEWORKS[framework][1])
    return [sys.executable, "-m", FRAMEWORKS[framework][0], str(tmp / "state.db")
            if framework == "langgraph" else str(tmp), mode, str(out), text]


def run_agent(framework: str, env: dict[str, str], tmp: Path, mode: str,
              final_text: str) -> dict[str, Any]:
    out = tmp / f"{mode}.json"
    subprocess.run(agent_argv(framework, tmp, mode, out, final_text), env=env, check=True,
                   timeout=120)
    return dict(json.loads(out.read_text()))


def kill_mid_charge(framework: str, store: SagaStore, env: dict[str, str], tmp: Path) -> str:
    """Start the agent; a worker dies right after charge's step_started (before the
    tool), the agent is SIGKILLed while it waits on charge; returns the saga id."""
    sid = saga_id_for("shop", "order-1", FRAMEWORKS[framework][2])  # the session names it so
    agent = subprocess.Popen(agent_argv(framework, tmp, "first", tmp / "x.json", "-"),
                             env=env, start_new_session=True)
    try:
        kill_at(env, TOOLS, "after_started", tmp, at=2)  # reserve, then charge
        st = store.state(sid)
        assert st.steps[1].tool == "charge_payment"
        assert st.steps[1].status is StepStatus.STARTED
        assert agent.poll() is None  # still waiting on charge's outcome
    finally:
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait()
    return str(sid)


def charge_done(store: SagaStore, sid: str) -> None:
    state = store.state(sid)
    store.follow(state, lambda s: s.steps[1].finished, timeout=60)


@pytest.mark.parametrize("unwound", [True, False], ids=["unwound-first", "resumed-in-time"])
@pytest.mark.parametrize("framework", list(FRAMEWORKS))
def test_a_framework_resumes_from_its_own_state_into_the_same_saga(
        store: SagaStore, worker_env: dict[str, str], tmp_path: Path, unwound: bool,
        framework: str) -> None:
    env = agent_env(worker_env)
    first, second = FRAMEWORKS[framework][2], FRAMEWORKS[framework][2][:-1] + "2"
    sid = kill_mid_charge(framework, store, env, tmp_path)
    with workers(env, TOOLS):
        charge_done(store, sid)  # a worker redelivered charge and ran it
        if unwound:  # the dead agent's client lease lapses: the sweeper unwinds
            store.redis.delete(store.events.keys.driver(sid))
            assert final(store, sid).status is Status.COMPENSATED
            assert kinds() == ["reserve", "charge", "refund", "release"]
        text = "Nothing is booked." if unwound else "Ordered."
        out = run_agent(framework, env, tmp_path, "resume", text)
        state = final(store, sid)
    assert out["sagas"] == [sid]  # attached, never a second saga
    assert out["last"] == text
    seen = {m["tool_call_id"]: m["content"] for m in out["received"][0]
            if m["type"] == "ToolMessage"}
    if unwound:
        assert state.status is Status.COMPENSATED
        assert seen[first].startswith("rolled back:")
        assert seen[second].startswith("rolled back:")
        # the closing note: a note of its own, or in the re-sent call's result
        assert any(f"Saga {sid} is compensated" in m["content"] for m in out["received"][0])
        assert kinds() == ["reserve", "charge", "refund", "release"]
    else:
        assert state.status is Status.COMMITTED
        assert "payment confirmed" in seen[second]
        assert kinds() == ["reserve", "charge"]
    # the resume sent call_2 again: answered from the log, no new intent
    intents = [e for e in store.events.log.bodies(sid) if e["kind"] == K.STEP_INTENT]
    assert [e["tool_call_id"] for e in intents] == [first, second]
