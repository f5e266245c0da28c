"""A broken tools module or a malformed plan is one line in the user's terms, exit 2."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from saga_store.cli.main import cli

PLAN = '{"agent_id": "a", "steps": [{"tool": "look", "args": {}}]}'


@pytest.mark.parametrize(("source", "says", "at_line"), [
    ("def look(:\n", "does not compile: invalid syntax", True),
    ("import not_installed_anywhere_xyz\n", "No module named 'not_installed_anywhere_xyz'",
     False),
    ("raise RuntimeError('DATABASE_URL is not set')\n",
     "RuntimeError: DATABASE_URL is not set", True),
], ids=["syntax-error", "import-error", "raises-at-import"])
def test_a_broken_tools_module_is_one_line_naming_the_problem(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, says: str, at_line: bool,
        request: pytest.FixtureRequest) -> None:
    name = f"broken_tools_{request.node.callspec.id.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(source)
    (tmp_path / "plan.json").write_text(PLAN)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    for args in (["run", "--tools", name, "plan.json"], ["worker", "--tools", name]):
        # no Redis is needed to find out: nothing is asked of it
        res = CliRunner().invoke(cli, args, env={"SAGA_REDIS_URL": "redis://127.0.0.1:1/0"})
        assert res.exit_code == 2, res.output
        assert res.output.count("\n") == 1, res.output
        assert res.output.startswith(f"error: tools module {name!r}")
        assert says in res.output
        if at_line:
            assert f"{name}.py, line 1" in res.output


def test_a_missing_tools_module_says_where_it_looked(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "plan.json").write_text(PLAN)
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(cli, ["run", "--tools", "no_such_tools", "plan.json"],
                             env={"SAGA_REDIS_URL": "redis://127.0.0.1:1/0"})
    assert res.exit_code == 2, res.output
    assert "no tools module 'no_such_tools'" in res.output
    assert "current folder" in res.output


@pytest.mark.parametrize(("plan", "says"), [
    ('["reserve"]', "a plan is a JSON object"),
    ('{"agent_id": "a", "steps": [{"tool": "t", "args": [1]}]}', "steps[0].args must be a "
                                                                 "JSON object"),
    ('{"steps": [{"tool": "t"}]}', "agent_id is missing"),
    ('{"agent_id": "a", "steps": []}', "steps must hold at least one step"),
    ('{"agent_id": "a", "steps": [{"tool": "t", "arg": {}}]}', "steps[0].arg is not a plan "
                                                               "field"),
    ('{"agent_id": 7, "steps": [{"tool": "t"}]}', "agent_id must be a"),
], ids=["not-an-object", "args-not-an-object", "no-agent", "no-steps", "unknown-field",
        "agent-not-a-string"])
def test_a_malformed_plan_is_explained_in_plan_terms(tmp_path: Path, plan: str,
                                                     says: str) -> None:
    path = tmp_path / "plan.json"
    path.write_text(plan)
    res = CliRunner().invoke(cli, ["run", "--tools", "tests.ledger_tools", str(path)],
                             env={"SAGA_REDIS_URL": "redis://127.0.0.1:1/0"})
    assert res.exit_code == 2, res.output
    assert says in res.output
    for internal in ("Input should be", "dictionary", "instance of", "pydantic",
                     "validation", "[type=", "Plan"):
        assert internal not in res.output, res.output
