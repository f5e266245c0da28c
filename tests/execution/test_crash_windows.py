"""Crash windows between a saga's closing (or opening) event and its ledger entry:
a process killed there leaves a debt the sweeper pays from the log, so the
chain verifies afterwards and cutting the saga's tail is still caught."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import redis
from click.testing import CliRunner
from saga_store.cli.main import cli

from saga_store.client.api import SagaStore
from saga_store.log.events import EventKind as K
from saga_store.log.layout import names_of
from saga_store.log.ledger import Ledger
from saga_store.protocol.state import Status
from saga_store.testing import assert_eventually
from saga_store.testing.workers import kill_at, workers

from ..helpers import LedgerKeys, ledger_entries
from ..ledger_tools import effects

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
TOOLS = "tests.ledger_tools"
ONE_STEP = [{"tool": "reserve_inventory", "args": {"sku": "A", "qty": 1}}]
TWO_THEN_FAIL = [{"tool": "reserve_inventory", "args": {"sku": f"S{i}", "qty": 1}}
                 for i in range(2)] + [{"tool": "fail_always", "args": {}}]


def verify(url: str, *args: str) -> int:
    env = {"SAGA_REDIS_URL": url, "SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": ""}
    return CliRunner().invoke(cli, ["verify", *args], env=env).exit_code


def ledger_has(store: SagaStore, sid: str, kind: str) -> bool:
    entries = ledger_entries(store.events.log)
    return any(e["kind"] == kind and e["data"]["saga_id"] == sid for e in entries)


def retired(client: redis.Redis, sid: str) -> bool:
    return client.zscore(names_of(client).active(sid), sid) is None


def cut_tail(client: redis.Redis, sid: str) -> None:
    """What an attacker with Redis access does to hide a saga's end: drop its last event."""
    log = names_of(client).log(sid)
    last = client.xrevrange(log, count=1)[0][0]
    client.xdel(log, last)


def recovered_then_cut(store: SagaStore, client: redis.Redis, url: str, sid: str) -> None:
    """After recovery the log verifies; then cutting its tail is caught."""
    assert ledger_has(store, sid, K.LEDGER_OPENED)
    assert ledger_has(store, sid, K.LEDGER_CLOSED)
    assert verify(url) == 0
    cut_tail(client, sid)
    assert verify(url) == 1
    assert verify(url, "--saga", sid) == 1


def test_a_worker_killed_right_after_the_last_outcome_owes_the_ledger_its_close(
        saga_store: SagaStore, client: redis.Redis, worker_env: dict[str, str],
        redis_url: str, ledger: Path, tmp_path: Path, worker_kind: str) -> None:
    """The committing worker dies before pushing the close; the next worker's sweeper
    writes it from the log before retiring the saga. (Of layout 3 the close's entry
    rides on the close's own append: there is no window, and nothing is owed.)"""
    sid = saga_store.submit(ONE_STEP, agent_id="agent-w")
    kill_at(worker_env, TOOLS, "after_outcome", tmp_path)
    assert saga_store.state(sid).status is Status.COMMITTED
    rides = saga_store.events.keys.bucketed
    assert ledger_has(saga_store, sid, K.LEDGER_CLOSED) is rides  # the window is real
    with workers(worker_env, TOOLS):
        assert_eventually(lambda: retired(client, sid), timeout=30,
                          what="the sweeper to retire the saga")
    assert len(effects("reserve")) == 1
    recovered_then_cut(saga_store, client, redis_url, sid)


def test_a_client_killed_between_submits_two_round_trips_owes_the_ledger_its_opening(
        saga_store: SagaStore, client: redis.Redis, worker_env: dict[str, str],
        redis_url: str, ledger: Path, tmp_path: Path) -> None:
    """The plan's saga exists with no ledger opening and no job; the sweeper runs it
    and pays the opening, so the committed saga is registered. (Of layout 3 the
    opening's entry rides on the saga's first append: only the job is missing.)"""
    flag = tmp_path / "fault"
    flag.touch()
    script = ("import sys; from saga_store import Registry, SagaStore, Settings\n"
              "s = SagaStore.from_url(sys.argv[1], Registry.from_modules('tests.ledger_tools'),"
              " Settings(lease_ms=1000))\n"
              "print(s.submit([{'tool': 'reserve_inventory', 'args': {'sku': 'A', 'qty': 1}}],"
              " agent_id='agent-k'), flush=True)\n")
    env = {**worker_env, "SAGA_FAULT": "submit_between", "SAGA_FAULT_ONCE": str(flag)}
    proc = subprocess.run([sys.executable, "-c", script, redis_url], env=env,
                          capture_output=True, timeout=60, check=False)
    assert proc.returncode == -9, proc.stderr.decode()  # killed where the fault names
    [sid] = saga_store.events.log.chain_ids()
    rides = saga_store.events.keys.bucketed
    assert ledger_has(saga_store, sid, K.LEDGER_OPENED) is rides
    with workers(worker_env, TOOLS):
        state = saga_store.wait(sid, timeout=60)
        assert_eventually(lambda: retired(client, sid), timeout=30, what="retired")
    assert state.status is Status.COMMITTED
    assert len(effects("reserve")) == 1
    recovered_then_cut(saga_store, client, redis_url, sid)


@pytest.mark.parametrize(("point", "at"), [
    ("comp_after_outcome", 1), ("comp_after_outcome", 2), ("comp_before_close", 1),
    ("comp_after_close", 1)])
def test_a_compensator_killed_after_a_compensation_or_around_the_close(
        saga_store: SagaStore, client: redis.Redis, worker_env: dict[str, str],
        redis_url: str, ledger: Path, tmp_path: Path, point: str, at: int,
        worker_kind: str) -> None:
    """Killed after the first or second compensation, before the close, or after the
    close and before its ledger entry: recovery finishes exactly once, in reverse,
    and the ledger closes the saga."""
    sid = saga_store.submit(TWO_THEN_FAIL, agent_id="agent-c")
    kill_at(worker_env, TOOLS, point, tmp_path, at)
    with workers(worker_env, TOOLS):
        state = saga_store.wait(sid, timeout=60)
        assert_eventually(lambda: retired(client, sid), timeout=30, what="retired")
    assert state.status is Status.COMPENSATED
    assert [e["step"] for e in saga_store.events.log.events(sid)
            if e["kind"] == K.COMPENSATION_SUCCEEDED] == [1, 0]
    assert len(effects("release")) == 2
    recovered_then_cut(saga_store, client, redis_url, sid)


@pytest.mark.layout(2)  # of layout 3 the close's entry rides on the commit: no such window
def test_a_client_killed_between_its_commit_and_the_ledger_close(
        saga_store: SagaStore, client: redis.Redis, worker_env: dict[str, str],
        redis_url: str, ledger: Path, tmp_path: Path) -> None:
    """A caller-driven saga whose process dies right after its commit is appended."""
    flag = tmp_path / "fault"
    flag.touch()
    script = ("import sys; from saga_store import Registry, SagaStore, Settings\n"
              "s = SagaStore.from_url(sys.argv[1], Registry.from_modules('tests.ledger_tools'),"
              " Settings(lease_ms=1000))\n"
              "with s.saga(agent_id='agent-d') as saga:\n"
              "    print(saga.saga_id, flush=True)\n"
              "    saga.call('reserve_inventory', {'sku': 'A', 'qty': 1})\n")
    env = {**worker_env, "SAGA_FAULT": "before_ledger_close", "SAGA_FAULT_ONCE": str(flag)}
    with workers(worker_env, TOOLS):
        proc = subprocess.run([sys.executable, "-c", script, redis_url], env=env,
                              capture_output=True, timeout=60, check=False)
        assert proc.returncode == -9, proc.stderr.decode()
        sid = proc.stdout.decode().split()[0]
        assert saga_store.state(sid).status is Status.COMMITTED
        assert_eventually(lambda: retired(client, sid), timeout=30, what="retired")
    recovered_then_cut(saga_store, client, redis_url, sid)


def test_a_backlog_of_any_size_seals_without_raising(saga_store: SagaStore,
                                                     client: redis.Redis) -> None:
    """120,000 pending entries (more than the old bound of 200 batches of 500) seal:
    copies of one saga's real close (a debt paid many times over is still one fact)."""
    from ..helpers import committed_saga
    w = committed_saga(saga_store.events)
    saga_store.events.ledger.flush()
    at = LedgerKeys(saga_store.events.log, w.saga_id)
    close = next(e for e in saga_store.events.log.bodies(at.chain)
                 if e["kind"] == K.LEDGER_CLOSED)
    entry = orjson.dumps({"kind": close["kind"], "data": close["data"]})
    pipe = client.pipeline(transaction=False)
    for i in range(120_000):
        pipe.rpush(at.pending, entry)
        if i % 10_000 == 9_999:
            pipe.execute()
    pipe.execute()
    assert Ledger(saga_store.events.log).seal() == 120_000
    assert client.llen(at.pending) == 0
    assert saga_store.events.log.head(at.chain).seq == 120_001
    assert Ledger(saga_store.events.log).rejected() == []


def test_a_flood_of_junk_on_the_pending_list_is_set_aside_in_batches(
        saga_store: SagaStore, client: redis.Redis) -> None:
    """20,000 entries no chain bears out cost the sealer a round trip per batch, not
    one per entry, and leave every one of them reported."""
    at = LedgerKeys(saga_store.events.log, "any-saga")
    client.rpush(at.pending, *[b"junk %d" % i for i in range(20_000)])
    assert Ledger(saga_store.events.log).seal() == 0
    assert client.llen(at.pending) == 0
    assert client.xlen(at.rejected) == 20_000
