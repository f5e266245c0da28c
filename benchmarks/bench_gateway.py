"""MCP gateway overhead: the same calls to the same server, direct and through
``saga mcp-guard`` (real Redis, AOF, no gate, a compensable tool, every call
logged), interleaved one by one in one run so noise hits both alike. Then cost
per call against session depth: calls N-99..N of one session against calls
1..100 of a fresh one, interleaved too.

The yardsticks, measured in the same rotation: a byte relay (the process hop
alone) and the two appends a logged call needs ([intent, started], then the
outcome), made by a bare writer on the same Redis. The targets are ratios the
machine's phase cannot fake: the stdio gateway's overhead at most (hop + two
appends) x 1.25, the in-process guard's at most (two appends) x 1.25.

    python -m benchmarks.bench_gateway [--calls 3000]
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

from saga_store import Registry, SagaStore
from saga_store.approval.policy import Policy
from saga_store.mcp.guarded import GuardedSession
from saga_store.ops.connection import connect
from saga_store.protocol import build
from saga_store.protocol.vocab import OutcomeKind, Phase

from .common import bench_redis, machine, percentile

ROOT = Path(__file__).resolve().parent.parent
SLACK = 1.25  # the targets' allowance over their yardsticks
SERVER = [sys.executable, str(ROOT / "benchmarks" / "mcp_kv_server.py")]


def _params(command: list[str], url: str | None = None,
            proxy: bool = False, relay: bool = False) -> StdioServerParameters:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if relay:
        return StdioServerParameters(command=sys.executable, env=env, args=[
            str(ROOT / "benchmarks" / "mcp_line_relay.py"), *command])
    if proxy:
        return StdioServerParameters(command=sys.executable, env=env, args=[
            str(ROOT / "benchmarks" / "mcp_passthrough.py"), *command])
    if url is None:
        return StdioServerParameters(command=command[0], args=command[1:], env=env)
    return StdioServerParameters(
        command=sys.executable, env=env,
        args=["-m", "saga_store.cli.main", "--redis-url", url, "mcp-guard", "--", *command])


class TwoAppends:
    """The Redis work of one logged call and nothing else: [intent, started] in one
    append, the outcome in another, by a writer of its own; each timed alone. With
    ``hop``, each append follows a direct call (untimed), as in the gateway, where
    Redis has been idle for a call's length before each append."""

    def __init__(self, store: SagaStore, hop: ClientSession | None = None) -> None:
        self.writer = store.events.open("bench-appends")
        self.step = 0
        self.first: list[float] = []
        self.second: list[float] = []
        self.hop = hop

    async def call_tool(self, name: str, args: dict[str, Any]) -> Any:
        n, self.step = self.step, self.step + 1
        if self.hop is not None:
            await self.hop.call_tool(name, args)
        t0 = time.perf_counter()
        self.writer.append_riding([
            build.step_intent(n, name, args, "compensable", None, f"k{n}"),
            build.step_started(n, 1, worker="bench")], phase=Phase.FORWARD)
        self.first.append((time.perf_counter() - t0) * 1000)
        if self.hop is not None:
            await self.hop.call_tool(name, args)
        t1 = time.perf_counter()
        self.writer.append_riding([build.step_outcome(n, OutcomeKind.SUCCEEDED,
                                                      result={"ok": True}, tool=name)])
        self.second.append((time.perf_counter() - t1) * 1000)
        return type("Done", (), {"is_error": False})()


async def _measure(url: str, side_by_side: int, depth: int) -> dict[str, Any]:
    async with stdio_client(_params(SERVER)) as (r1, w1), ClientSession(r1, w1) as direct, \
            stdio_client(_params(SERVER, url)) as (r2, w2), ClientSession(r2, w2) as guarded, \
            stdio_client(_params(SERVER, proxy=True)) as (r3, w3), \
            ClientSession(r3, w3) as proxied, \
            stdio_client(_params(SERVER, relay=True)) as (r4, w4), \
            ClientSession(r4, w4) as relayed:
        for s in (direct, guarded, proxied, relayed):
            await s.initialize()
        store = SagaStore(connect(url), Registry())
        inproc = GuardedSession(direct, store, policy=Policy.safe(), downstream="bench")
        await inproc.__aenter__()
        appends, after_hop = TwoAppends(store), TwoAppends(store, hop=direct)
        for s in (direct, guarded, proxied, relayed, inproc, appends, after_hop):
            for i in range(50):  # warm every path
                await s.call_tool("put", {"key": f"warm{i}", "value": "v"})
        await guarded.call_tool("saga_commit", {})
        d_ms: list[float] = []
        g_ms: list[float] = []
        p_ms: list[float] = []
        i_ms: list[float] = []
        r_ms: list[float] = []
        a_ms: list[float] = []
        h_ms: list[float] = []
        paths = [(direct, d_ms), (guarded, g_ms), (proxied, p_ms), (relayed, r_ms),
                 (inproc, i_ms), (appends, a_ms), (after_hop, h_ms)]
        for ap in (appends, after_hop):  # the warm-up's do not count
            ap.first, ap.second = [], []
        for i in range(side_by_side):
            k = i % len(paths)
            for s, out in paths[k:] + paths[:k]:  # rotate who goes first
                t0 = time.perf_counter()
                res = await s.call_tool("put", {"key": f"k{i}", "value": "v" * 100})
                out.append((time.perf_counter() - t0) * 1000)
                assert not res.is_error
        await guarded.call_tool("saga_commit", {})
        inproc.gateway.commit()
        depths = await _depth(url, direct, guarded, inproc, store, depth)
        await inproc.__aexit__(None, None, None)
    two = statistics.median(appends.first) + statistics.median(appends.second)
    two_after_hop = statistics.median(after_hop.first) + statistics.median(after_hop.second)
    hop = statistics.median(r_ms) - statistics.median(d_ms)
    gateway = statistics.median(g_ms) - statistics.median(d_ms)
    in_process = statistics.median(i_ms) - statistics.median(d_ms)
    return {
        "two_appends_p50_ms": two,
        # the same two appends, each right after a direct call, as the gateway makes them
        "two_appends_after_a_hop_p50_ms": two_after_hop,
        "append_ms": {"intent_started_p50": statistics.median(appends.first),
                      "outcome_p50": statistics.median(appends.second),
                      "p99": percentile(appends.first + appends.second, 99)},
        "targets": {
            "gateway_overhead_max_ms": (hop + two) * SLACK,
            "gateway_ratio": gateway / (hop + two),
            "gateway_met": gateway <= (hop + two) * SLACK,
            "in_process_overhead_max_ms": two * SLACK,
            "in_process_ratio": in_process / two,
            "in_process_met": in_process <= two * SLACK,
            "in_process_ratio_to_appends_after_a_hop": in_process / two_after_hop,
        },
        "direct_ms": {"p50": statistics.median(d_ms), "p99": percentile(d_ms, 99)},
        "gateway_ms": {"p50": statistics.median(g_ms), "p99": percentile(g_ms, 99)},
        "sdk_proxy_ms": {"p50": statistics.median(p_ms), "p99": percentile(p_ms, 99)},
        "in_process_guard_ms": {"p50": statistics.median(i_ms), "p99": percentile(i_ms, 99)},
        "in_process_overhead_p50_ms": statistics.median(i_ms) - statistics.median(d_ms),
        "overhead_p50_ms": statistics.median(g_ms) - statistics.median(d_ms),
        "sdk_proxy_overhead_p50_ms": statistics.median(p_ms) - statistics.median(d_ms),
        "byte_relay_ms": {"p50": statistics.median(r_ms), "p99": percentile(r_ms, 99)},
        "byte_relay_overhead_p50_ms": statistics.median(r_ms) - statistics.median(d_ms),
        "depth": depth, **depths, "calls_side_by_side": side_by_side,
    }


async def _depth(url: str, direct: ClientSession, guarded: ClientSession,
                 inproc: GuardedSession, store: SagaStore, depth: int) -> dict[str, Any]:
    """Calls depth-99..depth of one session against calls 1..100 of a fresh one,
    interleaved call by call (so the machine's drift hits both alike), for the
    stdio gateway and the in-process guard."""
    for i in range(depth - 100):  # take both sessions deep, untimed
        await guarded.call_tool("put", {"key": f"d{i}", "value": "v" * 100})
        await inproc.call_tool("put", {"key": f"e{i}", "value": "v" * 100})
    async with stdio_client(_params(SERVER, url)) as (r, w), ClientSession(r, w) as fresh:
        await fresh.initialize()
        for i in range(50):  # a warm process, then a new session
            await fresh.call_tool("put", {"key": f"fw{i}", "value": "v"})
        await fresh.call_tool("saga_commit", {})
        fresh_in = GuardedSession(direct, store, policy=Policy.safe(), downstream="fresh")
        await fresh_in.__aenter__()
        times: dict[str, list[float]] = {"first": [], "last": [], "in_first": [],
                                         "in_last": []}
        pairs = [(fresh, "first"), (guarded, "last"), (fresh_in, "in_first"),
                 (inproc, "in_last")]
        for i in range(100):
            for s, name in pairs[i % 4:] + pairs[:i % 4]:
                t0 = time.perf_counter()
                await s.call_tool("put", {"key": f"{name}{i}", "value": "v" * 100})
                times[name].append((time.perf_counter() - t0) * 1000)
        await guarded.call_tool("saga_commit", {})
        await fresh.call_tool("saga_commit", {})
        await fresh_in.__aexit__(None, None, None)
    m = {name: statistics.median(ts) for name, ts in times.items()}
    return {"first_100_ms": m["first"], "last_100_ms": m["last"],
            "depth_ratio": m["last"] / m["first"],
            "in_process_first_100_ms": m["in_first"], "in_process_last_100_ms": m["in_last"]}


async def _no_downstream(url: str, calls: int) -> dict[str, Any]:
    """The gateway's own work: ``Gateway.handle`` with the downstream answering at
    once in-process (no hop, no server), interleaved call by call with the two bare
    appends; what is left of the in-process overhead is around the downstream call."""
    import mcp_types as types

    from saga_store.mcp.gateway import CallOutcome, Gateway
    store = SagaStore(connect(url), Registry())
    block = {"type": "text", "text": '{"ok": true}'}

    async def answer(name: str, args: dict[str, Any], meta: dict[str, Any]) -> CallOutcome:
        return CallOutcome(True, {"ok": True}, block["text"], content=[block],
                           raw={"content": [block], "structuredContent": {"ok": True}})
    gw = Gateway(store, Policy.safe(), {}, answer, "bench-no-downstream")
    undo = {"reversibility": "compensable", "compensation": {
        "toolName": "delete", "parameterMapping": {"key": "$.input.key"}}}
    gw.set_tools([types.Tool(name="put", input_schema={"type": "object"},
                             meta={"dev.chronomcp/compensate": undo}),
                  types.Tool(name="delete", input_schema={"type": "object"})])
    appends = TwoAppends(store)
    g_ms: list[float] = []
    a_ms: list[float] = []
    for i in range(calls):
        args = {"key": f"k{i}", "value": "v" * 100}
        t0 = time.perf_counter()
        await gw.handle("put", args, None)
        t1 = time.perf_counter()
        await appends.call_tool("put", args)
        g_ms.append((t1 - t0) * 1000)
        a_ms.append((time.perf_counter() - t1) * 1000)
    gw.commit()
    g, a = statistics.median(g_ms[100:]), statistics.median(a_ms[100:])
    return {"handle_p50_ms": g, "two_appends_p50_ms": a, "own_work_p50_ms": g - a,
            "ratio_to_two_appends": g / a}


def run(calls: int = 3000, side_by_side: int = 1000) -> dict[str, Any]:
    srv = bench_redis()
    try:
        out: dict[str, Any] = anyio.run(_measure, srv.url, side_by_side, calls)
        out["no_downstream"] = anyio.run(_no_downstream, srv.url, side_by_side)
    finally:
        srv.stop()
    out["machine"] = machine()
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--side-by-side", type=int, default=1000)
    a = p.parse_args()
    print(json.dumps(run(a.calls, a.side_by_side), indent=2))


if __name__ == "__main__":
    main()
