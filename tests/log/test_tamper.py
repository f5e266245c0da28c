"""Every tamper class of the reliability brief is caught, with its first bad seq."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
import redis

from saga_store import keys
from saga_store.errors import AnchorMismatch
from saga_store.log.canonical import canonical
from saga_store.log.chain import Chain
from saga_store.log.layout import ROOT
from saga_store.log.store import EventStore
from saga_store.settings import Settings
from saga_store.verify.checker import ChainReport, Verifier
from saga_store.verify.export import export, verify_file

from ..helpers import (
    Entry,
    committed_saga,
    edit_body,
    read_stream,
    rehash_from,
    tamper,
    write_stream,
)

pytestmark = pytest.mark.parity
SHA = Chain(None)


def report_for(store: EventStore, saga_id: str) -> ChainReport:
    result = Verifier(store.log).verify()
    reps = {c.chain_id: c for c in result.chains}
    assert not result.ok
    return reps[saga_id]


def _edit_payload(es: list[Entry]) -> list[Entry]:
    es[4] = edit_body(es[4], lambda b: b["data"].update(args={"n": 999}))
    return es


def _edit_hash(es: list[Entry]) -> list[Entry]:
    eid, f = es[4]
    es[4] = (eid, {**f, b"h": bytes(32)})
    return es


def _delete(es: list[Entry]) -> list[Entry]:
    return es[:4] + es[5:]


def _swap(es: list[Entry]) -> list[Entry]:
    (a, fa), (b, fb) = es[4], es[5]
    es[4], es[5] = (a, fb), (b, fa)
    return es


def _insert_forged(es: list[Entry]) -> list[Entry]:
    # a well-formed event that passes the invariants, correctly linked after seq 3
    forged = edit_body(es[3], lambda b: b.update(seq=4, kind="step_duplicate_suppressed"),
                       SHA, prev=es[3][1][b"h"])
    shifted = [(keys.entry_id(i + 1).encode(), f) for i, (_, f) in enumerate(es[4:], start=4)]
    return [*es[:4], (b"0-5", forged[1]), *shifted]


def _replay(es: list[Entry]) -> list[Entry]:
    return [*es, (keys.entry_id(len(es)).encode(), es[2][1])]


def _downgrade(es: list[Entry]) -> list[Entry]:
    es[4] = edit_body(es[4], lambda b: b.update(v=0))
    return rehash_from(es, 4, SHA, orjson.loads(es[0][1][b"b"])["saga_id"])


def _trim_head(es: list[Entry]) -> list[Entry]:
    return es[2:]


CASES: list[tuple[str, Callable[[list[Entry]], list[Entry]], int, str]] = [
    ("edited payload", _edit_payload, 4, "hash_mismatch"),
    ("edited hash", _edit_hash, 4, "hash_mismatch"),
    ("deleted entry", _delete, 4, "missing_entry"),
    ("swapped entries", _swap, 4, "hash_mismatch"),
    ("inserted forged entry", _insert_forged, 5, "hash_mismatch"),
    ("replayed entry", _replay, 11, "hash_mismatch"),
    ("version downgrade, rehashed", _downgrade, 4, "bad_version"),
    ("head trimmed", _trim_head, 0, "head_trimmed"),
]


@pytest.mark.parametrize(("name", "change", "bad_seq", "reason"), CASES, ids=[c[0] for c in CASES])
def test_tamper_is_detected_at_the_first_bad_seq(store: EventStore, client: redis.Redis, name: str,
                                                 change: Callable[[list[Entry]], list[Entry]],
                                                 bad_seq: int, reason: str) -> None:
    """The verifier names the first bad seq and the reason class."""
    other = committed_saga(store)  # an untouched neighbour stays intact
    w = committed_saga(store)
    tamper(client, w.saga_id, change)
    assert store.log.head(w.saga_id).seq >= 0
    rep = report_for(store, w.saga_id)
    assert (rep.first_bad_seq, rep.reason) == (bad_seq, reason), rep.detail
    assert Verifier(store.log).verify(other.saga_id).ok


def test_event_spliced_from_another_saga_is_detected(store: EventStore,
                                                     client: redis.Redis) -> None:
    """An event of saga B, re-linked into saga A by a SHA-256 forger, is refused as wrong_chain."""
    a, b = committed_saga(store), committed_saga(store)
    b_entries = read_stream(client, store.keys.log(b.saga_id))

    def splice(es: list[Entry]) -> list[Entry]:
        es[4] = (es[4][0], dict(b_entries[4][1]))
        return rehash_from(es, 4, SHA, a.saga_id)
    tamper(client, a.saga_id, splice)
    rep = report_for(store, a.saga_id)
    assert (rep.first_bad_seq, rep.reason) == (4, "wrong_chain")


def test_tail_cut_after_close_is_caught_by_the_ledger(store: EventStore,
                                                      client: redis.Redis) -> None:
    """Dropping the last events of a closed saga: the chain alone is fine, the ledger is not."""
    w = committed_saga(store)
    tamper(client, w.saga_id, lambda es: es[:-2])
    rep = report_for(store, w.saga_id)
    assert (rep.first_bad_seq, rep.reason) == (9, "tail_cut")


def test_whole_saga_deleted_is_caught_by_the_ledger(store: EventStore, client: redis.Redis) -> None:
    w = committed_saga(store)
    client.delete(store.keys.log(w.saga_id))
    rep = report_for(store, w.saga_id)
    assert rep.reason == "saga_deleted"


def test_full_rewrite_of_a_saga_is_caught_by_the_ledger(store: EventStore,
                                                        client: redis.Redis) -> None:
    """A saga rewritten from seq 0 with recomputed SHA-256 differs from the ledger's record."""
    w = committed_saga(store)

    def rewrite(es: list[Entry]) -> list[Entry]:
        es[1] = edit_body(es[1], lambda b: b["data"].update(args={"n": -1}))
        return rehash_from(es, 1, SHA, w.saga_id)
    tamper(client, w.saga_id, rewrite)
    rep = report_for(store, w.saga_id)
    assert rep.reason == "rewritten"


def test_full_rewrite_including_the_ledger_needs_an_anchor(store: EventStore,
                                                          client: redis.Redis) -> None:
    """Rewriting saga and ledger with SHA-256 passes the chain checks; the anchor catches it."""
    w = committed_saga(store)
    anchor = store.ledger.anchor()
    tamper(client, w.saga_id, lambda es: rehash_from(
        [es[0], edit_body(es[1], lambda b: b["data"].update(args={"n": -1})), *es[2:]], 1, SHA,
        w.saga_id))
    new_head = store.log.head(w.saga_id)
    new_first = read_stream(client, store.keys.log(w.saga_id))[0][1][b"h"]

    def fix_ledger(es: list[Entry]) -> list[Entry]:
        out = []
        for e in es:
            def upd(b: dict[str, object]) -> None:
                data = b["data"]
                assert isinstance(data, dict)
                if b["kind"] == "saga_opened":
                    data["first"] = new_first.hex()
                else:
                    data["hash"] = new_head.hash.hex()
            out.append(edit_body(e, upd))
        return rehash_from(out, 0, SHA, chain)
    chain = store.log.layout.ledger_of(w.saga_id)
    tamper(client, chain, fix_ledger)
    new_ledger_head = store.log.head(chain).hash.hex()

    def fix_root(es: list[Entry]) -> list[Entry]:  # the root recorded the old head
        def upd(b: dict[str, object]) -> None:
            heads = b["data"]["heads"]  # type: ignore[index]
            if chain in heads:
                heads[chain][1] = new_ledger_head
        return rehash_from([edit_body(e, upd) for e in es], 0, SHA, ROOT)
    tamper(client, ROOT, fix_root)
    assert Verifier(store.log).verify().ok  # the documented limit of plain SHA-256
    with pytest.raises(AnchorMismatch, match="forked"):
        store.ledger.check_anchor(anchor)


def test_rewrite_without_the_hmac_key_is_caught(client: redis.Redis) -> None:
    """With an HMAC key, a forger who recomputes SHA-256 hashes fails at the first edit."""
    store = EventStore(client, Settings(hmac_key=b"k" * 32))
    w = committed_saga(store)
    tamper(client, w.saga_id, lambda es: rehash_from(
        [*es[:3], edit_body(es[3], lambda b: b.update(ts=1)), *es[4:]], 3, SHA, w.saga_id))
    rep = report_for(store, w.saga_id)
    assert (rep.first_bad_seq, rep.reason) == (3, "hash_mismatch")


def test_rollback_to_an_older_snapshot_is_caught_by_the_anchor(store: EventStore,
                                                              client: redis.Redis) -> None:
    """Redis going back in time verifies on its own, but is behind the anchor."""
    committed_saga(store)
    every = [keys.ledger_log(c) for c in [*store.ledger.chains(), ROOT]]
    ledger_before = {k: read_stream(client, k) for k in every}
    later = committed_saga(store)
    anchor = store.ledger.anchor()
    client.delete(store.keys.log(later.saga_id))
    for k, entries in ledger_before.items():  # every ledger chain as it was
        client.delete(k)
        if entries:
            write_stream(client, k, entries)
    assert Verifier(store.log).verify().ok
    with pytest.raises(AnchorMismatch, match="log behind anchor"):
        store.ledger.check_anchor(anchor)


def test_signed_anchor_that_was_edited_is_refused(client: redis.Redis) -> None:
    store = EventStore(client, Settings(hmac_key=b"k" * 32))
    committed_saga(store)
    anchor = store.ledger.anchor()
    assert store.ledger.check_anchor(anchor) == []
    anchor["ts"] += 1
    with pytest.raises(AnchorMismatch, match="signature"):
        store.ledger.check_anchor(anchor)


def test_invariant_violation_with_valid_hashes_is_caught(store: EventStore) -> None:
    """A correctly chained log that compensates out of order fails the saga invariants."""
    from saga_store.log.events import EventKind as K
    w = store.open("a")
    for n in range(2):
        w.append(K.STEP_INTENT, step=n, tool="t", data={"args": {}})
        w.append(K.STEP_SUCCEEDED, step=n, data={"result": {}})
    w.append(K.SAGA_FAILED)
    w.append(K.COMPENSATION_INTENT, step=0)
    w.append(K.COMPENSATION_INTENT, step=1)
    rep = report_for(store, w.saga_id)
    assert (rep.first_bad_seq, rep.reason) == (7, "invariant")
    assert "reverse order" in rep.detail


@pytest.mark.parametrize("reversibility", ["readonly", "compensable"])
def test_a_committed_saga_may_keep_a_failed_read_not_a_failed_write(
        store: EventStore, reversibility: str) -> None:
    """The gateway commits a session whose read failed (it changed nothing); a
    committed saga with a failed mutating step is a broken invariant."""
    from saga_store.log.events import EventKind as K
    w = store.open("a")
    w.append(K.STEP_INTENT, step=0, tool="t", data={"args": {}})
    w.append(K.STEP_SUCCEEDED, step=0, data={"result": {}})
    w.append(K.STEP_INTENT, step=1, tool="get", data={"args": {},
                                                       "reversibility": reversibility})
    w.append(K.STEP_FAILED, step=1, data={"error": "no such record"})
    w.append(K.SAGA_COMMITTED)
    if reversibility == "readonly":
        assert Verifier(store.log).verify().ok
        return
    rep = report_for(store, w.saga_id)
    assert (rep.first_bad_seq, rep.reason) == (5, "invariant")
    assert "step 1 not succeeded" in rep.detail


def test_edited_prev_in_an_export_is_a_broken_link(store: EventStore, tmp_path: Path) -> None:
    """Exports carry prev; one that does not match the event before is caught."""
    w = committed_saga(store)
    path = tmp_path / "x.jsonl"
    with open(path, "wb") as fh:
        export(store.log, fh)
    lines = path.read_bytes().splitlines()
    ev = orjson.loads(lines[5])
    ev["prev"] = "00" * 32
    lines[5] = canonical(ev)
    path.write_bytes(b"\n".join(lines) + b"\n")
    rep = {c.chain_id: c for c in verify_file(path, SHA).chains}[w.saga_id]
    assert (rep.first_bad_seq, rep.reason) == (4, "broken_link")
