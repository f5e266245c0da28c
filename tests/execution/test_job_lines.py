"""A worker's log line for a job says what the job is: its saga, step and tool (RQ
prints the job's description beside its id; it used to read ``None``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from saga_store import SagaStore
from saga_store.testing.workers import workers

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(60)]


def test_job_lines_name_the_saga_step_and_tool(saga_store: SagaStore,
                                               worker_env: dict[str, str], ledger: Path,
                                               tmp_path: Path) -> None:
    env = {**worker_env, "SAGA_EAGER_STEPS": "0"}  # every step through the queue
    sid = saga_store.submit([{"tool": "reserve_inventory", "args": {"sku": "J", "qty": 1}},
                             {"tool": "noop", "args": {"n": 1}}], agent_id="agent-j")
    log = tmp_path / "worker.log"
    with workers(env, "tests.ledger_tools", "--log-level", "INFO", log=log, kind="rq"):
        assert str(saga_store.wait(sid, timeout=30).status) == "committed"
    text = log.read_text()
    assert f"saga-steps: saga {sid} step 0 reserve_inventory (" in text, text[-2000:]
    assert f"saga-steps: saga {sid} step 1 noop (" in text, text[-2000:]
    assert ": None (" not in text
