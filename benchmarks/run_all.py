"""Run every benchmark and write benchmarks/out/results.json and a Markdown table.

    make bench          # full size (about 10 minutes on 2 cores)
    make bench QUICK=1  # smaller runs, for a smoke check
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from . import (
    bench_compensation,
    bench_gateway,
    bench_log,
    bench_steps,
    bench_wait,
    bench_workflows,
)

OUT = Path(__file__).parent / "out"


def table(log: dict[str, Any], steps: dict[str, Any], comp: dict[str, Any],
          flows: dict[str, Any], gw: dict[str, Any], wait: dict[str, Any]) -> str:
    rt, fc = steps["round_trip_ms"], steps["flat_cost_ms"]
    rows = [
        ("append, one at a time", f"{log['append_one_per_s']:,.0f} /s", ">= 5,000 /s"),
        ("append, batched", f"{log['append_batched_per_s']:,.0f} /s", ">= 40,000 /s"),
        ("append cost at seq 100,000 / seq 10",
         f"{log['append_us_at_seq_100000']:.0f} / {log['append_us_at_seq_10']:.0f} us "
         f"= {log['append_cost_ratio']:.2f}x", "flat"),
        ("verify from Redis", f"{log['verify_redis_per_s']:,.0f} events/s", ">= 200,000"),
        ("verify exported JSONL", f"{log['verify_file_per_s']:,.0f} events/s", ">= 400,000"),
        ("Redis memory per event (300 B payload)", f"{log['memory_bytes_per_event']:.0f} B",
         "<= 600 B"),
        ("step round trip p50 / p99 (durable)",
         f"{rt['durable']['p50']:.2f} / {rt['durable']['p99']:.2f} ms", "<= 3 / <= 10 ms"),
        ("bare RQ round trip p50 / p99 (same run)",
         f"{rt['bare_rq_simpleworker']['p50']:.2f} / "
         f"{rt['bare_rq_simpleworker']['p99']:.2f} ms", "reference"),
        ("step after 1,000 steps / step 1-10",
         f"{fc['step_1000_plus']:.2f} / {fc['step_1_to_10']:.2f} ms = {fc['ratio']:.2f}x",
         "<= 1.2x"),
    ]
    for n, tp in steps["throughput"].items():
        rows.append((f"no-op steps/s, {n} worker(s) (bare RQ same run)",
                     f"{tp['durable_steps_per_s']:,.0f} ({tp['bare_rq_jobs_per_s']:,.0f}) "
                     f"= {tp['ratio']:.1f}x", ">= 1,000 at best"))
    rss = max(r for tp in steps["throughput"].values() for r in tp["worker_rss_mb"])
    rows.append(("worker RSS (max)", f"{rss:.1f} MB", "<= 80 MB"))
    lag, rec, reb = comp["compensation_lag_ms"], comp["recovery_s"], comp["rebuild_1000_steps_ms"]
    rows += [
        ("step failed -> saga compensated (3 steps) p50 / p99",
         f"{lag['p50']:.0f} / {lag['p99']:.0f} ms", "p50 <= 15 ms"),
        ("compensator killed -> unwind finished (max of runs)",
         f"{rec['max']:.1f} s = {rec['max'] / rec['lease_s']:.2f} lease periods",
         "<= 2 lease periods"),
        ("rebuild history of a 1,000-step saga p50 / max",
         f"{reb['p50']:.0f} / {reb['max']:.0f} ms", "<= 50 ms"),
    ]
    rows.append(("yardstick: bare RQ, 8 SimpleWorkers, 10 ms jobs (same run)",
                 f"{flows['bare_rq_8_workers_10ms_jobs_per_s']:.0f} jobs/s",
                 "the issue quotes 280-360 for this machine"))
    for name, row in flows.items():
        if not name.startswith("n="):
            continue
        d, m = row["durable"], row["memory"]
        target = ">= 250 wf/s, p99 <= 250 ms" if name.startswith("n=50 ") else ">= 250 wf/s"
        rows.append((f"5-step workflows {name} (10 ms tools, {flows['workers']} workers): "
                     "durable vs in-memory",
                     f"{d['workflows_per_s']:.0f} vs {m['workflows_per_s']:.0f} wf/s "
                     f"(x{row['ratio']['workflows_per_s']:.2f}); p50/p95/p99 "
                     f"{d['p50_ms']:.0f}/{d['p95_ms']:.0f}/{d['p99_ms']:.0f} ms vs "
                     f"{m['p50_ms']:.0f}/{m['p95_ms']:.0f}/{m['p99_ms']:.0f} ms", target))
    rows += [
        ("MCP gateway (stdio) overhead per call p50, vs direct (byte relay hop alone; "
         "SDK proxy hop alone)",
         f"{gw['overhead_p50_ms']:.2f} ms ({gw['byte_relay_overhead_p50_ms']:.2f} ms; "
         f"{gw['sdk_proxy_overhead_p50_ms']:.2f} ms); direct {gw['direct_ms']['p50']:.2f} ms",
         "<= 1 ms"),
        ("MCP guard in the agent's process: overhead per call p50",
         f"{gw['in_process_overhead_p50_ms']:.2f} ms", "<= 1 ms"),
        (f"MCP gateway call {gw['depth']:,} / call 1 (median of 100)",
         f"{gw['last_100_ms']:.2f} / {gw['first_100_ms']:.2f} ms = {gw['depth_ratio']:.2f}x",
         "<= 1.2x"),
    ]
    for path in ("single", "pipeline"):
        w0, w1 = wait[path]["wait_0"], wait[path]["wait_1"]
        rows.append((f"append ({path} call), SAGA_WAIT_REPLICAS=1 vs 0, replica on loopback, "
                     "p50 / p99",
                     f"{w1['p50_us']:.0f} / {w1['p99_us']:.0f} us vs "
                     f"{w0['p50_us']:.0f} / {w0['p99_us']:.0f} us", "reference"))
    out = ["| measure | result | target |", "|---|---|---|"]
    out += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(out)


def main() -> None:
    quick = os.environ.get("QUICK") == "1" or "--quick" in sys.argv
    OUT.mkdir(exist_ok=True)
    started = time.time()
    log = bench_log.run(events=200_000 if quick else 1_000_000, runs=1 if quick else 3)
    steps = bench_steps.run(quick)
    comp = bench_compensation.run(quick)
    flows = bench_workflows.run(bench_workflows.WORKERS, quick)
    gw = bench_gateway.run(calls=1000 if quick else 3000, side_by_side=300 if quick else 1000)
    wait = bench_wait.run(rounds=4 if quick else 20, appends=250)
    results = {"log": log, "steps": steps, "compensation": comp, "workflows": flows,
               "gateway": gw, "wait": wait,
               "seconds": time.time() - started, "quick": quick}
    (OUT / "results.json").write_text(json.dumps(results, indent=1, default=str))
    md = table(log, steps, comp, flows, gw, wait)
    (OUT / "table.md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
