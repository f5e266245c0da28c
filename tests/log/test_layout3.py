"""Layout 3: a saga's keys, its bucket's indexes and its bucket's ledger list under
one hash tag, so the append script writes them together; the sweepers share
the buckets under leases on groups of them."""

from __future__ import annotations

import time

import orjson
import pytest
import redis
from redis.crc import key_slot

from saga_store import Registry, SagaStore, keys
from saga_store.approval import requests as approvals
from saga_store.errors import InvalidInput
from saga_store.execution.enqueue import in_flight
from saga_store.log.events import EventKind as K
from saga_store.log.ledger import CLOSE_FLAG, OPEN_FLAG
from saga_store.log.store import EventStore
from saga_store.settings import Settings
from saga_store.verify.checker import Verifier
from workers.sweeper import SWEEP_GROUP, Sweeper

from ..helpers import committed_saga

pytestmark = [pytest.mark.parity, pytest.mark.layout(None)]


def _store(client: redis.Redis, buckets: int = 16, **kw: object) -> EventStore:
    return EventStore(client, Settings(layout=3, buckets=buckets, **kw))  # type: ignore[arg-type]


def _pending(client: redis.Redis, store: EventStore, sid: str) -> list[dict[str, object]]:
    chain = store.log.layout.ledger_of(sid)
    return [orjson.loads(raw) for raw in client.lrange(keys.ledger_pending(chain), 0, -1)]


@pytest.mark.cluster
def test_a_sagas_keys_its_indexes_and_its_ledger_list_share_one_slot(
        client: redis.Redis) -> None:
    store = _store(client, buckets=1024)
    assert client.get(keys.LAYOUT) is None or store.log.layout.version == 3
    for sid in ("order-1", "order-2", "agent-q_01JAAAAAAAAAAAAAAAAAAAAAAA"):
        n = store.keys
        names = [n.log(sid), n.meta(sid), n.lease(sid), n.driver(sid), n.secrets(sid),
                 n.blob(sid, "ab" * 32), n.approvals(sid), n.needs_attention(sid),
                 keys.ledger_pending(store.log.layout.ledger_of(sid)),
                 keys.ledger_log(store.log.layout.ledger_of(sid))]
        if "_" not in sid:  # an agent's sagas stay in its own index (its user's key)
            names.append(n.active(sid))
        assert len({key_slot(k.encode()) for k in names}) == 1, names
        assert n.saga_of_log(n.log(sid)) == sid
    assert store.keys.saga_of_log("ss:{order-1}:log") is None  # a layout-2 name


@pytest.mark.cluster
def test_the_ledger_entries_go_in_the_sagas_own_appends_and_a_refused_open_pushes_none(
        client: redis.Redis) -> None:
    """Opening and closing entries are pushed by the script that appends the saga's
    first and final events (no crash can fall between the two), flagged paid in
    the same call; an open refused because the id is taken pushes nothing."""
    store = _store(client)
    store.ledger.deferred = True  # leave them pending, as a worker does
    w = store.open("agent-x", saga_id="order-7")
    [opened] = _pending(client, store, "order-7")
    assert opened["kind"] == K.LEDGER_OPENED
    assert opened["data"] == {"saga_id": "order-7", "agent_id": "agent-x",
                              "first": store.log.head("order-7").hash.hex()}
    assert client.hget(store.keys.meta("order-7"), OPEN_FLAG) == b"1"
    with pytest.raises(InvalidInput, match="already exists"):
        store.open("agent-y", saga_id="order-7")
    assert len(_pending(client, store, "order-7")) == 1
    w.append(K.SAGA_COMMITTED)
    opened_, closed = _pending(client, store, "order-7")
    assert opened_ == opened
    assert closed["data"] == {"saga_id": "order-7", "state": "committed",
                              "seq": w.head.seq, "hash": w.head.hash.hex()}
    assert client.hget(store.keys.meta("order-7"), CLOSE_FLAG) == b"1"
    assert store.ledger.seal() == 2
    report = Verifier(store.log).verify()
    assert report.ok, report.failures


def test_sagas_of_layout_3_verify_and_a_ledger_entry_is_written_once(
        client: redis.Redis) -> None:
    store = _store(client)
    sagas = [committed_saga(store, steps=2).saga_id for _ in range(30)]
    store.ledger.seal()
    entries = [e for c in store.ledger.chains() for e in store.log.bodies(c)]
    for sid in sagas:
        assert [e["kind"] for e in entries if e["data"]["saga_id"] == sid] == \
            [K.LEDGER_OPENED, K.LEDGER_CLOSED]
    assert Verifier(store.log).verify().ok


def test_an_approval_request_is_listed_by_its_own_append_due_by_redis_clock(
        client: redis.Redis) -> None:
    store = _store(client)
    w = store.open("agent-x")
    (secs, micros) = client.time()
    approvals.request(w, 0, "refund", {"args": {}}, timeout_s=30)
    due = client.zscore(store.keys.approvals(w.saga_id), approvals.member(w.saga_id, 0))
    now_ms = secs * 1000 + micros // 1000
    assert due is not None
    assert now_ms + 30_000 <= due < now_ms + 90_000
    w2 = store.open("agent-x")
    approvals.request(w2, 0, "refund", {"args": {}}, timeout_s=0)
    assert client.zscore(store.keys.approvals(w2.saga_id),
                         approvals.member(w2.saga_id, 0)) == approvals.NO_DEADLINE


def test_the_sweepers_share_the_buckets_under_leases_and_find_a_due_saga_in_any(
        client: redis.Redis, queues: redis.Redis) -> None:
    """With 4 groups of buckets, the first sweeper's pass takes every group and
    the second's, right after, none (the fleet looks at each bucket once an
    interval, not once per worker); once the leases lapse the second takes them.
    Sagas due in every bucket are all looked at."""
    client.set(keys.LAYOUT, f"3 {4 * SWEEP_GROUP}")
    store = SagaStore(client, Registry(), Settings(lease_ms=1000), queues=queues)
    names = store.events.keys
    assert names.bucketed
    looked: dict[str, list[str]] = {"a": [], "b": []}

    class Counting(Sweeper):
        def _look_at(self, sid: str, now_ms: int) -> int:
            looked[self.name].append(sid)
            return 0

    ids = [f"due-{i}" for i in range(200)]
    for sid in ids:
        client.zadd(names.active(sid), {sid: 1})  # due long ago
    used = {names.bucket_of(s) for s in ids}
    assert len(used) > 100
    assert {b // SWEEP_GROUP for b in used} == {0, 1, 2, 3}
    a, b = Counting(store, "a", interval_s=0.5), Counting(store, "b", interval_s=0.5)
    a.sweep()
    b.sweep()
    assert sorted(looked["a"]) == sorted(ids)
    assert looked["b"] == []
    time.sleep(0.5)  # the leases were for 0.45 s: the next pass may take them
    b.sweep()
    assert sorted(looked["b"]) == sorted(ids)
    assert sorted(in_flight(client, names)) == sorted(ids)


def test_a_saga_opened_and_closed_in_one_append_gets_both_ledger_entries(
        client: redis.Redis) -> None:
    """The opening's entry rides on the append; the close, which that append did
    not carry (its meta is the opening's), is pushed after it as on layout 2."""
    store = _store(client)
    store.ledger.deferred = True
    store.open("agent-x", saga_id="order-9", then=[(K.SAGA_COMMITTED, {})])
    assert [e["kind"] for e in _pending(client, store, "order-9")] == \
        [K.LEDGER_OPENED, K.LEDGER_CLOSED]
    store.ledger.seal()
    entries = [e["data"]["saga_id"] for c in store.ledger.chains() for e in store.log.bodies(c)]
    assert entries.count("order-9") == 2
