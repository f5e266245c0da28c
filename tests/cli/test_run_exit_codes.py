"""'saga run --wait' says in its exit code how the saga ended, and why a step failed."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import redis
from click.testing import CliRunner
from saga_store.cli.main import cli

from saga_store.ops.fleet import serving
from saga_store.testing import assert_eventually
from saga_store.testing.workers import workers

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
TOOLS = "tests.ledger_tools"
RESERVE = {"tool": "reserve_inventory", "args": {"sku": "A", "qty": 1}}
FAIL = {"tool": "fail_always", "args": {"why": "the CRM said no"}}


# how each of 'saga run --wait''s saga exit codes comes about (README, CLI)
RUN_CASES = [
    ([RESERVE], 0, "committed"),
    ([RESERVE, FAIL], 4, "compensated"),
    ([{"tool": "send_email", "args": {"to": "a@b"}}, FAIL], 5, "needs_attention"),
    ([{"tool": "reserve_forgetful", "args": {"sku": "B"}}, FAIL], 6, "stuck"),
]
TIMEOUT_CODE = 7  # test_a_wait_that_runs_out_is_exit_7_and_says_the_saga_goes_on


@pytest.mark.parametrize(("steps", "code", "state"), RUN_CASES,
                         ids=["committed", "compensated", "needs-attention", "stuck"])
def test_the_exit_code_names_how_the_saga_ended(
        redis_url: str, worker_env: dict[str, str], ledger: Path, tmp_path: Path,
        steps: list[dict[str, object]], code: int, state: str) -> None:
    plan = tmp_path / "plan.json"
    plan.write_bytes(orjson.dumps({"agent_id": "agent-x", "steps": steps}))
    env = {"SAGA_REDIS_URL": redis_url, "SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": ""}
    with workers(worker_env, TOOLS):
        # a worker that is up (registered with RQ): one still starting is not
        assert_eventually(lambda: serving(redis.Redis.from_url(redis_url)), timeout=30,
                          what="the worker to register")
        res = CliRunner().invoke(cli, ["run", "--tools", TOOLS, str(plan), "--wait"], env=env)
    assert res.exit_code == code, res.output
    assert f" {state}" in res.output
    assert "no worker is taking jobs" not in res.output  # a live worker: no warning
    if code:
        assert "the CRM said no" in res.output  # the failed step's reason


def test_a_wait_that_runs_out_is_exit_7_and_says_the_saga_goes_on(
        redis_url: str, tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_bytes(orjson.dumps({"agent_id": "agent-x", "steps": [RESERVE]}))
    res = CliRunner().invoke(cli, ["run", "--tools", TOOLS, str(plan), "--wait", "--timeout",
                                   "0.5"],
                             env={"SAGA_REDIS_URL": redis_url, "SAGA_HMAC_KEY": ""})
    assert res.exit_code == TIMEOUT_CODE, res.output
    assert "it goes on" in res.output
