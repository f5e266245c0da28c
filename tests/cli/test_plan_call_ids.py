"""Plan steps without a tool_call_id get ids no other saga's calls share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from saga_store.cli.main import cli

from saga_store.testing.workers import workers

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
TOOLS = "tests.ledger_tools"


def _ids(value: Any) -> list[str]:
    """Every call id in rebuilt OpenAI messages (each call's and each result's)."""
    if isinstance(value, dict):
        found = [v for k, v in value.items() if k in ("id", "tool_call_id")]
        return found + [i for v in value.values() for i in _ids(v)]
    if isinstance(value, list):
        return [i for v in value for i in _ids(v)]
    return []


def test_two_sagas_from_plans_without_ids_have_distinct_call_ids(
        redis_url: str, worker_env: dict[str, str], tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_bytes(orjson.dumps({"agent_id": "agent-c", "steps": [
        {"tool": "noop", "args": {"n": 1}}, {"tool": "noop", "args": {"n": 2}}]}))
    env = {"SAGA_REDIS_URL": redis_url, "SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": ""}
    runner = CliRunner()
    with workers(worker_env, TOOLS):
        for _ in range(2):
            res = runner.invoke(cli, ["run", "--tools", TOOLS, str(plan), "--wait"], env=env)
            assert res.exit_code == 0, res.output
    res = runner.invoke(cli, ["context", "--agent", "agent-c"], env=env)
    assert res.exit_code == 0, res.output
    calls = set(_ids(orjson.loads(res.output)))
    assert len(calls) == 4, calls  # 2 sagas x 2 steps, every id its own
    assert all(len(i) <= 40 for i in calls)
