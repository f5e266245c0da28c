"""``saga archive`` SIGKILLed between any two of its writes that are not one
script (a segment and the next, the last segment and the manifest, the manifest
and the removals, one batch of removals and the next, and again while a rerun
finishes an earlier run's removals): the store verifies at once, no saga is
gone without its segment and tombstone, and the next run finishes the job with
every saga archived exactly once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import redis
from click.testing import CliRunner
from saga_store.cli.main import cli

from saga_store.log.events import EventKind as K
from saga_store.log.ledger import Ledger
from saga_store.log.segments import file_digest
from saga_store.log.store import EventStore
from saga_store.verify.checker import Verifier

from ..helpers import committed_saga

pytestmark = [pytest.mark.real_redis, pytest.mark.layout(buckets=16)]
ARGS = ["archive", "--closed-before", "0s", "--batch", "2", "--per-segment", "2", "--to"]


def env_of(redis_url: str) -> dict[str, str]:
    return {"SAGA_REDIS_URL": redis_url, "SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": "",
            "PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def killed_at(redis_url: str, folder: Path, tmp_path: Path, point: str, at: int) -> None:
    flag = tmp_path / f"fault-{point}-{at}"
    flag.touch()
    run = subprocess.run(
        [sys.executable, "-m", "saga_store.cli.main", *ARGS, str(folder)],
        env={**env_of(redis_url), "SAGA_FAULT": point, "SAGA_FAULT_AT": str(at),
             "SAGA_FAULT_ONCE": str(flag)},
        capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == -9, run.stdout + run.stderr


def listed(folder: Path) -> dict[str, list[str]]:
    """Each saga the manifests list, with the digests of the segments listing it."""
    out: dict[str, list[str]] = {}
    for path in sorted(folder.glob("manifest-*.json")):
        doc = orjson.loads(path.read_bytes())
        digests = {s["name"]: s["sha256"] for s in doc["segments"]}
        for s in doc["sagas"]:
            out.setdefault(s["saga_id"], []).append(digests[s["segment"]])
    return out


def tombstones(store: EventStore) -> dict[str, list[str]]:
    ledger = Ledger(store.log)
    out: dict[str, list[str]] = {}
    for b in [*ledger.bodies(), *ledger.pending()]:
        if b["kind"] == K.LEDGER_ARCHIVED:
            out.setdefault(b["data"]["saga_id"], []).append(b["data"]["segment"])
    return out


def check_nothing_lost(store: EventStore, folder: Path, closed: list[str]) -> None:
    """Every closed saga is in Redis, or gone with a tombstone naming a segment on
    disk that a manifest lists; and the store verifies."""
    stones, where = tombstones(store), listed(folder)
    on_disk = {file_digest(p) for p in folder.glob("seg-*.jsonl.gz")}
    for sid in closed:
        if not store.exists(sid):
            assert len(stones.get(sid, [])) == 1, sid
            assert stones[sid][0] in where[sid], sid
            assert stones[sid][0] in on_disk, sid
    result = Verifier(store.log).verify()
    assert result.ok, [f.to_dict() for f in result.failures]


@pytest.mark.parametrize(("point", "at"), [("archive_after_segment", 2),
                                           ("archive_after_manifest", 1),
                                           ("archive_removing", 1),
                                           ("archive_removing", 2),
                                           ("archive_removing", 3)])
def test_a_killed_archive_run_is_finished_by_the_next(
        client: redis.Redis, store: EventStore, redis_url: str, tmp_path: Path,
        point: str, at: int) -> None:
    closed = [committed_saga(store, steps=1).saga_id for _ in range(5)]
    running = store.open("agent-1", conversation_id="conv-1").saga_id
    folder = tmp_path / "archive"
    killed_at(redis_url, folder, tmp_path, point, at)
    check_nothing_lost(store, folder, closed)
    if point == "archive_removing":  # the first `at` batches of two went, the rest stayed
        assert sum(not store.exists(s) for s in closed) == min(2 * at, 5)
    else:
        assert all(store.exists(s) for s in closed)
    if point == "archive_after_manifest":  # the rerun is killed too, finishing the first
        killed_at(redis_url, folder, tmp_path, "archive_removing", 1)
        check_nothing_lost(store, folder, closed)
    again = CliRunner().invoke(cli, [*ARGS, str(folder)], env=env_of(redis_url))
    assert again.exit_code == 0, again.output
    check_nothing_lost(store, folder, closed)
    assert not any(store.exists(s) for s in closed)
    assert store.exists(running)
    where, stones = listed(folder), tombstones(store)
    assert sorted(where) == sorted(closed)
    assert all(len(where[s]) == 1 and stones[s] == where[s] for s in closed)
    offline = CliRunner().invoke(cli, ["verify", "--archive", str(folder), "--with-store"],
                                 env=env_of(redis_url))
    assert offline.exit_code == 0, offline.output
    assert "warning" not in offline.output
