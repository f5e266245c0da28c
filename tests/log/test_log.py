"""The log: append/read round trip, compare-and-set, blobs, bad input."""

from __future__ import annotations

import itertools
import math

import pytest
import redis

from saga_store.errors import ConflictError, FencedOff, InvalidInput
from saga_store.log.canonical import canonical, check_json, loads
from saga_store.log.events import Event
from saga_store.log.events import EventKind as K
from saga_store.log.store import EventStore
from saga_store.log.stream import EMPTY, Lease
from saga_store.settings import Settings
from saga_store.verify.checker import Verifier

from ..helpers import committed_saga

pytestmark = pytest.mark.parity


@pytest.mark.cluster
def test_round_trip_returns_what_was_appended(store: EventStore) -> None:
    """Events read back carry the envelope fields, contiguous seqs and linked hashes."""
    w = committed_saga(store, steps=2)
    events = store.log.events(w.saga_id)
    assert [e["seq"] for e in events] == list(range(8))
    assert events[0]["kind"] == "saga_started"
    assert events[0]["prev"] == store.log.chain.genesis(w.saga_id).hex()
    for a, b in itertools.pairwise(events):
        assert b["prev"] == a["hash"]
    assert events[1]["data"]["args"] == {"n": 0, "pad": "x" * 40}
    Event.model_validate(events[1])  # the envelope contract holds
    assert Verifier(store.log).verify().ok


@pytest.mark.cluster
def test_stale_head_loses_the_race_and_learns_the_new_head(store: EventStore) -> None:
    """A writer with an old head gets ConflictError with the current head; nothing is written."""
    w = store.open("a")
    stale = w.head
    w.append(K.STEP_INTENT, step=0, tool="t", data={"args": {}})
    with pytest.raises(ConflictError) as exc:
        store.log.append(w.saga_id, [{"v": 1, "saga_id": w.saga_id, "kind": "step_intent",
                                      "ts": 1, "step": 1}], stale)
    assert exc.value.head.seq == 1
    assert store.log.head(w.saga_id) == w.head


@pytest.mark.cluster
def test_existing_saga_id_cannot_be_opened_again(store: EventStore) -> None:
    """Opening a saga id that exists is refused without touching the existing chain."""
    store.open("a", saga_id="order-1")
    before = store.log.head("order-1")
    with pytest.raises(InvalidInput, match="already exists"):
        store.open("a", saga_id="order-1")
    assert store.log.head("order-1") == before


@pytest.mark.cluster
def test_lease_and_phase_checks_fence_off_writers(store: EventStore, client: redis.Redis) -> None:
    """An append naming a lease it does not hold, or the wrong phase, is refused."""
    w = store.open("a")
    client.set(store.keys.lease(w.saga_id), "token-2")
    with pytest.raises(FencedOff, match="lease"):
        w.append(K.STEP_INTENT, step=0, tool="t", lease=Lease("token-1"))
    with pytest.raises(FencedOff, match="lease"):
        w.append(K.STEP_INTENT, step=0, tool="t", lease=Lease("token-1", "acquire", 1000))
    w.append(K.STEP_INTENT, step=0, tool="t", lease=Lease("token-2"), phase="forward")
    w.append(K.SAGA_FAILED, data={"reason": "x"})
    with pytest.raises(FencedOff, match="phase"):
        w.append(K.STEP_STARTED, step=0, phase="forward")
    assert store.meta(w.saga_id)["phase"] == "unwinding"


@pytest.mark.cluster
def test_batch_append_is_one_atomic_step(store: EventStore) -> None:
    """append_many writes all events or none, linked in order."""
    w = store.open("a")
    w.append_many([(K.STEP_INTENT, {"step": n, "tool": "t"}) for n in range(50)])
    assert store.log.head(w.saga_id).seq == 50
    assert Verifier(store.log).verify(w.saga_id).ok


@pytest.mark.cluster
def test_large_payload_goes_to_a_blob_covered_by_the_chain(store: EventStore) -> None:
    """A payload over the blob threshold is stored by content hash; the event carries the digest."""
    w = store.open("a")
    w.append(K.STEP_INTENT, step=0, tool="t", data={"args": {"doc": "y" * 50_000}})
    ev = store.log.events(w.saga_id)[1]
    ref = ev["data"]
    assert ref["$blob"].startswith("sha256:")
    assert store.log.load_blob(w.saga_id, ref) == {"args": {"doc": "y" * 50_000}}


@pytest.mark.parametrize(("value", "message"), [
    ({"x": math.nan}, "not allowed"),
    ({"x": math.inf}, "not allowed"),
    ({"x": 2**53 + 1}, "beyond 2"),
    ({"x": "\udc80"}, "UTF-8"),
    ({"x": {1, 2}}, "not JSON"),
    ({"x": (1, 2)}, "not JSON"),
    ({1: "a"}, "not a string"),
    ({"x": b"bytes"}, "not JSON"),
])
def test_bad_values_get_a_clear_error(value: object, message: str) -> None:
    """Values JSON can't carry faithfully are refused with a message naming the field."""
    with pytest.raises(InvalidInput, match=message):
        check_json(value, "args")


def test_nesting_beyond_the_limit_is_refused() -> None:
    deep: object = "leaf"
    for _ in range(40):
        deep = {"k": deep}
    with pytest.raises(InvalidInput, match="nested deeper"):
        check_json(deep, "args")


@pytest.mark.parametrize(("text", "value"), [
    (b'{"n": 18446744073709551616}', {"n": 2**64}),
    ('[-9223372036854775809, "12345678901234567890"]', [-(2**63) - 1, "12345678901234567890"]),
    (b'{"n": 9007199254740993, "f": 1.5}', {"n": 2**53 + 1, "f": 1.5}),
])
def test_loads_keeps_numbers_as_written(text: bytes | str, value: object) -> None:
    """orjson would read an integer beyond 64 bits as a float; loads keeps it exact,
    for check_json to refuse by name rather than pass a number nobody sent."""
    assert loads(text) == value
    with pytest.raises(InvalidInput, match="beyond 2"):
        check_json(loads(text), "args")


@pytest.mark.parametrize(("text", "message"), [
    (b"[NaN]", "plan: NaN is not allowed in JSON"),
    (b'{"x": Infinity}', "plan: Infinity is not allowed in JSON"),
    (b"-Infinity", "plan: -Infinity is not allowed in JSON"),
    (b"[" * 10_000 + b"]" * 10_000, "plan: nested too deeply"),
    (b"[" * 10_000 + b"12345678901234567890" + b"]" * 10_000, "plan: nested too deeply"),
    (b"[1e999]", "plan: number is infinity"),
    (b'{"a": 1', "plan: unexpected end"),
])
def test_loads_refuses_what_is_not_json_saying_why(text: bytes, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        loads(text, "plan")


def test_canonical_form_is_sorted_compact_and_strict() -> None:
    """One encoding: sorted keys, no spaces; big integers refused by the encoder too."""
    assert canonical({"b": 1, "a": [True, None, 1.5, "é"]}) == \
        '{"a":[true,null,1.5,"é"],"b":1}'.encode()
    with pytest.raises(InvalidInput):
        canonical({"x": 2**64})


@pytest.mark.parametrize("bad", ["a:b", "a*", "{x}", "a b", "a\nb", "x" * 129, "", "a?b"])
def test_bad_ids_are_refused_before_any_key_is_built(store: EventStore, client: redis.Redis,
                                                    bad: str) -> None:
    """Ids that would break key names are refused and nothing is written."""
    before = client.dbsize()  # 0, or the layout the test's store is to have (ss:layout)
    with pytest.raises(InvalidInput):
        store.open(bad)
    with pytest.raises(InvalidInput):
        store.open("agent", saga_id=bad)
    assert client.dbsize() == before


def test_oversized_event_is_refused_and_nothing_is_written(client: redis.Redis) -> None:
    """An event over the size limit raises before the append; the chain is unchanged."""
    store = EventStore(client, Settings(max_event_bytes=4096, blob_threshold=1 << 20))
    w = store.open("a")
    with pytest.raises(InvalidInput, match="limit"):
        w.append(K.STEP_INTENT, step=0, tool="t", data={"args": {"x": "z" * 5000}})
    assert store.log.head(w.saga_id) == w.head
    assert client.xlen(store.keys.log(w.saga_id)) == 1


def test_oversized_payload_is_refused_even_as_a_blob(client: redis.Redis) -> None:
    store = EventStore(client, Settings(max_event_bytes=4096, blob_threshold=1024))
    w = store.open("a")
    with pytest.raises(InvalidInput, match="payload"):
        w.append(K.STEP_INTENT, step=0, tool="t", data={"args": {"x": "z" * 5000}})
    assert client.xlen(store.keys.log(w.saga_id)) == 1
    assert not list(client.scan_iter(match="*:blob:*"))


def test_empty_chain_head(store: EventStore) -> None:
    assert store.log.head("nothing-here") == EMPTY


def test_meta_projection_is_rebuildable_from_the_log(store: EventStore,
                                                     client: redis.Redis) -> None:
    """The cached projection can be deleted and rebuilt to the same values."""
    w = committed_saga(store)
    before = store.meta(w.saga_id)
    client.delete(store.keys.meta(w.saga_id))
    after = store.rebuild_meta(w.saga_id)
    assert {k: before[k] for k in after} == after


@pytest.mark.cluster
def test_lease_is_acquired_renewed_and_released_with_the_append(store: EventStore,
                                                                client: redis.Redis) -> None:
    """'acquire' takes a free lease with a TTL on Redis's clock; 'release' drops it."""
    w = store.open("a")
    w.append(K.STEP_INTENT, step=0, tool="t", lease=Lease("w1", "acquire", 5000))
    assert client.get(store.keys.lease(w.saga_id)) == b"w1"
    assert 0 < client.pttl(store.keys.lease(w.saga_id)) <= 5000
    w.append(K.STEP_STARTED, step=0, lease=Lease("w1", "acquire", 9000))
    assert client.pttl(store.keys.lease(w.saga_id)) > 5000
    w.append(K.STEP_SUCCEEDED, step=0, lease=Lease("w1", "release"))
    assert client.get(store.keys.lease(w.saga_id)) is None


def test_append_reloads_the_script_after_redis_lost_it(store: EventStore,
                                                       client: redis.Redis) -> None:
    """After SCRIPT FLUSH (or a Redis restart) appends go on: the script is loaded again."""
    w = store.open("a")
    client.script_flush()
    w.append(K.STEP_INTENT, step=0, tool="t")
    assert store.log.head(w.saga_id).seq == 1


@pytest.mark.cluster
def test_a_closed_saga_takes_no_more_events(store: EventStore) -> None:
    """Nothing may follow a final event: the append script refuses any writer."""
    w = store.open("agent")
    w.append(K.SAGA_COMMITTED)
    head = store.log.head(w.saga_id)
    with pytest.raises(FencedOff, match="closed"):
        w.append(K.STEP_DUPLICATE_SUPPRESSED, step=0, data={"outcome": "step_succeeded"})
    assert store.log.head(w.saga_id) == head


def test_the_ledgers_id_is_no_saga_id(store: EventStore) -> None:
    """'ledger' names the ledger's chain: a saga opened under it would write into
    the ledger and fail it for ever."""
    with pytest.raises(InvalidInput, match="reserved"):
        store.open("agent-x", saga_id="ledger")


@pytest.mark.cluster
def test_a_guard_refuses_the_append_and_writes_nothing(store: EventStore,
                                                       client: redis.Redis) -> None:
    """An append guarded by a key that must be absent (the sweeper's abort of a saga
    whose caller's lease must have lapsed) is refused if the key exists."""
    from saga_store.errors import FencedOff
    from saga_store.log.stream import SideWrite
    from saga_store.protocol.vocab import Fence
    w = store.open("agent-x")
    guard = [SideWrite("absent", store.keys.driver(w.saga_id))]
    client.set(store.keys.driver(w.saga_id), "1")
    before = client.xlen(store.keys.log(w.saga_id))
    with pytest.raises(FencedOff) as refused:
        w.append_many([(K.SAGA_FAILED, {"data": {"reason": "gone"}})], side=guard)
    assert refused.value.reason is Fence.GUARD
    assert client.xlen(store.keys.log(w.saga_id)) == before
    client.delete(store.keys.driver(w.saga_id))
    w.append_many([(K.SAGA_FAILED, {"data": {"reason": "gone"}})], side=guard)
    assert client.xlen(store.keys.log(w.saga_id)) == before + 1


@pytest.mark.cluster
def test_index_writes_ride_on_the_append_and_a_refused_append_makes_none(
        store: EventStore, client: redis.Redis) -> None:
    """The append script writes the indexes a saga is in with its events (layout 3
    keeps them under the saga's bucket's tag): a sorted set scored by Redis's clock
    (or kept, with 'n'), a set, a list whose new length comes back; a refused
    append (a stale head) writes none of them."""
    from saga_store.log.stream import SideWrite
    w = store.open("agent-x")
    tag = store.keys.base(w.saga_id)
    index, marks, queue = f"{tag}:t-index", f"{tag}:t-set", f"{tag}:t-list"
    (now_s, now_us) = client.time()
    stale = w.head
    side = [SideWrite("zadd", index, (w.saga_id, 5000, "r")),
            SideWrite("zadd", index, ("fixed", 7, "")),
            SideWrite("sadd", marks, (w.saga_id,)),
            SideWrite("rpush", queue, ("one",)), SideWrite("rpush", queue, ("two",))]
    call = w.prepare([(K.STEP_INTENT, {"step": 0, "tool": "t", "data": {"args": {}}})],
                     side=side)
    reply = call.send(client)
    w.applied(call, reply)
    assert reply[3] == 2  # the list's length after the last push
    due = client.zscore(index, w.saga_id)
    assert now_s * 1000 + now_us // 1000 + 5000 <= due < now_s * 1000 + now_us // 1000 + 65_000
    assert client.zscore(index, "fixed") == 7
    assert client.smembers(marks) == {w.saga_id.encode()}
    assert client.lrange(queue, 0, -1) == [b"one", b"two"]
    # 'n' keeps a score already set; 'zrem' and 'srem' take a member out
    w.append_many([(K.STEP_INTENT, {"step": 1, "tool": "t", "data": {"args": {}}})],
                  side=[SideWrite("zadd", index, (w.saga_id, 1, "n")),
                        SideWrite("zrem", index, ("fixed",)),
                        SideWrite("srem", marks, (w.saga_id,))])
    assert client.zscore(index, w.saga_id) == due
    assert client.zscore(index, "fixed") is None
    assert client.scard(marks) == 0
    # a writer at a stale head is refused: nothing of its side writes lands
    late = store.log.prepare(w.saga_id, [{"v": 1, "saga_id": w.saga_id, "kind": "step_intent",
                                          "ts": 1, "step": 9}], stale,
                             side=[SideWrite("zadd", index, ("late", 1, "")),
                                   SideWrite("sadd", marks, ("late",)),
                                   SideWrite("rpush", queue, ("late",))])
    with pytest.raises(ConflictError):
        late.result(late.send(client))
    assert client.zscore(index, "late") is None
    assert client.scard(marks) == 0
    assert client.llen(queue) == 2
