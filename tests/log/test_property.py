"""A random single-byte change anywhere in a stored chain, or in an export, is detected."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from saga_store.log.chain import Chain
from saga_store.log.store import EventStore
from saga_store.ops.connection import embedded
from saga_store.verify.checker import Verifier
from saga_store.verify.export import export, verify_file

from ..helpers import committed_saga, read_stream, write_stream

pytestmark = pytest.mark.parity
FIELDS = [b"b", b"h"]


def _flip(data: bytes, pos: int, delta: int) -> bytes:
    i = pos % len(data)
    return data[:i] + bytes([(data[i] + delta) % 256]) + data[i + 1:]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chain_pick=st.integers(0, 2), entry_pick=st.integers(0, 1000), field=st.sampled_from(FIELDS),
       pos=st.integers(0, 10_000), delta=st.integers(1, 255))
def test_any_single_byte_change_in_redis_is_detected(chain_pick: int, entry_pick: int,
                                                     field: bytes, pos: int, delta: int) -> None:
    client: redis.Redis = embedded()
    store = EventStore(client)
    sagas = [committed_saga(store, steps=2).saga_id, committed_saga(store, steps=1).saga_id]
    chain_id = [*sagas, store.log.layout.ledger_of(sagas[0])][chain_pick]
    key = store.keys.chain_log(chain_id)
    entries = read_stream(client, key)
    eid, fields = entries[entry_pick % len(entries)]
    fields = {**fields, field: _flip(fields[field], pos, delta)}
    entries[entry_pick % len(entries)] = (eid, fields)
    write_stream(client, key, entries)
    assert not Verifier(store.log).verify().ok


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(pos=st.integers(0, 100_000), delta=st.integers(1, 255))
def test_any_single_byte_change_in_an_export_is_detected(tmp_path: Path, pos: int,
                                                         delta: int) -> None:
    store = EventStore(embedded())
    committed_saga(store, steps=2)
    path = tmp_path / "x.jsonl"
    with open(path, "wb") as fh:
        export(store.log, fh)
    raw = path.read_bytes()
    header_end = raw.index(b"\n") + 1
    body = raw[header_end:]
    i = pos % len(body)
    if body[i:i + 1] == b"\n":
        i = (i + 1) % len(body)  # a newline is a line boundary, not event content
    path.write_bytes(raw[:header_end] + _flip(body, i, delta))
    assert not verify_file(path, Chain(None)).ok


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1, max_size=140))
def test_a_saga_id_that_is_accepted_makes_job_ids_rq_accepts(text: str) -> None:
    """One definition of a saga id, checked against RQ's own rule for job ids: an id
    check_saga_id accepts never makes a worker raise on its jobs; one it refuses is
    refused with InvalidInput before anything is written."""
    from rq.job import validate_job_id

    from saga_store.errors import InvalidInput
    from saga_store.execution import jobs
    from saga_store.ids import check_saga_id
    try:
        sid = check_saga_id(text)
    except InvalidInput:
        return
    validate_job_id(jobs.step_job_id("ab" * 32, 7, sid))
    validate_job_id(jobs.compensation_job_id(sid))
