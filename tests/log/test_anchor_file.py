"""``saga verify --anchor`` refuses an anchor file whose fields cannot describe a
ledger head (exit 2, saying which field and what to do), and still takes every
anchor ``saga anchor`` writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from click.testing import CliRunner, Result
from saga_store.cli.main import cli

from saga_store.log.canonical import canonical
from saga_store.log.layout import V1
from saga_store.log.store import EventStore

from ..helpers import committed_saga

ENV = {"SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": ""}


def verify_with(url: str, path: Path, doc: Any) -> Result:
    path.write_bytes(doc if isinstance(doc, bytes) else orjson.dumps(doc))
    return CliRunner().invoke(cli, ["verify", "--anchor", str(path)],
                              env={**ENV, "SAGA_REDIS_URL": url})


@pytest.fixture
def good(store: EventStore) -> dict[str, Any]:
    """An anchor of a store with one committed saga, as 'saga anchor' makes it."""
    committed_saga(store)
    return dict(orjson.loads(canonical(store.ledger.anchor())))


BAD: list[tuple[str, dict[str, Any], str]] = [
    ("negative seq", {"seq": -5}, "anchor seq -5 is not a ledger seq"),
    ("seq as text", {"seq": "1"}, "anchor seq '1' is not a ledger seq"),
    ("fractional seq", {"seq": 1.5}, "anchor seq 1.5 is not a ledger seq"),
    ("boolean seq", {"seq": True}, "anchor seq True is not a ledger seq"),
    ("seq past 2^53", {"seq": 1 << 60}, "is not a ledger seq"),
    ("short hash", {"hash": "ab" * 31}, "is not 64 lower-case hex digits"),
    ("upper-case hash", {"hash": "AB" * 32}, "is not 64 lower-case hex digits"),
    ("hash not hex", {"hash": "zz" * 32}, "is not 64 lower-case hex digits"),
    ("hash of an empty ledger with a seq", {"hash": ""}, "is not 64 lower-case hex"),
    ("unknown version", {"v": 2}, "anchor version 2 is not one this release knows"),
    ("version as text", {"v": "1"}, "anchor version '1' is not one"),
    ("unknown mode", {"mode": "md5"}, "anchor mode 'md5' is not one of"),
    ("negative time", {"ts": -1}, "anchor ts -1 is not a time"),
    ("a bucket's chain", {"chain": "ledger:7"}, "anchor chain 'ledger:7' is not the ledger"),
    ("sig not hex", {"sig": "forged"}, "anchor sig 'forged' is not an HMAC-SHA256"),
    ("unknown field", {"buckets": 16}, "fields no anchor has (buckets)"),
]


@pytest.mark.parametrize(("change", "why"), [(c, w) for _, c, w in BAD],
                         ids=[name for name, _, _ in BAD])
def test_an_impossible_field_is_refused_with_exit_2(
        good: dict[str, Any], redis_url: str, tmp_path: Path, change: dict[str, Any],
        why: str) -> None:
    res = verify_with(redis_url, tmp_path / "anchor.json", {**good, **change})
    assert res.exit_code == 2, res.output
    assert why in res.output
    assert "saga anchor" in res.output  # what to do next


@pytest.mark.parametrize("field", ["v", "seq", "hash", "ts", "mode"])
def test_an_anchor_without_a_field_it_needs_is_refused(
        good: dict[str, Any], redis_url: str, tmp_path: Path, field: str) -> None:
    res = verify_with(redis_url, tmp_path / "anchor.json",
                      {k: v for k, v in good.items() if k != field})
    assert res.exit_code == 2, res.output
    assert f"anchor file lacks {field}" in res.output


@pytest.mark.parametrize("doc", [b"[1, 2]", b"{not json", b""])
def test_a_file_that_is_no_json_object_is_refused(
        store: EventStore, redis_url: str, tmp_path: Path, doc: bytes) -> None:
    committed_saga(store)
    res = verify_with(redis_url, tmp_path / "anchor.json", doc)
    assert res.exit_code == 2, res.output
    assert "anchor file" in res.output


def test_the_anchors_saga_anchor_writes_still_verify(
        good: dict[str, Any], store: EventStore, redis_url: str, tmp_path: Path) -> None:
    """A fresh anchor, one of an empty ledger (seq -1) and one written before
    anchors named their chain (of a store of one chain) all pass."""
    assert verify_with(redis_url, tmp_path / "a.json", good).exit_code == 0
    empty = {**good, "seq": -1, "hash": "", "sig": None}
    assert verify_with(redis_url, tmp_path / "b.json", empty).exit_code == 0


@pytest.mark.layout(1)
def test_an_anchor_of_a_store_in_buckets_is_refused_by_a_store_of_one_chain(
        client: redis.Redis, redis_url: str, tmp_path: Path) -> None:
    """The anchor's chain must be one the store has: a root anchor given to a store
    of layout 1 is another store's anchor (exit 2, not a mismatch)."""
    old = EventStore(client)
    old.log._layout = V1  # written as releases before buckets wrote it
    committed_saga(old)
    mine = dict(orjson.loads(canonical(old.ledger.anchor())))
    assert mine["chain"] == "ledger"
    undated = {k: v for k, v in mine.items() if k != "chain"}  # before anchors named it
    assert verify_with(redis_url, tmp_path / "a.json", undated).exit_code == 0
    res = verify_with(redis_url, tmp_path / "b.json", {**mine, "chain": "ledger:root"})
    assert res.exit_code == 2, res.output
    assert "another store's anchor" in res.output
