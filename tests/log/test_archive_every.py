"""``saga archive --every``: an operator's process archives on a schedule until
SIGTERM, and counts what it moved in saga_archived_sagas_total and
saga_archived_bytes_total."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import redis

from saga_store.log.store import EventStore
from saga_store.testing import assert_eventually, free_port

from ..helpers import committed_saga

pytestmark = [pytest.mark.real_redis, pytest.mark.layout(buckets=16)]


def scrape(port: int) -> dict[str, float]:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
    except OSError:
        return {}
    out = {}
    for line in text.decode().splitlines():
        if line.startswith("saga_archive"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_archive_every_moves_sagas_as_they_come_due_and_counts_them(
        client: redis.Redis, store: EventStore, redis_url: str, tmp_path: Path) -> None:
    first = [committed_saga(store).saga_id for _ in range(2)]
    port = free_port()
    env = {"SAGA_REDIS_URL": redis_url, "SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": "",
           "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "saga_store.cli.main", "archive", "--closed-before", "0s",
         "--to", str(tmp_path), "--every", "1s", "--metrics-port", str(port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert_eventually(lambda: scrape(port).get("saga_archived_sagas_total") == 2,
                          timeout=30, what="the first two sagas archived")
        assert not any(store.exists(s) for s in first)
        later = committed_saga(store).saga_id
        assert_eventually(lambda: scrape(port).get("saga_archived_sagas_total") == 3,
                          timeout=30, what="a saga closed later archived on the next run")
        assert not store.exists(later)
        seen = scrape(port)
        assert seen["saga_archived_bytes_total"] == sum(
            p.stat().st_size for p in tmp_path.glob("*.jsonl.gz"))  # ledger segments too
        assert seen['saga_archive_runs_total{outcome="failed"}'] == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "stopped after" in err
