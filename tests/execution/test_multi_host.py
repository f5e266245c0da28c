"""Workers on several hosts: each host a network namespace with its own hostname and
PID namespace (``saga_store.testing.hosts``), all reaching one Redis over a bridge.
A host killed whole, a host partitioned and healed, and lease holders judged
from another host: nothing may assume that every process shares one machine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from saga_store import Registry, SagaStore, Settings
from saga_store.log.events import EventKind as K
from saga_store.ops.fleet import registered as fleet_of
from saga_store.protocol.state import Status
from saga_store.testing import RedisServer, assert_eventually
from saga_store.testing.hosts import Host, Network, missing
from saga_store.testing.workers import WorkerProcess
from saga_store.verify.checker import Verifier

from ..host_tools import gate
from ..ledger_tools import effects

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(60)]
TOOLS = "tests.host_tools"
OUTCOMES = {K.STEP_SUCCEEDED, K.STEP_FAILED, K.STEP_IN_DOUBT}
CARD = "4111111111111111"


@dataclass
class Fleet:
    net: Network
    redis: RedisServer
    env: dict[str, str]
    store: SagaStore

    def worker(self, host: Host, *args: str, log: Path | None = None,
               kind: str | None = None) -> WorkerProcess:
        return WorkerProcess(self.env, TOOLS, "--log-level", "INFO", *args, log=log,
                             kind=kind, prefix=host.command()).start()


@pytest.fixture
def fleet(worker_env: dict[str, str]) -> Iterator[Fleet]:
    """Two hosts and a Redis on their bridge; the test's ledger and short leases."""
    reason = missing()
    if reason:
        pytest.skip(f"needs root and ip netns: {reason}")
    with Network(2) as net, net.redis() as srv:
        store = SagaStore.from_url(srv.url, Registry.from_modules(TOOLS),
                                   Settings(lease_ms=1000))
        try:
            yield Fleet(net, srv, {**worker_env, "SAGA_REDIS_URL": srv.url}, store)
        finally:
            store.redis.close()


def started_on(kind: str = "started") -> dict[str, list[str]]:
    """Idempotency key -> the hosts that started it (or wrote ``kind`` for it)."""
    out: dict[str, list[str]] = {}
    for _, key, host in effects(kind):
        out.setdefault(key.split(":")[0], []).append(host)
    return out


def outcomes(store: SagaStore, sid: str) -> dict[int, int]:
    """Step -> how many outcome events the log holds for it."""
    out: dict[int, int] = {}
    for ev in store.events.log.events(sid):
        if ev["kind"] in OUTCOMES:
            out[ev["step"]] = out.get(ev["step"], 0) + 1
    return out


def test_a_host_killed_mid_run_has_its_steps_finished_on_the_other(
        fleet: Fleet, ledger: Path, worker_kind: str) -> None:
    """Both hosts run workers; host A is killed whole (every process in its PID
    namespace) while steps run there: host B runs them again under the same keys,
    every saga commits, each reservation and charge is made exactly once, and the
    chains verify (`saga verify` run on host B too)."""
    a, b = fleet.net.hosts
    plan = [{"tool": "reserve_inventory", "args": {"sku": "A", "qty": 1}},
            {"tool": "host_sleep", "args": {"seconds": 1.0}},
            {"tool": "charge_payment", "args": {"amount_cents": 5, "card_number": CARD}}]
    ids = [fleet.store.submit(plan, agent_id=f"agent-{i}") for i in range(8)]
    args = ("-n", "2") if worker_kind == "rq" else ()
    fleet.worker(a, *args)
    fleet.worker(b, *args)

    def both_busy() -> bool:
        running = [hosts for key, hosts in started_on().items()
                   if key not in started_on("slept")]
        return any(a.hostname in h for h in running) and any(b.hostname in h for h in running)
    assert_eventually(both_busy, timeout=20, what="steps running on both hosts")
    a.kill()
    cut = started_on()  # what host A had started when it died
    states = [fleet.store.wait(sid, timeout=30) for sid in ids]

    assert [st.status for st in states] == [Status.COMMITTED] * len(ids)
    assert len(effects("reserve")) == len(ids)
    assert len(effects("charge")) == len(ids)
    slept = started_on("slept")
    assert len(slept) == len(ids)
    lost = [key for key, hosts in cut.items() if a.hostname in hosts
            and slept.get(key) != [a.hostname]]
    assert lost, "host A had no step in flight when it was killed"
    assert all(slept[key] == [b.hostname] for key in lost), "a step of host A never moved"
    assert all(set(outcomes(fleet.store, sid).values()) == {1} for sid in ids)
    assert Verifier(fleet.store.events.log).verify().ok
    verify = b.run([sys.executable, "-m", "saga_store.cli.main", "verify"], env=fleet.env)
    assert verify.returncode == 0, verify.stdout + verify.stderr  # from host B, over the bridge


def test_a_partitioned_lease_holder_is_fenced_off_after_it_heals(
        fleet: Fleet, ledger: Path, tmp_path: Path) -> None:
    """A step's call runs on host A while A is cut off: its lease lapses, host B takes
    the step over; healed, A's outcome is refused (fenced off), A writes nothing to
    the log after B took over, and the saga commits with one outcome per step."""
    a, b = fleet.net.hosts
    for host in (a, b):
        gate(host.hostname).touch()
    [sid] = [fleet.store.submit([
        {"tool": "reserve_inventory", "args": {"sku": "A", "qty": 1}},
        {"tool": "host_hold", "args": {}},
        {"tool": "charge_payment", "args": {"amount_cents": 5, "card_number": CARD}}],
        agent_id="agent-p")]
    log_a = tmp_path / "worker-a.log"
    # asyncio workers run a sync tool on a thread and renew its lease meanwhile: the
    # lease lapses because A is cut off, not because the call outlived it
    fleet.worker(a, log=log_a, kind="async")
    assert_eventually(lambda: started_on().get(key_of(fleet, sid)) == [a.hostname],
                      timeout=20, what="the held call to start on host A")
    # once renewed by the running call, the lease is good for one SAGA_LEASE_MS
    lease = fleet.store.events.keys.lease(sid)
    assert_eventually(lambda: 0 < fleet.store.redis.pttl(lease) <= 1000,
                      timeout=10, what="the call's lease renewal")
    a.partition()
    fleet.worker(b, kind="async")
    assert_eventually(lambda: b.hostname in started_on().get(key_of(fleet, sid), []),
                      timeout=20, what="host B to take the step over")
    taken_at = len(fleet.store.events.log.events(sid))
    a.heal()
    gate(a.hostname).unlink()
    assert_eventually(lambda: "lease lost before the outcome was recorded" in
                      log_a.read_text(), timeout=20, what="host A's late outcome refused")
    assert len(fleet.store.events.log.events(sid)) == taken_at, "host A wrote after B took over"
    gate(b.hostname).unlink()
    state = fleet.store.wait(sid, timeout=20)

    assert state.status is Status.COMMITTED
    assert outcomes(fleet.store, sid) == {0: 1, 1: 1, 2: 1}
    assert [h for _, _, h in effects("returned")] == [a.hostname, b.hostname]
    assert len(effects("held")) == len(effects("reserve")) == len(effects("charge")) == 1
    workers = [ev["data"]["worker"] for ev in fleet.store.events.log.events(sid)
               if ev["kind"] == K.STEP_STARTED and ev["step"] == 1]
    hosts = {w.name: w.hostname for w in fleet_of(fleet.store.redis, work=False)}
    assert [hosts[w] for w in workers] == [a.hostname, b.hostname]
    assert Verifier(fleet.store.events.log).verify().ok


def key_of(fleet: Fleet, sid: str, step: int = 1) -> str | None:
    """The idempotency key of a step, from its intent in the log."""
    for ev in fleet.store.events.log.events(sid):
        if ev["kind"] == K.STEP_INTENT and ev["step"] == step:
            return str(ev["idem_key"])
    return None


PROBE = (sys.executable, "-m", "tests.lease_probe")


def claim_from(fleet: Fleet, host: Host, sid: str, token: str) -> dict[str, Any]:
    res = host.run([*PROBE, "claim", fleet.redis.url, sid, token], env=fleet.env)
    assert res.returncode == 0, res.stderr
    return dict(orjson.loads(res.stdout))


def test_a_lease_holder_on_another_host_is_not_taken_for_gone(fleet: Fleet) -> None:
    """A gateway's lease held on host A: from host B, where A's pid does not exist,
    the holder counts as alive and the saga is not claimed; on host A, once the
    holder has died, it is gone and the lease is taken at once."""
    a, b = fleet.net.hosts
    sid = "agent-g_01JAAAAAAAAAAAAAAAAAAAAAAA"
    for _ in range(5):  # A's holder gets a pid that B has not used
        a.run(["true"])
    holder = a.spawn([*PROBE, "hold", fleet.redis.url, sid], env=fleet.env,
                     out=subprocess.PIPE)
    assert holder.stdout is not None
    claimed, token = holder.stdout.readline().decode().split()
    assert claimed == "True"
    seen_from_b = claim_from(fleet, b, sid, token)
    assert seen_from_b == {"gone": False, "pid_here": False, "claimed": False}
    os.killpg(holder.pid, signal.SIGKILL)  # nsenter and the holder it runs
    holder.wait()
    assert_eventually(lambda: a.pids() == {a.init_pid}, timeout=10,
                      what="the holder to end on host A")
    seen_from_a = claim_from(fleet, a, sid, token)
    assert (seen_from_a["gone"], seen_from_a["claimed"]) == (True, True)
