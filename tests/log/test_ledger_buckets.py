"""The ledger split into buckets (layout 2): each saga's entries in its bucket's
chain, a root chain over the buckets, and stores of the layout before it that
still verify and move over with 'saga migrate' without breaking a chain."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import redis
from click.testing import CliRunner
from saga_store.cli.main import cli

from saga_store import keys
from saga_store.errors import AnchorMismatch
from saga_store.log import layout
from saga_store.log.events import EventKind as K
from saga_store.log.events import body_dict
from saga_store.log.layout import LEGACY, ROOT, V1, Layout
from saga_store.log.store import EventStore
from saga_store.settings import Settings
from saga_store.testing import assert_eventually
from saga_store.verify.checker import Verifier

from ..helpers import LedgerKeys, commit_from_threads, committed_saga, ledger_entries

pytestmark = pytest.mark.parity


def reasons(store: EventStore) -> list[str | None]:
    return [f.reason for f in Verifier(store.log).verify().failures]


def old_store(client: redis.Redis) -> EventStore:
    """A store writing as releases before buckets did: one ledger chain, no layout
    recorded (layout 1's keys and chain id are those of that release)."""
    store = EventStore(client)
    store.log._layout = V1
    return store


@pytest.mark.layout(None)  # the store is created here, of each layout in turn
@pytest.mark.parametrize("version", [2, 3])
def test_a_new_store_records_its_layout_and_spreads_sagas_over_the_buckets(
        client: redis.Redis, version: int) -> None:
    store = EventStore(client, Settings(buckets=8, layout=version))
    sagas = [committed_saga(store, steps=1).saga_id for _ in range(40)]
    assert client.get(keys.LAYOUT) == f"{version} 8".encode()
    # another process with other settings reads what was recorded
    assert EventStore(client, Settings(buckets=512)).log.layout == Layout(version, 8)
    used = {store.log.layout.ledger_of(s) for s in sagas}
    assert len(used) >= 6  # 40 sagas over 8 buckets: nearly all of them
    for sid in sagas:
        chain = store.log.layout.ledger_of(sid)
        assert chain == f"ledger:{layout.Layout(version, 8).bucket_of(sid)}"
        mine = [e["data"]["saga_id"] for e in store.log.bodies(chain)]
        assert mine.count(sid) == 2  # its opening and its close, in its bucket only
    assert not client.exists(keys.LEDGER_LOG)  # nothing in the chain of the old layout
    assert Verifier(store.log).verify().ok


def test_an_entry_pushed_onto_another_buckets_list_is_set_aside(client: redis.Redis) -> None:
    store = EventStore(client, Settings(buckets=4))
    store.ledger.deferred = True
    w = committed_saga(store)
    mine = store.log.layout.ledger_of(w.saga_id)
    other = next(c for c in store.ledger.chains() if c not in (mine, LEGACY))
    real = client.lrange(keys.ledger_pending(mine), 0, -1)
    client.delete(keys.ledger_pending(mine))
    client.rpush(keys.ledger_pending(other), *real)  # real entries, in the wrong bucket
    assert store.ledger.seal() == 0
    assert [why for _, why in store.ledger.rejected()] == \
        [f"its saga's ledger chain is {mine}, not {other}"] * 2
    assert "rejected_entry" in reasons(store)


def test_an_entry_chained_in_another_bucket_fails_verify(client: redis.Redis) -> None:
    store = EventStore(client, Settings(buckets=4))
    w = committed_saga(store)
    mine = store.log.layout.ledger_of(w.saga_id)
    other = next(c for c in store.ledger.chains() if c not in (mine, LEGACY))
    opening = next(e for e in store.log.bodies(mine) if e["kind"] == K.LEDGER_OPENED)
    # a writer with the rights to chain appends a true entry to the wrong chain
    store.log.append(other, [body_dict(other, 0, K.LEDGER_OPENED, data=opening["data"])],
                     store.log.head(other))
    assert reasons(store) == ["wrong_bucket"]
    # the check runs in parallel too, with the same verdict
    verifier = Verifier(store.log, jobs=2)
    verifier.PARALLEL_MIN_EVENTS = 1
    assert [f.reason for f in verifier.verify().failures] == ["wrong_bucket"]


@pytest.mark.real_redis
def test_a_bucket_cut_after_the_root_recorded_it_fails_verify_and_the_anchor(
        client: redis.Redis) -> None:
    store = EventStore(client, Settings(buckets=4))
    w = committed_saga(store)
    anchor = store.ledger.anchor()
    assert anchor["chain"] == ROOT
    assert store.ledger.check_anchor(anchor) == []
    chain = store.log.layout.ledger_of(w.saga_id)
    # hide the saga's end: its close out of the bucket, its last event out of its log
    last = client.xrevrange(keys.ledger_log(chain), count=1)[0][0]
    client.xdel(keys.ledger_log(chain), last)
    assert reasons(store) == ["root_mismatch"]  # the root holds the bucket to its head
    with pytest.raises(AnchorMismatch, match=f"ledger chain {chain}"):
        store.ledger.check_anchor(anchor)


@pytest.mark.real_redis
def test_concurrent_writers_over_many_buckets_chain_each_entry_once(
        client: redis.Redis) -> None:
    """8 threads open and close 30 sagas each, sealing at once in 1,024 buckets."""
    store = EventStore(client)
    made = commit_from_threads(client, Settings(), threads=8, each=30)
    assert store.ledger.backlog() == {}
    chained = sorted((e["kind"], e["data"]["saga_id"]) for e in store.ledger.bodies())
    assert chained == sorted([(K.LEDGER_OPENED, s) for s in made]
                             + [(K.LEDGER_CLOSED, s) for s in made])
    assert Verifier(store.log).verify().ok


@pytest.mark.layout(1)
def test_a_store_of_the_old_layout_still_verifies_as_it_is(client: redis.Redis) -> None:
    old = old_store(client)
    w = committed_saga(old)
    assert client.exists(keys.LEDGER_LOG)
    assert client.get(keys.LAYOUT) is None
    reader = EventStore(client)  # this release, on the old data
    assert reader.log.layout == V1
    assert Verifier(reader.log).verify().ok
    anchor = reader.ledger.anchor()
    assert anchor["chain"] == LEGACY
    log = reader.keys.log(w.saga_id)
    client.xdel(log, client.xrevrange(log, count=1)[0][0])
    assert reasons(reader) == ["tail_cut"]


@pytest.mark.real_redis
@pytest.mark.layout(1)
def test_migrate_moves_an_old_store_to_buckets_without_breaking_a_chain(
        client: redis.Redis, redis_url: str) -> None:
    old = old_store(client)
    done = committed_saga(old).saga_id
    open_ = old.open("agent-1")  # still open when the store moves
    before = EventStore(client).ledger.anchor()
    env = {"SAGA_REDIS_URL": redis_url, "SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": ""}
    dry = CliRunner().invoke(cli, ["migrate", "--dry-run", "--buckets", "16"], env=env)
    assert dry.exit_code == 0, dry.output
    assert "would move layout 1 1 to 2 16" in dry.output
    assert client.get(keys.LAYOUT) is None
    res = CliRunner().invoke(cli, ["migrate", "--buckets", "16"], env=env)
    assert res.exit_code == 0, res.output
    assert "migrated" in res.output
    assert client.get(keys.LAYOUT) == b"2 16"
    again = CliRunner().invoke(cli, ["migrate"], env=env)
    assert again.exit_code == 0
    assert "nothing to do" in again.output
    dry = CliRunner().invoke(cli, ["migrate", "--dry-run"], env=env)
    assert "already layout 2 16: nothing to do" in dry.output
    new = EventStore(client)
    assert new.log.layout == Layout(2, 16)
    assert new.ledger.root_heads()[LEGACY][0] == 2  # the old chain's 3 entries, as left
    # the saga opened before closes into its bucket; one more saga starts there too
    w = new.writer(open_.saga_id)
    w.append(K.SAGA_COMMITTED)
    later = committed_saga(new, steps=1).saga_id
    for sid in (open_.saga_id, later):
        chain = new.log.layout.ledger_of(sid)
        assert any(e["data"]["saga_id"] == sid for e in new.log.bodies(chain))
    # a process started before the migration still writes the old way: sealed too
    straggler = committed_saga(old_store(client), steps=1).saga_id
    new.ledger.flush()
    assert any(e["data"]["saga_id"] == straggler for e in new.log.bodies(LEGACY))
    assert Verifier(new.log).verify().ok
    code = CliRunner().invoke(cli, ["verify"], env=env)
    assert code.exit_code == 0, code.output
    # the anchor of before the move still holds, and a new one covers both layouts
    assert new.ledger.check_anchor(before) == []
    after = new.ledger.anchor()
    assert new.ledger.check_anchor(after) == []
    entries = {(e["kind"], e["data"]["saga_id"]) for e in ledger_entries(new.log)}
    assert {(K.LEDGER_CLOSED, done), (K.LEDGER_CLOSED, open_.saga_id)} <= entries
    # cutting the old chain now is caught by the root's record of it
    client.xdel(keys.LEDGER_LOG, client.xrevrange(keys.LEDGER_LOG, count=1)[0][0])
    assert "root_mismatch" in reasons(new)
    with pytest.raises(AnchorMismatch):
        new.ledger.check_anchor(after)


def test_bad_bucket_counts_and_a_hand_edited_layout_get_clear_errors(
        client: redis.Redis) -> None:
    from saga_store.errors import InvalidInput
    for bad in ("0", "x", "20000"):
        with pytest.raises(InvalidInput, match="SAGA_BUCKETS"):
            Settings.from_env({"SAGA_BUCKETS": bad})
    client.set(keys.LAYOUT, "two buckets")
    with pytest.raises(InvalidInput, match="changed by hand"):
        _ = EventStore(client).log.layout
    client.set(keys.LAYOUT, "4 8")  # a layout of a later release
    with pytest.raises(InvalidInput, match="upgrade"):
        _ = EventStore(client).log.layout


@pytest.mark.layout(buckets=1)
def test_one_bucket_keys_helper_names_the_single_chain(client: redis.Redis) -> None:
    store = EventStore(client, Settings(buckets=1))
    w = committed_saga(store)
    at = LedgerKeys(store.log)
    assert at.chain == "ledger:0" == store.log.layout.ledger_of(w.saga_id)
    assert [orjson.loads(f[b"b"])["kind"] for _, f in client.xrange(at.log)] == \
        [K.LEDGER_OPENED, K.LEDGER_CLOSED]


@pytest.mark.layout(buckets=300)
def test_the_root_records_many_buckets_in_entries_small_enough_to_stay_inline(
        client: redis.Redis) -> None:
    """Heads of hundreds of buckets go a hundred to an entry: an entry stored aside
    as a blob would live in another slot and hide its heads from the checks."""
    store = EventStore(client, Settings(buckets=300))
    for _ in range(400):
        store.open("agent-1")
    store.ledger.anchor()
    bodies = store.log.bodies(ROOT)
    assert len(bodies) >= 2
    assert all(0 < len(b["data"]["heads"]) <= 100 for b in bodies)
    assert len(store.ledger.root_heads()) == len(store.ledger.present())
    assert store.ledger.record_root() == store.log.head(ROOT)  # nothing moved: no entry
    store.open("agent-1")
    assert store.ledger.record_root().seq == len(bodies)  # one bucket moved: one entry
    assert Verifier(store.log).verify().ok


def test_sagas_opened_in_one_millisecond_list_in_the_order_they_were_opened(
        client: redis.Redis) -> None:
    """Merged from many buckets, the newest-first list still has the order of
    opening: ids made in one millisecond by one process increase."""
    from saga_store.ids import new_id
    made = [new_id() for _ in range(10_000)]
    assert made == sorted(made)
    assert len(set(made)) == len(made)
    store = EventStore(client)
    opened = [store.open("agent-1").saga_id for _ in range(200)]
    assert store.saga_ids() == opened[::-1]


def test_sagas_list_in_the_order_they_opened_whatever_order_their_buckets_seal(
        client: redis.Redis) -> None:
    """A ledger entry keeps the time it was written, not the time a sealer chained
    it: buckets are sealed in no particular order."""
    import time
    store = EventStore(client, Settings(buckets=64))
    store.ledger.deferred = True
    first = store.open("agent-1").saga_id
    second = next(w.saga_id for w in iter(lambda: store.open("agent-2"), None)
                  if store.log.layout.ledger_of(w.saga_id)
                  != store.log.layout.ledger_of(first))
    time.sleep(0.005)  # the sealings below come later, and apart, by the ms clock
    assert store.ledger.seal(store.log.layout.ledger_of(second)) >= 1
    time.sleep(0.005)
    assert store.ledger.seal(store.log.layout.ledger_of(first)) >= 1
    both = (first, second)  # of the sagas opened (the loop may open more)
    assert [s for s in store.saga_ids() if s in both] == [second, first]
    from saga_store.console.listing import Filters, list_page
    rows = list_page(store, Filters(), None, 50).rows
    assert [r.saga_id for r in rows if r.saga_id in both] == [second, first]


@pytest.mark.layout(None)
def test_migrate_on_a_redis_with_no_store_writes_nothing_and_says_so(
        client: redis.Redis, redis_url: str) -> None:
    env = {"SAGA_REDIS_URL": redis_url, "SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": ""}
    for args in (["migrate"], ["migrate", "--dry-run", "--buckets", "8"]):
        res = CliRunner().invoke(cli, args, env=env)
        assert res.exit_code == 0, res.output
        assert "no store here" in res.output
    assert client.dbsize() == 0


CREATOR = r'''
import sys, redis
from saga_store.log.store import EventStore
from saga_store.settings import Settings
from tests.helpers import committed_saga
url, buckets = sys.argv[1], int(sys.argv[2])
r = redis.Redis.from_url(url)
r.rpush("test:ready", buckets)
r.blpop(["test:go"], timeout=30)  # all of them start writing at once
store = EventStore(r, Settings(buckets=buckets))  # the first write creates the store
for _ in range(5):
    print(committed_saga(store, steps=1).saga_id, flush=True)
'''


@pytest.mark.real_redis
@pytest.mark.layout(None)  # they create the store
def test_processes_creating_one_store_at_once_all_take_the_first_ones_layout(
        client: redis.Redis, redis_url: str) -> None:
    """Six processes with six bucket counts open sagas on an empty Redis at the same
    moment: one layout is recorded, every process writes by it (each saga's entries in
    its bucket of that layout), and the ledger verifies."""
    root = Path(__file__).resolve().parents[2]
    counts = [8, 16, 32, 64, 128, 256]
    procs = [subprocess.Popen([sys.executable, "-c", CREATOR, redis_url, str(n)], cwd=root,
                              stdout=subprocess.PIPE, text=True) for n in counts]
    assert_eventually(lambda: client.llen("test:ready") == len(counts), timeout=30,
                      what="every process ready")
    client.rpush("test:go", *["go"] * len(counts))
    sagas = [line.strip() for p in procs for line in p.communicate(timeout=60)[0].split()]
    assert [p.returncode for p in procs] == [0] * len(counts)
    recorded = layout.parse(client.get(keys.LAYOUT))
    assert recorded is not None
    assert recorded.buckets in counts
    store = EventStore(client)
    assert len(sagas) == 5 * len(counts)
    for sid in sagas:
        mine = [e["data"]["saga_id"] for e in store.log.bodies(recorded.ledger_of(sid))]
        assert mine.count(sid) == 2, (sid, recorded)
    assert Verifier(store.log).verify().ok
