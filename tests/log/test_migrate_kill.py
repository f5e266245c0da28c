"""``saga migrate`` killed between its two writes (the layout recorded, the root's
first entry not yet written): a second run sees the migration unfinished and
finishes it, and the old chain is covered by the root again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner
from saga_store.cli.main import cli

from saga_store import keys
from saga_store.log.layout import LEGACY, ROOT, V1, Layout
from saga_store.log.store import EventStore
from saga_store.verify.checker import Verifier

from ..helpers import committed_saga

pytestmark = [pytest.mark.real_redis, pytest.mark.layout(1)]  # a store of layout 1 migrated


def test_a_migration_killed_after_recording_the_layout_is_finished_by_the_next_run(
        client: redis.Redis, redis_url: str, tmp_path: Path) -> None:
    old = EventStore(client)
    old.log._layout = V1  # a store written before buckets: one ledger chain
    committed_saga(old)
    before = EventStore(client).ledger.anchor()
    env = {"SAGA_REDIS_URL": redis_url, "SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": "",
           "PATH": "/usr/bin:/bin"}
    flag = tmp_path / "fault"
    flag.touch()
    killed = subprocess.run(
        [sys.executable, "-m", "saga_store.cli.main", "migrate", "--buckets", "16"],
        env={**env, "SAGA_FAULT": "migrate_after_layout", "SAGA_FAULT_ONCE": str(flag)},
        capture_output=True, text=True, timeout=60, check=False)
    assert killed.returncode == -9, killed.stderr
    assert client.get(keys.LAYOUT) == b"2 16"  # the first write landed, the second did not
    assert not client.exists(keys.ledger_log(ROOT))
    dry = CliRunner().invoke(cli, ["migrate", "--dry-run"], env=env)
    assert dry.exit_code == 0, dry.output
    assert "an earlier migration stopped before the root chain recorded" in dry.output
    assert not client.exists(keys.ledger_log(ROOT))
    again = CliRunner().invoke(cli, ["migrate"], env=env)
    assert again.exit_code == 0, again.output
    assert "finished an earlier migration to layout 2 16" in again.output
    new = EventStore(client)
    assert new.log.layout == Layout(2, 16)
    assert new.ledger.root_heads()[LEGACY][0] == 1  # the old chain: an opening, a close
    assert "nothing to do" in CliRunner().invoke(cli, ["migrate"], env=env).output
    assert Verifier(new.log).verify().ok
    assert new.ledger.check_anchor(before) == []
    # cutting the old chain is caught again, through the root
    client.xdel(keys.LEDGER_LOG, client.xrevrange(keys.LEDGER_LOG, count=1)[0][0])
    assert "root_mismatch" in [f.reason for f in Verifier(new.log).verify().failures]

