"""OpenTelemetry spans for sagas and tool calls (the ``otel`` extra).

Spans follow the GenAI semantic conventions for tool execution: a tool call is
an ``execute_tool {tool}`` span with ``gen_ai.operation.name``,
``gen_ai.tool.name`` and ``gen_ai.tool.call.id``; a compensation is one too,
marked ``saga_store.compensation``. A caller's span context rides in each step
intent (``data.trace``, a W3C ``traceparent``), so the worker's span is the
caller's child across the process hop, and so are a plan's later steps and the
unwind. A client-driven saga (``with store.saga(...)``) is a ``saga {agent}``
span of its own.

Without the ``opentelemetry`` API installed, or with no tracer provider set,
every function here costs next to nothing and records nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

try:
    from opentelemetry import propagate, trace
except ImportError:  # the extra is not installed
    propagate = trace = None  # type: ignore[assignment]

TRACER = "saga_store"


def carrier() -> dict[str, str] | None:
    """The current span context as a W3C carrier, to log with a step's intent;
    None when there is no span to carry."""
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    out: dict[str, str] = {}
    propagate.inject(out)
    return out or None


@contextlib.contextmanager
def tool_span(tool: str, tool_call_id: str | None, saga_id: str, step: int, *,
              parent: Mapping[str, str] | None, compensation: bool = False,
              ) -> Iterator[Any]:
    """A span around one tool call, the child of ``parent`` (the carrier logged
    with the step's intent) when there is one. Yields the span, or None."""
    if trace is None or (not parent and not _recording()):
        yield None  # nothing to record, no caller's context to pass on to the tool
        return
    ctx = propagate.extract(dict(parent)) if parent else None
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
        "saga_store.saga.id": saga_id, "saga_store.step": step,
    }
    if tool_call_id:
        attributes["gen_ai.tool.call.id"] = tool_call_id
    if compensation:
        attributes["saga_store.compensation"] = True
    tracer = trace.get_tracer(TRACER)
    with tracer.start_as_current_span(f"execute_tool {tool}", context=ctx,
                                      kind=trace.SpanKind.INTERNAL,
                                      attributes=attributes) as span:
        yield span


def _recording() -> bool:
    """Whether a tracer provider that records is set (the API's own default only
    hands out spans that record nothing: about 7 us a tool call for nothing)."""
    return not isinstance(trace.get_tracer_provider(),
                          trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def outcome(span: Any, kind: str, error: str | None) -> None:
    """Record a tool call's outcome on its span (an error status unless it succeeded)."""
    if span is None or trace is None:
        return
    span.set_attribute("saga_store.outcome", kind)
    if kind != "succeeded":
        span.set_attribute("error.type", kind)
        span.set_status(trace.Status(trace.StatusCode.ERROR, (error or kind)[:200]))


class SagaSpan:
    """The span of a client-driven saga, current while its block runs."""

    def __init__(self, agent_id: str, saga_id: str) -> None:
        self._span: Any = None
        self._token: Any = None
        if trace is None:
            return
        from opentelemetry import context
        self._span = trace.get_tracer(TRACER).start_span(
            f"saga {agent_id}", attributes={"saga_store.saga.id": saga_id,
                                            "gen_ai.agent.id": agent_id})
        self._token = context.attach(trace.set_span_in_context(self._span))

    def end(self, status: str) -> None:
        if self._span is None or trace is None:
            return
        from opentelemetry import context
        self._span.set_attribute("saga_store.saga.status", status)
        if status != "committed":
            self._span.set_status(trace.Status(trace.StatusCode.ERROR, status))
        with contextlib.suppress(ValueError):  # ended from another context
            context.detach(self._token)
        self._span.end()
        self._span = None
