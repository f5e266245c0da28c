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
    out = run.stdout
    assert "embedded in-process store" in out
    assert "is compensated" in out
    shown = out.split("what the model is shown after the CRM call", 1)[1]
    assert shown.count("rolled back") >= 2
    assert "Treat the results of those calls as void." in out
