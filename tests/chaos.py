"""The chaos soak: many sagas of mixed shapes through several worker pools while
pools (step workers and compensators) are SIGKILLed at random about every two
seconds and Redis is killed and restarted once; then every guarantee is checked
against the soak's own side-effect ledger, ``saga verify`` and the metrics.

    python -m tests.chaos --sagas 10000          # what ``make chaos`` runs
    python -m tests.chaos --sagas 400            # a short run (CI runs one as a test)

Shapes: success (4 steps); failure at a random step (compensated); an in-doubt
timeout (the probe settles it, compensated); an irreversible step before a
failure (needs attention); invalid input (refused, nothing written); a slow
service whose tries and back-offs outlast the lease (committed: one body at a
time, never two workers on it); a tool that raises SystemExit,
KeyboardInterrupt, GeneratorExit or a BaseException of its own after its
effect (in doubt after that one run; the probe finds the effect; compensated).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from saga_store import Registry, SagaStore, Settings, keys
from saga_store.errors import InvalidInput, StoreUnavailable
from saga_store.execution import jobs
from saga_store.execution.enqueue import in_flight
from saga_store.log.layout import names_of
from saga_store.ops.connection import connect
from saga_store.protocol.state import SagaState, Status
from saga_store.testing import RedisServer
from saga_store.testing.cluster import RedisClusterServers
from saga_store.testing.workers import ASYNC_CONCURRENCY, WorkerProcess

from . import chaos_tools
from .chaos_failover import LaggedFailovers
from .chaos_tools import FORWARD

TOOLS = "tests.chaos_tools"
ROOT = Path(__file__).resolve().parent.parent
EXPECTED = {"success": Status.COMMITTED, "fail": Status.COMPENSATED,
            "in_doubt": Status.COMPENSATED, "irreversible": Status.NEEDS_ATTENTION,
            "slow": Status.COMMITTED, "raises": Status.COMPENSATED}
SHAPES = [("success", 40), ("fail", 30), ("in_doubt", 10), ("irreversible", 10),
          ("invalid", 10), ("slow", 3), ("raises", 5)]
SLOW_TRY_S = 0.35  # four tries and three back-offs: about 2.4 s, past a 1 s lease


@dataclass
class Config:
    sagas: int = 10_000
    step_pools: int = 2
    compensator_pools: int = 1
    workers_per_pool: int = 2
    kill_every_s: float = 2.0
    in_flight: int = 200
    redis_restart_at: float = 0.5  # once this share of sagas is final
    lease_ms: int = 1000
    seed: int = 1
    timeout_s: float = 3600.0
    worker_kind: str = "rq"  # or "async": each process runs ASYNC_CONCURRENCY jobs at once
    # the log on a six-node Redis Cluster, RQ's queues on a Redis of their own; instead
    # of the Redis restart, a master is SIGKILLed (its replica takes over), then
    # started again (it rejoins as a replica) and slots are resharded under load
    cluster: bool = False
    reshard_at: float = 0.6
    # SAGA_WAIT_REPLICAS for every process: an append counts as done only once a
    # replica holds it, so a failover loses nothing the soak counted (the cluster
    # soak's default: without it a master killed can take acknowledged appends)
    wait_replicas: int = 0
    # replica-lag failovers instead of the one kill and the reshard, back to back
    # under load (tests/chaos_failover.py): a master's replica stopped and cut off
    # for at least lag_stall_ms, the master SIGKILLed, the replica promoted
    master_kills: int = 0
    lag_stall_ms: int = 1500

    @property
    def slots(self) -> int:
        """Jobs one worker process may have in flight."""
        return ASYNC_CONCURRENCY if self.worker_kind == "async" else 1


@dataclass
class Report:
    config: Config
    seconds: float = 0.0
    by_shape: Counter[str] = field(default_factory=Counter)
    by_state: Counter[str] = field(default_factory=Counter)
    pool_kills: int = 0
    processes_killed: int = 0
    redis_restarts: int = 0
    failovers: int = 0
    reshards: int = 0
    takeovers: int = 0  # promotions the cluster did not make on its own
    lag_bytes: list[int] = field(default_factory=list)  # per lagged failover
    waits_cut: int = 0  # lagged failovers that killed a master with a WAIT blocked
    unconfirmed_submits: int = 0  # submits told "not confirmed" (sent again, same id)
    unconfirmed_logged: int = 0  # workers' appends told "not confirmed" (their log)
    lost: int = 0  # sagas whose submit was acknowledged and whose log is gone
    # sagas not final at the end and in no index a sweeper reads: no worker will
    # ever look at them (one not final but indexed only ran out of time)
    stranded: int = 0
    effects: int = 0
    compensations: int = 0
    tool_reruns: int = 0
    doubled: int = 0  # overlapping tries of one step, BaseException tools run twice
    in_doubt: int = 0
    recoveries_s: list[float] = field(default_factory=list)
    unrecovered: int = 0
    metrics: dict[str, tuple[float, int]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def fail(self, message: str) -> None:
        if len(self.failures) < 50:
            self.failures.append(message)

    def percentile(self, q: float) -> float:
        xs = sorted(self.recoveries_s)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0

    def table(self) -> str:
        c = self.config
        rows = [
            ("sagas", f"{sum(self.by_shape.values())} "
                      f"({', '.join(f'{k} {v}' for k, v in sorted(self.by_shape.items()))})"),
            ("final states", ", ".join(f"{k} {v}" for k, v in sorted(self.by_state.items()))),
            ("worker pools", f"{c.step_pools} step + {c.compensator_pools} compensator, "
                             f"{c.workers_per_pool} {c.worker_kind} processes each, "
                             f"{c.slots} job(s) at once"),
            ("pool kills (SIGKILL)", f"{self.pool_kills} ({self.processes_killed} processes)"),
            ("SAGA_WAIT_REPLICAS", str(c.wait_replicas)),
            *([] if c.cluster else [("Redis kill -9 + restart", str(self.redis_restarts))]),
            *([("master kill -9 (failover), reshard", f"{self.failovers}, {self.reshards}")]
              if c.cluster else []),
            *([("lagged failovers: takeovers, WAIT cut off",
                f"{self.takeovers}, {self.waits_cut} of {self.failovers}"),
               ("bytes the promoted replica lacked min / p50 / max",
                f"{min(self.lag_bytes, default=0)} / "
                f"{sorted(self.lag_bytes)[len(self.lag_bytes) // 2] if self.lag_bytes else 0}"
                f" / {max(self.lag_bytes, default=0)}"),
               ("appends not confirmed: submits, workers",
                f"{self.unconfirmed_submits}, {self.unconfirmed_logged}")]
              if c.master_kills else []),
            ("acknowledged sagas lost, stranded", f"{self.lost}, {self.stranded}"),
            ("forward effects", str(self.effects)),
            ("compensations", str(self.compensations)),
            ("tool bodies re-run after a kill", str(self.tool_reruns)),
            ("doubled effects (overlapping tries, BaseException tools run twice)",
             str(self.doubled)),
            ("steps left in doubt by a kill", f"{self.in_doubt} (irreversible, not re-run)"),
            ("stall after a kill p50 / p99 / max",
             f"{self.percentile(0.5):.2f} / {self.percentile(0.99):.2f} / "
             f"{max(self.recoveries_s, default=0):.2f} s "
             f"({len(self.recoveries_s)} sagas, lease {c.lease_ms} ms)"),
            ("metrics vs log", "; ".join(f"{k} {v[0]:.0f}/{v[1]}" for k, v in
                                         sorted(self.metrics.items()))),
            ("duration", f"{self.seconds:.1f} s"),
            ("result", "PASS" if self.ok else f"FAIL ({len(self.failures)} problems)"),
        ]
        width = max(len(r[0]) for r in rows)
        return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def plan_for(shape: str, rng: random.Random, n: int) -> list[dict[str, Any]]:
    sku, customer = f"sku-{n % 97}", f"cust-{n}"
    forward = [{"tool": "reserve", "args": {"sku": sku}},
               {"tool": "charge", "args": {"amount_cents": 100 + n % 900,
                                           "card": f"4{n:015d}"}},
               {"tool": "crm", "args": {"customer": customer, "hang": False}}]
    fraud = {"tool": "check_fraud", "args": {"score": 99}}
    if shape == "success":
        return [*forward, {"tool": "ship", "args": {"order": f"o-{n}"}}]
    if shape == "fail":
        at = rng.randrange(len(forward) + 1)
        return [*forward[:at], fraud, *forward[at:]]
    if shape == "in_doubt":
        return [forward[0], forward[1], {"tool": "crm", "args": {"customer": customer,
                                                                 "hang": True}}]
    if shape == "irreversible":
        return [forward[0], {"tool": "ship", "args": {"order": f"o-{n}"}}, fraud]
    if shape == "slow":
        return [{"tool": "book", "args": {"slot": f"slot-{n}", "seconds": SLOW_TRY_S}},
                forward[1]]
    if shape == "raises":
        return [forward[0], {"tool": "hold", "args": {
            "slot": f"slot-{n}", "raises": rng.choice(chaos_tools.RAISED)}}]
    bad = rng.choice([{"tool": "charge", "args": {"amount_cents": "lots", "card": "4"}},
                      {"tool": "reserve", "args": {"sku": "x", "extra": 1}},
                      {"tool": "no_such_tool", "args": {}}])
    return [forward[0], bad]


class Pools:
    """The worker pools, each a ``saga worker`` process group; killed and restarted."""

    def __init__(self, cfg: Config, env: dict[str, str], log: Path) -> None:
        self.specs = ([jobs.STEP_QUEUE] * cfg.step_pools
                      + [jobs.COMPENSATION_QUEUE] * cfg.compensator_pools)
        self.cfg, self.env, self.log = cfg, env, log
        self.procs = [self._start(q) for q in self.specs]

    def _start(self, queue: str) -> WorkerProcess:
        return WorkerProcess(self.env, TOOLS, "-n", str(self.cfg.workers_per_pool),
                             "--queues", queue, "--log-level", "WARNING", log=self.log,
                             kind=self.cfg.worker_kind).start()

    def kill(self, i: int) -> None:
        """SIGKILL pool ``i`` (its whole group) and start a new one."""
        self.procs[i].kill()
        self.procs[i] = self._start(self.specs[i])

    def stop(self) -> None:
        for p in self.procs:
            if p.proc is not None and p.alive:
                p.proc.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                if p.proc is not None:
                    p.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def worker_names(r: redis.Redis, pids: set[int]) -> set[str]:
    """RQ worker names of these processes (from RQ's worker registry)."""
    names = [k.decode() for k in r.smembers("rq:workers")]
    pipe = r.pipeline(transaction=False)
    for k in names:
        pipe.hget(k, "pid")
    return {k.rsplit(":", 1)[-1] for k, pid in zip(names, pipe.execute(), strict=True)
            if pid is not None and int(pid) in pids}


def held_by(r: redis.Redis, names: set[str]) -> dict[str, int]:
    """Active sagas whose lease one of ``names`` holds, with their head seq (read
    from the log itself, not the cached meta)."""
    at = names_of(r)
    active = in_flight(r, at)
    pipe = r.pipeline(transaction=False)
    for sid in active:
        pipe.get(at.lease(sid))
        pipe.xrevrange(at.log(sid), count=1)
    replies = pipe.execute()
    out = {}
    for i, sid in enumerate(active):
        holder, last = replies[2 * i], replies[2 * i + 1]
        if holder and holder.decode().split(":", 1)[0] in names and last:
            out[sid] = keys.seq_of_entry_id(last[0][0])
    return out


def run(cfg: Config, out: Any = sys.stdout) -> Report:
    rep = Report(cfg)
    rng = random.Random(cfg.seed)
    shapes = rng.choices([s for s, _ in SHAPES], [w for _, w in SHAPES], k=cfg.sagas)
    work = Path(tempfile.mkdtemp(prefix="saga-chaos-"))
    ledger, metrics_dir = work / "ledger.db", work / "metrics"
    metrics_dir.mkdir()
    os.environ["SAGA_TEST_LEDGER"] = str(ledger)  # for this process's ledger reads
    registry = Registry.from_modules(TOOLS)
    started = time.monotonic()
    servers = RedisClusterServers(appendfsync="everysec") if cfg.cluster else \
        RedisServer(appendfsync="everysec")
    with servers as srv:
        env = {**os.environ, "SAGA_REDIS_URL": srv.url, "SAGA_TEST_LEDGER": str(ledger),
               "SAGA_LEASE_MS": str(cfg.lease_ms), "PYTHONPATH": str(ROOT),
               "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
        client = connect(srv.url, retry_s=120)
        rq_redis = client
        if isinstance(srv, RedisClusterServers):
            env["SAGA_QUEUE_URL"] = srv.queue_url
            rq_redis = connect(srv.queue_url, retry_s=120)
        env["SAGA_WAIT_REPLICAS"] = str(cfg.wait_replicas)
        store = SagaStore(client, registry, Settings(lease_ms=cfg.lease_ms,
                                                     wait_replicas=cfg.wait_replicas),
                          queues=rq_redis)
        faults: ClusterFaults | LaggedFailovers | None = None
        if isinstance(srv, RedisClusterServers):
            faults = LaggedFailovers(srv, cfg.master_kills, cfg.lag_stall_ms, cfg.seed) \
                if cfg.master_kills else ClusterFaults(srv, rep)
        pools = Pools(cfg, env, work / "workers.log")
        ids: dict[str, str] = {}
        submitted = threading.Event()
        errors: list[BaseException] = []

        def submit_all() -> None:
            try:
                for n, shape in enumerate(shapes):
                    while len(in_flight(client)) >= cfg.in_flight:
                        time.sleep(0.01)
                    sid = f"chaos-{n}"
                    try:
                        _submit(store, rep, plan_for(shape, rng_for(cfg, n), n),
                                f"agent-{n % 16}", sid)
                    except InvalidInput:
                        if shape != "invalid":
                            raise
                    ids[sid] = shape
            except BaseException as exc:  # reported by the main loop
                errors.append(exc)
            finally:
                submitted.set()

        submitter = threading.Thread(target=submit_all, daemon=True)
        submitter.start()
        next_kill = time.monotonic() + rng.uniform(0.5, 1.5) * cfg.kill_every_s
        pending: dict[str, tuple[int, float]] = {}
        restarted = False
        last_print = 0.0
        try:
            while True:
                now = time.monotonic()
                if errors:
                    raise errors[0]
                active = len(in_flight(client))
                done = len(ids) - active if ids else 0
                # not while a master is down: its indexes are not read then
                if submitted.is_set() and active == 0 and not (
                        isinstance(faults, LaggedFailovers) and faults.busy):
                    break
                if now - started > cfg.timeout_s:
                    rep.fail(f"timed out after {cfg.timeout_s:.0f} s with "
                             f"{active} sagas not final")
                    break
                if isinstance(faults, LaggedFailovers):
                    faults.start()
                elif faults is not None:
                    faults.step(done / cfg.sagas, cfg)
                elif not restarted and done >= cfg.redis_restart_at * cfg.sagas:
                    assert isinstance(srv, RedisServer)
                    srv.kill()
                    srv.start()  # same port and directory: the AOF is replayed
                    rep.redis_restarts += 1
                    restarted = True
                if now >= next_kill:
                    i = rng.randrange(len(pools.procs))
                    pids = pools.procs[i].pids()
                    victims = held_by(client, worker_names(rq_redis, pids))
                    t_kill = time.monotonic()
                    pools.kill(i)
                    rep.processes_killed += len(pids)
                    rep.pool_kills += 1
                    for sid, seq in victims.items():
                        pending[sid] = (seq, t_kill)
                    next_kill = now + rng.uniform(0.5, 1.5) * cfg.kill_every_s
                _track_recovery(client, pending, rep)
                if now - last_print > 5:
                    lagged = (f", {len(faults.done)} lagged failovers"
                              if isinstance(faults, LaggedFailovers) else "")
                    print(f"  {now - started:6.1f} s  {done}/{cfg.sagas} final, "
                          f"{rep.pool_kills} kills{lagged}", file=out, flush=True)
                    last_print = now
                time.sleep(0.02)
            deadline = time.monotonic() + 30
            while pending and time.monotonic() < deadline:
                _track_recovery(client, pending, rep)
                time.sleep(0.02)
            rep.unrecovered = len(pending)
        finally:
            pools.stop()
            if faults is not None:
                faults.join()
        if isinstance(faults, LaggedFailovers):
            _count_failovers(rep, faults, work / "workers.log")
        rep.seconds = time.monotonic() - started
        check(rep, store, ids, ledger, metrics_dir, srv.url)
    return rep


class ClusterFaults:
    """The cluster's faults, once each: a master SIGKILLed (its replica is promoted
    within about the node timeout) and started again as soon as that is done (it
    rejoins as a replica: with SAGA_WAIT_REPLICAS=1, its slots take appends again
    once it holds them), and a reshard of 500 slots between two masters while the
    sagas run (each on a thread of its own: the kills go on)."""

    def __init__(self, servers: RedisClusterServers, rep: Report) -> None:
        self.servers, self.rep = servers, rep
        self.victim: RedisServer | None = None
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def step(self, done: float, cfg: Config) -> None:
        if self.errors:
            raise self.errors[0]
        if self.rep.failovers == 0 and done >= cfg.redis_restart_at:
            self.victim = self.servers.kill_master()
            self.rep.failovers += 1
            self._start(self._rejoin)
        elif len(self.threads) == 1 and done >= cfg.reshard_at:
            self._start(self._reshard)

    def _start(self, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, daemon=True)
        self.threads.append(thread)
        thread.start()

    def _rejoin(self) -> None:
        try:
            assert self.victim is not None
            self.servers.wait_ok(timeout=60)  # its replica took over
            self.victim.start()  # its nodes.conf: back as a replica of its successor
            self.servers.wait_ok(timeout=60)
        except BaseException as exc:  # reported by the main loop, or after it
            self.errors.append(exc)

    def _reshard(self) -> None:
        try:
            # after the rejoin (a node starting again may answer as the master it
            # was): started now, so it runs even if the sagas end first, and the
            # end of the soak waits for it
            self.threads[0].join(timeout=120)
            self.servers.reshard(500)
            self.rep.reshards += 1
        except BaseException as exc:
            self.errors.append(exc)

    def join(self) -> None:
        for thread in self.threads:
            thread.join(timeout=120)
        for exc in self.errors:
            self.rep.fail(f"cluster fault failed: {exc!r}")


def _submit(store: SagaStore, rep: Report, plan: list[dict[str, Any]], agent: str,
            sid: str) -> None:
    """Submit until it is acknowledged: one told "not confirmed" (too few replicas
    acknowledged it, or its master failed over) is sent again under the same id,
    as a client should, and attaches to the saga if that stands."""
    for _ in range(100):
        try:
            store.submit(plan, agent_id=agent, saga_id=sid)
            return
        except StoreUnavailable as exc:
            if "not confirmed" not in str(exc):
                raise
            rep.unconfirmed_submits += 1
    raise StoreUnavailable(f"{sid}: 100 submits, none confirmed")


def _count_failovers(rep: Report, faults: LaggedFailovers, workers_log: Path) -> None:
    """The lagged failovers as measured, and the workers' appends told "not
    confirmed" (each logged once by the worker it happened to)."""
    for exc in faults.errors:
        rep.fail(f"lagged failover failed: {exc!r}")
    rep.failovers = len(faults.done)
    rep.takeovers = sum(f.takeover for f in faults.done)
    rep.waits_cut = sum(f.wait_cut for f in faults.done)
    rep.lag_bytes = [f.lag_bytes for f in faults.done]
    if rep.failovers < rep.config.master_kills:
        rep.fail(f"{rep.failovers} of {rep.config.master_kills} lagged master kills ran "
                 "before the sagas were done; run more sagas")
    if workers_log.exists():
        with workers_log.open(errors="replace") as f:
            rep.unconfirmed_logged = sum("not confirmed" in line for line in f)


def rng_for(cfg: Config, n: int) -> random.Random:
    return random.Random(cfg.seed * 1_000_003 + n)


def _track_recovery(client: redis.Redis, pending: dict[str, tuple[int, float]],
                    rep: Report) -> None:
    """A saga recovers from a kill when its log moves past where the kill left it.
    One whose log ends, closed, where the kill found it was not caught mid-step:
    its last append landed between reading its lease and the kill."""
    if not pending:
        return
    sids = list(pending)
    at = names_of(client)
    pipe = client.pipeline(transaction=False)
    for sid in sids:
        pipe.xrevrange(at.log(sid), count=1)
    now = time.monotonic()
    for sid, last in zip(sids, pipe.execute(), strict=True):
        if not last:
            continue
        eid, fields = last[0]
        if keys.seq_of_entry_id(eid) > pending[sid][0]:
            rep.recoveries_s.append(now - pending[sid][1])
            del pending[sid]
        elif fields.get(b"p") == b"closed":
            del pending[sid]


def check(rep: Report, store: SagaStore, ids: dict[str, str], ledger: Path,
          metrics_dir: Path, url: str) -> None:
    """Every guarantee, against the soak's own ledger."""
    rep.by_shape.update(ids.values())
    db = chaos_tools.db()
    by_saga: dict[str, list[tuple[int, str, int]]] = defaultdict(list)
    for n, kind, saga, step in db.execute("SELECT n, kind, saga, step FROM effects"):
        by_saga[saga].append((n, kind, step))
    runs = db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    total = db.execute("SELECT COUNT(*) FROM effects").fetchone()[0]
    rep.tool_reruns = runs - total
    _check_doubles(rep, db)
    comp_kinds = set(FORWARD.values())
    log_counts: Counter[str] = Counter()
    indexed = set(in_flight(store.redis))
    for sid, shape in ids.items():
        rows = sorted(by_saga.pop(sid, []))
        if shape == "invalid":
            rep.by_state["refused (nothing written)"] += 1
            if not store.events.log.head(sid).empty or rows:
                rep.fail(f"{sid}: invalid input left a trace")
            continue
        if store.events.log.head(sid).empty:
            rep.lost += 1  # its submit was acknowledged: a replica held the opening
            rep.fail(f"{sid} ({shape}): acknowledged, and its log is gone")
            continue
        st = store.state(sid)
        rep.by_state[str(st.status)] += 1
        if not st.final and sid not in indexed:
            rep.stranded += 1
            rep.fail(f"{sid} ({shape}): stranded, {st.status} and in no index a sweeper reads")
        log_counts[f"finished {st.status}"] += 1
        expected = {EXPECTED[shape]}
        if any(s.status == "in_doubt" for s in st.steps.values()):
            expected = {Status.COMPENSATED, Status.NEEDS_ATTENTION}  # a kill left it unknown
        if not st.final or st.status not in expected:
            rep.fail(f"{sid} ({shape}): {st.status}, expected {EXPECTED[shape]}; {_steps(st)}")
        _check_saga(rep, sid, st, rows, comp_kinds, log_counts)
    for sid in by_saga:
        rep.fail(f"effects for {sid}, which the soak never submitted")
    _check_metrics(rep, metrics_dir, log_counts)
    verify = subprocess.run([sys.executable, "-m", "saga_store.cli.main", "--redis-url", url,
                             "verify",
                             ], capture_output=True, text=True, cwd=ROOT, check=False)
    if verify.returncode != 0:
        rep.fail(f"saga verify exited {verify.returncode}: {verify.stdout[-500:]}"
                 f"{verify.stderr[-500:]}")


def _check_saga(rep: Report, sid: str, st: SagaState, rows: list[tuple[int, str, int]],
                comp_kinds: set[str], log_counts: Counter[str]) -> None:
    """Effects against the log. A step left in doubt (its worker was killed inside
    an irreversible tool, which is never re-run blind) may or may not have had its
    effect: that is what in doubt means, and why the saga then needs a person."""
    forward = [(n, kind, step) for n, kind, step in rows if kind not in comp_kinds]
    comps = [(n, kind, step) for n, kind, step in rows if kind in comp_kinds]
    rep.effects += len(forward)
    rep.compensations += len(comps)
    steps = st.steps.values()
    effectful = ("reserve", "charge", "crm", "ship", "book", "hold")
    exact = {(s.tool, s.step) for s in steps if s.status == "succeeded" and s.tool in effectful}
    maybe = {(s.tool, s.step) for s in steps if s.status == "in_doubt" and s.tool in effectful}
    rep.in_doubt += len(maybe)
    got = Counter((kind, step) for _, kind, step in forward)
    if (not exact <= set(got) <= exact | maybe) or any(v != 1 for v in got.values()):
        rep.fail(f"{sid}: forward effects {dict(got)}, log says succeeded {sorted(exact)}, "
                 f"in doubt {sorted(maybe)}; {_steps(st)}")
    log_counts["steps succeeded"] += sum(1 for s in steps if s.status == "succeeded")
    undo = set() if st.status is Status.COMMITTED else {
        (FORWARD[s.tool], s.step) for s in steps if s.status == "succeeded" and s.tool in FORWARD}
    undo_maybe = {(FORWARD[s.tool], s.step) for s in steps
                  if s.status == "in_doubt" and s.tool in FORWARD}
    got_comps = Counter((kind, step) for _, kind, step in comps)
    if (not undo <= set(got_comps) <= undo | undo_maybe) or any(
            v != 1 for v in got_comps.values()):
        rep.fail(f"{sid}: compensations {dict(got_comps)}, expected {sorted(undo)}; "
                 f"{_steps(st)}")
    steps_in_order = [step for _, _, step in comps]
    if steps_in_order != sorted(steps_in_order, reverse=True):
        rep.fail(f"{sid}: compensated steps in order {steps_in_order}, not in reverse")
    if comps and forward and max(n for n, _, _ in forward) > min(n for n, _, _ in comps):
        rep.fail(f"{sid}: a forward effect came after compensation began")
    for s in steps:
        if s.compensation == "succeeded" and st.status is not Status.COMMITTED:
            log_counts["compensations succeeded"] += 1


def _check_doubles(rep: Report, db: Any) -> None:
    """The soak's own ledger: no two tries of one step ran at the same time (a step
    whose tries outlast the lease stays with its worker while that lives), and no
    tool that raised a BaseException ran twice (it is in doubt after one run)."""
    overlaps = db.execute(
        "SELECT a.key, a.pid, b.pid FROM tries a JOIN tries b ON a.key = b.key "
        "AND a.rowid < b.rowid AND a.start < b.end AND b.start < a.end").fetchall()
    twice = db.execute("SELECT key, COUNT(*) FROM runs WHERE kind = 'hold' GROUP BY key "
                       "HAVING COUNT(*) > 1").fetchall()
    rep.doubled = len(overlaps) + len(twice)
    for key, a, b in overlaps[:10]:
        rep.fail(f"tries of step {key[:16]} ran at once in processes {a} and {b}")
    for key, n in twice[:10]:
        rep.fail(f"the BaseException tool ran {n} times under key {key[:16]}")


def _steps(st: SagaState) -> str:
    return ", ".join(f"{s.step}:{s.tool}={s.status}/{s.compensation}" for s in
                     st.steps.values())


def _check_metrics(rep: Report, metrics_dir: Path, log_counts: Counter[str]) -> None:
    """Counters can lag the log by an increment per job a killed process had in
    flight (a kill between an append and its increment), never lead it."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector
    reg = CollectorRegistry()
    # a process killed between creating its file and sizing it leaves it empty:
    # no samples, and the collector cannot read it (struct.error)
    for empty in (f for f in metrics_dir.glob("*.db") if f.stat().st_size == 0):
        empty.unlink()
    # no-untyped-call: the library leaves it untyped
    MultiProcessCollector(reg, path=str(metrics_dir))  # type: ignore[no-untyped-call]
    got: Counter[str] = Counter()
    for family in reg.collect():
        for s in family.samples:
            if s.name == "saga_sagas_finished_total":
                got[f"finished {s.labels['state']}"] += s.value
            elif s.name == "saga_steps_total" and s.labels["outcome"] == "succeeded":
                got["steps succeeded"] += s.value
            elif s.name == "saga_compensations_total" and s.labels["outcome"] == "succeeded":
                got["compensations succeeded"] += s.value
    slack = rep.processes_killed * rep.config.slots
    for name, want in log_counts.items():
        value = got.get(name, 0.0)
        rep.metrics[name] = (value, want)
        if not want - slack <= value <= want:
            rep.fail(f"metric {name} = {value:.0f}, log says {want} "
                     f"(allowed lag {slack}: one per job a killed process had in flight)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sagas", type=int, default=Config.sagas)
    p.add_argument("--step-pools", type=int, default=Config.step_pools)
    p.add_argument("--compensator-pools", type=int, default=Config.compensator_pools)
    p.add_argument("--workers-per-pool", type=int, default=Config.workers_per_pool)
    p.add_argument("--kill-every", type=float, default=Config.kill_every_s)
    p.add_argument("--in-flight", type=int, default=Config.in_flight)
    p.add_argument("--seed", type=int, default=Config.seed)
    p.add_argument("--worker-kind", choices=("rq", "async"), default=Config.worker_kind)
    p.add_argument("--cluster", action="store_true",
                   help="the log on a six-node Redis Cluster (a master killed, slots resharded)")
    p.add_argument("--wait-replicas", type=int, default=None,
                   help="SAGA_WAIT_REPLICAS for every process (default: 1 with --cluster, else 0)")
    p.add_argument("--master-kills", type=int, default=Config.master_kills,
                   help="with --cluster: this many replica-lag failovers (a master's replica "
                        "stopped and cut off, the master SIGKILLed, the replica promoted) "
                        "instead of one plain kill and a reshard")
    p.add_argument("--lag-stall-ms", type=int, default=Config.lag_stall_ms,
                   help="how long a lagging replica is stopped at least before the kill")
    a = p.parse_args(argv)
    if a.master_kills and not a.cluster:
        p.error("--master-kills needs --cluster")
    cfg = Config(sagas=a.sagas, step_pools=a.step_pools, compensator_pools=a.compensator_pools,
                 workers_per_pool=a.workers_per_pool, kill_every_s=a.kill_every,
                 in_flight=a.in_flight, seed=a.seed, worker_kind=a.worker_kind,
                 cluster=a.cluster, wait_replicas=a.wait_replicas if a.wait_replicas is not None
                 else int(a.cluster), master_kills=a.master_kills, lag_stall_ms=a.lag_stall_ms)
    print(f"chaos soak: {cfg.sagas} sagas, a pool SIGKILLed every ~{cfg.kill_every_s} s, "
          + (f"{cfg.master_kills} cluster masters SIGKILLed with their replicas lagging"
             if cfg.master_kills else "a cluster master SIGKILLed, slots resharded"
             if cfg.cluster else "Redis restarted once"), flush=True)
    rep = run(cfg)
    print(rep.table())
    for f in rep.failures:
        print(f"  FAIL {f}")
    return 0 if rep.ok else 1


if __name__ == "__main__":
    sys.exit(main())
