"""Two checkouts' MCP gateways side by side, call by call.

This machine's speed drifts by tens of percent over minutes, so two versions of
the gateway measured one after the other cannot be compared. Here one process
keeps three sessions to the same kind of server up at once (direct, through
the gateway of checkout A, through the gateway of checkout B, each gateway
started from its own checkout) and sends the same call through each in turn,
rotating who goes first. Reports, per run, each gateway's overhead p50 over
direct and the CPU its process spent per call.

    git worktree add /tmp/before <rev>
    python -m benchmarks.ab_gateway /tmp/before . [--calls 2000] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from .common import bench_redis

SERVER = [sys.executable, str(Path(__file__).resolve().parent / "mcp_kv_server.py")]


def _gateway(root: str, url: str, name: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable, cwd=root, env={**os.environ, "PYTHONPATH": root},
        args=["-m", "saga_store.cli.main", "--redis-url", url, "mcp-guard", "--gateway-id", name,
              "--", *SERVER])


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _gateway_pid(name: str) -> int:
    """The gateway process started with ``--gateway-id name`` (the server it runs is
    its child)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if b"mcp-guard" in args and name.encode() in args:
            return int(pid)
    raise RuntimeError(f"no gateway {name} running")


async def _run(url: str, roots: dict[str, str], calls: int) -> dict[str, Any]:
    direct = StdioServerParameters(command=SERVER[0], args=SERVER[1:], env=dict(os.environ))
    async with stdio_client(direct) as (r0, w0), ClientSession(r0, w0) as d, \
            stdio_client(_gateway(roots["A"], url, "ab-A")) as (r1, w1), \
            ClientSession(r1, w1) as a, \
            stdio_client(_gateway(roots["B"], url, "ab-B")) as (r2, w2), \
            ClientSession(r2, w2) as b:
        sessions = {"direct": d, "A": a, "B": b}
        for s in sessions.values():
            await s.initialize()
            for i in range(100):  # warm every path
                await s.call_tool("put", {"key": f"w{i}", "value": "v"})
        pids = {k: _gateway_pid(f"ab-{k}") for k in ("A", "B")}
        cpu0 = {k: _cpu_s(pid) for k, pid in pids.items()}
        times: dict[str, list[float]] = {k: [] for k in sessions}
        order = list(sessions.items())
        for i in range(calls):
            for name, s in order[i % 3:] + order[:i % 3]:
                t0 = time.perf_counter()
                res = await s.call_tool("put", {"key": f"k{i}", "value": "v" * 100})
                times[name].append((time.perf_counter() - t0) * 1000)
                assert not res.is_error
        cpu = {k: (_cpu_s(pid) - cpu0[k]) / calls * 1e6 for k, pid in pids.items()}
        for k in ("A", "B"):
            await sessions[k].call_tool("saga_commit", {})
    p50 = {k: statistics.median(v) for k, v in times.items()}
    return {"direct_ms": p50["direct"],
            **{f"{k}_overhead_ms": p50[k] - p50["direct"] for k in ("A", "B")},
            **{f"{k}_cpu_us_per_call": cpu[k] for k in ("A", "B")}}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("a", help="checkout A (e.g. a worktree of the commit before)")
    p.add_argument("b", help="checkout B")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    roots = {"A": os.path.abspath(args.a), "B": os.path.abspath(args.b)}
    srv = bench_redis()
    try:
        runs = [anyio.run(_run, srv.url, roots, args.calls) for _ in range(args.runs)]
    finally:
        srv.stop()
    diffs = [r["B_overhead_ms"] - r["A_overhead_ms"] for r in runs]
    print(json.dumps({"checkouts": roots, "runs": runs,
                      "B_minus_A_overhead_ms_median": statistics.median(diffs)}, indent=2))


if __name__ == "__main__":
    main()
