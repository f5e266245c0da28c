"""Ledger entries go through the pending list and are chained in batches:
nothing lost, nothing chained twice, whoever writes and whoever dies."""

from __future__ import annotations

import pytest
import redis

from saga_store.log.events import EventKind as K
from saga_store.log.ledger import SEAL_AT
from saga_store.log.store import EventStore
from saga_store.settings import Settings
from saga_store.verify.checker import Verifier

from ..helpers import LedgerKeys, commit_from_threads, committed_saga

# the mechanics of one chain (of whichever layout the run is of)
pytestmark = [pytest.mark.parity, pytest.mark.layout(buckets=1)]


ONE = Settings(buckets=1)  # the mechanics of one chain: every entry in the same bucket


def ledger_kinds(store: EventStore) -> list[tuple[str, str]]:
    return [(e["kind"], e["data"]["saga_id"]) for e in store.ledger.bodies()]


def test_deferred_entries_wait_pending_and_verify_reads_them(client: redis.Redis) -> None:
    store = EventStore(client, ONE)
    store.ledger.deferred = True
    w = committed_saga(store)
    assert ledger_kinds(store) == []
    assert [e["kind"] for e in store.ledger.pending()] == [K.LEDGER_OPENED, K.LEDGER_CLOSED]
    res = Verifier(store.log).verify()
    assert res.ok
    assert any("not yet chained" in w for w in res.to_dict()["warnings"])
    # a cut tail is caught from the pending closing entry too
    last_id = client.xrevrange(store.keys.log(w.saga_id), count=1)[0][0]
    client.xdel(store.keys.log(w.saga_id), last_id)
    cut = Verifier(store.log).verify()
    assert [f.reason for f in cut.failures] == ["tail_cut"]
    assert store.ledger.pending()  # the check above read the entry from the list
    # a sealer chains only what the chain still bears out: the close of the cut
    # event is set aside, and the cut stays caught, now through what was set aside
    assert store.ledger.seal() == 1
    assert ledger_kinds(store) == [(K.LEDGER_OPENED, w.saga_id)]
    assert [why for _, why in store.ledger.rejected()] == ["the saga has no such event"]
    assert store.ledger.pending() == []
    assert client.llen(LedgerKeys(store.log).pending) == 0
    # and the saga's cached state still says committed: the log no longer does
    assert [f.reason for f in Verifier(store.log).verify().failures] == \
        ["rejected_entry", "projection"]


def test_a_deferred_writer_seals_once_enough_are_waiting(client: redis.Redis) -> None:
    store = EventStore(client, ONE)
    store.ledger.deferred = True
    sagas = [store.open("agent-1").saga_id for _ in range(SEAL_AT)]
    assert client.llen(LedgerKeys(store.log).pending) == 0  # the 64th writer sealed all 64
    assert [sid for _, sid in ledger_kinds(store)] == sagas


@pytest.mark.real_redis
def test_concurrent_writers_leave_nothing_pending_and_chain_each_entry_once(
        client: redis.Redis) -> None:
    """8 threads open and close 40 sagas each, sealing at once: every entry ends in
    the chain exactly once, in no particular order, and none is left pending."""
    store = EventStore(client, ONE)
    made = commit_from_threads(client, ONE, threads=8, each=40)
    assert client.llen(LedgerKeys(store.log).pending) == 0
    chained = ledger_kinds(store)
    assert sorted(chained) == sorted([(K.LEDGER_OPENED, s) for s in made]
                                     + [(K.LEDGER_CLOSED, s) for s in made])
    assert Verifier(store.log).verify().ok


def test_a_sealer_that_died_holding_the_lease_delays_but_loses_nothing(
        client: redis.Redis) -> None:
    store = EventStore(client, ONE)
    store.ledger.deferred = True
    client.set(LedgerKeys(store.log).lease, "dead-sealer", px=300)  # its process is gone
    w = committed_saga(store)
    assert store.ledger.seal() == 0  # the lease is still held
    assert len(store.ledger.pending()) == 2
    assert store.ledger.flush(timeout_s=5) == 0  # waits the lease out, then seals
    assert ledger_kinds(store) == [(K.LEDGER_OPENED, w.saga_id), (K.LEDGER_CLOSED, w.saga_id)]


def test_a_foreign_pending_item_is_dropped_and_the_rest_chained(client: redis.Redis) -> None:
    store = EventStore(client, ONE)
    store.ledger.deferred = True
    client.rpush(LedgerKeys(store.log).pending, b"not a ledger entry")
    w = committed_saga(store)
    assert store.ledger.seal() == 2
    assert ledger_kinds(store) == [(K.LEDGER_OPENED, w.saga_id), (K.LEDGER_CLOSED, w.saga_id)]
    assert client.llen(LedgerKeys(store.log).pending) == 0


def test_anchor_covers_what_was_pending(client: redis.Redis) -> None:
    store = EventStore(client, ONE)
    store.ledger.deferred = True
    committed_saga(store)
    anchor = store.ledger.anchor()
    assert anchor["chain"] == "ledger:root"  # over the root, which recorded the bucket's
    assert store.ledger.root_heads()["ledger:0"][0] == 1  # both entries chained first
    assert store.ledger.check_anchor(anchor) == []


@pytest.mark.layout(2, buckets=1)  # of layout 3 the close's entry rides on the close: no debt
def test_a_cut_tail_behind_a_hand_paid_ledger_debt_is_caught(client: redis.Redis) -> None:
    """The writer died after the close, before the ledger's closing entry (``lc=0``).
    Someone cuts the close off the log and marks the debt paid (``lc=1``) so that no
    sweeper ever writes the close: the cache still says committed, the log does
    not, and verify fails the saga."""
    store = EventStore(client, ONE)
    w = store.open("agent-1")
    w.append(K.STEP_INTENT, step=0, tool="t", data={"args": {}, "reversibility": "readonly"})
    w.append(K.STEP_STARTED, step=0, attempt=1)
    w.append(K.STEP_SUCCEEDED, step=0, data={"result": {}})
    call = w.prepare([(K.SAGA_COMMITTED, {})])
    w.applied(call, call.send(client), ledger=False)  # killed before the ledger close
    assert client.hget(store.keys.meta(w.saga_id), "lc") == b"0"
    last_id = client.xrevrange(store.keys.log(w.saga_id), count=1)[0][0]
    client.xdel(store.keys.log(w.saga_id), last_id)
    client.hset(store.keys.meta(w.saga_id), "lc", 1)
    store.ledger.flush()
    bad = Verifier(store.log).verify()
    assert [(f.chain_id, f.reason) for f in bad.failures] == [(w.saga_id, "projection")]
