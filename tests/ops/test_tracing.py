"""OpenTelemetry spans (the ``otel`` extra), recorded by the SDK's in-memory
exporter: a tool call is an ``execute_tool`` span after the GenAI semantic
conventions, a client-driven saga a span of its own, and the caller's context
crosses the hop to whoever runs the step through the log alone."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import redis

pytest.importorskip("opentelemetry.sdk", reason="the otel extra's SDK (pip install "
                    "opentelemetry-sdk) records the spans this test checks")
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

from saga_store import Registry, SagaStore, Settings
from saga_store.errors import StepError

pytestmark = pytest.mark.real_redis
TOOLS = "tests.ledger_tools"
EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Any:
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
        trace.set_tracer_provider(provider)
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


def _store(client: redis.Redis) -> SagaStore:
    return SagaStore(client, Registry.from_modules(TOOLS), Settings(lease_ms=1000))


def test_a_saga_and_its_tool_calls_are_spans(spans: Any, client: redis.Redis,
                                             ledger: Path) -> None:
    """An agent turn opens a saga: the saga's span is the turn's child, each call and
    each compensation an execute_tool span under it, the failed call in error."""
    store = _store(client)
    tracer = trace.get_tracer("test")
    opened: list[str] = []

    def turn_that_fails() -> None:
        with store.saga(agent_id="agent-t", executor="inline") as saga:
            opened.append(saga.saga_id)
            saga.call("reserve_inventory", {"sku": "T", "qty": 1}, tool_call_id="call_a")
            saga.call("fail_always", {}, tool_call_id="call_b")

    with tracer.start_as_current_span("agent turn") as turn, pytest.raises(StepError):
        turn_that_fails()
    got = {s.name: s for s in spans.get_finished_spans()}
    saga_span = got["saga agent-t"]
    assert saga_span.parent.span_id == turn.get_span_context().span_id
    assert saga_span.attributes["saga_store.saga.id"] == opened[0]
    reserve = got["execute_tool reserve_inventory"]
    assert reserve.parent.span_id == saga_span.context.span_id
    assert reserve.attributes["gen_ai.operation.name"] == "execute_tool"
    assert reserve.attributes["gen_ai.tool.name"] == "reserve_inventory"
    assert reserve.attributes["gen_ai.tool.call.id"] == "call_a"
    failed = got["execute_tool fail_always"]
    assert failed.status.status_code is trace.StatusCode.ERROR
    undo = got["execute_tool release_inventory"]
    assert undo.attributes["saga_store.compensation"] is True
    assert undo.attributes["gen_ai.tool.call.id"] == "call_a"  # the call it undoes
    assert undo.parent.span_id == saga_span.context.span_id
    assert {s.context.trace_id for s in got.values()} == {turn.get_span_context().trace_id}


def test_the_callers_context_crosses_the_hop_in_the_log(spans: Any, client: redis.Redis,
                                                       ledger: Path) -> None:
    """A plan submitted under a span is run by a runner with no context of its own
    (another thread, as another process would be): every step's span is still the
    submitter's child, the plan's later steps included, read from the log."""
    from saga_store.workers.inline import InlineRunner
    store = _store(client)
    with trace.get_tracer("test").start_as_current_span("submit") as submit:
        sid = store.submit([{"tool": "reserve_inventory", "args": {"sku": "H", "qty": 1}},
                            {"tool": "noop", "args": {"n": 1}}], agent_id="agent-t")
    runner = threading.Thread(target=InlineRunner(store, "elsewhere").drain)
    runner.start()
    runner.join(30)
    assert store.state(sid).status.value == "committed"
    steps = [s for s in spans.get_finished_spans() if s.name.startswith("execute_tool")]
    assert [s.name for s in steps] == ["execute_tool reserve_inventory", "execute_tool noop"]
    for s in steps:
        assert s.context.trace_id == submit.get_span_context().trace_id
        assert s.parent.span_id == submit.get_span_context().span_id


def test_without_a_tracer_provider_no_span_is_made_but_the_callers_context_passes() -> None:
    """With the API's own default provider (nothing records), a tool call makes no
    span at all; a caller's context logged with the intent is still current in the
    tool, so an instrumented client there passes it on. (In a process of its own:
    a provider, once set, stays.)"""
    import subprocess
    import sys
    code = """
from opentelemetry import trace
from saga_store.ops import tracing
with tracing.tool_span("t", None, "s-1", 0, parent=None) as span:
    assert span is None, span
parent = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
with tracing.tool_span("t", None, "s-1", 0, parent=parent) as span:
    got = trace.get_current_span().get_span_context()
    assert format(got.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c", got
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


def test_a_sync_tool_on_the_asyncio_worker_runs_in_its_calls_span(spans: Any) -> None:
    """The asyncio worker runs a sync tool on a pool thread: the tool call's span is
    still the current one there (an instrumented client in the tool is its child)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from saga_store.workers.invoke import Call, Invoker

    from saga_store.ops import tracing
    from saga_store.tools.spec import StepContext

    spec = Registry.from_modules("tests.timing_tools").get("current_trace")
    ctx = StepContext("k" * 16, "s-1", 0, 1, None, None)

    async def main() -> tuple[str, dict[str, Any]]:
        with tracing.tool_span("current_trace", None, "s-1", 0, parent=None) as span, \
                ThreadPoolExecutor(1) as pool:
            want = format(span.get_span_context().trace_id, "032x")
            return want, (await Invoker().ainvoke(Call(spec, {}, ctx), pool)).result
    want, got = asyncio.run(main())
    assert got == {"trace_id": want}
    assert want != "0" * 32
