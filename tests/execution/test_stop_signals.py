"""SIGTERM is honoured within 2 s in every wait of a worker of either kind: the
Redis outage's retries (Redis killed, or stopped with SIGSTOP so that its
sockets hang), a back-off between two tries (the step is handed back, and the
next delivery is no lost one), a lease renewal or check that Redis does not
answer. A tool call under way is what a warm stop waits for, never cut."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from saga_store import Registry, SagaStore, Settings
from saga_store.log.events import EventKind as K
from saga_store.ops.connection import connect
from saga_store.protocol.state import Status
from saga_store.testing import RedisServer, assert_eventually
from saga_store.testing.workers import WorkerProcess

from ..ledger_tools import effects
from ..timing_tools import overlapping, tries

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
TOOLS = "tests.timing_tools"
ROOT = str(Path(__file__).resolve().parents[2])
LIMIT_S = 2.0


@contextmanager
def _redis() -> Iterator[RedisServer]:
    srv = RedisServer()
    srv.start()
    try:
        yield srv
    finally:
        if srv.proc is not None:
            os.kill(srv.proc.pid, signal.SIGCONT)
        srv.stop()


def _env(srv: RedisServer, ledger: Path) -> dict[str, str]:
    return {**os.environ, "SAGA_REDIS_URL": srv.url, "SAGA_TEST_LEDGER": str(ledger),
            "SAGA_LEASE_MS": "600", "PYTHONPATH": ROOT, "SAGA_HMAC_KEY": "",
            "SAGA_HMAC_KEY_FILE": ""}


def _take_down(srv: RedisServer, how: str) -> None:
    assert srv.proc is not None
    if how == "killed":
        srv.kill()
    else:
        os.kill(srv.proc.pid, signal.SIGSTOP)


def _stop_time(worker: WorkerProcess) -> float:
    """SIGTERM the worker; seconds until its process is gone."""
    assert worker.proc is not None
    t0 = time.monotonic()
    worker.proc.send_signal(signal.SIGTERM)
    try:
        worker.proc.wait(timeout=15)
    except Exception:
        worker.kill()
        return float("inf")
    return time.monotonic() - t0


@pytest.mark.parametrize("kind", ["rq", "async"])
@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_an_idle_worker_in_a_redis_outage_stops_within_2_s(
        ledger: Path, tmp_path: Path, kind: str, how: str) -> None:
    """Redis killed (connections refused, the outage's retries) or stopped (its
    sockets hang): SIGTERM, and the worker is gone within 2 s."""
    log = tmp_path / "worker.log"
    with _redis() as srv:
        worker = WorkerProcess(_env(srv, ledger), TOOLS, log=log, kind=kind).start()
        try:
            assert_eventually(lambda: "Listening on" in log.read_text()
                              or "asyncio, up to" in log.read_text(), timeout=30,
                              what="the worker to listen")
            time.sleep(0.5)
            _take_down(srv, how)
            time.sleep(3.0)  # in the retry loop, or blocked on a socket
            assert worker.alive, log.read_text()
            took = _stop_time(worker)
        finally:
            worker.kill()
    assert took < LIMIT_S, (took, log.read_text())


@pytest.mark.parametrize(("kind", "tool"), [("rq", "slow_retry"), ("async", "slow_retry"),
                                            ("async", "slow_retry_async")])
def test_a_worker_stopped_in_a_back_off_hands_its_step_back(
        ledger: Path, tmp_path: Path, kind: str, tool: str) -> None:
    """SIGTERM between two tries (Redis up): the worker logs step_released and
    exits within 2 s; another worker takes the step at once, as a delivery that
    was not lost (the tool, irreversible, allows one: it is not put in doubt) and
    the saga commits, one try at a time, one effect."""
    log = tmp_path / "worker.log"
    with _redis() as srv:
        store = SagaStore(connect(srv.url), Registry.from_modules(TOOLS),
                          Settings(lease_ms=600))
        env = _env(srv, ledger)
        sid = store.submit([{"tool": tool, "args": {"seconds": 0.3, "fail": 3}}],
                           agent_id="agent-stop")
        first = WorkerProcess(env, TOOLS, log=log, kind=kind).start()
        second = None
        try:
            assert_eventually(lambda: len(tries()) >= 2, timeout=30, what="two tries")
            time.sleep(0.05)  # the back-off after the second try (0.8 s)
            took = _stop_time(first)
            second = WorkerProcess(env, TOOLS, log=log, kind=kind).start()
            state = assert_eventually(lambda: (st := store.state(sid)).final and st,
                                      timeout=60, what="the saga to end")
        finally:
            first.kill()
            if second is not None:
                second.kill()
        kinds = [ev["kind"] for ev in store.events.log.bodies(sid)]
    assert took < LIMIT_S, (took, log.read_text())
    assert K.STEP_RELEASED in kinds, kinds
    assert kinds.count(K.STEP_STARTED) == 2
    assert state.status is Status.COMMITTED, (state.status, state.steps[0].error)
    assert not overlapping(tries())
    assert len(effects("slow_effect")) == 1


@pytest.mark.parametrize("kind", ["rq", "async"])
def test_a_worker_whose_redis_hangs_mid_step_stops_within_2_s(
        ledger: Path, tmp_path: Path, kind: str) -> None:
    """Redis stopped (SIGSTOP) while a step waits between two tries: its lease
    check and any write hang; SIGTERM, and the worker is gone within 2 s. Redis
    back, another worker finishes the step."""
    log = tmp_path / "worker.log"
    with _redis() as srv:
        store = SagaStore(connect(srv.url), Registry.from_modules(TOOLS),
                          Settings(lease_ms=600))
        env = _env(srv, ledger)
        sid = store.submit([{"tool": "slow_read", "args": {"seconds": 0.3, "fail": 3}}],
                           agent_id="agent-hang")
        first = WorkerProcess(env, TOOLS, log=log, kind=kind).start()
        try:
            assert_eventually(lambda: len(tries()) >= 1, timeout=30, what="a try")
            _take_down(srv, "stopped")
            time.sleep(1.5)  # the back-off is over: the check before the next try hangs
            took = _stop_time(first)
        finally:
            first.kill()
        assert srv.proc is not None
        os.kill(srv.proc.pid, signal.SIGCONT)
        second = WorkerProcess(env, TOOLS, log=log, kind=kind).start()
        try:
            state = assert_eventually(lambda: (st := store.state(sid)).final and st,
                                      timeout=60, what="the saga to end")
        finally:
            second.kill()
    assert took < LIMIT_S, (took, log.read_text())
    assert state.status is Status.COMMITTED
    assert len(effects("slow_effect")) == 1
