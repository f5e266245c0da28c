"""'saga run --wait' says on stderr what the saga waits for as that changes (never
on --json's stdout), and gives up within half a second of --timeout."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from click.testing import CliRunner
from saga_store.cli.main import cli
from saga_store.cli.waiting import waiting_for

from saga_store.ops.fleet import serving
from saga_store.protocol.state import fold
from saga_store.testing import assert_eventually
from saga_store.testing.workers import workers

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
TOOLS = "tests.cli.wait_tools"
ROOT = Path(__file__).resolve().parents[2]
GATED = [{"tool": "look_up", "args": {"sku": "A"}}, {"tool": "ship", "args": {"sku": "A"}}]
UNDO_FAILS = [{"tool": "reserve", "args": {"sku": "B"}},
              {"tool": "refuse", "args": {"why": "the customer cancelled"}}]


class Waiting:
    """``saga run PLAN --wait`` in a process of its own, its stderr read as it comes."""

    def __init__(self, env: dict[str, str], plan: Path, *args: str) -> None:
        self.began = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "saga_store.cli.main", "run", "--tools", TOOLS,
             str(plan), "--wait", "--json", *args], env=env, cwd=ROOT,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: list[str] = []
        self.ended: float | None = None
        stderr = self.proc.stderr
        assert stderr is not None
        self.reader = threading.Thread(
            target=lambda: self.lines.extend(ln.decode() for ln in stderr), daemon=True)
        self.reader.start()

    def said(self, text: str) -> bool:
        return any(text in ln for ln in self.lines)

    def finish(self, timeout: float = 60) -> tuple[int, bytes]:
        assert self.proc.stdout is not None
        out = self.proc.stdout.read()
        self.proc.wait(timeout)
        self.ended = time.monotonic()
        self.reader.join(5)
        return self.proc.returncode, out


def _plan(tmp_path: Path, steps: list[dict[str, Any]]) -> Path:
    plan = tmp_path / "plan.json"
    plan.write_bytes(orjson.dumps({"agent_id": "shop", "steps": steps}))
    return plan


@pytest.fixture
def env(worker_env: dict[str, str]) -> dict[str, str]:
    return {**worker_env, "PYTHONPATH": str(ROOT)}


def _serving(env: dict[str, str], client: redis.Redis) -> None:
    assert_eventually(lambda: serving(client, "saga-steps"), timeout=30,
                      what="the worker to take jobs")


def test_a_step_held_for_approval_says_so_with_the_line_that_approves_it(
        env: dict[str, str], client: redis.Redis, tmp_path: Path) -> None:
    """The approve line is on stderr while it waits; once approved, stdout is the
    JSON outcome alone."""
    with workers(env, TOOLS):
        _serving(env, client)
        run = Waiting(env, _plan(tmp_path, GATED), "--timeout", "60")
        assert_eventually(lambda: run.said("waits for a person's approval: saga approve "),
                          timeout=30, what="the approval line")
        line = next(ln for ln in run.lines if "saga approve" in ln)
        sid = line.split()[1].rstrip(":")
        assert f"saga approve {sid} 1" in line
        # a wait that runs out says what holds the saga, not "is 'saga worker' running?"
        other = CliRunner().invoke(cli, ["run", "--tools", TOOLS, str(_plan(tmp_path, GATED)),
                                         "--wait", "--timeout", "5"],
                                   env={"SAGA_REDIS_URL": env["SAGA_REDIS_URL"]})
        assert other.exit_code == 7, other.output
        assert "(it waits: step 1 (ship) waits for a person's approval: saga approve" in \
            other.stderr
        res = CliRunner().invoke(cli, ["approve", sid, "1", "--by", "ops"],
                                 env={"SAGA_REDIS_URL": env["SAGA_REDIS_URL"]})
        assert res.exit_code == 0, res.output
        code, out = run.finish()
    assert code == 0, run.lines
    assert orjson.loads(out)["state"] == "committed"
    assert not run.said("is 'saga worker' running?")


def test_an_unwind_whose_undo_fails_says_it_retries_and_why(
        env: dict[str, str], client: redis.Redis, tmp_path: Path) -> None:
    """Compensating, each try of the undo, and each failure with its error, said
    once each as they come; the saga ends stuck (exit 6)."""
    with workers(env, TOOLS):
        _serving(env, client)
        run = Waiting(env, _plan(tmp_path, UNDO_FAILS), "--timeout", "60")
        code, out = run.finish()
    assert code == 6, run.lines
    assert orjson.loads(out)["state"] == "stuck"
    said = "".join(run.lines)
    assert "compensating (step 1: ValueError: the customer cancelled)" in said
    failed = [ln for ln in run.lines if "undoing step 0 (reserve) failed on try 1 "
              "(RuntimeError: the warehouse is offline); retrying" in ln]
    assert len(failed) == 1, run.lines  # printed as it changes, not on every round
    assert "undoing step 0 (reserve) (try 2)" in said


@pytest.mark.parametrize("timeout", [3.0, 5.0])
def test_the_wait_stops_within_half_a_second_of_its_timeout(
        env: dict[str, str], tmp_path: Path, timeout: float) -> None:
    """Counted from the command's start, as the person who typed it counts (no
    worker runs: the saga waits)."""
    run = Waiting(env, _plan(tmp_path, GATED), "--timeout", str(timeout))
    code, out = run.finish()
    assert run.ended is not None
    took = run.ended - run.began
    assert code == 7, run.lines
    assert out == b""
    assert timeout - 0.2 <= took <= timeout + 0.5, (took, run.lines)


def _events(*kinds: tuple[str, int | None, dict[str, Any] | None]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"kind": "saga_started", "seq": 0, "agent_id": "a"}]
    for i, (kind, step, data) in enumerate(kinds, start=1):
        ev: dict[str, Any] = {"kind": kind, "seq": i, "data": data}
        if step is not None:
            ev["step"] = step
            ev["tool"] = "charge"
        out.append(ev)
    return out


def test_a_redelivered_step_and_a_step_in_doubt_are_named() -> None:
    """Without Redis: the fold of a log says which step, and why."""
    again = fold("a_1", _events(("step_intent", 0, {"args": {}}), ("step_started", 0, None),
                                ("step_started", 0, None)))
    assert waiting_for(again) == ("step 0 (charge) is retrying (attempt 2): the last "
                                  "delivery did not finish")
    doubt = fold("a_1", _events(("step_intent", 0, {"args": {}}), ("step_started", 0, None),
                                ("step_in_doubt", 0, {"error": "timed out"})))
    assert waiting_for(doubt) == "step 0 (charge) is in doubt (timed out); its probe decides"
    running = fold("a_1", _events(("step_intent", 0, {"args": {}}), ("step_started", 0, None)))
    assert waiting_for(running) is None
