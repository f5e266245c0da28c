"""``saga archive`` moves closed sagas out of Redis into segments that verify
offline, leaving a tombstone in the ledger; ``saga verify`` passes on the store
after it, and ``saga verify --archive`` catches a tampered segment or manifest."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest
import redis
from click.testing import CliRunner
from saga_store.cli.main import cli

from saga_store import keys
from saga_store.log.events import EventKind as K
from saga_store.log.ledger import Ledger, tombstone
from saga_store.log.store import EventStore
from saga_store.ops import acl
from saga_store.testing import assert_eventually
from saga_store.verify.checker import Verifier

from ..helpers import committed_saga

pytestmark = [pytest.mark.real_redis, pytest.mark.layout(buckets=16)]


def env_of(redis_url: str, key: str = "") -> dict[str, str]:
    return {"SAGA_REDIS_URL": redis_url, "SAGA_HMAC_KEY": key, "SAGA_HMAC_KEY_FILE": "",
            "SAGA_RETENTION": "", "SAGA_ARCHIVE_DIR": ""}


def some_sagas(store: EventStore, closed: int = 3) -> tuple[list[str], str]:
    """``closed`` committed sagas and one still running."""
    done = [committed_saga(store, steps=2).saga_id for _ in range(closed)]
    running = store.open("agent-1", conversation_id="conv-1")
    running.append(K.STEP_INTENT, step=0, tool="tool_0", tool_call_id="call-0",
                   data={"args": {}, "reversibility": "compensable"})
    return done, running.saga_id


def tombstones(store: EventStore) -> dict[str, dict[str, object]]:
    ledger = Ledger(store.log)
    return {b["data"]["saga_id"]: b["data"] for b in [*ledger.bodies(), *ledger.pending()]
            if b["kind"] == K.LEDGER_ARCHIVED}


def manifest_sagas(folder: Path) -> list[str]:
    return [s["saga_id"] for p in sorted(folder.glob("manifest-*.json"))
            for s in orjson.loads(p.read_bytes())["sagas"]]


def test_archive_moves_closed_sagas_out_and_both_verifies_pass(
        client: redis.Redis, store: EventStore, redis_url: str, tmp_path: Path) -> None:
    done, running = some_sagas(store)
    folder, env = tmp_path / "archive", env_of(redis_url)
    young = CliRunner().invoke(cli, ["archive", "--closed-before", "1h", "--to", str(folder)],
                               env=env)
    assert young.exit_code == 0, young.output
    assert "archived 0 sagas" in young.output
    assert all(store.exists(s) for s in done)
    keys_before = client.dbsize()
    out = CliRunner().invoke(cli, ["archive", "--closed-before", "0s", "--to", str(folder)],
                             env=env)
    assert out.exit_code == 0, out.output
    assert "archived 3 sagas" in out.output
    assert "removed 3 from Redis" in out.output
    assert not any(store.exists(s) for s in done)
    assert store.exists(running)
    assert not any(client.exists(store.keys.meta(s)) for s in done)
    assert client.dbsize() < keys_before
    stones = tombstones(store)
    assert sorted(stones) == sorted(done)
    assert all(s["state"] == "committed" and s["seq"] == 7 for s in stones.values())
    result = Verifier(store.log).verify()
    assert result.ok, [f.to_dict() for f in result.failures]
    for extra in ([], ["--with-store"]):
        offline = CliRunner().invoke(cli, ["verify", "--archive", str(folder), *extra],
                                     env=env)
        assert offline.exit_code == 0, offline.output
        assert "intact" in offline.output
    again = CliRunner().invoke(cli, ["archive", "--closed-before", "0s", "--to", str(folder)],
                               env=env)
    assert "archived 0 sagas" in again.output
    assert sorted(manifest_sagas(folder)) == sorted(done)


def test_a_saga_deleted_by_hand_is_still_caught_next_to_archived_ones(
        client: redis.Redis, store: EventStore, redis_url: str, tmp_path: Path) -> None:
    _done, _ = some_sagas(store, closed=2)
    CliRunner().invoke(cli, ["archive", "--closed-before", "0s", "--to", str(tmp_path)],
                       env=env_of(redis_url))
    deleted = committed_saga(store).saga_id
    Ledger(store.log).flush()
    client.delete(store.keys.log(deleted))
    reasons = {f.chain_id: f.reason for f in Verifier(store.log).verify().failures}
    assert reasons == {deleted: "saga_deleted"}


def test_verify_archive_reports_the_first_bad_item_of_a_tampered_archive(
        store: EventStore, redis_url: str, tmp_path: Path) -> None:
    some_sagas(store, closed=2)
    env = env_of(redis_url)
    assert CliRunner().invoke(cli, ["archive", "--closed-before", "0s", "--to",
                                    str(tmp_path)], env=env).exit_code == 0
    manifest = next(tmp_path.glob("manifest-*.json"))
    segment = next(tmp_path.glob("seg-*.jsonl.gz"))
    lines = gzip.decompress(segment.read_bytes()).splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if b'\\"ok\\":0' in line)
    row = orjson.loads(lines[at])
    row["b"] = row["b"].replace('"ok":0', '"ok":1')  # a result edited
    forged = gzip.compress(b"".join([*lines[:at], orjson.dumps(row) + b"\n",
                                     *lines[at + 1:]]))
    original = segment.read_bytes()

    def verify() -> str:
        got = CliRunner().invoke(cli, ["verify", "--archive", str(tmp_path)], env=env)
        assert got.exit_code == 1, got.output
        return str(got.output)

    segment.write_bytes(forged)
    assert "segment_digest" in verify()
    # a forger who also fixes the manifest's digest (no key): the chain catches it
    doc = orjson.loads(manifest.read_bytes())
    kept = manifest.read_bytes()
    doc["segments"][0]["sha256"] = __import__("hashlib").sha256(forged).hexdigest()
    manifest.write_bytes(orjson.dumps(doc))
    assert f"{row['saga_id']}: first bad seq {row['seq']}: hash_mismatch" in verify()
    segment.write_bytes(original)
    manifest.write_bytes(kept)
    doc = orjson.loads(kept)
    doc["sagas"][0]["seq"] = 5  # the manifest says it ended earlier
    manifest.write_bytes(orjson.dumps(doc))
    assert "not_closed" in verify()


def test_with_a_key_a_changed_manifest_fails_its_signature(
        client: redis.Redis, redis_url: str, tmp_path: Path) -> None:
    from saga_store.settings import Settings
    key = "k" * 32
    store = EventStore(client, Settings(hmac_key=key.encode()))
    some_sagas(store, closed=1)
    env = env_of(redis_url, key)
    assert CliRunner().invoke(cli, ["archive", "--closed-before", "0s", "--to",
                                    str(tmp_path)], env=env).exit_code == 0
    ok = CliRunner().invoke(cli, ["verify", "--archive", str(tmp_path), "--with-store"],
                            env=env)
    assert ok.exit_code == 0, ok.output
    manifest = next(tmp_path.glob("manifest-*.json"))
    doc = orjson.loads(manifest.read_bytes())
    doc["created_ms"] += 1
    manifest.write_bytes(orjson.dumps(doc))
    bad = CliRunner().invoke(cli, ["verify", "--archive", str(tmp_path)], env=env)
    assert bad.exit_code == 1, bad.output
    assert "bad_signature" in bad.output
    keyless = CliRunner().invoke(cli, ["verify", "--archive", str(tmp_path)],
                                 env=env_of(redis_url))
    assert keyless.exit_code == 3, keyless.output
    assert "SAGA_HMAC_KEY" in keyless.output


def test_a_worker_user_is_told_archiving_needs_an_admin_and_nothing_is_removed(
        client: redis.Redis, store: EventStore, redis_server: object, tmp_path: Path) -> None:
    done, _ = some_sagas(store, closed=2)
    client.execute_command("ACL", "SETUSER", *acl.setuser_args("worker", acl.worker_rules()),
                           ">w-pass")
    port = client.connection_pool.connection_kwargs["port"]
    url = f"redis://worker:w-pass@127.0.0.1:{port}/0"
    try:
        got = CliRunner().invoke(cli, ["archive", "--closed-before", "0s", "--to",
                                       str(tmp_path)], env=env_of(url))
    finally:
        client.execute_command("ACL", "DELUSER", "worker")
    assert got.exit_code == 2, got.output
    assert "NOPERM on UNLINK" in got.output
    assert "admin user" in got.output
    assert not any(tmp_path.iterdir())  # refused before anything was written
    assert all(store.exists(s) for s in done)
    assert not tombstones(store)
    assert Verifier(store.log).verify().ok


def test_a_duration_that_is_not_one_is_refused(redis_url: str, tmp_path: Path) -> None:
    got = CliRunner().invoke(cli, ["archive", "--closed-before", "7 days", "--to",
                                   str(tmp_path)], env=env_of(redis_url))
    assert got.exit_code == 2, got.output
    assert "e.g. 7d, 12h" in got.output
    assert not any(tmp_path.iterdir())


def test_every_key_of_an_archived_saga_goes_and_its_large_payload_is_kept(
        client: redis.Redis, store: EventStore, redis_url: str, tmp_path: Path) -> None:
    _, running = some_sagas(store, closed=0)
    w = store.open("agent-1", conversation_id="conv-1")
    w.append(K.STEP_INTENT, step=0, tool="tool_0", tool_call_id="call-0",
             data={"args": {}, "reversibility": "compensable"})
    w.append(K.STEP_SUCCEEDED, step=0, data={"result": {"text": "t" * 20_000}})
    w.append(K.SAGA_COMMITTED)
    assert list(client.scan_iter(match=f"*{w.saga_id}:blob:*"))  # stored aside
    got = CliRunner().invoke(cli, ["archive", "--closed-before", "0s", "--to",
                                   str(tmp_path)], env=env_of(redis_url))
    assert got.exit_code == 0, got.output
    left = [k.decode() for k in client.scan_iter(match=f"*{w.saga_id}*")]
    assert left == [], left
    segment = next(tmp_path.glob("seg-*.jsonl.gz"))
    rows = [orjson.loads(line) for line in gzip.decompress(segment.read_bytes()).splitlines()]
    assert [len(r["raw"]) for r in rows if "blob" in r] == [len('{"result":{"text":""}}') + 20_000]
    ok = CliRunner().invoke(cli, ["verify", "--archive", str(tmp_path)], env=env_of(redis_url))
    assert ok.exit_code == 0, ok.output
    assert list(client.scan_iter(match=f"*{running}*"))


def test_a_tombstone_pushed_by_hand_for_a_saga_still_here_is_never_chained(
        client: redis.Redis, store: EventStore) -> None:
    """Someone who may push ledger entries cannot make the ledger say a live saga
    was archived: the sealer sets the tombstone aside, and verify reports it."""
    w = committed_saga(store)
    head = store.log.head(w.saga_id)
    chain = store.log.layout.ledger_of(w.saga_id)
    client.rpush(keys.ledger_pending(chain), tombstone(w.saga_id, "committed", head.seq,
                                                       head.hash.hex(), "0" * 64))
    Ledger(store.log).flush()
    [(entry, why)] = Ledger(store.log).rejected()
    assert b"saga_archived" in entry
    assert why == "the saga it says was archived is still in Redis"
    assert [f.reason for f in Verifier(store.log).verify().failures] == ["rejected_entry"]


def test_a_dry_run_names_what_would_go_and_changes_nothing(
        client: redis.Redis, store: EventStore, redis_url: str, tmp_path: Path) -> None:
    done, _ = some_sagas(store, closed=2)
    got = CliRunner().invoke(cli, ["archive", "--closed-before", "0s", "--to",
                                   str(tmp_path / "a"), "--dry-run"], env=env_of(redis_url))
    assert got.exit_code == 0, got.output
    assert "would archive 2 sagas" in got.output
    assert all(store.exists(s) for s in done)
    assert not (tmp_path / "a").exists()


def test_a_saga_that_ended_needing_attention_is_archived_and_leaves_the_set(
        client: redis.Redis, store: EventStore, redis_url: str, tmp_path: Path) -> None:
    w = store.open("agent-1", conversation_id="conv-1")
    w.append(K.STEP_INTENT, step=0, tool="t", tool_call_id="c0",
             data={"args": {}, "reversibility": "irreversible"})
    w.append(K.STEP_STARTED, step=0, attempt=1)
    w.append(K.STEP_SUCCEEDED, step=0, data={"result": {}})
    w.append(K.STEP_INTENT, step=1, tool="t", tool_call_id="c1",
             data={"args": {}, "reversibility": "compensable"})
    w.append(K.STEP_STARTED, step=1, attempt=1)
    w.append(K.STEP_FAILED, step=1, data={"error": {"message": "declined"}})
    w.append(K.SAGA_FAILED, data={"reason": "step 1 failed"})
    w.append(K.STEP_NOT_COMPENSABLE, step=0)
    w.append(K.SAGA_NEEDS_ATTENTION, data={"steps": [0]})
    client.sadd(store.keys.needs_attention(w.saga_id), w.saga_id)  # as the compensator does
    got = CliRunner().invoke(cli, ["archive", "--closed-before", "0s", "--to",
                                   str(tmp_path)], env=env_of(redis_url))
    assert got.exit_code == 0, got.output
    assert not store.exists(w.saga_id)
    assert not client.sismember(store.keys.needs_attention(w.saga_id), w.saga_id)
    assert tombstones(store)[w.saga_id]["state"] == "needs_attention"
    assert Verifier(store.log).verify().ok


def test_a_second_run_on_the_same_store_is_refused_while_one_holds_the_lease(
        client: redis.Redis, store: EventStore, redis_url: str, tmp_path: Path) -> None:
    """Two runs into two folders would pick the same sagas: one at a time."""
    done, _ = some_sagas(store, closed=1)
    client.set(keys.ARCHIVE_LEASE, "another-run", px=60_000)
    got = CliRunner().invoke(cli, ["archive", "--closed-before", "0s", "--to",
                                   str(tmp_path)], env=env_of(redis_url))
    assert got.exit_code == 2, got.output
    assert "another 'saga archive' is running on this store" in got.output
    assert store.exists(done[0])
    client.delete(keys.ARCHIVE_LEASE)
    again = CliRunner().invoke(cli, ["archive", "--closed-before", "0s", "--to",
                                     str(tmp_path)], env=env_of(redis_url))
    assert again.exit_code == 0, again.output
    assert not store.exists(done[0])
    assert not client.exists(keys.ARCHIVE_LEASE)  # given up at the end


def test_a_saga_archived_while_verify_runs_is_not_a_deleted_one(
        store: EventStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Archived between verify's read of the ledger and its read of the sagas: the
    saga is gone and the tombstone was not in the ledger as read; the ledger read
    again holds it: intact."""
    from collections.abc import Iterator

    from saga_store.log.archive import Archiver
    from saga_store.log.stream import SagaLog
    done, _ = some_sagas(store, closed=2)
    Ledger(store.log).flush()
    scan = SagaLog.chain_ids
    ran: list[int] = []

    def chain_ids(log: SagaLog) -> Iterator[str]:
        if not ran:
            ran.append(Archiver(store.log, tmp_path).run(2**52).removed)
        yield from scan(log)
    monkeypatch.setattr(SagaLog, "chain_ids", chain_ids)
    res = Verifier(store.log, jobs=1).verify()
    assert ran == [2]
    assert not any(store.exists(s) for s in done)
    assert res.ok, res.to_dict()["failures"]


def test_archive_trims_the_context_feeds_but_not_from_a_saga_still_open(
        client: redis.Redis, store: EventStore, redis_url: str, tmp_path: Path) -> None:
    """The agent's context stream (``ss:ctx:{A}``) loses the events older than the
    cut-off (here: the closed sagas'), and keeps those of its saga still open (one
    no index lists, as an MCP gateway's session); a second run trims nothing more."""
    from saga_store.client.context import project
    done = [committed_saga(store, steps=2).saga_id for _ in range(3)]
    for sid in done:
        project(store, sid)
    feed = keys.agent_ctx("agent-1")
    last = client.xrevrange(feed, count=1)[0][0]
    assert_eventually(lambda: int(client.time()[0]) * 1000 + int(client.time()[1]) // 1000
                      > int(last.split(b"-")[0]), timeout=5, what="Redis's clock to move on")
    running = store.open("agent-1")
    running.append(K.STEP_INTENT, step=0, tool="tool_0", tool_call_id="call-0",
                   data={"args": {}, "reversibility": "compensable"})
    running.append(K.STEP_STARTED, step=0, attempt=1)
    running.append(K.STEP_SUCCEEDED, step=0, tool="tool_0", data={"result": {"ok": 1}})
    project(store, running.saga_id)
    for sid in done:  # events the closed sagas' drivers told after the open one began
        client.xadd(feed, {"e": orjson.dumps({"kind": "note", "saga_id": sid})})

    def told() -> list[str]:
        return [orjson.loads(f[b"e"])["saga_id"] for _, f in client.xrange(feed)]
    before = told()
    since = before[before.index(running.saga_id):]  # from the open saga's first event
    assert set(before[:len(before) - len(since)]) == set(done)
    env = env_of(redis_url)
    args = ["archive", "--closed-before", "0s", "--to", str(tmp_path / "archive")]
    out = CliRunner().invoke(cli, args, env=env)
    assert out.exit_code == 0, out.output
    assert told() == since, out.output  # the closed sagas' events before it: gone
    assert f"trimmed {len(before) - len(since)} context events" in out.output
    again = CliRunner().invoke(cli, args, env=env)
    assert "trimmed" not in again.output
    assert told() == since
