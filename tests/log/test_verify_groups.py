"""A large store is verified a group of buckets at a time: the verdicts are those
of one pass over everything (each kind of damage found, in whichever group it
lies), and what the check holds at once is one group's, not the store's."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis

from saga_store.log.events import EventKind as K
from saga_store.log.events import body_dict
from saga_store.log.layout import LEGACY
from saga_store.log.store import EventStore
from saga_store.settings import Settings
from saga_store.verify.checker import Verifier, VerifyResult

from ..helpers import committed_saga, edit_body, tamper

pytestmark = [pytest.mark.parity, pytest.mark.layout(None)]


@contextmanager
def groups_of(entries: int) -> Iterator[None]:
    was = vars(Verifier).get("GROUP_ENTRIES")
    Verifier.GROUP_ENTRIES = entries  # type: ignore[misc]  # a test's setting
    try:
        yield
    finally:
        Verifier.GROUP_ENTRIES = was  # type: ignore[misc,assignment]


def verdicts(result: VerifyResult) -> list[tuple[str, str | None]]:
    return sorted((f.chain_id, f.reason) for f in result.failures)


def test_groups_of_buckets_give_the_verdicts_of_one_pass(client: redis.Redis) -> None:
    store = EventStore(client, Settings(buckets=16, layout=3))
    sagas = [committed_saga(store, steps=1).saga_id for _ in range(60)]
    whole = Verifier(store.log, jobs=1).verify()
    with groups_of(20):
        assert len(Verifier(store.log)._groups(store.ledger.present())) > 4
        grouped = Verifier(store.log, jobs=1).verify()
    assert whole.ok
    assert grouped.ok
    assert (grouped.chain_count, grouped.events) == (whole.chain_count, whole.events)
    chains = len(store.ledger.present())  # the buckets' chains that hold entries
    assert grouped.chain_count == 60 + chains + 1  # the sagas, those chains, the root
    # of a store verified in groups only the ledger's reports and the failures are kept
    assert len(grouped.chains) == chains + 1

    # damage of four kinds, in sagas of different buckets
    edited, deleted, astray = sagas[3], sagas[17], sagas[41]
    tamper(client, edited, lambda es: [es[0], edit_body(es[1], lambda b: b.update(step=7)),
                                       *es[2:]])
    client.delete(store.keys.chain_log(deleted))
    mine = store.log.layout.ledger_of(astray)
    other = next(c for c in store.ledger.chains()
                 if c not in (mine, LEGACY) and store.log.head(c).seq >= 0)
    opening = next(e for e in store.log.bodies(mine) if e["kind"] == K.LEDGER_OPENED
                   and e["data"]["saga_id"] == astray)
    store.log.append(other, [body_dict(other, 0, K.LEDGER_OPENED, data=opening["data"])],
                     store.log.head(other))
    whole = Verifier(store.log, jobs=1).verify()
    with groups_of(20):
        grouped = Verifier(store.log, jobs=1).verify()
        parallel = Verifier(store.log, jobs=2)
        parallel.PARALLEL_MIN_EVENTS = 1
        forked = parallel.verify()
    expected = sorted([(edited, "hash_mismatch"), (deleted, "saga_deleted"),
                       (astray, "wrong_bucket")])
    assert verdicts(whole) == expected
    assert verdicts(grouped) == expected
    assert verdicts(forked) == expected


def test_what_verify_holds_at_once_is_a_groups_worth(client: redis.Redis) -> None:
    """600 sagas over 64 buckets: verified whole, the check's peak is the whole
    store's; in groups of about 150 ledger entries it is a fraction of that."""
    store = EventStore(client, Settings(buckets=64, layout=3))
    for _ in range(600):
        committed_saga(store, steps=0)

    def peak(entries: int) -> int:
        with groups_of(entries):
            tracemalloc.start()
            try:
                assert Verifier(store.log, jobs=1).verify().ok
                return tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
    whole, grouped = peak(10**9), peak(150)
    assert grouped < 0.4 * whole, (grouped, whole)
