"""Nobody with a Redis login can make the ledger vouch for a cut saga: a pending
entry that its saga's chain does not bear out is never chained, and is reported;
the verifier writes nothing, so it never blesses what it checks."""

from __future__ import annotations

import orjson
import pytest
import redis
from click.testing import CliRunner
from saga_store.cli.main import cli

from saga_store.log.ledger import Ledger
from saga_store.log.store import ChainWriter, EventStore
from saga_store.settings import Settings

from ..cli.test_ids_and_resolve import snapshot
from ..helpers import LedgerKeys, committed_saga

pytestmark = [pytest.mark.real_redis, pytest.mark.layout(buckets=1)]  # one chain to forge
KEY = "k" * 32


def verify(url: str, *args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, ["verify", *args],
                             env={"SAGA_REDIS_URL": url, "SAGA_HMAC_KEY": KEY,
                                  "SAGA_HMAC_KEY_FILE": ""})
    return res.exit_code, res.output


@pytest.fixture
def store(client: redis.Redis) -> EventStore:
    """Workers' settings: ledger entries wait on the pending list for a sealer."""
    s = EventStore(client, Settings(hmac_key=KEY.encode(), buckets=1))  # one chain to forge
    s.ledger.deferred = True
    return s


def cut_and_forge(client: redis.Redis, w: ChainWriter, keep: int) -> None:
    """The attack: drop the saga's real close from the pending list, cut its log to
    ``keep`` events, and push a close that matches the cut head."""
    pending = client.lrange(LedgerKeys(w.store.log).pending, 0, -1)
    real = [p for p in pending if b'"saga_closed"' in p and w.saga_id.encode() in p]
    assert real
    client.lrem(LedgerKeys(w.store.log).pending, 0, real[0])
    entries = client.xrange(w.store.keys.log(w.saga_id))
    client.xdel(w.store.keys.log(w.saga_id), *[eid for eid, _ in entries[keep:]])
    last = entries[keep - 1][1]
    client.rpush(LedgerKeys(w.store.log).pending, orjson.dumps({"kind": "saga_closed", "data": {
        "saga_id": w.saga_id, "state": "committed", "seq": keep - 1,
        "hash": last[b"h"].hex()}}))


def test_verify_writes_nothing_with_entries_pending(store: EventStore, client: redis.Redis,
                                                    redis_url: str) -> None:
    committed_saga(store)
    assert client.llen(LedgerKeys(store.log).pending) == 2
    before = snapshot(client)
    code, out = verify(redis_url)
    assert code == 0, out
    assert "not yet chained" in out
    assert snapshot(client) == before


def test_a_forged_close_for_a_cut_saga_is_caught_before_and_after_sealing(
        store: EventStore, client: redis.Redis, redis_url: str) -> None:
    """With the HMAC key, verify exits 1 whether the forged close is still pending
    (it names an event that is no close) or a sealer met it (it was refused)."""
    w = committed_saga(store)
    cut_and_forge(client, w, keep=3)
    code, out = verify(redis_url)
    assert code == 1, out
    assert "forged_close" in out
    assert Ledger(store.log).seal() == 1  # the opening only
    ledger = [orjson.loads(b) for b in (e[1][b"b"] for e in
                                        client.xrange(LedgerKeys(store.log).log))]
    assert [e["kind"] for e in ledger] == ["saga_opened"]
    code, out = verify(redis_url)
    assert code == 1, out
    assert "rejected_entry" in out


@pytest.mark.parametrize("forged", [
    {"kind": "saga_opened", "data": {"saga_id": "NOSUCH", "agent_id": "a", "first": "00"}},
    {"kind": "saga_closed", "data": {"saga_id": "SID", "state": "committed", "seq": 1,
                                     "hash": "HASH1"}},
    {"kind": "saga_closed", "data": {"saga_id": "SID", "state": "compensated", "seq": -1,
                                     "hash": "HEAD"}},
    {"kind": "saga_opened", "data": {"saga_id": "SID", "agent_id": "a", "first": "ab" * 32}},
    {"kind": "saga_opened", "data": {"saga_id": "SID", "agent_id": "mallory", "first": "FIRST"}},
    {"kind": "saga_closed", "data": {"saga_id": "SID", "state": "committed", "seq": -1,
                                     "hash": "HEAD", "approved_by": "ceo"}},
], ids=["open-of-no-saga", "close-at-a-step", "close-in-the-wrong-state", "wrong-first",
        "another-agent", "an-extra-field"])
def test_the_sealer_chains_only_entries_the_chains_bear_out(
        store: EventStore, client: redis.Redis, forged: dict[str, object]) -> None:
    """A forged entry between real ones: the real ones are chained, the forged one is
    set aside with why, whatever the kind of forgery."""
    w = committed_saga(store)
    entries = client.xrange(store.keys.log(w.saga_id))
    text = orjson.dumps(forged).decode().replace("SID", w.saga_id)
    text = text.replace("HASH1", entries[1][1][b"h"].hex())
    text = text.replace("FIRST", entries[0][1][b"h"].hex())
    text = text.replace("HEAD", entries[-1][1][b"h"].hex())
    text = text.replace('"seq":-1', f'"seq":{len(entries) - 1}')
    client.rpush(LedgerKeys(store.log).pending, text)
    committed_saga(store)
    assert Ledger(store.log).seal() == 4
    chained = [e[1][b"b"] for e in client.xrange(LedgerKeys(store.log).log)]
    assert all(text.encode() not in b for b in chained)
    [(entry, why)] = Ledger(store.log).rejected()
    assert entry == text.encode()
    assert why
    assert client.llen(LedgerKeys(store.log).pending) == 0


def test_data_written_before_still_verifies_with_entries_from_both_writers(
        store: EventStore, client: redis.Redis, redis_url: str) -> None:
    """Real entries pass the sealer's check, duplicates of a paid debt included."""
    committed_saga(store)
    # the same close pushed twice (a debt paid twice) is one fact
    client.rpush(LedgerKeys(store.log).pending, client.lindex(LedgerKeys(store.log).pending, -1))
    assert Ledger(store.log).seal() == 3
    assert Ledger(store.log).rejected() == []
    assert verify(redis_url)[0] == 0
