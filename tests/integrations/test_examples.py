"""The framework examples run offline, end to end, on the embedded store: each
agent's order is rolled back and the agent says so."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = [("openai_agents_shop", "agents"), ("pydantic_ai_shop", "pydantic_ai"),
            ("langgraph_shop", "langgraph"), ("anthropic_shop", "anthropic")]
OFFLINE = ("SAGA_REDIS_URL", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "SAGA_EXAMPLE_MODEL")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("module", "framework"), EXAMPLES)
def test_the_example_rolls_the_order_back_offline(module: str, framework: str) -> None:
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} is not installed (its saga-store extra)")
    env = {k: v for k, v in os.environ.items() if k not in OFFLINE}
    run = subprocess.run([sys.executable, "-m", f"examples.{module}"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=100, check=False)
    assert run.returncode == 0, run.stderr
    out = " ".join(run.stdout.split())  # the text as read, whatever its line breaks
    assert "embedded in-process store" in out
    assert "is compensated" in out
    shown = out.split("what the model is shown after the CRM call", 1)[1]
    assert shown.count("rolled back") >= 2
    assert "Treat the results of those calls as void." in out
    # the story is told in sentences: none cut short, no worker warning in between
    assert shown.count("Its earlier result no longer holds.") >= 2
    assert "..." not in out
    assert "cannot be stopped" not in run.stdout + run.stderr


@pytest.mark.timeout(120)
def test_the_shop_client_driver_runs_on_the_embedded_store() -> None:
    """examples.shop_client: its plan commits; its declined order rolls back and the
    agent's history says so."""
    env = {k: v for k, v in os.environ.items() if k not in OFFLINE}
    run = subprocess.run([sys.executable, "-m", "examples.shop_client"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=100, check=False)
    assert run.returncode == 0, run.stderr
    assert "embedded in-process store" in run.stdout
    assert "plan order.json: saga shop-bot_" in run.stdout
    assert " is committed" in run.stdout
    assert " is compensated" in run.stdout
    assert "the agent sees reserve_inventory: retracted" in run.stdout


@pytest.mark.real_redis
@pytest.mark.timeout(120)
def test_the_example_plans_run_with_saga_run_under_the_example_policy(
        redis_url: str, worker_env: dict[str, str]) -> None:
    """saga run --wait of each example plan, with a worker on the example tools and
    policy: the order commits (0), the declined one compensates (4)."""
    from click.testing import CliRunner
    from saga_store.cli.main import cli

    from saga_store.testing.workers import workers
    env = {"SAGA_REDIS_URL": redis_url, "SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": ""}
    with workers(worker_env, "examples.shop_tools", "--policy",
                 str(ROOT / "examples" / "policy.toml")):
        for plan, code in (("order.json", 0), ("declined.json", 4)):
            res = CliRunner().invoke(cli, ["run", "--tools", "examples.shop_tools",
                                           str(ROOT / "examples" / "plans" / plan), "--wait"],
                                     env=env)
            assert res.exit_code == code, (plan, res.output)
    assert "card declined" in res.output


def test_the_example_tools_map_classifies_the_memory_servers_tools() -> None:
    from saga_store.mcp.classify import load_tools_map
    found = load_tools_map(ROOT / "examples" / "tools-map.toml")
    assert found["create_relations"].compensation is not None
    assert found["read_graph"].reversibility == "readonly"
