"""A framework's own tools as saga tools, without declaring them again.

:func:`saga_registry` takes the tools an agent already has (plain functions, a
LangChain ``@tool`` or ``StructuredTool``, a Pydantic AI ``Tool`` or tool
function; for OpenAI Agents, the function behind ``@function_tool``, since a
``FunctionTool`` keeps it out of reach) and the
compensations declared beside them, and builds each one's spec as ``@tool``
would (argument types from the function's hints, the same mapping checks)
into a :class:`~saga_store.Registry`. A store built on it runs them with
``executor="inline"`` like any declared tool: validated, deduplicated,
logged, compensated last first.

Workers import their tools by module name (``saga worker --tools``), and a
registry built here lives in this process only: to run these tools on
workers, declare them with ``@tool`` in a module the workers import.

>>> from saga_store import SagaStore
>>> from saga_store.integrations import saga_registry
>>> def reserve(sku: str) -> dict: ...
>>> def release(reservation_id: str) -> dict: ...
>>> registry = saga_registry([reserve], compensations={
...     "reserve": (release, {"reservation_id": "$.output.reservation_id"})})
>>> # SagaStore(client, registry).saga("shop", executor="inline")

Imports no framework: the tool objects are read by their attributes. (Not
:func:`saga_store.integrations.openai_agents.saga_tools`, which goes the other
way: a saga's tools as FunctionTools for an Agent.)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from saga_store.errors import InvalidInput
from saga_store.protocol.vocab import Reversibility
from saga_store.tools.registry import Registry
from saga_store.tools.spec import RetryPolicy, ToolSpec, build_spec, spec_of

Compensation = tuple[Any, Mapping[str, str]]

TAKES = ("a plain function, a LangChain @tool or StructuredTool, a Pydantic AI Tool or "
         "tool function, or the function an OpenAI Agents @function_tool decorates")


@dataclass(frozen=True)
class Native:
    """One tool as found: the name the model calls it by, its function, its text."""

    name: str
    fn: Callable[..., Any]
    description: str | None
    spec: ToolSpec | None = None  # already declared with @tool: kept as declared


def saga_registry(tools: Iterable[Any], *,
                  compensations: Mapping[str, Compensation] | None = None,
                  reversibility: Mapping[str, Reversibility | str] | None = None,
                  timeout: float = 30.0, retry: RetryPolicy | None = None,
                  declared: Registry | None = None) -> InlineRegistry:
    """A registry of ``tools`` for a store that runs its sagas inline.

    ``compensations`` maps a tool's name (the framework's name for it, else the
    function's) to ``(compensation, mapping)``: the compensation is a function
    or framework tool (registered with the rest if not among ``tools``), the
    mapping its arguments as ``@tool`` takes them (``"$.output.<field>"``,
    ``"$.input.<field>"``). A tool with a compensation is compensable; one
    without is irreversible unless ``reversibility`` says otherwise (e.g.
    ``{"get_price": "readonly"}``). ``declared``: a registry of ``@tool``
    tools to hold beside these (it is not changed).

    Raises :class:`~saga_store.InvalidInput` for a compensation of a tool not
    given, a mapping the compensation cannot take, or an object with no
    function to run.
    """
    found = [native(t) for t in tools]
    names = [n.name for n in found]
    comps = dict(compensations or {})
    unknown = sorted(set(comps) - set(names))
    if unknown:
        raise InvalidInput(f"compensations name {unknown}, which are not among the tools "
                           f"given ({', '.join(names) or 'none'}); pass those tools too, or "
                           "key each compensation by its tool's name")
    unknown_rev = sorted(set(reversibility or {}) - set(names))
    if unknown_rev:
        raise InvalidInput(f"reversibility names {unknown_rev}, which are not among the "
                           f"tools given ({', '.join(names) or 'none'})")
    revs = dict(reversibility or {})
    reg = InlineRegistry(declared or ())
    specs: dict[str, ToolSpec] = {}
    for tool_name, comp in comps.items():
        comp_tool, mapping = _pair(tool_name, comp)
        if comp_tool.name not in specs:
            specs[comp_tool.name] = comp_tool.spec or _spec(
                comp_tool, None, {}, revs.get(comp_tool.name), timeout, retry)
        own = next(n for n in found if n.name == tool_name)
        specs[tool_name] = _spec(own, comp_tool.name, mapping, revs.get(tool_name),
                                 timeout, retry)
    for n in found:
        if n.name not in specs:
            specs[n.name] = n.spec or _spec(n, None, {}, revs.get(n.name), timeout, retry)
    for spec in specs.values():
        reg.add(spec)
    reg.check()
    return reg


class InlineRegistry(Registry):
    """The registry :func:`saga_registry` builds. Its tools live in this process
    only, so a saga on workers is refused (:func:`refuse_on_workers`)."""

    inline_only = True


def refuse_on_workers(registry: Registry, inline: bool) -> None:
    """Refuse a saga run by workers on tools no worker can import."""
    if registry.inline_only and not inline:
        raise InvalidInput("this store's tools come from saga_registry and live in this "
                           "process only: open the saga with executor='inline', or, to run "
                           "them on workers, declare them with @tool in a module the "
                           "workers import (saga worker --tools) and build the store on "
                           "Registry.from_modules", field="executor")


def native(obj: Any) -> Native:
    """The function behind ``obj``, and the name the framework gives it."""
    spec = spec_of(obj)
    if spec is not None:
        return Native(spec.name, spec.fn, spec.description, spec)
    if inspect.isfunction(obj) or inspect.ismethod(obj):
        _refuse_run_context(obj, obj.__name__)
        return Native(obj.__name__, obj, None)
    name = getattr(obj, "name", None)
    if not isinstance(name, str):
        raise InvalidInput(f"{obj!r} is not a tool saga_registry can take: pass {TAKES}")
    description = getattr(obj, "description", None)
    for attr in ("func", "coroutine", "function"):  # LangChain's, then Pydantic AI's
        fn = getattr(obj, attr, None)
        if inspect.isfunction(fn) or inspect.ismethod(fn):
            _refuse_run_context(fn, name)
            return Native(name, fn, description if isinstance(description, str) else None)
    if type(obj).__name__ == "FunctionTool":
        raise InvalidInput(f"tool {name}: an OpenAI Agents FunctionTool keeps its function "
                           "in a closure saga_registry cannot reach; pass the function you "
                           "decorated with @function_tool instead, and give the Agent the "
                           "saga's tools with openai_agents.saga_tools(saga)")
    raise InvalidInput(f"tool {name}: saga_registry finds no function on this "
                       f"{type(obj).__name__} (no func, coroutine or function attribute); "
                       f"pass {TAKES}")


def _refuse_run_context(fn: Callable[..., Any], name: str) -> None:
    """A Pydantic AI tool taking ``RunContext`` needs the agent's run, which a
    saga step does not have (and a parameter named ``ctx`` would get a
    StepContext). Read from the annotations as written: strings under
    ``from __future__ import annotations``, which need not resolve here."""
    for pname, p in inspect.signature(fn).parameters.items():
        if "RunContext" in str(p.annotation):
            raise InvalidInput(f"tool {name}: parameter {pname} is a Pydantic AI RunContext, "
                               "which a saga step does not have; pass a function of its "
                               "arguments alone (a tool_plain function), taking "
                               "ctx: StepContext if it needs the step's idempotency key")


def _pair(tool_name: str, comp: Any) -> tuple[Native, dict[str, str]]:
    if not (isinstance(comp, tuple) and len(comp) == 2 and isinstance(comp[1], Mapping)):
        raise InvalidInput(f"compensations[{tool_name!r}] must be (compensation, mapping), "
                           "e.g. (release, {'reservation_id': '$.output.reservation_id'})")
    return native(comp[0]), dict(comp[1])


def _spec(n: Native, compensation: str | None, mapping: Mapping[str, str],
          reversibility: Reversibility | str | None, timeout: float,
          retry: RetryPolicy | None) -> ToolSpec:
    return build_spec(n.fn, name=n.name, reversibility=reversibility,
                      compensation=compensation, mapping=mapping, preconditions=(),
                      postconditions=(), timeout=timeout, retry=retry, secret=(),
                      probe=None, description=n.description)
