"""'saga worker' logs one line at start: where it works (the password redacted),
its queues, its tools module and its policy."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from saga_store.testing import RedisServer

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(60)]
ROOT = Path(__file__).resolve().parents[2]


def test_the_start_line_names_url_queues_tools_and_policy(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[defaults]\nreadonly = "allow"\n')
    with RedisServer() as srv:
        redis.Redis(port=srv.port).acl_setuser("runner", enabled=True, passwords=["+s3cret-pw"],
                                               keys=["*"], channels=["*"], commands=["+@all"])
        url = f"redis://runner:s3cret-pw@127.0.0.1:{srv.port}/0"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "SAGA_REDIS_URL": url,
               "SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": ""}
        done = subprocess.run(
            [sys.executable, "-P", "-m", "saga_store.cli.main", "worker", "--burst",
             "--tools", "tests.cli.wait_tools", "--queues", "saga-steps",
             "--policy", str(policy)], env=env, cwd=ROOT, capture_output=True, text=True,
            timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "s3cret-pw" not in done.stderr
    start = [ln for ln in done.stderr.splitlines() if "saga worker: " in ln]
    assert len(start) == 1, done.stderr
    assert (f"saga worker: 1 RQ process on redis://runner:***@127.0.0.1:{srv.port}/0, queues "
            f"saga-steps, tools tests.cli.wait_tools, policy {policy}") in start[0]


def test_a_burst_worker_on_empty_queues_exits_at_once(redis_url: str) -> None:
    """RQ's pubsub thread waited up to 60 s after the unsubscribe, and stopping the
    worker joins it: about one exit in three took a minute. Five in a row now take
    seconds each."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SAGA_REDIS_URL": redis_url,
           "SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": ""}
    for _ in range(5):
        began = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-P", "-m", "saga_store.cli.main", "worker", "--burst",
             "--tools", "tests.cli.wait_tools"], env=env, cwd=ROOT, capture_output=True,
            text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert time.monotonic() - began < 15, done.stderr
