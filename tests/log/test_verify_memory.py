"""What verify keeps per saga while it runs stays small: the ledger's view of
each saga holds digests, not the entries' encoded bytes (orjson hands those
back in buffers of about 4 KB)."""

from __future__ import annotations

import tracemalloc

from saga_store.log.ledger import Ledger
from saga_store.log.store import EventStore
from saga_store.verify.checker import Verifier

from ..helpers import committed_saga

SAGAS = 300


def test_the_ledgers_view_of_a_saga_takes_under_2_kb(store: EventStore) -> None:
    for _ in range(SAGAS):
        committed_saga(store, steps=0)
    verifier = Verifier(store.log, jobs=1)
    chains = Ledger(store.log).present()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        reports, view = verifier._check_ledgers(chains, None)
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(view.opened) == len(view.closed) == SAGAS
    assert all(r.ok for r in reports)
    assert kept / SAGAS < 2048, f"{kept / SAGAS:.0f} B a saga"
