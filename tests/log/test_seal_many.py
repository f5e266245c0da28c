"""Sealing many buckets together (a sweeper's pass): one pipelined round trip per
phase for every bucket, and each bucket still sealed under its own lease, its
entries checked against their sagas' chains, each chained once."""

from __future__ import annotations

import threading
from collections.abc import Callable

import orjson
import pytest
import redis

from saga_store import keys
from saga_store.log.events import EventKind as K
from saga_store.log.store import EventStore
from saga_store.settings import Settings
from saga_store.verify.checker import Verifier

from ..helpers import committed_saga

pytestmark = [pytest.mark.parity, pytest.mark.cluster]


def pending_store(client: redis.Redis, sagas: int = 40, buckets: int = 16,
                  ) -> tuple[EventStore, list[str]]:
    """``sagas`` committed, their ledger entries all left pending (as by an agent
    user, which may not seal)."""
    store = EventStore(client, Settings(buckets=buckets))
    store.ledger.may_seal = False
    made = [committed_saga(store, steps=1).saga_id for _ in range(sagas)]
    store.ledger.may_seal = True
    assert sum(store.ledger.backlog().values()) == 2 * sagas
    return store, made


def chained(store: EventStore) -> list[tuple[str, str]]:
    return sorted((e["kind"], e["data"]["saga_id"]) for e in store.ledger.bodies())


def test_a_pass_seals_every_bucket_but_the_one_another_sealer_holds(
        client: redis.Redis) -> None:
    store, made = pending_store(client)
    backlog = store.ledger.backlog()
    assert len(backlog) >= 10  # 80 entries over 16 buckets: nearly all of them
    busy = sorted(backlog)[0]
    client.set(keys.ledger_lease(busy), "another-sealer", px=60_000)
    held = backlog[busy]
    sealed = store.ledger.seal_many(sorted(backlog))
    assert sealed == sum(backlog.values()) - held
    assert store.ledger.backlog() == {busy: held}  # left to the sealer holding it
    assert client.get(keys.ledger_lease(busy)) == b"another-sealer"
    for chain in backlog:  # every lease taken here was given back
        if chain != busy:
            assert client.get(keys.ledger_lease(chain)) is None
    client.delete(keys.ledger_lease(busy))
    assert store.ledger.seal_many([busy]) == held
    assert chained(store) == sorted([(K.LEDGER_OPENED, s) for s in made]
                                    + [(K.LEDGER_CLOSED, s) for s in made])
    assert Verifier(store.log).verify().ok


def test_a_forged_entry_is_set_aside_and_the_other_buckets_seal(
        client: redis.Redis) -> None:
    store, made = pending_store(client)
    backlog = store.ledger.backlog()
    victim = sorted(backlog)[-1]
    forged = orjson.dumps({"kind": K.LEDGER_CLOSED, "ts": 1, "data": {
        "saga_id": made[0], "state": "committed", "seq": 99, "hash": "00" * 32}})
    client.lpush(keys.ledger_pending(victim), forged)  # at the head of one bucket's list
    assert store.ledger.seal_many(sorted(backlog)) == sum(backlog.values())
    assert store.ledger.backlog() == {}
    assert [entry for entry, _ in store.ledger.rejected()] == [forged]
    assert chained(store) == sorted([(K.LEDGER_OPENED, s) for s in made]
                                    + [(K.LEDGER_CLOSED, s) for s in made])
    assert [f.reason for f in Verifier(store.log).verify().failures] == ["rejected_entry"]


@pytest.mark.layout(buckets=1)
def test_a_bucket_over_one_batch_is_sealed_whole(client: redis.Redis) -> None:
    store, _ = pending_store(client, sagas=300, buckets=1)  # 600 entries, batches of 500
    (chain,) = store.ledger.backlog()
    assert store.ledger.seal_many([chain]) == 600
    assert store.ledger.backlog() == {}
    assert len(chained(store)) == 600
    assert Verifier(store.log).verify().ok


@pytest.mark.real_redis
def test_sweepers_sealing_at_once_while_sagas_close_chain_each_entry_once(
        client: redis.Redis) -> None:
    """Four sealers pass over every bucket again and again while four writers open
    and close sagas: every entry is chained once, none is left pending."""
    settings = Settings(buckets=32)
    EventStore(client, settings).log.layout  # noqa: B018  the store's layout, recorded
    made: list[str] = []
    errors: list[BaseException] = []
    lock, writing = threading.Lock(), threading.Event()
    writing.set()

    def guarded(work: Callable[[EventStore], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                work(EventStore(client, settings))  # a store of its own, one client
            except BaseException as exc:
                errors.append(exc)
        return run

    def write(own: EventStore) -> None:
        own.ledger.deferred = True
        for _ in range(40):
            sid = committed_saga(own, steps=1).saga_id
            with lock:
                made.append(sid)

    def seal(own: EventStore) -> None:
        while writing.is_set():
            own.ledger.seal_many(own.ledger.chains())

    writers = [threading.Thread(target=guarded(write)) for _ in range(4)]
    sealers = [threading.Thread(target=guarded(seal)) for _ in range(4)]
    for t in writers + sealers:
        t.start()
    for t in writers:
        t.join()
    writing.clear()
    for t in sealers:
        t.join()
    assert errors == []
    assert len(made) == 160
    store = EventStore(client, settings)
    store.ledger.seal_many(store.ledger.chains())
    assert store.ledger.backlog() == {}
    assert chained(store) == sorted([(K.LEDGER_OPENED, s) for s in made]
                                    + [(K.LEDGER_CLOSED, s) for s in made])
    assert Verifier(store.log).verify().ok
