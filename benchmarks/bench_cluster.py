"""Saga Store on one Redis and on a three-master Redis Cluster (each master with a
replica), side by side in interleaved rounds (one, cluster, cluster, one, ...),
AOF with ``appendfsync everysec`` everywhere:

- **appends**: T threads each open sagas and append 10 events to each, one
  append per call as a driver makes them; appends/s and Redis CPU per saga;
- **workflows**: the peer workload of bench_workflows (N concurrent 5-step
  workflows of 10 ms steps, 20% failing at step 3 and compensating) through W RQ
  workers; workflows/s and Redis CPU per workflow;
- **sealing**: E ledger entries pending, spread over the buckets, sealed by S
  threads at once; entries/s;
- **spread**: of the ledger entries the workflow runs wrote, the largest bucket's
  and the largest master's share.

Redis CPU is user + system time from ``/proc`` of the processes that serve the
work: the one Redis (which holds RQ's queues too), or the three masters plus the
standalone queue Redis. Replicas' CPU is shown apart: they replicate, they serve
nothing. A Redis Cluster client routes each command to its slot's node and runs
a pipeline as one batch per node, so the cluster costs the client more than a
single Redis; the figure that decides capacity is Redis CPU per saga, because the
masters' share grows with their number while the client's does not.

    python -m benchmarks.bench_cluster [--rounds 3] [--quick]
    make bench-cluster
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from saga_store import Registry, SagaStore, Settings, keys
from saga_store.log.events import EventKind as K
from saga_store.log.layout import DEFAULT_VERSION, LEGACY
from saga_store.log.store import EventStore
from saga_store.ops.connection import connect
from saga_store.testing import RedisServer, assert_eventually
from saga_store.testing.cluster import RedisClusterServers, free_cluster_port
from saga_store.testing.workers import WorkerProcess

from .bench_workflows import ROOT, TOOLS, cpu_s, durable_run, plans, summarize
from .common import machine

OUT = Path(__file__).parent / "out"
WORKERS = 12  # RQ workers: fewer than bench_workflows's 26, as six Redis processes share the cores
LAYOUT = [DEFAULT_VERSION]  # the layout of the stores (--layout)


@dataclass
class Backend:
    """One of the two deployments, up for the whole run."""

    name: str
    url: str
    queue_url: str
    serving: Callable[[], set[int]]  # pids whose CPU counts as Redis's
    replicas: Callable[[], set[int]] = lambda: set()
    masters: Callable[[], list[Any]] = list
    procs: list[WorkerProcess] = field(default_factory=list)
    idle_ms_per_s: float = 0.0  # Redis CPU with the workers idle (see idle_ms_per_s())
    flush: Callable[[], None] = lambda: None  # empty it (before any worker runs)
    workflows: bool = True  # whether the workflow runs (with workers) are made on it

    def store(self) -> SagaStore:
        return SagaStore.from_url(self.url, Registry.from_modules(TOOLS),
                                  Settings(layout=LAYOUT[0]), queue_url=self.queue_url)



@contextmanager
def backends() -> Iterator[list[Backend]]:
    """The one Redis gets a replica too, as the cluster's masters have: a master
    pays for feeding its replica, and that is not the cluster's cost."""
    one = RedisServer(appendfsync="everysec").start()
    twin = RedisServer("--replicaof", "127.0.0.1", str(one.port), appendfsync="everysec")
    cluster = RedisClusterServers(appendfsync="everysec")
    # cluster mode on one node that serves every slot: what cluster mode costs a
    # Redis, apart from what spreading over six processes on these cores costs
    solo = RedisServer("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                       appendfsync="everysec")
    solo.port = free_cluster_port()
    try:
        twin.start()
        cluster.start()
        solo.start()
        c = redis.Redis(port=solo.port)
        c.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        assert_eventually(lambda: c.cluster("info")["cluster_state"] == "ok", timeout=30,
                          what="the one-node cluster to be ok")

        def pid(node: Any) -> set[int]:
            return {node.proc.pid} if node.proc is not None else set()
        yield [
            Backend("one Redis", one.url, one.url, lambda: pid(one), lambda: pid(twin),
                    flush=lambda: connect(one.url).flushall()),
            Backend("3-master cluster", cluster.url, cluster.queue_url,
                    lambda: set().union(*map(pid, cluster.masters()), pid(cluster.queue)),
                    lambda: set().union(*map(pid, cluster.live())) - set().union(
                        *map(pid, cluster.masters())),
                    cluster.masters, flush=cluster.flush),
            Backend("1-node cluster", f"redis+cluster://127.0.0.1:{solo.port}", one.url,
                    lambda: pid(solo), workflows=False),
        ]
    finally:
        solo.stop()
        cluster.stop()
        twin.stop()
        one.stop()


def redis_cpu(b: Backend) -> tuple[float, float]:
    return cpu_s(b.serving()), cpu_s(b.replicas())


def idle_ms_per_s(b: Backend, seconds: float = 3.0) -> float:
    """Redis CPU (ms per second) with nothing to do but the workers' sweeps and, of
    a cluster, the nodes' gossip: what runs whatever the load."""
    cpu0, _ = redis_cpu(b)
    time.sleep(seconds)
    return (redis_cpu(b)[0] - cpu0) * 1000 / seconds


def appends(b: Backend, sagas: int, threads: int) -> dict[str, float]:
    """T threads, each opening sagas/T sagas and appending 10 events to each."""
    each = sagas // threads
    stores = [EventStore(connect(b.url), Settings(layout=LAYOUT[0])) for _ in range(threads)]

    def work(store: EventStore) -> None:
        for _ in range(each):
            w = store.open("bench")
            for n in range(10):
                w.append(K.STEP_INTENT if n % 2 == 0 else K.STEP_SUCCEEDED, step=n // 2,
                         tool="t", data={"args": {"n": n}})
    cpu0, rep0 = redis_cpu(b)
    t0 = time.perf_counter()
    pool = [threading.Thread(target=work, args=(s,)) for s in stores]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    elapsed = time.perf_counter() - t0
    cpu1, rep1 = redis_cpu(b)
    done = each * threads
    return {"appends_per_s": done * 11 / elapsed,
            "redis_cpu_ms_per_saga": (cpu1 - cpu0) * 1000 / done,
            "redis_cpu_ms_per_saga_net": ((cpu1 - cpu0) * 1000 - b.idle_ms_per_s * elapsed)
            / done,
            "replica_cpu_ms_per_saga": (rep1 - rep0) * 1000 / done}


def start_workers(b: Backend, count: int) -> None:
    env = {**os.environ, "SAGA_REDIS_URL": b.url, "SAGA_QUEUE_URL": b.queue_url,
           "SAGA_LAYOUT": str(LAYOUT[0]),
           "PYTHONPATH": ROOT, "SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": ""}
    b.procs = [WorkerProcess(env, TOOLS, "--log-level", "WARNING").start()
               for _ in range(count)]
    from rq.worker import Worker
    q = connect(b.queue_url)
    assert_eventually(lambda: len(Worker.all(connection=q)) >= count, timeout=90,
                      what="workers to start")


def workflows(b: Backend, fails: list[bool]) -> dict[str, float]:
    store = b.store()
    workers = set().union(*(p.pids() for p in b.procs))
    cpu0, rep0 = redis_cpu(b)
    w0 = cpu_s(workers)
    t0 = time.perf_counter()
    row = summarize(*durable_run(store, fails))
    elapsed = time.perf_counter() - t0
    cpu1, rep1 = redis_cpu(b)
    n = len(fails)
    idle = b.idle_ms_per_s
    row.update(redis_cpu_ms_per_wf=(cpu1 - cpu0) * 1000 / n,
               redis_cpu_ms_per_wf_net=((cpu1 - cpu0) * 1000 - idle * elapsed) / n,
               replica_cpu_ms_per_wf=(rep1 - rep0) * 1000 / n,
               workers_cpu_ms_per_wf=(cpu_s(workers) - w0) * 1000 / n)
    return row


def spread(b: Backend) -> dict[str, float]:
    """Of the ledger entries in the store, the largest bucket's and master's share."""
    store = b.store().events
    store.ledger.flush()
    counts = Counter({c: store.redis.xlen(keys.ledger_log(c)) for c in store.ledger.present()
                      if c != LEGACY})
    total = sum(counts.values()) or 1
    m = store.log.layout.buckets
    rng = random.Random(1)  # the same count thrown at random buckets, for comparison
    thrown = Counter(rng.randrange(m) for _ in range(total))
    out = {"ledger_entries": float(total),
           "largest_bucket_share": max(counts.values(), default=0) / total,
           "largest_bucket_share_if_random": max(thrown.values()) / total,
           "buckets": float(m)}
    masters = b.masters()
    if masters:
        from redis.crc import key_slot
        owner: dict[int, int] = {}  # slot -> the port of the master serving it
        for lo, hi, master, *_ in redis.Redis(port=masters[0].port).execute_command(
                "CLUSTER", "SLOTS"):
            owner.update(dict.fromkeys(range(int(lo), int(hi) + 1), int(master[1])))
        by_master: Counter[int] = Counter()
        for chain, n in counts.items():
            by_master[owner.get(key_slot(keys.ledger_log(chain).encode()), -1)] += n
        out["largest_master_share"] = max(by_master.values()) / total
        out["masters"] = float(len(masters))
    return out


def sealing(b: Backend, entries: int, threads: int) -> dict[str, float]:
    """``entries`` real ledger entries pending over the buckets, then ``threads``
    sealers at once, each over every bucket (the leases share them out)."""
    store = EventStore(connect(b.url), Settings(layout=LAYOUT[0]))
    store.ledger.deferred = True
    made = [store.open("bench") for _ in range(200)]
    pending = [(keys.ledger_pending(store.log.layout.ledger_of(w.saga_id)),
                store.redis.lindex(keys.ledger_pending(store.log.layout.ledger_of(w.saga_id)),
                                   -1)) for w in made]
    store.ledger.flush()
    pipe = store.redis.pipeline(transaction=False)
    for i in range(entries):  # copies of real openings: a debt paid twice is one fact
        key, entry = pending[i % len(pending)]
        pipe.rpush(key, entry)
        if i % 5000 == 4999:
            pipe.execute()
    pipe.execute()
    t0 = time.perf_counter()
    with mp.get_context("fork").Pool(threads) as pool:  # processes: no shared GIL
        sealed = pool.map(_seal, [b.url] * threads)
    elapsed = time.perf_counter() - t0
    left = sum(store.ledger.backlog().values())
    return {"sealed_per_s": sum(sealed) / elapsed, "sealed": float(sum(sealed)),
            "left": float(left)}


def _seal(url: str) -> int:
    return EventStore(connect(url), Settings(layout=LAYOUT[0])).ledger.seal()


def run(rounds: int, quick: bool) -> dict[str, Any]:
    rng = random.Random(7)
    n = 100 if quick else 300
    sagas, threads = (400, 4) if quick else (1200, 4)
    seal_n = 20_000 if quick else 60_000
    rows: dict[str, dict[str, list[dict[str, float]]]] = {}
    with backends() as bs:
        for r in range(rounds):  # sealing first, with no workers' sweepers sealing too
            for b in (bs if r % 2 == 0 else bs[::-1]):
                rows.setdefault(b.name, {}).setdefault("sealing", []).append(
                    sealing(b, seal_n, 3))
        for b in bs:
            b.flush()  # the sealing runs' copies would weigh on the spread
            if b.workflows:
                start_workers(b, WORKERS)
        for b in bs:
            b.idle_ms_per_s = idle_ms_per_s(b)
            rows[b.name]["idle"] = [{"redis_cpu_ms_per_s": b.idle_ms_per_s}]
        try:
            for r in range(rounds):
                order = bs if r % 2 == 0 else bs[::-1]
                fails = plans(n, 0.2, rng)
                for b in order:
                    got = rows.setdefault(b.name, {})
                    got.setdefault("appends", []).append(appends(b, sagas, threads))
                    if not b.workflows:
                        continue
                    got.setdefault("workflows", []).append(workflows(b, fails))
                    if r == rounds - 1:
                        got["spread"] = [spread(b)]
                    print(json.dumps({b.name: {k: v[-1] for k, v in got.items()}}), flush=True)
        finally:
            for b in bs:
                for p in b.procs:
                    p.kill()
    med = {name: {part: {k: statistics.median(row[k] for row in runs) for k in runs[0]}
                  for part, runs in parts.items()} for name, parts in rows.items()}
    one, cl, solo = med["one Redis"], med["3-master cluster"], med["1-node cluster"]
    ratios = {
        "redis_cpu_per_saga_appends_1_node_cluster": solo["appends"]["redis_cpu_ms_per_saga"]
        / one["appends"]["redis_cpu_ms_per_saga"],
        "sealing_1_node_cluster_over_1": solo["sealing"]["sealed_per_s"]
        / one["sealing"]["sealed_per_s"],
        "redis_cpu_per_saga_appends": cl["appends"]["redis_cpu_ms_per_saga"]
        / one["appends"]["redis_cpu_ms_per_saga"],
        "redis_cpu_per_saga_appends_net": cl["appends"]["redis_cpu_ms_per_saga_net"]
        / one["appends"]["redis_cpu_ms_per_saga_net"],
        "redis_cpu_per_workflow": cl["workflows"]["redis_cpu_ms_per_wf"]
        / one["workflows"]["redis_cpu_ms_per_wf"],
        "redis_cpu_per_workflow_net": cl["workflows"]["redis_cpu_ms_per_wf_net"]
        / one["workflows"]["redis_cpu_ms_per_wf_net"],
        "sealing_3_masters_over_1": cl["sealing"]["sealed_per_s"]
        / one["sealing"]["sealed_per_s"],
        "workflows_per_s": cl["workflows"]["workflows_per_s"]
        / one["workflows"]["workflows_per_s"],
    }
    sizing = {name: {"workflows_per_redis_core_s": 1000 / m["workflows"]["redis_cpu_ms_per_wf"],
                     "sagas_per_redis_core_s_appends": 1000
                     / m["appends"]["redis_cpu_ms_per_saga"]}
              for name, m in med.items() if "workflows" in m}
    return {"machine": machine(), "rounds": rounds, "n": n, "workers": WORKERS,
            "layout": LAYOUT[0],
            "median": med, "ratios_cluster_over_one": ratios, "sizing": sizing,
            "runs": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--layout", type=int, choices=(2, 3), default=DEFAULT_VERSION,
                    help="the layout the stores are created with")
    args = ap.parse_args()
    LAYOUT[0] = args.layout
    out = run(1 if args.quick else args.rounds, args.quick)
    OUT.mkdir(exist_ok=True)
    (OUT / f"cluster-layout{LAYOUT[0]}.json").write_text(json.dumps(out, indent=2))
    print(json.dumps({k: out[k] for k in ("median", "ratios_cluster_over_one", "sizing")},
                     indent=2))


if __name__ == "__main__":
    main()
