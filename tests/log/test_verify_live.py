"""``saga verify`` on a store that is busy, and that nobody touched, says intact
every time: what it compares (a saga's cached projection, the ledger's
entries, the root's record of the buckets' heads) it compares as of one
moment, however the workers move the store between its reads. A projection
changed by hand is still caught on the same busy store."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from click.testing import CliRunner
from saga_store.cli.main import cli

from saga_store import Registry, SagaStore, keys
from saga_store.log.events import EventKind as K
from saga_store.log.store import EventStore
from saga_store.log.stream import SagaLog
from saga_store.protocol.state import Status
from saga_store.settings import Settings
from saga_store.testing import RedisServer, assert_eventually
from saga_store.testing.workers import workers
from saga_store.verify.checker import Verifier

from ..helpers import committed_saga

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(180)]
TOOLS = "tests.ledger_tools"
PLAN = [{"tool": "noop", "args": {"n": n}} for n in range(3)]
# steps of 20 ms: a drain a few verify runs long on a fast machine as on a slow one
SLOW_PLAN = [{"tool": "slow_noop", "args": {"seconds": 0.02}} for _ in range(3)]
FINAL = {Status.COMMITTED, Status.COMPENSATED, Status.NEEDS_ATTENTION}


@pytest.fixture
def server(store_layout: str | None) -> Iterator[RedisServer]:
    """A Redis of the test's own (AOF on, fsync every second as in production), so
    it can be restarted under the workers."""
    with RedisServer(appendfsync="everysec") as srv:
        if store_layout:
            redis.Redis.from_url(srv.url).set("ss:layout", store_layout)
        yield srv


def verify(url: str) -> dict[str, Any]:
    res = CliRunner().invoke(cli, ["verify", "--json"], env={
        "SAGA_REDIS_URL": url, "SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": ""})
    out: dict[str, Any] = orjson.loads(res.output) if res.output.startswith("{") else {}
    out["exit"] = res.exit_code
    out["text"] = res.output
    return out


def settled(store: SagaStore, ids: list[str]) -> bool:
    return all(store.state(sid).status in FINAL for sid in ids)


class Submitter(threading.Thread):
    """Keeps opening sagas while verify runs: openings the ledger gets between
    verify's reads."""

    def __init__(self, url: str, batches: int, per: int = 10) -> None:
        super().__init__(daemon=True)
        self.url, self.batches, self.per = url, batches, per
        self.ids: list[str] = []

    def run(self) -> None:
        own = SagaStore(redis.Redis.from_url(self.url), Registry.from_modules(TOOLS),
                        Settings(lease_ms=1000))
        for _ in range(self.batches):
            self.ids += own.submit_many([PLAN] * self.per, agent_id="agent-2")


def drain_verifying(url: str, store: SagaStore, ids: list[str], sub: Submitter,
                    during: Any = None) -> list[dict[str, Any]]:
    """Run verify again and again until every saga has ended; returns each run."""
    runs: list[dict[str, Any]] = []
    sub.start()
    while not runs or not (not sub.is_alive() and settled(store, ids + sub.ids)):
        if during is not None and len(runs) == 2:
            during()
        runs.append(verify(url))
    sub.join()
    return runs


def test_verify_says_intact_every_time_while_workers_drain_sagas(
        server: RedisServer, worker_env: dict[str, str], tmp_path: Path) -> None:
    """200 plans (steps of 20 ms) drain through two workers while 40 more are
    opened: every verify run on the way exits 0, and there were several."""
    env = {**worker_env, "SAGA_REDIS_URL": server.url}
    store = SagaStore(redis.Redis.from_url(server.url), Registry.from_modules(TOOLS),
                      Settings(lease_ms=1000))
    ids = store.submit_many([SLOW_PLAN] * 200, agent_id="agent-1")
    with workers(env, TOOLS, count=2, log=tmp_path / "workers.log"):
        runs = drain_verifying(server.url, store, ids, Submitter(server.url, 4))
    bad = [r for r in runs if r["exit"] != 0]
    assert not bad, f"{len(bad)} of {len(runs)} runs failed; the first: {bad[0]['text']}"
    assert len(runs) >= 3
    assert verify(server.url)["exit"] == 0


def test_verify_says_intact_every_time_across_a_redis_restart(
        server: RedisServer, worker_env: dict[str, str], tmp_path: Path) -> None:
    """Redis restarts (AOF on) while the workers drain: verify runs that reach it
    exit 0 (a run that finds Redis down says so: exit 3, never 1)."""
    env = {**worker_env, "SAGA_REDIS_URL": server.url}
    store = SagaStore(redis.Redis.from_url(server.url), Registry.from_modules(TOOLS),
                      Settings(lease_ms=1000))
    ids = store.submit_many([PLAN] * 120, agent_id="agent-1")

    def restart() -> None:
        server.stop()
        server.start()
    with workers(env, TOOLS, count=2, log=tmp_path / "workers.log"):
        runs = drain_verifying(server.url, store, ids, Submitter(server.url, 3), restart)
    bad = [r["text"] for r in runs if r["exit"] not in (0, 3)]
    assert not bad, f"{len(bad)} of {len(runs)} runs failed; the first: {bad[0]}"
    assert sum(r["exit"] == 0 for r in runs) >= 3
    assert verify(server.url)["exit"] == 0


def test_a_projection_changed_by_hand_is_caught_on_a_busy_store(
        server: RedisServer, worker_env: dict[str, str], tmp_path: Path) -> None:
    """While workers drain other sagas, a committed saga's cached state is set to
    running by hand: verify fails that saga, and only it, with 'projection'."""
    env = {**worker_env, "SAGA_REDIS_URL": server.url}
    client = redis.Redis.from_url(server.url)
    store = SagaStore(client, Registry.from_modules(TOOLS), Settings(lease_ms=1000))
    [first] = store.submit_many([PLAN], agent_id="agent-1")
    with workers(env, TOOLS, count=2, log=tmp_path / "workers.log"):
        assert_eventually(lambda: settled(store, [first]), timeout=30, what="the first saga")
        ids = store.submit_many([PLAN] * 100, agent_id="agent-1")
        client.hset(store.events.keys.meta(first), "state", "running")
        out = verify(server.url)
        assert_eventually(lambda: settled(store, ids), timeout=60, what="the drain")
    assert out["exit"] == 1, out["text"]
    assert [(f["chain"], f["reason"]) for f in out["failures"]] == [(first, "projection")]


def test_a_saga_that_moves_between_its_chain_and_its_projection_is_judged_at_one_head(
        store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The saga's state changes (saga_failed) right after verify read its chain and
    before it reads the cached state: verify judges the cache at one head, not the
    old chain against the new cache, and finds it intact."""
    w = store.open("agent-1")
    w.append(K.STEP_INTENT, step=0, tool="t", data={"args": {}, "reversibility": "readonly"})
    read = SagaLog.pages
    moved: list[str] = []

    def pages(log: SagaLog, chain_id: str, *args: Any, **kwargs: Any) -> Iterator[Any]:
        yield from read(log, chain_id, *args, **kwargs)
        if chain_id == w.saga_id and not moved:  # once its chain was read whole
            moved.append(chain_id)
            w.append(K.SAGA_FAILED, data={"reason": "moved while verified"})
    monkeypatch.setattr(SagaLog, "pages", pages)
    res = Verifier(store.log, jobs=1).verify()
    assert moved
    assert res.ok, res.to_dict()["failures"]
    monkeypatch.undo()
    store.redis.hset(store.keys.meta(w.saga_id), "state", "running")  # by hand
    assert [(f.chain_id, f.reason) for f in Verifier(store.log).verify().failures] == \
        [(w.saga_id, "projection")]


def test_a_saga_opened_after_the_ledger_was_read_is_not_unregistered(
        store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A saga opened (with a step announced) between verify's read of the ledger and
    its read of the sagas is found in the ledger read again: intact."""
    committed_saga(store, steps=1)
    scan = SagaLog.chain_ids
    made: list[str] = []

    def chain_ids(log: SagaLog) -> Iterator[str]:
        if not made:
            w = store.open("agent-2")
            w.append(K.STEP_INTENT, step=0, tool="t", data={"args": {}})
            made.append(w.saga_id)
        yield from scan(log)
    monkeypatch.setattr(SagaLog, "chain_ids", chain_ids)
    res = Verifier(store.log, jobs=1).verify()
    assert made
    assert res.ok, res.to_dict()["failures"]


def test_a_saga_whose_opening_never_reached_the_ledger_is_still_unregistered(
        store: EventStore, client: redis.Redis) -> None:
    """The opening entry of a saga with events is taken off the pending list before
    it is chained: the ledger read again does not hold it either, and verify fails
    the saga ('unregistered')."""
    store.ledger.deferred = True
    w = store.open("agent-1")
    w.append(K.STEP_INTENT, step=0, tool="t", data={"args": {}})
    pending = keys.ledger_pending(store.log.layout.ledger_of(w.saga_id))
    [entry] = client.lrange(pending, 0, -1)
    client.lrem(pending, 1, entry)
    assert [(f.chain_id, f.reason) for f in Verifier(store.log).verify().failures] == \
        [(w.saga_id, "unregistered")]


def test_a_root_that_records_heads_sealed_after_the_ledger_was_read_is_no_mismatch(
        store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweeper seals new entries and records their chain's head in the root
    between verify's read of the ledger chains and its read of the sagas: the
    root, read before the chains, holds them only to heads they had."""
    committed_saga(store, steps=1)
    store.ledger.record_root()
    scan = SagaLog.chain_ids
    made: list[str] = []

    def chain_ids(log: SagaLog) -> Iterator[str]:
        if not made:
            made.append(committed_saga(store, steps=1).saga_id)  # sealed at once
            store.ledger.record_root()
        yield from scan(log)
    monkeypatch.setattr(SagaLog, "chain_ids", chain_ids)
    res = Verifier(store.log, jobs=1).verify()
    assert made
    assert res.ok, res.to_dict()["failures"]
