"""SAGA_WAIT_REPLICAS: an append counts as done only once N replicas hold it,
against a real master and replica (a SIGSTOPped replica acknowledges nothing;
a SIGKILLed master and a promoted replica make the failover)."""

from __future__ import annotations

import hashlib
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

from saga_store import Registry, SagaStore
from saga_store.approval.requests import request
from saga_store.errors import ConflictError, InvalidInput, StepError, StoreUnavailable
from saga_store.log import scripts
from saga_store.log.events import EventKind as K
from saga_store.log.store import EventStore
from saga_store.ops.acl import agent_rules, worker_rules
from saga_store.settings import Settings
from saga_store.testing import RedisServer, assert_eventually
from saga_store.testing.workers import workers

from ..ledger_tools import effects

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
TIMEOUT_MS = 300
CARD = "4242424242424242"


def _linked(master: redis.Redis, replica: redis.Redis) -> bool:
    """Whether the replica streams from the master (both sides say so; the master
    counts a replica for WAIT once it is online, past its first sync)."""
    mine = replica.info("replication")
    theirs = master.info("replication").get("slave0") or {}
    return mine.get("master_link_status") == "up" and theirs.get("state") == "online"


@contextmanager
def master_and_replica(*master_args: str) -> Iterator[tuple[RedisServer, RedisServer]]:
    """A master and one replica of it, linked and in sync."""
    # disk-based sync: a diskless one puts the replica online only at its first ack
    with RedisServer("--repl-diskless-sync", "no", *master_args) as master, \
            RedisServer("--replicaof", "127.0.0.1", str(master.port)) as replica:
        m, r = redis.Redis(port=master.port), redis.Redis(port=replica.port)
        try:
            assert_eventually(lambda: _linked(m, r), timeout=20, what="the replica to link")
        finally:
            m.close()
            r.close()
        try:
            yield master, replica
        finally:
            # a replica refuses SIGTERM while it writes its first AOF after a sync
            replica.kill()


@contextmanager
def stopped(server: RedisServer) -> Iterator[None]:
    """``server`` frozen (SIGSTOP) for the block: it reads nothing, acknowledges nothing."""
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)


def _store(url: str, replicas: int) -> EventStore:
    return EventStore(redis.Redis.from_url(url),
                      Settings(wait_replicas=replicas, wait_timeout_ms=TIMEOUT_MS))


def _seqs(server: RedisServer, saga_id: str) -> list[int]:
    """The seqs of a saga's events as ``server`` holds them."""
    client = redis.Redis(port=server.port)
    try:
        return [e["seq"] for e in EventStore(client).log.bodies(saga_id)]
    finally:
        client.close()


def _promote(replica: RedisServer) -> None:
    """The replica takes the place of its master (which crashed)."""
    promoted = redis.Redis(port=replica.port)
    try:
        promoted.execute_command("REPLICAOF", "NO", "ONE")
    finally:
        promoted.close()


def _append_counted(store: EventStore, saga_id: str, k: int) -> list[int]:
    """Append ``k`` events one by one; the seqs of those the client was told are done
    (the test's own count: an append that raised is not counted)."""
    done = []
    w = store.writer(saga_id)
    for i in range(k):
        try:
            done.append(w.append(K.STEP_STARTED, step=i).seq)
        except StoreUnavailable:
            w = store.writer(saga_id)  # its outcome unknown: re-read the head
    return done


def test_appends_wait_for_the_replica_and_it_holds_them_at_once() -> None:
    """With the replica up, appends succeed and the replica holds each when it returns."""
    with master_and_replica() as (master, replica):
        store = _store(master.url, 1)
        w = store.open("agent-w")
        for i in range(20):
            head = w.append(K.STEP_STARTED, step=i)
            assert _seqs(replica, w.saga_id)[-1] == head.seq  # no waiting: it is there


def test_a_stopped_replica_fails_the_append_clearly_and_its_retry_appends_once() -> None:
    """Replica frozen: the append fails as not confirmed within about the timeout;
    resent after the replica resumes, it is found in the chain, not appended twice."""
    with master_and_replica() as (master, replica):
        store = _store(master.url, 1)
        w = store.open("agent-w")
        call = w.prepare([(K.STEP_STARTED, {"step": 1})])
        with stopped(replica):
            began = time.monotonic()
            with pytest.raises(StoreUnavailable, match=r"not confirmed: 0 of 1 replicas") as exc:
                w.applied(call, call.send(store.redis))
            took = time.monotonic() - began
        # what to do: submit again under the same id (it attaches), never under a new one
        assert f"submitted again with saga_id={w.saga_id} attaches" in str(exc.value)
        assert f"'saga show {w.saga_id}'" in str(exc.value)
        assert TIMEOUT_MS / 1000 * 0.9 < took < TIMEOUT_MS / 1000 + 2
        head = assert_eventually(lambda: _retried(w, call), timeout=10,
                                 what="the resent append to be confirmed",
                                 swallow=(StoreUnavailable,))
        assert head.seq == 1
        assert _seqs(master, w.saga_id) == [0, 1] == _seqs(replica, w.saga_id)


def _retried(w: Any, call: Any) -> Any:
    return w.applied(call, call.send(w.store.redis))


def test_a_resend_on_a_new_connection_is_not_confirmed_while_the_replica_lags() -> None:
    """Resent on a fresh connection (as after a lost one), alone or on a plain
    pipeline, an append that is only on the master still fails as not confirmed."""
    with master_and_replica() as (master, replica):
        store = _store(master.url, 1)
        w = store.open("agent-w")
        call = w.prepare([(K.STEP_STARTED, {"step": 1})])
        with stopped(replica):
            with pytest.raises(StoreUnavailable, match="not confirmed"):
                w.applied(call, call.send(store.redis))
            fresh = redis.Redis.from_url(master.url)  # as after a lost connection
            with pytest.raises(StoreUnavailable, match="not confirmed"):
                w.applied(call, call.send(fresh))
            pipe = fresh.pipeline(transaction=False)
            queued = call.queue(pipe)
            with pytest.raises(StoreUnavailable, match="not confirmed"):
                w.applied(call, queued(pipe.execute(raise_on_error=False)))
            fresh.close()


def test_a_resend_that_finds_its_append_replicates_a_write() -> None:
    """Sent again after it landed, an append replicates a write of its own, so a WAIT
    after it covers the first send whatever connection it goes on (a server may
    move a connection's WAIT offset only on writes); a rival append that lost the
    race is refused."""
    with master_and_replica() as (master, _replica):
        store = _store(master.url, 0)  # no WAIT: its GETACK moves the offset too
        w = store.open("agent-w")
        call = w.prepare([(K.STEP_STARTED, {"step": 1})])
        rival = store.writer(w.saga_id).prepare([(K.STEP_STARTED, {"step": 2})])
        w.applied(call, call.send(store.redis))

        def offset() -> int:
            return int(store.redis.info("replication")["master_repl_offset"])
        before = offset()
        assert w.applied(call, call.send(store.redis)).seq == 1  # found at the head
        assert offset() > before
        with pytest.raises(ConflictError):
            rival.result(rival.send(store.redis))
        assert _seqs(master, w.saga_id) == [0, 1]


def test_the_agent_and_worker_users_may_wait_for_replicas() -> None:
    """The ACL users that ``saga acl`` prints may send the WAIT after their appends."""
    with master_and_replica() as (master, replica):
        admin = redis.Redis(port=master.port)
        for name, rules in (("bot", agent_rules("bot")), ("worker", worker_rules())):
            admin.execute_command("ACL", "SETUSER", name, "reset", "on", ">pw", *rules)
            url = f"redis://{name}:pw@127.0.0.1:{master.port}/0"
            w = _store(url, 1).open("bot")
            assert _seqs(replica, w.saga_id) == [0]
            w.store.redis.close()
        admin.close()


@pytest.mark.parametrize("replicas", [0, 1])
def test_failover_loses_acknowledged_appends_only_without_wait(replicas: int) -> None:
    """Replica cut off, master killed, replica promoted: without WAIT the appends the
    old master acknowledged meanwhile are gone (the control); with it, every append
    the client counted as done is on the promoted replica."""
    k = 10
    with master_and_replica() as (master, replica):
        store = _store(master.url, replicas)
        w = store.open("agent-f")
        before = _append_counted(store, w.saga_id, k)
        m = redis.Redis(port=master.port)
        with stopped(replica):
            # the stopped replica's link cut: nothing sent from now on reaches it
            m.execute_command("CLIENT", "KILL", "TYPE", "replica")
            during = _append_counted(store, w.saga_id, k)
            master.kill()  # SIGKILL, while the replica still sleeps
        m.close()
        _promote(replica)
        promoted = assert_eventually(lambda: _seqs(replica, w.saga_id), timeout=10,
                                     what="the promoted replica to answer",
                                     swallow=(redis.ConnectionError, redis.BusyLoadingError))
        assert len(before) == k
        counted = [0, *before, *during]
        lost = sorted(set(counted) - set(promoted))
        if replicas:
            assert during == []  # not confirmed, so not counted
            assert lost == []
        else:
            assert len(during) == k
            assert lost == during  # acknowledged, and gone


@pytest.mark.timeout(180)
def test_a_worker_with_wait_commits_and_the_replica_holds_every_event(
        ledger: Path, worker_kind: str) -> None:
    """End to end through a real ``saga worker`` with SAGA_WAIT_REPLICAS=1: the
    workflow commits, and once the worker has gone past its commit, the replica
    holds every event of the saga, and every append the master ran (the worker's,
    the submit's, the ledger sealer's) sent its WAIT."""
    with master_and_replica(*LOG_EVERY_COMMAND) as (master, replica):
        env = {**os.environ, "SAGA_REDIS_URL": master.url, "SAGA_TEST_LEDGER": str(ledger),
               "SAGA_LEASE_MS": "1000", "SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": "",
               "SAGA_WAIT_REPLICAS": "1", "SAGA_WAIT_TIMEOUT_MS": "2000",
               "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        settings = Settings.from_env(env)
        assert settings.wait_replicas == 1
        client = redis.Redis.from_url(master.url)
        saga_store = SagaStore(client, Registry.from_modules("tests.ledger_tools"), settings)
        with workers(env, "tests.ledger_tools"):
            sid = saga_store.submit([
                {"tool": "reserve_inventory", "args": {"sku": "A", "qty": 1}},
                {"tool": "charge_payment", "args": {"amount_cents": 5, "card_number": CARD}},
            ], agent_id="e2e")
            assert str(saga_store.wait(sid, timeout=60).status) == "committed"
            # the closing ledger entry goes out after the commit's append and its WAIT
            assert_eventually(lambda: _closed_in_ledger(saga_store.events, sid), timeout=30,
                              what="the saga's closing ledger entry")
        on_master = _seqs(master, sid)
        assert _seqs(replica, sid) == on_master
        assert on_master == list(range(len(on_master)))
        assert len(effects("reserve")) == 1
        assert len(effects("charge")) == 1
        client.close()
        appends, waits = _appends_and_waits(master)
        assert appends >= 4
        assert waits == appends


def test_a_client_driven_saga_that_unwinds_waits_on_every_path(ledger: Path) -> None:
    """In the caller's process (open, intents, steps, their unwind and close, each
    on its own send path) with SAGA_WAIT_REPLICAS=1: every append sends its WAIT,
    and the replica holds every event."""
    with master_and_replica(*LOG_EVERY_COMMAND) as (master, replica):
        client = redis.Redis.from_url(master.url)
        store = SagaStore(client, Registry.from_modules("tests.ledger_tools"),
                          Settings(wait_replicas=1, wait_timeout_ms=2000, lease_ms=1000))
        opened = []

        def turn_that_fails() -> None:
            with store.saga(agent_id="agent-c", executor="inline") as saga:
                opened.append(saga.saga_id)
                saga.call("reserve_inventory", {"sku": "C", "qty": 1})
                saga.call("fail_always", {})
        with pytest.raises(StepError):
            turn_that_fails()
        sid = opened[0]
        assert str(store.state(sid).status) == "compensated"
        assert_eventually(lambda: _closed_in_ledger(store.events, sid), timeout=10,
                          what="the saga's closing ledger entry")
        on_master = _seqs(master, sid)
        assert _seqs(replica, sid) == on_master == list(range(len(on_master)))
        assert len(effects("release")) == 1
        client.close()
        appends, waits = _appends_and_waits(master)
        assert appends >= 6
        assert waits == appends


LOG_EVERY_COMMAND = ("--slowlog-log-slower-than", "0", "--slowlog-max-len", "100000")


def test_an_approval_request_waits_and_fails_as_not_confirmed_when_unacknowledged() -> None:
    """The approval request's append (riding with its place in ss:approvals) waits
    for the replica like any other: confirmed with it up, not confirmed when frozen."""
    with master_and_replica() as (master, replica):
        store = _store(master.url, 1)
        w = store.open("agent-a")
        request(w, 0, "charge_payment", {"amount_cents": 5}, 0)
        assert _seqs(replica, w.saga_id) == [0, 1]
        with stopped(replica), pytest.raises(StoreUnavailable, match="not confirmed"):
            request(w, 1, "charge_payment", {"amount_cents": 6}, 0)
        assert _seqs(master, w.saga_id) == [0, 1, 2]  # on the master all the same


def _appends_and_waits(server: RedisServer) -> tuple[int, int]:
    """How many append script calls the master ran (from its slow log, which logs
    every command), and how many WAITs (from its command stats: a WAIT that
    blocked is not in the slow log). Only appends send WAIT."""
    client = redis.Redis(port=server.port)
    try:
        entries = client.slowlog_get(100_000)
        waits = client.info("commandstats").get("cmdstat_wait", {}).get("calls", 0)
    finally:
        client.close()
    sha = hashlib.sha1(scripts.APPEND.encode()).hexdigest().encode()  # noqa: S324  # Redis's
    append = (b"EVAL " + scripts.APPEND.encode()[:60], b"EVALSHA " + sha)
    return sum(e["command"].startswith(append) for e in entries), int(waits)


def _closed_in_ledger(store: EventStore, saga_id: str) -> bool:
    entries = [*store.ledger.bodies(), *store.ledger.pending()]
    return any(e["kind"] == K.LEDGER_CLOSED and (e.get("data") or {}).get("saga_id") == saga_id
               for e in entries)


@pytest.mark.parametrize(("var", "value"), [
    ("SAGA_WAIT_REPLICAS", "-1"), ("SAGA_WAIT_REPLICAS", "one"), ("SAGA_WAIT_REPLICAS", "1.5"),
    ("SAGA_WAIT_TIMEOUT_MS", "0"), ("SAGA_WAIT_TIMEOUT_MS", "-5"),
    ("SAGA_WAIT_TIMEOUT_MS", "1s"),
])
def test_bad_wait_settings_are_refused_with_what_to_use(var: str, value: str) -> None:
    """A bad value names the variable and shows a value that works."""
    with pytest.raises(InvalidInput, match=rf"{var}={value!r}: use a whole number .* e\.g\. "
                                           rf"{var}=\d+"):
        Settings.from_env({var: value})


def test_wait_settings_are_read_from_the_environment() -> None:
    """Unset: no wait; set: the values given."""
    assert (Settings.from_env({}).wait_replicas, Settings.from_env({}).wait_timeout_ms) == \
        (0, 1000)
    s = Settings.from_env({"SAGA_WAIT_REPLICAS": "2", "SAGA_WAIT_TIMEOUT_MS": "250"})
    assert (s.wait_replicas, s.wait_timeout_ms) == (2, 250)


def test_doctor_and_a_worker_say_when_the_replicas_waited_for_are_missing() -> None:
    """SAGA_WAIT_REPLICAS=2 against a master with one replica: `saga doctor` exits 1
    naming it, a worker starting warns; with 1 it is fine."""
    from click.testing import CliRunner
    from saga_store.cli.main import cli

    def run(n: int, *args: str) -> Any:
        return CliRunner().invoke(cli, list(args), env={
            "SAGA_REDIS_URL": master.url, "SAGA_WAIT_REPLICAS": str(n), "SAGA_HMAC_KEY": "",
            "SAGA_HMAC_KEY_FILE": ""})

    with master_and_replica() as (master, _replica):
        res = run(1, "doctor")
        assert res.exit_code == 0, res.output
        assert "ok   wait_replicas = 1 (replicas connected: 1)" in res.output
        res = run(2, "doctor")
        assert res.exit_code == 1, res.output
        assert "FIX  wait_replicas = 2 (replicas connected: 1): SAGA_WAIT_REPLICAS=2 but " \
               "only 1 connected" in res.output
        res = run(2, "worker", "--tools", "tests.ledger_tools", "--burst")
        assert "WARNING: wait_replicas=2 (replicas connected: 1)" in res.output
