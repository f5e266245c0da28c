"""``saga archive`` SIGKILLed between the writes of a ledger cut (the ledger
segment and the manifest; the manifest and the cuts; one chain's cut and the
next): the store verifies at once, and the next run finishes, every ledger
entry then in Redis or in exactly one archived prefix, never both, never
neither."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import redis
from click.testing import CliRunner
from saga_store.cli.main import cli

from saga_store import keys
from saga_store.log.ledger import Ledger
from saga_store.log.ledger_cut import parse_base
from saga_store.log.store import EventStore
from saga_store.verify.checker import Verifier

from ..helpers import committed_saga
from .test_archive_kill import env_of

pytestmark = [pytest.mark.real_redis, pytest.mark.layout(None)]
CHAINS = [f"ledger:{b}" for b in range(4)]


@pytest.fixture(autouse=True)
def four_chains(client: redis.Redis, store: EventStore) -> None:
    client.set(keys.LAYOUT, "3 4")
    store.log.forget_layout()


def archived_entries(folder: Path) -> dict[str, list[int]]:
    """Each chain's seqs the listed ledger segments hold."""
    out: dict[str, list[int]] = {}
    for path in sorted(folder.glob("manifest-*.json")):
        for ls in orjson.loads(path.read_bytes()).get("ledger_segments", []):
            for line in gzip.decompress((folder / ls["name"]).read_bytes()).splitlines():
                row = orjson.loads(line)
                out.setdefault(row["chain"], []).append(row["seq"])
    return out


def check_each_entry_once(client: redis.Redis, folder: Path) -> int:
    """Every chain's entries 0 .. head are in Redis or archived, each once; returns
    how many are archived."""
    archived = archived_entries(folder)
    for c in CHAINS:
        here = [keys.seq_of_entry_id(eid) for eid, _ in client.xrange(keys.ledger_log(c))]
        both = sorted(archived.get(c, []) + here)
        assert both == list(range(len(both))), (c, archived.get(c), here)
        base = parse_base(client.get(keys.ledger_base(c)))
        assert base.seq == max(archived.get(c, [-1])), c
    return sum(map(len, archived.values()))


@pytest.mark.parametrize(("point", "at"), [("archive_after_ledger_segment", 1),
                                           ("archive_after_manifest", 1),
                                           ("archive_cut_recorded", 1),
                                           ("archive_cutting", 1)])
def test_a_run_killed_around_a_ledger_cut_is_finished_by_the_next(
        client: redis.Redis, store: EventStore, redis_url: str, tmp_path: Path,
        point: str, at: int) -> None:
    folder = tmp_path / "archive"
    env = env_of(redis_url)
    for _ in range(12):
        committed_saga(store, steps=1)
    args = ["archive", "--closed-before", "0s", "--batch", "1", "--to", str(folder)]
    assert CliRunner().invoke(cli, args, env=env).exit_code == 0
    Ledger(store.log).record_root()
    for _ in range(12):  # after the recorded heads, so no cut is a chain's last entry
        committed_saga(store, steps=1)
    Ledger(store.log).flush()
    flag = tmp_path / "fault-once"
    flag.touch()
    run = subprocess.run(
        [sys.executable, "-m", "saga_store.cli.main", *args],
        env={**env, "SAGA_FAULT": point, "SAGA_FAULT_AT": str(at),
             "SAGA_FAULT_ONCE": str(flag)},
        capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == -9, run.stdout + run.stderr
    result = Verifier(store.log).verify()
    assert result.ok, [f.to_dict() for f in result.failures]
    again = CliRunner().invoke(cli, args, env=env)
    assert again.exit_code == 0, again.output
    assert check_each_entry_once(client, folder) > 0
    result = Verifier(store.log).verify()
    assert result.ok, [f.to_dict() for f in result.failures]
    out = CliRunner().invoke(cli, ["verify", "--archive", str(folder), "--with-store"],
                             env=env)
    assert out.exit_code == 0, out.output
