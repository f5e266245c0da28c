"""The step path on one Redis and on a Redis Cluster, side by side: plans of
no-op steps run in-process by a StepRunner (eager steps: each next step is
claimed with the previous outcome), the queues on a standalone Redis beside
the cluster. Reports worker CPU (``time.process_time``) and wall time per step.

    python -m benchmarks.bench_cluster_steps --plans 100 --rounds 2
"""

from __future__ import annotations

import argparse
import time

import redis
from saga_store.workers.step import StepRunner

from saga_store import Registry, SagaStore, Settings
from saga_store.execution import jobs
from saga_store.ops.connection import connect
from saga_store.testing import RedisServer
from saga_store.testing.cluster import RedisClusterServers


def per_step(store: SagaStore, plans: int, steps: int) -> tuple[float, float]:
    """(CPU ms, wall ms) per step, the second of two passes (the first warms up)."""
    runner = StepRunner(store, "bench")
    plan = [{"tool": "noop", "args": {"n": i}} for i in range(steps)]
    cpu = wall = 0.0
    for _warm in (True, False):
        ids = [store.submit(plan, agent_id="bench") for _ in range(plans)]
        q = store.queues
        t0, w0 = time.process_time(), time.perf_counter()
        while (raw := q.lpop(jobs.queue_key(jobs.STEP_QUEUE))) is not None:
            got = jobs.decode(q.hget(jobs.job_key(raw.decode()), "data"))
            assert got is not None
            args = got[1]
            runner.run(str(args[0]), int(args[1]), int(args[2]))
        cpu, wall = time.process_time() - t0, time.perf_counter() - w0
    assert all(store.state(s).status == "committed" for s in ids)
    n = plans * steps
    return cpu * 1000 / n, wall * 1000 / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plans", type=int, default=100)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    registry = Registry.from_modules("tests.ledger_tools")
    settings = Settings(lease_ms=5000)
    for _ in range(a.rounds):
        with RedisServer(appendfsync="everysec") as srv:
            one = SagaStore(redis.Redis.from_url(srv.url), registry, settings)
            cpu, wall = per_step(one, a.plans, a.steps)
            print(f"one Redis  CPU / wall ms per step: {cpu:.3f} / {wall:.3f}")
        with RedisClusterServers(appendfsync="everysec") as c:
            on_cluster = SagaStore(connect(c.url), registry, settings,
                                   queues=redis.Redis.from_url(c.queue_url))
            cpu, wall = per_step(on_cluster, a.plans, a.steps)
            print(f"cluster    CPU / wall ms per step: {cpu:.3f} / {wall:.3f}")


if __name__ == "__main__":
    main()
