"""'saga run' refuses a plan file holding NaN, Infinity, an integer beyond 2^53
or nesting past the limit: exit 2, a message naming the spot, nothing written.
Python's json would take NaN and huge integers; orjson would make 2^64 a float."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from click.testing import CliRunner
from saga_store.cli.main import cli

pytestmark = pytest.mark.real_redis
TOOLS = "tests.number_tools"


def plan(args: bytes, tool: bytes = b"keep") -> bytes:
    return b'{"agent_id": "agent-p", "steps": [{"tool": "' + tool + b'", "args": ' + args + b"}]}"


@pytest.mark.parametrize(("doc", "message"), [
    (plan(b'{"value": NaN}'), "NaN is not allowed in JSON"),
    (plan(b'{"value": [Infinity]}'), "Infinity is not allowed in JSON"),
    (plan(b'{"value": -Infinity}'), "-Infinity is not allowed in JSON"),
    (plan(b'{"value": 18446744073709551616}'),
     "plan.steps[0].args.value: integer 18446744073709551616 is beyond 2^53"),
    (plan(b'{"ratio": 18446744073709551616}', b"measure"),
     "plan.steps[0].args.ratio: integer 18446744073709551616 is beyond 2^53"),
    (plan(b'{"value": -9007199254740993}'), "integer -9007199254740993 is beyond 2^53"),
    (plan(b'{"value": ' + b"[" * 500 + b"]" * 500 + b"}"), "nested deeper than 32 levels"),
    (plan(b'{"value": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"), "nested too deeply"),
], ids=["nan", "infinity", "-infinity", "2^64", "2^64-for-a-float", "-2^53-1", "depth-500",
        "depth-10000"])
def test_a_plan_with_a_bad_number_or_depth_exits_2_and_writes_nothing(
        redis_url: str, client: redis.Redis, tmp_path: Path, doc: bytes,
        message: str) -> None:
    path = tmp_path / "plan.json"
    path.write_bytes(doc)
    before = client.dbsize()  # 0, or the layout the test's store is to have (ss:layout)
    res = CliRunner().invoke(cli, ["run", "--tools", TOOLS, str(path)],
                             env={"SAGA_REDIS_URL": redis_url, "SAGA_HMAC_KEY": "",
                                  "SAGA_HMAC_KEY_FILE": ""})
    assert res.exit_code == 2, res.output
    assert f"error: {path}: " in res.output
    assert message in res.output
    assert client.dbsize() == before
