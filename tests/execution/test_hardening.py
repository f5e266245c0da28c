"""Hardening against a real Redis: the ACL users for workers and agents work and
cannot delete or trim anything; TLS and password URLs work; secret arguments
never show up in Redis, the workers' log lines, exceptions, metrics or exports."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import redis

from saga_store import Registry, SagaStore, Settings, keys
from saga_store.errors import InvalidInput
from saga_store.keys import SagaKeys
from saga_store.log.layout import names_of
from saga_store.ops import acl
from saga_store.ops.connection import connect
from saga_store.ops.doctor import examine, persistent
from saga_store.protocol.state import Status
from saga_store.testing import RedisServer, assert_eventually, free_port
from saga_store.testing.workers import workers
from saga_store.verify.checker import Verifier

from ..ledger_tools import effects

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(180)]
TOOLS = "tests.ledger_tools"
ROOT = str(Path(__file__).resolve().parents[2])
GOOD_CARD, BAD_CARD = "4111222233334444", "5105105105105100"


def _plan(card: str) -> list[dict[str, object]]:
    return [{"tool": "reserve_inventory", "args": {"sku": "A", "qty": 1}},
            {"tool": "charge_payment", "args": {"amount_cents": 1200, "card_number": card}}]


def _env(url: str, ledger: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "SAGA_REDIS_URL": url, "SAGA_TEST_LEDGER": str(ledger),
            "SAGA_LEASE_MS": "2000", "PYTHONPATH": ROOT, **extra}


def _setuser(admin: redis.Redis, user: str, rules: list[str], password: str) -> None:
    admin.execute_command("ACL", "SETUSER", *acl.setuser_args(user, rules), f">{password}")


def _refused(client: redis.Redis, *command: object) -> bool:
    try:
        client.execute_command(*command)
    except redis.ResponseError as exc:
        text = str(exc)  # inside a script, Redis words the refusal its own way
        return any(m in text for m in ("NOPERM", "no permissions", "can't run this command",
                                       "can't access at least one of the keys"))
    return False


DESTRUCTIVE = [("DEL", "{log}"), ("UNLINK", "{log}"), ("XDEL", "{log}", "0-1"),
               ("XTRIM", "{log}", "MAXLEN", "0"), ("SET", "{log}", "x"),
               ("PEXPIRE", "{log}", "0"), ("DEL", "{meta}"), ("DEL", keys.LEDGER_LOG),
               ("XTRIM", keys.LEDGER_LOG, "MAXLEN", "0"), ("FLUSHALL",), ("FLUSHDB",),
               ("CONFIG", "GET", "*"), ("CONFIG", "SET", "appendonly", "no"),
               ("SCRIPT", "FLUSH"), ("KEYS", "*"),
               ("EVAL", "return redis.call('DEL', KEYS[1])", "1", "{log}"),
               ("EVAL", "return redis.call('XTRIM', KEYS[1], 'MAXLEN', 0)", "1", "{log}")]


def _destructive(names: SagaKeys, saga_id: str) -> list[tuple[object, ...]]:
    subs = {"{log}": names.log(saga_id), "{meta}": names.meta(saga_id)}
    return [tuple(subs.get(str(a), a) for a in cmd) for cmd in DESTRUCTIVE]


def test_acl_users_run_sagas_and_cannot_destroy(ledger: Path, tmp_path: Path,
                                                store_layout: str | None) -> None:
    registry = Registry.from_modules(TOOLS)
    with RedisServer() as srv:
        admin = redis.Redis.from_url(srv.url)
        if store_layout:  # the store of the run's layout (SAGA_TEST_LAYOUT), as ``client``
            admin.set(keys.LAYOUT, store_layout)
        _setuser(admin, "saga-worker", acl.worker_rules(), "w-pass")
        _setuser(admin, "agent-a", acl.agent_rules("agent-a"), "a-pass")
        _setuser(admin, "agent-b", acl.agent_rules("agent-b"), "b-pass")
        base = f"127.0.0.1:{srv.port}/0"
        worker_url, a_url = f"redis://saga-worker:w-pass@{base}", f"redis://agent-a:a-pass@{base}"
        agent_a = SagaStore(connect(a_url, retry_s=0), registry)
        agent_b = SagaStore(connect(f"redis://agent-b:b-pass@{base}", retry_s=0), registry)
        log = tmp_path / "worker.log"
        with workers(_env(worker_url, ledger), TOOLS, "--log-level", "INFO", log=log):
            ok = agent_a.submit(_plan(GOOD_CARD), agent_id="agent-a", saga_id="agent-a_1")
            bad = agent_a.submit(_plan(BAD_CARD), agent_id="agent-a", saga_id="agent-a_2")
            other = agent_b.submit(_plan(GOOD_CARD), agent_id="agent-b", saga_id="agent-b_1")
            finals = {sid: store.wait(sid, timeout=60) for store, sid in
                      ((agent_a, ok), (agent_a, bad), (agent_b, other))}
        assert finals[ok].status is Status.COMMITTED
        assert finals[bad].status is Status.COMPENSATED
        assert finals[other].status is Status.COMMITTED
        assert len(effects("reserve")) == 3
        assert len(effects("release")) == 1
        assert len(effects("charge")) == 2
        assert not effects("refund")

        # an agent cannot open, read or append to another agent's sagas
        with pytest.raises(InvalidInput, match="namespace"):
            agent_a.submit(_plan(GOOD_CARD), agent_id="agent-a", saga_id="agent-b_2")
        with pytest.raises(redis.ResponseError, match=r"NOPERM|permissions"):
            agent_a.submit(_plan(GOOD_CARD), agent_id="agent-b", saga_id="agent-b_2")
        names = names_of(admin)
        assert _refused(agent_a.events.redis, "XRANGE", names.log(other), "-", "+")
        assert _refused(agent_a.events.redis, "HGETALL", names.meta(other))
        assert not _refused(agent_a.events.redis, "XRANGE", names.log(ok), "-", "+")

        worker = connect(worker_url, retry_s=0)
        # without CONFIG, the AOF check reads INFO: a worker still knows it is durable
        assert persistent(examine(worker))
        for client in (worker, agent_a.events.redis):
            for cmd in _destructive(names, ok):
                assert _refused(client, *cmd), f"{cmd[0]} was allowed"
        assert "NOPERM" not in log.read_text(), "a worker was refused something it needs"
        assert "Traceback" not in log.read_text()
        assert Verifier(SagaStore(admin, registry).events.log).verify().ok


def test_an_agent_user_needs_an_id_that_can_own_a_namespace() -> None:
    for bad in ("agent_a", "agent-*", "a" * 65):
        with pytest.raises(InvalidInput, match=r"namespace|contains"):
            acl.agent_rules(bad)


def _certificates(d: Path) -> tuple[Path, Path, Path]:
    openssl = shutil.which("openssl")
    assert openssl, "openssl is needed to make test certificates (apt-get install openssl)"
    ca_key, ca, key, csr, cert = (d / n for n in ("ca.key", "ca.crt", "srv.key", "srv.csr",
                                                  "srv.crt"))

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
        "-keyout", str(ca_key), "-out", str(ca))
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", str(key),
        "-out", str(csr))
    ext = d / "ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", str(cert))
    return ca, cert, key


def test_tls_and_password_url(ledger: Path, tmp_path: Path) -> None:
    """rediss:// with a CA file and an ACL user's password: a worker runs a saga over
    TLS, and a wrong CA or password is a clear error, not a hang."""
    ca, cert, key = _certificates(tmp_path)
    tls_port = free_port()
    registry = Registry.from_modules(TOOLS)
    with RedisServer("--tls-port", str(tls_port), "--tls-cert-file", str(cert),
                     "--tls-key-file", str(key), "--tls-ca-cert-file", str(ca),
                     "--tls-auth-clients", "no") as srv:
        admin = redis.Redis.from_url(srv.url)
        _setuser(admin, "saga-worker", acl.worker_rules(), "p@ss:w/rd")
        url = (f"rediss://saga-worker:p%40ss%3Aw%2Frd@127.0.0.1:{tls_port}/0"
               f"?ssl_ca_certs={ca}&ssl_cert_reqs=required")
        tls_client = connect(url, retry_s=0)
        assert tls_client.connection_pool.connection_class is redis.SSLConnection
        store = SagaStore(tls_client, registry, Settings())
        with workers(_env(url, ledger), TOOLS):
            sid = store.submit([{"tool": "reserve_inventory", "args": {"sku": "T", "qty": 1}}],
                               agent_id="tls-agent")
            assert store.wait(sid, timeout=60).status is Status.COMMITTED
        assert len(effects("reserve")) == 1

        # the wrong password: a clear error at once, with the password redacted
        wrong = url.replace("p%40ss%3Aw%2Frd", "nope")
        out = subprocess.run([sys.executable, "-m", "saga_store.cli.main", "--redis-url", wrong,
                              "ls"],
                             capture_output=True, text=True, timeout=30, cwd=ROOT, check=False)
        assert out.returncode == 3, out.stderr
        assert "nope" not in out.stderr
        assert "***" in out.stderr
        # a server certificate not signed by the CA we trust: refused
        other_ca = tmp_path / "other"
        other_ca.mkdir()
        untrusted = url.replace(str(ca), str(_certificates(other_ca)[0]))
        with pytest.raises(Exception, match=r"(?i)certificate|ssl"):
            connect(untrusted, retry_s=0)


def test_secrets_never_leak(ledger: Path, tmp_path: Path, redis_url: str) -> None:
    """After sagas with a secret argument (one succeeds, one fails with the card
    number in its exception, one is compensated), the secret is nowhere: not in any
    Redis key, the workers' DEBUG log, the failure seen by the caller, /metrics, an
    export or the CLI's views."""
    registry = Registry.from_modules(TOOLS)
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    store = SagaStore(client, registry, Settings())
    port = free_port()
    log = tmp_path / "worker.log"
    with workers(_env(redis_url, ledger), TOOLS, "--log-level", "DEBUG", "--metrics-port",
                 str(port), log=log):
        ok = store.submit(_plan(GOOD_CARD), agent_id="agent-s")
        bad = store.submit(_plan(BAD_CARD), agent_id="agent-s")
        states = [store.wait(sid, timeout=60) for sid in (ok, bad)]
        assert_eventually(lambda: b"saga_steps_total" in urllib.request.urlopen(
            f"http://127.0.0.1:{port}/metrics", timeout=5).read(), timeout=30,
            what="metrics from the workers")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            metrics_text = r.read().decode()
    assert [s.status for s in states] == [Status.COMMITTED, Status.COMPENSATED]
    failure = next(st.error for st in states[1].steps.values() if st.error)
    assert "declined" in failure

    places: dict[str, str] = {"worker log": log.read_text(), "metrics": metrics_text,
                              "failure": failure}
    for key in client.scan_iter(count=1000):
        places[f"redis {key.decode()}"] = _dump(client, key)
    for args in (["show", ok], ["show", bad], ["export", "-"], ["context", "--agent", "agent-s"]):
        out = subprocess.run([sys.executable, "-m", "saga_store.cli.main", "--redis-url",
                              redis_url, *args],
                             capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
        assert out.returncode == 0, out.stderr
        places[f"saga {' '.join(args)}"] = out.stdout + out.stderr
    assert len(places) > 10
    assert '"export":"saga-store"' in places["saga export -"]  # the export was scanned
    for secret in (GOOD_CARD, BAD_CARD):
        leaks = [where for where, text in places.items() if secret in text]
        assert not leaks, f"{secret} leaked into {leaks}"


def _dump(client: redis.Redis, key: bytes) -> str:
    """Everything a key holds, as text, whatever its type."""
    kind = client.type(key).decode()
    value: object = {
        "string": lambda: client.get(key),
        "hash": lambda: client.hgetall(key),
        "list": lambda: client.lrange(key, 0, -1),
        "set": lambda: client.smembers(key),
        "zset": lambda: client.zrange(key, 0, -1),
        "stream": lambda: client.xrange(key),
    }[kind]()
    return repr(value)


def test_the_python_api_takes_the_hmac_key_from_the_environment(
        ledger: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SagaStore.from_url, as the README builds a store, chains with SAGA_HMAC_KEY
    as the workers do: their saga runs and verifies under the key. A worker with
    another key refuses to run what it cannot verify, and says why."""
    with RedisServer() as srv:
        _hmac_from_the_environment(srv.url, ledger, tmp_path, monkeypatch)


def _hmac_from_the_environment(redis_url: str, ledger: Path, tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    key = "the-deployments-key-0123456789abc"
    monkeypatch.setenv("SAGA_HMAC_KEY", key)
    store = SagaStore.from_url(redis_url, Registry.from_modules(TOOLS))
    assert store.settings.hmac_key is not None
    sid = store.submit([{"tool": "reserve_inventory", "args": {"sku": "H", "qty": 1}}],
                       agent_id="agent-h")
    with workers(_env(redis_url, ledger, SAGA_HMAC_KEY=key), TOOLS):
        assert store.wait(sid, timeout=60).status is Status.COMMITTED
    assert Verifier(store.events.log).verify(sid).ok
    other = store.submit([{"tool": "reserve_inventory", "args": {"sku": "O", "qty": 1}}],
                         agent_id="agent-h")
    log = tmp_path / "worker.log"
    with workers(_env(redis_url, ledger, SAGA_HMAC_KEY="another-key-0123456789abcdefghij"),
                 TOOLS, log=log):
        assert_eventually(lambda: "another SAGA_HMAC_KEY" in log.read_text(), timeout=30,
                          what="the worker to say why it will not run the step")
    assert [e[2] for e in effects("reserve")] == ["Hx1"]
    assert store.state(other).steps[0].status == "intent"


def test_a_follower_refuses_an_event_that_does_not_link_under_its_key(
        client: redis.Redis) -> None:
    """A caller waiting on its saga reads an event appended with another key (a
    forger, or workers given another SAGA_HMAC_KEY): a clear IntegrityError, not a
    result taken on trust."""
    from saga_store.errors import IntegrityError
    from saga_store.protocol import build
    store = SagaStore(client, Registry.from_modules(TOOLS), Settings())
    forger = SagaStore(client, Registry.from_modules(TOOLS),
                       Settings(hmac_key=b"f" * 32))
    saga = store.saga(agent_id="agent-f")
    state = saga.state
    forger.events.writer(saga.saga_id).append_many([build.saga_failed("forged")])
    with pytest.raises(IntegrityError, match="SAGA_HMAC_KEY"):
        store.follow(state, lambda s: s.seq >= 1, timeout=5)
