"""'saga run --wait' says when nobody works its queue; 'saga workers' shows who does."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from click.testing import CliRunner
from saga_store.cli.main import cli

from saga_store import Registry, SagaStore
from saga_store.settings import Settings
from saga_store.testing import assert_eventually
from saga_store.testing.workers import workers

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
TOOLS = "tests.ledger_tools"
ROOT = Path(__file__).resolve().parents[2]


def saga(redis_url: str, *args: str) -> Any:
    res = CliRunner().invoke(cli, [*args], env={"SAGA_REDIS_URL": redis_url,
                                                "SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": ""})
    assert res.exit_code == 0, res.output
    return res


def test_run_wait_warns_within_seconds_that_no_worker_takes_its_jobs(
        redis_url: str, client: redis.Redis, tmp_path: Path) -> None:
    """With no worker registered, the warning is on stderr within 5 s, long before
    the wait runs out."""
    plan = tmp_path / "plan.json"
    plan.write_bytes(orjson.dumps({"agent_id": "agent-x", "steps": [
        {"tool": "reserve_inventory", "args": {"sku": "A", "qty": 1}}]}))
    env = {**os.environ, "SAGA_REDIS_URL": redis_url, "SAGA_HMAC_KEY": "",
           "SAGA_HMAC_KEY_FILE": "", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(  # our own argv, no shell
        [sys.executable, "-m", "saga_store.cli.main", "run", "--tools", TOOLS, str(plan),
         "--wait", "--timeout", "60"], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)
    lines: list[str] = []
    assert proc.stderr is not None
    stderr = proc.stderr
    reader = threading.Thread(target=lambda: lines.extend(ln.decode() for ln in stderr),
                              daemon=True)
    reader.start()
    try:
        assert_eventually(lambda: any("no worker is taking jobs" in ln for ln in lines),
                          timeout=5, interval=0.05, what="the no-worker warning")
        assert proc.poll() is None  # it warns and goes on waiting
    finally:
        proc.kill()
        proc.wait()
    assert "saga worker --tools" in "".join(lines)


def test_saga_workers_lists_a_real_worker_its_job_queues_and_sagas_in_flight(
        redis_url: str, worker_env: dict[str, str], client: redis.Redis,
        worker_kind: str) -> None:
    """A worker shows with its host, pid and state, then busy with the step it runs."""
    with workers(worker_env, TOOLS) as [w]:
        def listed() -> dict[str, Any] | None:
            out = orjson.loads(saga(redis_url, "workers", "--json").output)
            return out if out["workers"] else None
        first = assert_eventually(listed, timeout=30, what="the worker to be listed")
        [info] = first["workers"]
        assert info["pid"] in w.pids()
        assert info["hostname"]
        assert info["live"] is True
        assert set(info["queues"]) == {"saga-steps", "saga-compensations"}
        assert first["queues"] == {"saga-steps": 0, "saga-compensations": 0}
        assert first["sagas_in_flight"] == 0

        store = SagaStore(client, Registry.from_modules(TOOLS), Settings())
        sid = store.submit([{"tool": "slow_noop", "args": {"seconds": 2}}], agent_id="agent-w")

        def busy() -> dict[str, Any] | None:
            out = orjson.loads(saga(redis_url, "workers", "--json").output)
            job = out["workers"][0]["current_job"]
            return out if job == f"step of {sid}" else None
        during = assert_eventually(busy, timeout=15, what="the worker busy with the step")
        assert during["workers"][0]["state"] == "busy"
        assert during["sagas_in_flight"] == 1
        human = saga(redis_url, "workers").output
        assert "WORKER" in human
        assert f"step of {sid}" in human
        assert "queue saga-steps: 0 waiting" in human
        assert "sagas with work in flight: 1" in human
        store.wait(sid, 30)


def test_saga_workers_says_when_there_are_none(redis_url: str, client: redis.Redis) -> None:
    out = saga(redis_url, "workers").output
    assert "no live workers" in out


def test_a_killed_worker_is_taken_for_gone_once_its_heartbeat_is_stale(
        redis_url: str, worker_env: dict[str, str], client: redis.Redis) -> None:
    """SIGKILL leaves RQ's registration behind for minutes; 'saga workers' counts it
    while its last heartbeat is recent, stops once it is STALE_S old, and --all still
    shows it. (The heartbeat, by Redis's clock, is aged in RQ's hash rather than
    waited for.)"""
    from rq.worker import Worker

    from saga_store.execution.enqueue import server_ms
    from saga_store.ops.fleet import BEAT_FIELD, STALE_S
    with workers(worker_env, TOOLS) as [w]:
        [seen] = assert_eventually(lambda: orjson.loads(saga(
            redis_url, "workers", "--json").output)["workers"], timeout=30,
            what="the worker to be listed")
        w.kill()
        key = Worker.redis_worker_namespace_prefix + seen["name"]
        assert client.exists(key)  # RQ's registration outlives the process
        assert orjson.loads(saga(redis_url, "workers", "--json").output)["workers"]
        beat = server_ms(client) - int((STALE_S - 2) * 1000)
        client.hset(key, BEAT_FIELD, beat)
        assert orjson.loads(saga(redis_url, "workers", "--json").output)["workers"]
        client.hset(key, BEAT_FIELD, beat - 3000)
        assert not orjson.loads(saga(redis_url, "workers", "--json").output)["workers"]
    [gone] = orjson.loads(saga(redis_url, "workers", "--all", "--json").output)["workers"]
    assert gone["live"] is False
    assert gone["heartbeat_age_s"] >= STALE_S


def test_a_worker_is_live_to_a_reader_whose_clock_runs_ahead_of_its_host(
        worker_env: dict[str, str], client: redis.Redis, monkeypatch: pytest.MonkeyPatch,
        ) -> None:
    """Read on a host whose clock runs ten minutes ahead of the worker's, an idle
    worker that beats is live, its heartbeat seconds old: the age is measured by
    Redis's clock, not by comparing two hosts' clocks."""
    import datetime as dt
    from types import SimpleNamespace

    from saga_store.ops import fleet

    class Ahead(dt.datetime):
        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> Any:
            return dt.datetime.now(tz) + dt.timedelta(minutes=10)
    monkeypatch.setattr(fleet, "dt", SimpleNamespace(datetime=Ahead, UTC=dt.UTC))
    with workers(worker_env, TOOLS):
        [w] = assert_eventually(lambda: [w for w in fleet.registered(client) if w.live],
                                timeout=20, what="the worker to be live to this reader")
    assert w.heartbeat_age_s is not None
    assert w.heartbeat_age_s < fleet.STALE_S
