"""Redis itself failing: a restart with AOF on loses nothing acknowledged, and the
sagas that were in flight finish."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import redis

from saga_store import Registry, SagaStore, Settings
from saga_store.protocol.state import Status
from saga_store.testing import RedisServer, assert_eventually
from saga_store.testing.workers import workers
from saga_store.verify.checker import Verifier

from ..ledger_tools import effects

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(180)]
TOOLS = "tests.ledger_tools"
PLAN = [{"tool": "slow_noop", "args": {"seconds": 0.2}},
        {"tool": "reserve_inventory", "args": {"sku": "A", "qty": 1}},
        {"tool": "slow_noop", "args": {"seconds": 0.2}},
        {"tool": "charge_payment", "args": {"amount_cents": 7, "card_number": "4111222233334444"}}]


def test_redis_killed_and_restarted_mid_run(ledger: Path, tmp_path: Path) -> None:
    """kill -9 of Redis (AOF, fsync always) while sagas run: after the restart every
    acknowledged event is there, every saga ends committed, effects are not doubled,
    and the chain verifies."""
    with RedisServer() as srv:
        client = redis.Redis.from_url(srv.url)
        store = SagaStore(client, Registry.from_modules(TOOLS), Settings(lease_ms=1000))
        env = {**os.environ, "SAGA_REDIS_URL": srv.url, "SAGA_TEST_LEDGER": str(ledger),
               "SAGA_LEASE_MS": "1000", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        with workers(env, TOOLS, count=2):
            ids = [store.submit(PLAN, agent_id=f"agent-{i}") for i in range(6)]
            assert_eventually(lambda: len(effects("reserve")) >= 2, timeout=60,
                              what="some sagas to be under way")
            acknowledged = {sid: store.events.log.head(sid) for sid in ids}
            srv.kill()
            srv.start()  # same port and directory: the AOF is replayed
            for sid, head in acknowledged.items():
                assert store.events.log.head(sid).seq >= head.seq  # nothing acknowledged lost
            states = [assert_eventually(
                lambda sid=sid: (st := store.state(sid)).final and st, timeout=120,
                what=f"saga {sid} to finish", swallow=(redis.ConnectionError,))
                for sid in ids]
        assert all(st.status is Status.COMMITTED for st in states)
        assert len(effects("reserve")) == 6
        assert len(effects("charge")) == 6
        assert Verifier(store.events.log).verify().ok


@pytest.mark.parametrize("how", ["no persistence", "older snapshot"])
def test_redis_losing_data_is_caught_by_the_anchor(tmp_path: Path, how: str) -> None:
    """A real Redis that comes back without recent writes (restarted with no
    persistence at all, or from an older RDB snapshot): the log alone still
    verifies, but 'saga verify --anchor' exits 1 with 'log behind anchor'."""
    import shutil
    import subprocess
    import sys
    root = str(Path(__file__).resolve().parents[2])
    if how == "no persistence":
        srv = RedisServer("--appendonly", "no")
    else:
        srv = RedisServer("--appendonly", "no", "--dbfilename", "dump.rdb")
    with srv:
        store = SagaStore(redis.Redis.from_url(srv.url), Registry.from_modules(TOOLS))
        saga = store.events.open("agent-a")
        saga.append("saga_committed")
        if how == "older snapshot":
            store.redis.save()  # the snapshot holds the first saga only
            shutil.copy(srv.dir / "dump.rdb", tmp_path / "old.rdb")
        second = store.events.open("agent-b")
        second.append("saga_committed")
        anchor = tmp_path / "anchor.json"

        def saga(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "saga_store.cli.main", "--redis-url",
                                   srv.url,
                                   *args], capture_output=True, text=True, cwd=root,
                                  timeout=60, check=False)

        assert saga("anchor", "--out", str(anchor)).returncode == 0
        assert saga("verify", "--anchor", str(anchor)).returncode == 0
        srv.kill()
        if how == "older snapshot":
            shutil.copy(tmp_path / "old.rdb", srv.dir / "dump.rdb")
        srv.start()
        assert saga("verify").returncode == 0  # what is left is self-consistent
        res = saga("verify", "--anchor", str(anchor))
        assert res.returncode == 1, res.stdout + res.stderr
        assert "log behind anchor" in res.stdout + res.stderr
