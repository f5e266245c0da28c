"""What a framework adapter adds to each tool call, over a bare ``saga.call``.

One process, one private Redis, one worker process running a no-op tool. Each
round runs a block of calls through every variant, in an order that rotates
from round to round, so the machine's drifting speed hits every variant alike:

* ``bare``: ``saga.call("noop", ...)``, the baseline;
* ``core``: ``SagaCalls.run``, the shared path every adapter takes;
* ``openai_agents``: what the SDK calls per tool call of ``saga_tools``
  (``needs_approval``, then ``on_invoke_tool``), on an event loop;
* ``pydantic_ai``: ``SagaToolset.call_tool``, on an event loop;
* ``langgraph``: a graph of just ``saga_tool_node(...)`` invoked with one tool
  call, against the same graph around a ``ToolNode`` whose plain tool calls
  ``saga.call`` itself (``langgraph_plain``), so the framework's own cost
  cancels out;
* ``anthropic``: ``run_tool_uses`` on a reply with one ``tool_use``.

Per variant: the median over rounds of the per-call time of its block, the
ratio to ``bare`` and the difference (the adapter's cost per call).

    python -m benchmarks.bench_integrations [--rounds 15] [--calls 40]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from saga_store import Registry, SagaStore
from saga_store.integrations._common import calls_for

from .bench_steps import start_saga_workers, stop
from .common import bench_redis, machine

TOOLS = "benchmarks.bench_tools"


def _variants(store: SagaStore, loop: asyncio.AbstractEventLoop,
              ) -> dict[str, Callable[[int], float]]:
    """Each variant: a function that runs ``n`` calls in a fresh saga and returns
    the seconds they took (the saga's opening and commit are left out)."""
    from agents.tool_context import ToolContext
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool as lc_tool
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode
    from pydantic_ai import RunContext
    from pydantic_ai.models.test import TestModel
    from pydantic_ai.usage import RunUsage

    from saga_store.integrations.anthropic import run_tool_uses
    from saga_store.integrations.langgraph import saga_tool_node
    from saga_store.integrations.openai_agents import saga_tools
    from saga_store.integrations.pydantic_ai import SagaToolset

    counter = itertools.count()

    def timed(setup: Callable[[Any], Any], body: Callable[[Any, int], None],
              ) -> Callable[[int], float]:
        def run(n: int) -> float:
            with store.saga(agent_id="bench") as saga:
                glue = setup(saga)  # what a framework builds once per saga
                begin = time.perf_counter()
                for _ in range(n):
                    body(glue, next(counter))
                return time.perf_counter() - begin
        return run

    def timed_async(setup: Callable[[Any], Any], body: Callable[[Any, int], Any],
                    ) -> Callable[[int], float]:
        def run(n: int) -> float:
            with store.saga(agent_id="bench") as saga:
                glue = setup(saga)

                async def block() -> float:
                    begin = time.perf_counter()
                    for _ in range(n):
                        await body(glue, next(counter))
                    return time.perf_counter() - begin
                return loop.run_until_complete(block())
        return run

    def same(saga: Any) -> Any:
        return saga

    def bare(saga: Any, i: int) -> None:
        saga.call("noop", {"n": i}, tool_call_id=f"call_{i}")

    def core(saga: Any, i: int) -> None:
        assert calls_for(saga).run("noop", {"n": i}, f"call_{i}").ok

    async def openai_agents(fn: Any, i: int) -> None:
        ctx = ToolContext(context=None, tool_name="noop", tool_call_id=f"call_{i}",
                          tool_arguments=json.dumps({"n": i}))
        assert not await fn.needs_approval(ctx, {"n": i}, f"call_{i}")
        await fn.on_invoke_tool(ctx, json.dumps({"n": i}))

    model = TestModel()

    def toolset(saga: Any) -> tuple[SagaToolset, Any]:
        ts = SagaToolset(saga, ["noop"])
        ctx: RunContext[None] = RunContext(deps=None, model=model, usage=RunUsage())
        return ts, loop.run_until_complete(ts.get_tools(ctx))["noop"]

    async def pydantic_ai(glue: Any, i: int) -> None:
        ts, tool = glue
        ctx: RunContext[None] = RunContext(deps=None, model=model, usage=RunUsage(),
                                           tool_call_id=f"call_{i}")
        await ts.call_tool("noop", {"n": i}, ctx, tool)

    def one_call(i: int) -> dict[str, Any]:
        return {"messages": [AIMessage(content="", tool_calls=[
            {"name": "noop", "args": {"n": i}, "id": f"call_{i}", "type": "tool_call"}])]}

    def in_graph(tool_node: ToolNode) -> Any:
        """A ToolNode runs inside a graph (it needs the graph's runtime)."""
        g = StateGraph(MessagesState)
        g.add_node("tools", tool_node)
        g.add_edge(START, "tools")
        g.add_edge("tools", END)
        return g.compile()

    def plain_node(saga: Any) -> Any:
        @lc_tool
        def noop(n: int) -> str:
            """No-op."""
            return json.dumps(saga.call("noop", {"n": n}, tool_call_id=f"call_{n}"))
        return in_graph(ToolNode([noop]))

    def node(graph: Any, i: int) -> None:
        graph.invoke(one_call(i))

    def anthropic(saga: Any, i: int) -> None:
        run_tool_uses(saga, {"role": "assistant", "content": [
            {"type": "tool_use", "id": f"toolu_{i}", "name": "noop", "input": {"n": i}}]})

    return {"bare": timed(same, bare), "core": timed(same, core),
            "openai_agents": timed_async(lambda s: saga_tools(s, ["noop"])[0], openai_agents),
            "pydantic_ai": timed_async(toolset, pydantic_ai),
            "langgraph": timed(lambda s: in_graph(saga_tool_node(s, ["noop"])), node),
            "langgraph_plain": timed(plain_node, node),
            "anthropic": timed(same, anthropic)}


def run(rounds: int = 15, calls: int = 40) -> dict[str, Any]:
    srv = bench_redis()
    workers = start_saga_workers(srv.url, 1)
    loop = asyncio.new_event_loop()
    try:
        store = SagaStore.from_url(srv.url, Registry.from_modules(TOOLS))
        variants = _variants(store, loop)
        names = list(variants)
        for name in names:  # warm up: imports, connections, the worker's first jobs
            variants[name](5)
        per_call: dict[str, list[float]] = {n: [] for n in names}
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                per_call[name].append(variants[name](calls) / calls)
    finally:
        loop.close()
        stop(workers)
        srv.stop()
    med = {n: statistics.median(v) for n, v in per_call.items()}
    base = med["bare"]
    out: dict[str, Any] = {"machine": machine(), "rounds": rounds, "calls_per_block": calls,
                           "per_call_us": {n: round(v * 1e6, 1) for n, v in med.items()}}
    out["ratio_to_bare"] = {n: round(v / base, 3) for n, v in med.items()}
    out["overhead_us"] = {n: round((v - base) * 1e6, 1) for n, v in med.items()}
    out["overhead_us"]["langgraph_vs_plain_toolnode"] = round(
        (med["langgraph"] - med["langgraph_plain"]) * 1e6, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=40)
    args = parser.parse_args()
    print(json.dumps(run(args.rounds, args.calls), indent=2))


if __name__ == "__main__":
    main()
