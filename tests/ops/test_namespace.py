"""SAGA_NAMESPACE: two deployments on one Redis never see each other's sagas,
ledger or queues, and `saga demo` on a real Redis keeps to a namespace of its own.
Each namespace is a process of its own (keys are named when the package is
imported), so everything here goes through the CLI and real workers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import redis

from saga_store.testing import RedisServer, assert_eventually
from saga_store.testing.workers import workers

from ..ledger_tools import effects

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(180)]
TOOLS = "tests.ledger_tools"
ROOT = str(Path(__file__).resolve().parents[2])


def saga(url: str, ns: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SAGA_NAMESPACE": ns, "PYTHONPATH": ROOT, "SAGA_HMAC_KEY": "",
           "SAGA_HMAC_KEY_FILE": ""}
    return subprocess.run([sys.executable, "-m", "saga_store.cli.main", "--redis-url", url,
                           *args], capture_output=True, text=True, timeout=90, cwd=ROOT,
                          env=env, check=False)


def test_two_namespaces_on_one_redis_never_meet(tmp_path: Path, ledger: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_bytes(orjson.dumps({"agent_id": "shop", "steps": [
        {"tool": "reserve_inventory", "args": {"sku": "NS", "qty": 1}}]}))
    with RedisServer() as srv:
        env = {**os.environ, "SAGA_REDIS_URL": srv.url, "SAGA_TEST_LEDGER": str(ledger),
               "PYTHONPATH": ROOT}
        waiting = saga(srv.url, "beta", "run", "--tools", TOOLS, str(plan))
        assert waiting.returncode == 0, waiting.stderr
        beta_id = waiting.stdout.strip()
        with workers({**env, "SAGA_NAMESPACE": "alpha"}, TOOLS):
            done = saga(srv.url, "alpha", "run", "--tools", TOOLS, str(plan), "--wait")
            assert done.returncode == 0, done.stdout + done.stderr
        alpha_id = done.stdout.split()[0]
        # alpha's worker ran alpha's saga only: beta's waits in beta's own queue
        assert len(effects("reserve")) == 1
        admin = redis.Redis.from_url(srv.url)
        assert admin.llen("rq:queue:beta-saga-steps") == 1
        for ns, mine, theirs in (("alpha", alpha_id, beta_id), ("beta", beta_id, alpha_id)):
            listed = saga(srv.url, ns, "ls", "--json")
            assert listed.returncode == 0, listed.stderr
            ids = [row["saga_id"] for row in orjson.loads(listed.stdout)]
            assert ids == [mine]
            assert saga(srv.url, ns, "show", theirs).returncode == 2  # no such saga here
            verified = saga(srv.url, ns, "verify")
            assert verified.returncode == 0, verified.stdout
        ours = [k.decode() for k in admin.scan_iter(count=1000) if not k.startswith(b"rq:")]
        assert ours
        assert all(k.startswith(("alpha:", "beta:")) for k in ours), ours
        with workers({**env, "SAGA_NAMESPACE": "beta"}, TOOLS):
            assert_eventually(lambda: '"committed"' in saga(srv.url, "beta", "show", beta_id,
                                                           "--json").stdout,
                              timeout=60, what="beta's saga to run under beta's worker")
        assert len(effects("reserve")) == 2


def test_a_bad_namespace_is_refused_with_what_to_use() -> None:
    out = saga("redis://127.0.0.1:1/0", "Not OK", "ls")
    assert out.returncode != 0
    assert "SAGA_NAMESPACE" in out.stderr
    assert "lower-case" in out.stderr


def test_the_demo_on_a_real_redis_keeps_to_its_own_namespace() -> None:
    """`saga demo --redis-url` on a Redis that holds a deployment's keys: the demo's
    sagas, ledger and queues are all under saga-demo, and the deployment's keys
    are byte-for-byte what they were."""
    with RedisServer() as srv:
        admin = redis.Redis.from_url(srv.url)
        admin.set("ss:{deployment}:meta", "theirs")
        admin.rpush("rq:queue:saga-steps", "their-job")
        before = {k: admin.dump(k) for k in admin.scan_iter()}
        env = {k: v for k, v in os.environ.items() if k != "SAGA_NAMESPACE"}
        out = subprocess.run([sys.executable, "-m", "saga_store.cli.main", "--redis-url",
                              srv.url, "demo", "--workers", "1"], capture_output=True,
                             text=True, timeout=150, cwd=ROOT, env=env, check=False)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "keys under saga-demo:" in out.stdout
        assert {k: admin.dump(k) for k in before} == before
        new = {k for k in admin.scan_iter() if k not in before}
        assert new
        assert all(k.startswith((b"saga-demo:", b"rq:job:saga-demo-", b"rq:queue:saga-demo-",
                                 b"rq:")) for k in new)
        assert not [k for k in new if k.startswith(b"ss:")]
