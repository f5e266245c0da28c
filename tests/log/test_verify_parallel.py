"""Verification split over processes finds the same failures as a single pass."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from saga_store.log.chain import Chain
from saga_store.log.store import EventStore
from saga_store.verify import export as export_mod
from saga_store.verify.checker import Verifier
from saga_store.verify.export import export, verify_file

from ..helpers import committed_saga, edit_body, tamper

pytestmark = pytest.mark.real_redis


def _tampered_store(store: EventStore, client: redis.Redis) -> str:
    ids = [committed_saga(store, steps=2).saga_id for _ in range(12)]
    tamper(client, ids[7], lambda es: [*es[:5], edit_body(es[5], lambda b: b.update(ts=9)),
                                       *es[6:]])
    return ids[7]


def test_parallel_redis_verification_matches_single(store: EventStore, client: redis.Redis,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    bad = _tampered_store(store, client)
    monkeypatch.setattr(Verifier, "PARALLEL_MIN_EVENTS", 0)
    single = Verifier(store.log, jobs=1).verify()
    multi = Verifier(store.log, jobs=2).verify()
    assert [c.to_dict() for c in single.chains] == [c.to_dict() for c in multi.chains]
    assert [(c.chain_id, c.first_bad_seq) for c in multi.failures] == [(bad, 5)]


def test_parallel_file_verification_matches_single(store: EventStore, client: redis.Redis,
                                                   tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    bad = _tampered_store(store, client)
    path = tmp_path / "x.jsonl"
    with open(path, "wb") as fh:
        export(store.log, fh)
    monkeypatch.setattr(export_mod, "PARALLEL_MIN_BYTES", 0)
    single = verify_file(path, Chain(None), jobs=1)
    multi = verify_file(path, Chain(None), jobs=3)
    assert [c.to_dict() for c in single.chains] == [c.to_dict() for c in multi.chains]
    assert [(c.chain_id, c.first_bad_seq) for c in multi.failures] == [(bad, 5)]
