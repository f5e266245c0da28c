"""Clients on hosts whose clocks disagree with Redis's: when the sweeper first
looks at a saga is set by Redis's clock, never by the submitting host's."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from saga_store import SagaStore
from saga_store.protocol.state import Status
from saga_store.testing.workers import kill_at, workers

from ..ledger_tools import effects

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(60)]
TOOLS = "tests.ledger_tools"
AHEAD_NS = 600 * 10**9  # the submitting host's clock, ten minutes ahead
PLAN = [{"tool": "reserve_inventory", "args": {"sku": "A", "qty": 1}}]


def test_a_plan_submitted_from_a_host_whose_clock_runs_ahead_is_swept_in_time(
        saga_store: SagaStore, worker_env: dict[str, str], ledger: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan submitted by a client whose clock runs ten minutes ahead, its worker
    killed inside the tool: the next worker's sweeper redelivers the step within
    seconds, not ten minutes later, and the reservation is made once."""
    real = time.time_ns
    with monkeypatch.context() as m:
        m.setattr(time, "time_ns", lambda: real() + AHEAD_NS)
        sid = saga_store.submit(PLAN, agent_id="agent-a")
    kill_at(worker_env, TOOLS, "in_tool", tmp_path)
    with workers(worker_env, TOOLS):
        assert saga_store.wait(sid, timeout=20).status is Status.COMMITTED
    assert len(effects("reserve")) == 1
