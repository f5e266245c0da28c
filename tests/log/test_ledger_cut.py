"""``saga archive`` moves out of Redis the prefix of each ledger chain whose
sagas are all archived, cut at a head the root chain recorded; ``saga verify``
holds the chain's base to the root, ``saga verify --archive`` links the
archived prefixes up to the base Redis holds, and tampering with either shows."""

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
from saga_store.log.ledger import Ledger
from saga_store.log.ledger_cut import parse_base
from saga_store.log.segments import file_digest
from saga_store.log.store import EventStore
from saga_store.verify.checker import Verifier

from ..helpers import committed_saga

pytestmark = [pytest.mark.real_redis, pytest.mark.layout(None)]
CHAIN = "ledger:0"


@pytest.fixture(autouse=True)
def one_chain(client: redis.Redis, store: EventStore) -> None:
    """One bucket, so every saga's entries go to one ledger chain, in order."""
    client.set(keys.LAYOUT, "3 1")
    store.log.forget_layout()


def env_of(redis_url: str) -> dict[str, str]:
    return {"SAGA_REDIS_URL": redis_url, "SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": "",
            "SAGA_RETENTION": "", "SAGA_ARCHIVE_DIR": ""}


def archive(redis_url: str, folder: Path, before: str = "0s") -> str:
    out = CliRunner().invoke(cli, ["archive", "--closed-before", before, "--to", str(folder),
                                   "--json"], env=env_of(redis_url))
    assert out.exit_code == 0, out.output
    return out.output


def archived_and_cut(store: EventStore, redis_url: str, folder: Path, n: int = 3,
                     ) -> list[str]:
    """``n`` sagas archived, the root recording the chain after their tombstones, a
    younger saga closed after it, and a second run that cuts the chain."""
    done = [committed_saga(store, steps=1).saga_id for _ in range(n)]
    archive(redis_url, folder)
    Ledger(store.log).record_root()
    committed_saga(store, steps=1)
    Ledger(store.log).flush()
    archive(redis_url, folder, before="1h")
    return done


def verify_archive(redis_url: str, folder: Path, *extra: str) -> tuple[int, str]:
    out = CliRunner().invoke(cli, ["verify", "--archive", str(folder), *extra],
                             env=env_of(redis_url))
    return out.exit_code, out.output


def test_the_prefix_of_archived_sagas_leaves_redis_and_both_verifies_pass(
        client: redis.Redis, store: EventStore, redis_url: str, tmp_path: Path) -> None:
    """Every ledger entry of the archived sagas goes (their openings, closes and
    tombstones); the chain starts at a base the root recorded; the store, the
    archive against it, and an anchor taken before the cut all still verify."""
    anchor = Ledger(store.log).anchor()
    done = archived_and_cut(store, redis_url, tmp_path)
    base = parse_base(client.get(keys.ledger_base(CHAIN)))
    assert base.seq == 3 * len(done) - 1  # opening, close and tombstone of each
    assert client.xlen(keys.ledger_log(CHAIN)) == 2  # the younger saga's opening, close
    left = {b["data"]["saga_id"] for b in Ledger(store.log).bodies()}
    assert not left & set(done)
    result = Verifier(store.log).verify()
    assert result.ok, [f.to_dict() for f in result.failures]
    assert Ledger(store.log).check_anchor(anchor) == []
    for extra in ([], ["--with-store"]):
        code, output = verify_archive(redis_url, tmp_path, *extra)
        assert code == 0, output
    again = orjson.loads(archive(redis_url, tmp_path))  # archives the younger one too
    assert again["written"] == 1
    assert again["ledger_cuts"] == 0


def test_a_saga_still_open_holds_the_cut_before_its_opening(
        client: redis.Redis, store: EventStore, redis_url: str, tmp_path: Path) -> None:
    """A running saga's opening is never cut: a chain is cut only up to the first
    entry of a saga not archived, whatever the root recorded after it."""
    first = committed_saga(store, steps=1).saga_id
    archive(redis_url, tmp_path)
    Ledger(store.log).record_root()  # records the chain at seq 2, first's tombstone
    running = store.open("agent-1", conversation_id="conv-1")
    later = committed_saga(store, steps=1).saga_id
    archive(redis_url, tmp_path)
    Ledger(store.log).record_root()
    committed_saga(store, steps=1)
    Ledger(store.log).flush()
    archive(redis_url, tmp_path, before="1h")
    base = parse_base(client.get(keys.ledger_base(CHAIN)))
    assert base.seq == 2  # first's opening, close and tombstone; running's opening is 3
    left = {b["data"]["saga_id"] for b in Ledger(store.log).bodies()}
    assert {running.saga_id, later} <= left
    assert first not in left
    result = Verifier(store.log).verify()
    assert result.ok, [f.to_dict() for f in result.failures]


def test_a_tombstone_left_in_redis_after_its_saga_s_close_was_cut_still_verifies(
        client: redis.Redis, store: EventStore, redis_url: str, tmp_path: Path) -> None:
    """Under steady load a saga's tombstone comes long after its opening and close,
    behind younger sagas' entries: the chain is cut between them, and both
    verifies still pass with the close in the archive and the tombstone in Redis."""
    first = committed_saga(store, steps=1).saga_id
    Ledger(store.log).flush()
    Ledger(store.log).record_root()  # the chain at seq 1, first's close
    archive(redis_url, tmp_path)  # first's tombstone: seq 2
    committed_saga(store, steps=1)
    Ledger(store.log).flush()
    archive(redis_url, tmp_path, before="1h")
    assert parse_base(client.get(keys.ledger_base(CHAIN))).seq == 1
    kinds = {b["kind"] for b in Ledger(store.log).bodies() if b["data"]["saga_id"] == first}
    assert kinds == {"saga_archived"}
    result = Verifier(store.log).verify()
    assert result.ok, [f.to_dict() for f in result.failures]
    code, output = verify_archive(redis_url, tmp_path, "--with-store")
    assert code == 0, output


def test_a_prefix_trimmed_by_hand_with_a_made_up_base_fails_verify_naming_the_chain(
        client: redis.Redis, store: EventStore, redis_url: str, tmp_path: Path) -> None:
    """A base the root never recorded (a real entry's seq and hash, or made up)
    is a cut prefix: exit 1, the chain named."""
    for _ in range(3):
        committed_saga(store, steps=1)
    Ledger(store.log).flush()
    rows = client.xrange(keys.ledger_log(CHAIN))
    _eid, fields = rows[2]
    for made_up in (fields[b"h"].hex(), "ab" * 32):
        client.set(keys.ledger_base(CHAIN), f"2 {made_up}")
        client.xtrim(keys.ledger_log(CHAIN), minid="0-4", approximate=False)
        out = CliRunner().invoke(cli, ["verify"], env=env_of(redis_url))
        assert out.exit_code == 1, out.output
        failures = {f.chain_id: f for f in Verifier(store.log).verify().failures}
        assert failures[CHAIN].reason == "head_trimmed"
        assert "never recorded" in failures[CHAIN].detail
        assert CHAIN in out.output


def test_a_prefix_trimmed_by_hand_without_a_base_fails_verify(
        client: redis.Redis, store: EventStore, redis_url: str) -> None:
    committed_saga(store, steps=1)
    committed_saga(store, steps=1)
    Ledger(store.log).flush()
    client.xtrim(keys.ledger_log(CHAIN), minid="0-3", approximate=False)
    result = Verifier(store.log).verify()
    failures = {f.chain_id: f.reason for f in result.failures}
    assert failures.get(CHAIN) == "head_trimmed", result.to_dict()


def test_an_edited_ledger_segment_fails_verify_archive(
        client: redis.Redis, store: EventStore, redis_url: str, tmp_path: Path) -> None:
    """An archived ledger entry edited (and the file's digest in the manifest left
    as it was, or recomputed): exit 1 either way."""
    archived_and_cut(store, redis_url, tmp_path)
    (path,) = tmp_path.glob("ledger-*.jsonl.gz")
    lines = gzip.decompress(path.read_bytes()).splitlines(keepends=True)
    row = orjson.loads(lines[1])
    row["b"] = row["b"].replace('"committed"', '"compensated"')
    lines[1] = orjson.dumps(row) + b"\n"
    path.write_bytes(gzip.compress(b"".join(lines)))
    code, output = verify_archive(redis_url, tmp_path)
    assert code == 1, output
    assert "segment_digest" in output, output
    (manifest,) = [p for p in tmp_path.glob("manifest-*.json")
                   if orjson.loads(p.read_bytes())["cuts"]]
    doc = orjson.loads(manifest.read_bytes())
    doc["ledger_segments"][0]["sha256"] = file_digest(path)
    manifest.write_bytes(orjson.dumps(doc))
    code, output = verify_archive(redis_url, tmp_path)
    assert code == 1, output
    assert "hash_mismatch" in output, output


def test_verify_archive_with_the_store_fails_when_redis_starts_past_the_archive(
        client: redis.Redis, store: EventStore, redis_url: str, tmp_path: Path) -> None:
    """A chain cut further than any archived prefix reaches (entries lost between):
    the archive checked against the store names the chain."""
    archived_and_cut(store, redis_url, tmp_path)
    committed_saga(store, steps=1)
    Ledger(store.log).flush()
    base = parse_base(client.get(keys.ledger_base(CHAIN)))
    _eid, fields = client.xrange(keys.ledger_log(CHAIN), keys.entry_id(base.seq + 1),
                                keys.entry_id(base.seq + 1))[0]
    client.set(keys.ledger_base(CHAIN), f"{base.seq + 1} {fields[b'h'].hex()}")
    client.xtrim(keys.ledger_log(CHAIN), minid=keys.entry_id(base.seq + 2), approximate=False)
    code, output = verify_archive(redis_url, tmp_path, "--with-store")
    assert code == 1, output
    assert CHAIN in output, output


@pytest.mark.parametrize("trim", [True, False], ids=["trimmed", "base-only"])
def test_a_saga_hidden_behind_a_base_set_at_a_head_the_root_recorded_fails_verify(
        client: redis.Redis, store: EventStore, redis_url: str, trim: bool) -> None:
    """Someone with write access deletes a saga that was never archived, then sets
    the chain's base at a head the root did record past its entries (trimming the
    prefix, or not): that is no cut 'saga archive' made, and verify says so."""
    hidden = committed_saga(store, steps=1).saga_id
    committed_saga(store, steps=1)
    Ledger(store.log).flush()
    Ledger(store.log).record_root()  # the root records the chain's head, seq 3
    committed_saga(store, steps=1)
    Ledger(store.log).flush()
    head = client.xrange(keys.ledger_log(CHAIN))[3][1][b"h"].hex()
    for key in client.scan_iter(match=f"*{hidden}*"):
        client.unlink(key)
    client.set(keys.ledger_base(CHAIN), f"3 {head}")
    if trim:
        client.xtrim(keys.ledger_log(CHAIN), minid="0-5", approximate=False)
    out = CliRunner().invoke(cli, ["verify"], env=env_of(redis_url))
    assert out.exit_code == 1, out.output
    failures = {f.chain_id: f for f in Verifier(store.log).verify().failures}
    assert failures[CHAIN].reason == "head_trimmed"


def test_a_saga_id_opened_again_after_its_archive_holds_the_cut_before_its_new_opening(
        client: redis.Redis, store: EventStore, redis_url: str, tmp_path: Path) -> None:
    """An id a caller chose, archived, then opened again (its log was gone, so the
    open went through): the tombstone of its first life does not archive its
    second, whose opening stays in Redis, uncut."""
    first = store.open("agent-1", saga_id="ORDER-9")
    first.append(K.SAGA_COMMITTED)
    Ledger(store.log).flush()
    archive(redis_url, tmp_path)
    again = store.open("agent-1", saga_id="ORDER-9")  # its second life, still open
    Ledger(store.log).flush()
    Ledger(store.log).record_root()  # records the chain past the second opening
    committed_saga(store, steps=1)
    Ledger(store.log).flush()
    archive(redis_url, tmp_path, before="1h")
    openings = [b for b in Ledger(store.log).bodies()
                if b["kind"] == K.LEDGER_OPENED and b["data"]["saga_id"] == "ORDER-9"]
    assert openings, "the open saga's opening was cut"
    assert again.saga_id == "ORDER-9"
