"""Redis unreachable for 30 seconds while sagas run: workers back off without a
crash loop, say so once in their log and on /metrics, clients either ride it
out or get a clear error with nothing half-written, and after Redis is back
every saga finishes with each effect exactly once."""

from __future__ import annotations

import os
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from saga_store import Registry, SagaStore, Settings
from saga_store.errors import StoreUnavailable
from saga_store.ops.connection import connect
from saga_store.protocol.state import Status
from saga_store.testing import RedisServer, assert_eventually, free_port
from saga_store.testing.workers import workers
from saga_store.verify.checker import Verifier

from ..ledger_tools import effects

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(240)]
KEEP = os.environ.get("KEEP_DUMP")
TOOLS = "tests.ledger_tools"
OUTAGE_S = 30.0
PLAN = [{"tool": "slow_noop", "args": {"seconds": 0.3}},
        {"tool": "reserve_inventory", "args": {"sku": "A", "qty": 1}},
        {"tool": "slow_noop", "args": {"seconds": 0.3}},
        {"tool": "charge_payment", "args": {"amount_cents": 7, "card_number": "4111222233334444"}}]


def _redis_up(port: int) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    for family in text_string_to_metric_families(text):
        if family.name == "saga_redis_up":
            return float(family.samples[0].value)
    return None


def test_redis_unreachable_for_30_seconds(ledger: Path, tmp_path: Path, worker_kind: str,
                                          ) -> None:
    registry = Registry.from_modules(TOOLS)
    with RedisServer() as srv:
        # the test's own reads fail fast; the clients under test are built below
        store = SagaStore(connect(srv.url, retry_s=0), registry, Settings(lease_ms=1000))
        port = free_port()
        log = tmp_path / "workers.log"
        env = {**os.environ, "SAGA_REDIS_URL": srv.url, "SAGA_TEST_LEDGER": str(ledger),
               "SAGA_LEASE_MS": "1000", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        with workers(env, TOOLS, "-n", "2", "--metrics-port", str(port), log=log) as [pool]:
            assert pool.proc is not None
            ids = [store.submit(PLAN, agent_id=f"agent-{i}") for i in range(6)]
            assert_eventually(lambda: len(effects("reserve")) >= 2, timeout=60,
                              what="some sagas to be under way")
            assert_eventually(lambda: len(pool.pids()) >= 3, timeout=30,
                              what="the pool and its two workers")
            pids = pool.pids()
            acknowledged = {sid: store.events.log.head(sid) for sid in ids}

            srv.kill()
            down_at = time.monotonic()
            assert_eventually(lambda: _redis_up(port) == 0, timeout=15,
                              what="/metrics to report saga_redis_up 0")

            # a client with a short window: a clear error, soon, nothing written
            impatient = SagaStore(connect(srv.url, check=False, retry_s=1.0), registry)
            t0 = time.monotonic()
            with pytest.raises((StoreUnavailable, redis.ConnectionError)) as err:
                impatient.submit(PLAN, agent_id="impatient", saga_id="impatient-1")
            assert time.monotonic() - t0 < 10
            assert "Redis" in str(err.value) or "connect" in str(err.value).lower()

            # a patient client (the default 30 s window is shorter than what is
            # left of this outage plus the restart, so give it 90 s)
            patient = SagaStore(connect(srv.url, check=False, retry_s=90.0), registry)
            late: list[str] = []
            submitter = threading.Thread(target=lambda: late.append(
                patient.submit(PLAN, agent_id="patient", saga_id="patient-1")))
            submitter.start()

            # the outage itself is the condition under test: it lasts 30 s
            time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
            assert pool.alive
            assert pool.pids() == pids, "a worker died or was restarted"
            assert _redis_up(port) == 0
            srv.start()  # same port and directory: the AOF is replayed

            submitter.join(timeout=90)
            assert late == ["patient-1"]
            for sid, head in acknowledged.items():
                assert store.events.log.head(sid).seq >= head.seq
            states = [assert_eventually(
                lambda sid=sid: (st := store.state(sid)).final and st, timeout=120,
                what=f"saga {sid} to finish") for sid in [*ids, "patient-1"]]
            assert_eventually(lambda: _redis_up(port) == 1, timeout=15,
                              what="/metrics to report saga_redis_up 1")
            assert pool.pids() == pids, "a worker died or was restarted"
        assert all(st.status is Status.COMMITTED for st in states)
        assert store.events.log.head("impatient-1").empty  # nothing half-written
        assert len(effects("reserve")) == 7  # the test's ledger: once per saga
        assert len(effects("charge")) == 7
        result = Verifier(store.events.log).verify()
        if KEEP and not result.ok:
            for c in result.chains:
                if not c.ok:
                    for ev in store.events.log.bodies(c.chain_id):
                        print(ev)
        assert result.ok, [(c.chain_id, c.first_bad_seq, c.reason, c.detail)
                           for c in result.chains if not c.ok]

    lines = log.read_text().splitlines()
    down = [ln for ln in lines if "Redis unreachable" in ln]
    back = [ln for ln in lines if "Redis reachable again" in ln]
    # one line per process and outage, not one per retry (3 processes at most)
    assert 1 <= len(down) <= 6, "\n".join(lines)
    assert back, "no line said Redis was back"
    assert not [ln for ln in lines if "Traceback" in ln], "a worker raised during the outage"
