"""``saga migrate --to 3``: a store of layout 2 moved to layout 3, its sagas'
keys renamed under their buckets' tags and its shared indexes split by bucket,
every chain and anchor as it was; a run killed between its writes is finished
by the next; refused while a worker is alive."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner
from saga_store.cli.main import cli

from saga_store import keys
from saga_store.approval import requests as approvals
from saga_store.execution.enqueue import in_flight
from saga_store.log.events import EventKind as K
from saga_store.log.layout import Layout
from saga_store.log.store import EventStore
from saga_store.settings import Settings
from saga_store.verify.checker import Verifier

from ..helpers import committed_saga

pytestmark = [pytest.mark.real_redis, pytest.mark.layout(None)]
OLD = keys.SagaKeys(2, 16)


def _old_store(client: redis.Redis) -> dict[str, str]:
    """A store of layout 2 with a saga of each kind: committed, with a blob, in
    flight, waiting for an approval, needing attention, an agent's, one with
    secrets; returns their ids by kind."""
    store = EventStore(client, Settings(layout=2, buckets=16, blob_threshold=1024))
    assert store.log.layout == Layout(2, 16)
    ids = {"committed": committed_saga(store).saga_id}
    w = store.open("agent-x", saga_id="order-blob")  # in no agent's namespace
    w.append(K.STEP_INTENT, step=0, tool="t", data={"args": {"note": "n" * 3000}})  # a blob
    ids["blob"] = w.saga_id
    client.zadd(keys.ACTIVE, {w.saga_id: 4242})
    w = store.open("agent-x")
    w.append(K.STEP_INTENT, step=0, tool="refund", data={"args": {}})
    approvals.request(w, 0, "refund", {"args": {}}, timeout_s=600)
    ids["approval"] = w.saga_id
    w = store.open("agent-x")
    client.sadd(keys.NEEDS_ATTENTION, w.saga_id)  # as a compensator lists one
    ids["attention"] = w.saga_id
    w = store.open("bot", saga_id="bot_order-1")
    client.zadd(keys.agent_active("bot"), {w.saga_id: 77})  # as a schedule lists it
    client.sadd(keys.AGENTS, "bot")
    ids["agent"] = w.saga_id
    client.hset(OLD.secrets(w.saga_id), "0", "card")
    client.pexpire(OLD.secrets(w.saga_id), 600_000)
    w = store.open("agent-y")
    client.zadd(keys.ACTIVE, {w.saga_id: 55})  # written before agents had indexes
    ids["early"] = w.saga_id
    store.ledger.seal()
    return ids


def _check_moved(client: redis.Redis, ids: dict[str, str], anchor: str) -> None:
    store = EventStore(client)
    names = store.keys
    assert store.log.layout == Layout(3, 16)
    left = [k for k in client.scan_iter(match="ss:{*}:*")
            if k.decode().split("}:", 1)[1] in ("log", "meta", "secrets")
            and not k.decode().startswith("ss:{b")]
    assert left == []  # no saga key under its old name
    for k in (keys.ACTIVE, keys.APPROVALS, keys.NEEDS_ATTENTION):
        assert not client.exists(k)
    for sid in ids.values():
        assert client.exists(names.log(sid))
        assert store.log.head(sid).seq >= 0
    # what the indexes held is where layout 3 looks for it, scores kept
    assert client.zscore(names.active(ids["blob"]), ids["blob"]) == 4242
    assert client.zscore(names.active(ids["agent"]), ids["agent"]) == 77
    assert client.zscore(names.active(ids["early"]), ids["early"]) == 55  # its agent's now
    assert sorted(in_flight(client, names)) == sorted([ids["blob"], ids["agent"], ids["early"]])
    assert _pending(store) == [ids["approval"]]
    assert [m for key in names.all_needs_attention() for m in client.smembers(key)] == \
        [ids["attention"].encode()]
    assert 0 < client.pttl(names.secrets(ids["agent"])) <= 600_000  # its time to live kept
    ref = store.log.events(ids["blob"])[1]["data"]  # a blob: moved with its saga
    assert store.log.load_blob(ids["blob"], ref)["args"]["note"] == "n" * 3000
    report = Verifier(store.log).verify()
    assert report.ok, report.failures
    assert store.ledger.check_anchor(anchor) == []


def _pending(store: EventStore) -> list[str]:
    return [m.decode().rpartition(":")[0] for key in store.keys.all_approvals()
            for m in store.redis.zrange(key, 0, -1)]


def _env(redis_url: str) -> dict[str, str]:
    return {"SAGA_REDIS_URL": redis_url, "SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": "",
            "PATH": "/usr/bin:/bin"}


def test_migrate_to_3_moves_every_saga_and_index_and_every_chain_still_verifies(
        client: redis.Redis, redis_url: str) -> None:
    ids = _old_store(client)
    anchor = EventStore(client).ledger.anchor()
    env = _env(redis_url)
    dry = CliRunner().invoke(cli, ["migrate", "--to", "3", "--dry-run"], env=env)
    assert dry.exit_code == 0, dry.output
    assert "would move layout 2 16 to 3 16" in dry.output
    assert client.get(keys.LAYOUT) == b"2 16"
    done = CliRunner().invoke(cli, ["migrate", "--to", "3"], env=env)
    assert done.exit_code == 0, done.output
    assert f"of {len(ids)} sagas" in done.output
    _check_moved(client, ids, anchor)
    again = CliRunner().invoke(cli, ["migrate", "--to", "3"], env=env)
    assert "already layout 3 16: nothing to do" in again.output


@pytest.mark.parametrize("point", ["rekey_after_copy", "rekey_after_indexes"])
def test_a_migration_to_3_killed_part_way_is_finished_by_the_next_run(
        client: redis.Redis, redis_url: str, tmp_path: Path, point: str) -> None:
    ids = _old_store(client)
    anchor = EventStore(client).ledger.anchor()
    flag = tmp_path / "fault"
    flag.touch()
    killed = subprocess.run(
        [sys.executable, "-m", "saga_store.cli.main", "migrate", "--to", "3"],
        env={**_env(redis_url), "SAGA_FAULT": point, "SAGA_FAULT_ONCE": str(flag)},
        capture_output=True, text=True, timeout=60, check=False)
    assert killed.returncode == -9, killed.stderr
    assert client.get(keys.LAYOUT) == b"2 16"  # every process still reads the old names
    if point == "rekey_after_copy":  # copied, not yet dropped: both names exist
        assert client.exists(OLD.log(ids["committed"]))
        assert client.exists(Layout(3, 16).keys().log(ids["committed"]))
    done = CliRunner().invoke(cli, ["migrate", "--to", "3"], env=_env(redis_url))
    assert done.exit_code == 0, done.output
    _check_moved(client, ids, anchor)


def test_migrate_to_3_refuses_while_a_worker_is_alive(client: redis.Redis,
                                                      redis_url: str) -> None:
    from saga_store.testing.workers import workers
    ids = _old_store(client)
    env = _env(redis_url)
    with workers({**env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
                 "tests.ledger_tools"):
        from saga_store.ops import fleet
        from saga_store.testing import assert_eventually
        assert_eventually(lambda: any(w.live for w in fleet.registered(client, work=False)),
                          timeout=30, what="a live worker")
        refused = CliRunner().invoke(cli, ["migrate", "--to", "3"], env=env)
        assert refused.exit_code != 0
        assert "worker(s) alive" in refused.output
        assert client.get(keys.LAYOUT) == b"2 16"
    assert EventStore(client).log.layout.version == 2
    assert client.exists(OLD.log(ids["committed"]))  # nothing moved


def test_a_second_migration_is_refused_while_one_holds_the_store(
        client: redis.Redis, redis_url: str) -> None:
    """Two runs at once could copy a key over what the first run's layout-3 writers
    appended since: the second is refused, and writes nothing."""
    from saga_store.log.rekey import MIGRATION_LOCK
    ids = _old_store(client)
    client.set(MIGRATION_LOCK, "another-run", px=60_000)
    before = {k: client.dump(k) for k in client.scan_iter(count=1000)}
    refused = CliRunner().invoke(cli, ["migrate", "--to", "3"], env=_env(redis_url))
    assert refused.exit_code != 0
    assert "another 'saga migrate --to 3' is running" in refused.output
    assert {k: client.dump(k) for k in client.scan_iter(count=1000)} == before
    client.delete(MIGRATION_LOCK)
    anchor = EventStore(client).ledger.anchor()
    assert CliRunner().invoke(cli, ["migrate", "--to", "3"], env=_env(redis_url)).exit_code == 0
    _check_moved(client, ids, anchor)
    assert not client.exists(MIGRATION_LOCK)  # given up with the last write


def test_what_a_process_left_on_layout_2_wrote_is_moved_by_running_it_again(
        client: redis.Redis, redis_url: str) -> None:
    """A client started before the migration keeps its layout and writes a saga
    under the old names: 'saga migrate --to 3' again moves it; a saga whose new name
    exists already is kept where it is and named, never overwritten."""
    ids = _old_store(client)
    straggler = EventStore(client)  # reads layout 2 now, and keeps it
    assert straggler.log.layout.version == 2
    env = _env(redis_url)
    assert CliRunner().invoke(cli, ["migrate", "--to", "3"], env=env).exit_code == 0
    late = committed_saga(straggler).saga_id  # under ss:{S}:..., into ss:active etc.
    assert client.exists(OLD.log(late))
    both = ids["committed"]  # a saga written under both names: the new one stands
    client.xadd(OLD.log(both), {"b": b"stale"}, id="0-1")
    dry = CliRunner().invoke(cli, ["migrate", "--to", "3", "--dry-run"], env=env)
    assert dry.exit_code == 0, dry.output
    assert "would move layout 3 16 to 3 16" in dry.output
    again = CliRunner().invoke(cli, ["migrate", "--to", "3"], env=env)
    assert again.exit_code == 0, again.output
    assert "moved what processes still running with layout 2 wrote" in again.output
    assert OLD.log(both) in again.output  # kept, and said so
    store = EventStore(client)
    assert not client.exists(OLD.log(late))
    assert store.log.head(late).seq >= 1
    assert client.exists(OLD.log(both))
    assert store.log.head(both).seq >= 1  # the saga itself untouched
    store.ledger.seal()
    report = Verifier(store.log).verify()
    assert report.ok, report.failures


def test_dry_runs_write_nothing_on_an_empty_redis_or_a_store_of_layout_3(
        client: redis.Redis, redis_url: str) -> None:
    env = _env(redis_url)
    dry = CliRunner().invoke(cli, ["migrate", "--to", "3", "--dry-run"], env=env)
    assert "no store here" in dry.output
    assert client.dbsize() == 0
    EventStore(client, Settings(buckets=8)).open("agent-x")
    before = {k: client.dump(k) for k in client.scan_iter(count=1000)}
    for args in (["--dry-run"], []):
        out = CliRunner().invoke(cli, ["migrate", "--to", "3", *args], env=env)
        assert out.exit_code == 0, out.output
        assert "already layout 3 8: nothing to do" in out.output
    assert {k: client.dump(k) for k in client.scan_iter(count=1000)} == before
