"""Two checkouts' worker CPU per step, side by side: plans of no-op steps run
in-process by the checkout's own StepRunner against a private Redis, timed by
``time.process_time`` (the process's own CPU, so the machine's other load and
its scheduling matter far less than for wall-clock rates). Rounds alternate
A, B, B, A, ...; reports the median CPU per step and the ratio B/A.

    git worktree add /tmp/before <rev>
    python -m benchmarks.ab_step_cpu /tmp/before . --rounds 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess

from benchmarks.common import python_of

CHILD = r'''
import json, sys, time
sys.path.insert(0, ".")
from saga_store import Registry, SagaStore, Settings
from saga_store.testing import RedisServer
try:
    from saga_store.execution import jobs
    from saga_store.workers.step import StepRunner
except ImportError:  # the layout before saga_store took one top-level name
    from saga_store import jobs
    from workers.step import StepRunner
import redis
plans, steps = int(sys.argv[1]), int(sys.argv[2])
with RedisServer(appendfsync="everysec") as srv:
    store = SagaStore(redis.Redis.from_url(srv.url), Registry.from_modules("tests.ledger_tools"),
                      Settings(lease_ms=5000))
    runner = StepRunner(store, "bench")
    plan = [{"tool": "noop", "args": {"n": i}} for i in range(steps)]
    for warm in (True, False):
        ids = [store.submit(plan, agent_id="bench") for _ in range(plans)]
        r = store.redis
        t0 = time.process_time()
        while True:
            raw = r.lpop(jobs.queue_key(jobs.STEP_QUEUE))
            if raw is None:
                break
            func, args = jobs.decode(r.hget(jobs.job_key(raw.decode()), "data"))
            runner.run(str(args[0]), int(args[1]), int(args[2]))
        cpu = time.process_time() - t0
    done = sum(store.state(s).status == "committed" for s in ids)
    print(json.dumps({"cpu_ms_per_step": cpu * 1000 / (plans * steps), "committed": done}))
'''


def one(spec: str, plans: int, steps: int) -> float:
    """One round on ``spec``: a checkout, or ``DIR:PYTHON`` for one with its own
    virtual environment (an editable install maps packages to its own tree)."""
    checkout, _, python = spec.partition(":")
    out = subprocess.run([python or python_of(checkout), "-c", CHILD, str(plans), str(steps)],
                         cwd=checkout, capture_output=True, text=True, check=True, timeout=600)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["committed"] == plans, res
    return float(res["cpu_ms_per_step"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("checkouts", nargs=2)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--plans", type=int, default=200)
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    got: list[list[float]] = [[], []]
    for r in range(a.rounds):
        for i in ((0, 1) if r % 2 == 0 else (1, 0)):
            got[i].append(one(a.checkouts[i], a.plans, a.steps))
    med = [statistics.median(g) for g in got]
    for i in (0, 1):
        print(f"{'AB'[i]} {a.checkouts[i]}: worker CPU per no-op step {med[i]:.3f} ms "
              f"(rounds {', '.join(f'{x:.3f}' for x in got[i])})")
    print(f"B/A: {med[1] / med[0]:.3f}x")


if __name__ == "__main__":
    main()
