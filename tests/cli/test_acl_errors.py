"""A command an agent's ACL user may not run says so in the user's terms: what
that user may do instead, with the flag that does it; never a raw Redis error or
an internal key's name."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner, Result
from saga_store.cli.main import cli

from saga_store.testing import RedisServer

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(60)]
TOOLS = "tests.cli.wait_tools"


def saga(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--redis-url", url, *args],
                              env={"SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": ""})


@pytest.fixture(scope="module")
def agent() -> Iterator[tuple[str, str, str]]:
    """The admin's URL, the URL of the user 'saga acl agent --agent shop' makes, and
    one saga of that agent (beside one of another agent)."""
    with RedisServer() as srv:
        line = saga(srv.url, "acl", "agent", "--agent", "shop")
        assert line.exit_code == 0, line.output
        for cmd in (line.output, "ACL SETUSER shop >s-pass\n"):
            out = subprocess.run(["redis-cli", "-p", str(srv.port)], input=cmd, text=True,
                                 capture_output=True, timeout=30, check=True)
            assert out.stdout.strip() == "OK", out.stdout + out.stderr
        plan = Path(srv.dir) / "plan.json"
        plan.write_bytes(orjson.dumps({"agent_id": "shop", "steps": [
            {"tool": "look_up", "args": {"sku": "A"}}]}))
        sid = saga(srv.url, "run", "--tools", TOOLS, str(plan)).output.strip()
        plan.write_bytes(orjson.dumps({"agent_id": "other", "steps": [
            {"tool": "look_up", "args": {"sku": "B"}}]}))
        assert saga(srv.url, "run", "--tools", TOOLS, str(plan)).exit_code == 0
        yield srv.url, f"redis://shop:s-pass@127.0.0.1:{srv.port}/0", sid


def _refused(res: Result) -> str:
    assert res.exit_code == 3, res.output
    text = res.stderr
    assert "no permissions" not in text
    assert "ss:" not in text  # no internal key names
    assert "Traceback" not in text
    return text


def test_ls_names_the_agent_flag_that_works(agent: tuple[str, str, str]) -> None:
    _, url, sid = agent
    text = _refused(saga(url, "ls"))
    assert "may not use a key this command needs (Redis ACL)" in text
    assert "saga ls --agent AGENT_ID" in text
    mine = saga(url, "ls", "--agent", "shop")
    assert mine.exit_code == 0, mine.output
    assert sid in mine.output


def test_verify_of_its_own_saga_says_which_user_can(agent: tuple[str, str, str]) -> None:
    _, url, sid = agent
    text = _refused(saga(url, "verify", "--saga", sid))
    assert "verify as the worker's user ('saga acl worker')" in text


def test_a_whole_store_command_says_it_needs_another_user(
        agent: tuple[str, str, str]) -> None:
    _, url, _ = agent
    text = _refused(saga(url, "approvals"))
    assert "'saga approvals' reads the whole store: run it as the worker's Redis user" in text
