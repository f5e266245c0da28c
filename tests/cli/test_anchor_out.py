"""'saga anchor --out' into a folder that is not there is the caller's to fix:
exit 2 with what to do, no traceback, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from saga_store.cli.main import cli

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(60)]


def test_anchor_out_to_a_missing_folder_exits_2_and_says_how(redis_url: str,
                                                            tmp_path: Path) -> None:
    target = tmp_path / "var-lib-saga" / "anchor.json"
    res = CliRunner().invoke(cli, ["--redis-url", redis_url, "anchor", "--out", str(target)],
                             env={"SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": ""})
    assert res.exit_code == 2, res.output
    assert f"mkdir -p {target.parent}" in res.stderr
    assert "StateDirectory=" in res.stderr
    assert "Traceback" not in res.output
    assert not target.parent.exists()
    target.parent.mkdir()
    res = CliRunner().invoke(cli, ["--redis-url", redis_url, "anchor", "--out", str(target)],
                             env={"SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": ""})
    assert res.exit_code == 0, res.output
    assert target.read_bytes().startswith(b"{")
