"""Declaring tools: ``@tool`` on a plain function (sync or async).

The decorator builds the tool's argument model from its type hints, checks
what can be checked on its own (mapping syntax, that ``$.input`` fields are
parameters, that a compensation given as a function accepts what the mapping
gives it) and attaches a :class:`ToolSpec` to the function. Nothing is
registered globally: a :class:`~saga_store.registry.Registry` collects the
specs of a module the operator names.

>>> from saga_store import tool, Reversibility
>>> @tool(reversibility=Reversibility.READONLY)
... def get_price(sku: str) -> dict:
...     return {"sku": sku, "cents": 1999}
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, create_model

from saga_store.errors import InvalidInput, InvalidToolCall
from saga_store.log.canonical import MAX_DEPTH, check_json
from saga_store.protocol.vocab import Reversibility

SPEC_ATTR = "__saga_tool__"
CTX_PARAM = "ctx"


@dataclass(frozen=True)
class RetryPolicy:
    """How a step is retried.

    ``max_attempts`` bounds tries after retryable errors (exponential backoff
    from ``backoff_s``, capped at ``max_backoff_s``). ``after_crash`` says what
    a redelivered step whose earlier attempt never finished does: ``"retry"``
    (same idempotency key; right for tools that honour it) or ``"in_doubt"``
    (record the step in doubt and unwind). The default is ``"retry"`` except
    for irreversible tools. After ``max_deliveries`` unfinished attempts the
    step is dead-lettered: recorded in doubt (any attempt may have taken
    effect), and the saga unwinds it with the rest.
    """

    max_attempts: int = 3
    backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    after_crash: str | None = None
    max_deliveries: int = 3

    def __post_init__(self) -> None:
        if self.after_crash not in (None, "retry", "in_doubt"):
            raise InvalidInput("RetryPolicy.after_crash must be 'retry' or 'in_doubt'")
        if self.max_attempts < 1 or self.max_deliveries < 1:
            raise InvalidInput("RetryPolicy max_attempts and max_deliveries must be at least 1")

    def backoff(self, attempt: int) -> float:
        return float(min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)))


@dataclass(frozen=True)
class StepContext:
    """What a tool taking a ``ctx`` parameter receives."""

    idempotency_key: str
    saga_id: str
    step: int
    attempt: int
    tool_call_id: str | None = None
    agent_id: str | None = None


Condition = Callable[..., Any]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    fn: Callable[..., Any]
    is_async: bool
    args_model: type[BaseModel]
    params: tuple[str, ...]
    takes_ctx: bool
    reversibility: Reversibility
    compensation: str | None = None
    mapping: Mapping[str, str] = field(default_factory=dict)
    preconditions: tuple[Condition, ...] = ()
    postconditions: tuple[Condition, ...] = ()
    timeout: float = 30.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    secret: frozenset[str] = frozenset()
    probe: str | None = None
    description: str = ""
    approval: str | None = None  # the tool's own least decision: require_approval, deny

    @property
    def after_crash(self) -> str:
        if self.retry.after_crash is not None:
            return self.retry.after_crash
        return "in_doubt" if self.reversibility is Reversibility.IRREVERSIBLE else "retry"

    def validate(self, args: Any, max_depth: int = MAX_DEPTH) -> dict[str, Any]:
        """Check ``args`` against the argument model; JSON-ready values back.

        Raises :class:`InvalidToolCall` listing every problem, for the agent to repair.
        The arguments are plain JSON both as sent and as validated: pydantic would
        take NaN for an untyped field and write it as null, read "inf" as a float,
        and recurse into any depth, so :func:`check_json` looks first (on what was
        sent) and last (on what pydantic made of it).
        """
        if not isinstance(args, dict):
            raise InvalidToolCall(self.name, [{"loc": [], "msg": "arguments must be an object"}])
        from pydantic import ValidationError
        self._check_json(args, max_depth)
        try:
            model = self.args_model.model_validate(args)
        except ValidationError as exc:
            errors = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]}
                      for e in exc.errors(include_url=False, include_input=False)]
            raise InvalidToolCall(self.name, errors) from None
        validated = model.model_dump(mode="json")
        self._check_json(validated, max_depth)
        return validated

    def _check_json(self, args: dict[str, Any], max_depth: int) -> None:
        try:
            check_json(args, "arguments", max_depth)
        except InvalidInput as exc:
            where = exc.field or "arguments"
            raise InvalidToolCall(self.name, [{
                "loc": [where], "msg": str(exc).removeprefix(f"{where}: "),
                "type": "not_plain_json"}]) from None

    def kwargs(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """Python values for calling the function (validated again, so types are rich)."""
        model = self.args_model.model_validate(args)
        return {name: getattr(model, name) for name in self.params}


ToolFn = TypeVar("ToolFn", bound=Callable[..., Any])


@overload
def tool(fn: ToolFn, /) -> ToolFn: ...


@overload
def tool(*, name: str | None = None, reversibility: Reversibility | str | None = None,
         compensation: str | Callable[..., Any] | None = None,
         mapping: Mapping[str, str] | None = None,
         preconditions: Sequence[Condition] = (), postconditions: Sequence[Condition] = (),
         timeout: float = 30.0, retry: RetryPolicy | None = None,
         secret: Sequence[str] = (), probe: str | Callable[..., Any] | None = None,
         description: str | None = None, approval: str | None = None,
         ) -> Callable[[ToolFn], ToolFn]: ...


# overloaded so a decorated function keeps its own type (mypy --strict takes an
# Any-returning decorator for an untyped one)
def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None,
         reversibility: Reversibility | str | None = None,
         compensation: str | Callable[..., Any] | None = None,
         mapping: Mapping[str, str] | None = None,
         preconditions: Sequence[Condition] = (), postconditions: Sequence[Condition] = (),
         timeout: float = 30.0, retry: RetryPolicy | None = None,
         secret: Sequence[str] = (), probe: str | Callable[..., Any] | None = None,
         description: str | None = None, approval: str | None = None) -> Any:
    """Declare a tool. Usable bare (``@tool``) or with options (``@tool(...)``)."""

    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        spec = build_spec(f, name=name, reversibility=reversibility, compensation=compensation,
                          mapping=mapping, preconditions=preconditions,
                          postconditions=postconditions, timeout=timeout, retry=retry,
                          secret=secret, probe=probe, description=description,
                          approval=approval)
        setattr(f, SPEC_ATTR, spec)
        return f

    return wrap(fn) if fn is not None else wrap


def spec_of(fn: Any) -> ToolSpec | None:
    spec = getattr(fn, SPEC_ATTR, None)
    return spec if isinstance(spec, ToolSpec) else None


def build_spec(f: Callable[..., Any], *, name: str | None,
               reversibility: Reversibility | str | None,
               compensation: str | Callable[..., Any] | None,
               mapping: Mapping[str, str] | None, preconditions: Sequence[Condition],
               postconditions: Sequence[Condition], timeout: float,
               retry: RetryPolicy | None, secret: Sequence[str],
               probe: str | Callable[..., Any] | None, description: str | None,
               approval: str | None = None) -> ToolSpec:
    tool_name = name or f.__name__
    model, params, takes_ctx = _args_model(f, tool_name)
    comp_name = compensation if isinstance(compensation, str) or compensation is None \
        else (getattr(spec_of(compensation), "name", None) or compensation.__name__)
    if reversibility is None:
        rev = Reversibility.COMPENSABLE if comp_name else Reversibility.IRREVERSIBLE
    else:
        try:
            rev = Reversibility(reversibility)
        except ValueError:
            raise InvalidInput(f"tool {tool_name}: reversibility must be one of "
                               f"{[r.value for r in Reversibility]}") from None
    if rev is Reversibility.COMPENSABLE and not comp_name:
        raise InvalidInput(f"tool {tool_name} is compensable but names no compensation")
    if comp_name and rev is not Reversibility.COMPENSABLE:
        raise InvalidInput(f"tool {tool_name} names a compensation but is {rev}")
    if timeout <= 0:
        raise InvalidInput(f"tool {tool_name}: timeout must be positive seconds")
    unknown_secret = set(secret) - set(params)
    if unknown_secret:
        raise InvalidInput(f"tool {tool_name}: secret fields {sorted(unknown_secret)} "
                           "are not parameters")
    maps = dict(mapping or {})
    check_mapping(tool_name, maps, params, set(secret))
    comp_spec = spec_of(compensation) if callable(compensation) else None
    if comp_spec is not None:
        check_mapping_targets(tool_name, maps, comp_spec)
    if approval not in (None, "allow", "require_approval", "deny"):
        raise InvalidInput(f"tool {tool_name}: approval must be 'allow', 'require_approval' "
                           "or 'deny'")
    probe_name = probe if isinstance(probe, str) or probe is None else \
        (getattr(spec_of(probe), "name", None) or probe.__name__)
    return ToolSpec(
        name=tool_name, fn=f, is_async=inspect.iscoroutinefunction(f), args_model=model,
        params=params, takes_ctx=takes_ctx, reversibility=rev, compensation=comp_name,
        mapping=maps, preconditions=tuple(preconditions), postconditions=tuple(postconditions),
        timeout=float(timeout), retry=retry or RetryPolicy(), secret=frozenset(secret),
        probe=probe_name, description=description or inspect.getdoc(f) or "",
        approval=approval)


def check_mapping(tool_name: str, mapping: Mapping[str, str], params: Sequence[str],
                  secret: set[str]) -> None:
    for target, source in mapping.items():
        if not isinstance(source, str) or not source.startswith(("$.input.", "$.output.")):
            raise InvalidInput(f"tool {tool_name}: mapping for {target!r} must be "
                               f"'$.input.<field>' or '$.output.<field>', got {source!r}")
        path = source.split(".")[2:]
        if not all(path):
            raise InvalidInput(f"tool {tool_name}: mapping {source!r} has an empty field name")
        if source.startswith("$.input.") and path[0] not in params:
            raise InvalidInput(f"tool {tool_name}: mapping {source!r} names no parameter "
                               f"of {tool_name} (parameters: {', '.join(params)})")
        if source.startswith("$.input.") and path[0] in secret:
            raise InvalidInput(f"tool {tool_name}: mapping {source!r} would copy a secret "
                               "into the compensation; map an id from the output instead")


def check_mapping_targets(tool_name: str, mapping: Mapping[str, str], comp: ToolSpec) -> None:
    """The compensation must accept every mapped name and get every required one."""
    extra = set(mapping) - set(comp.params)
    if extra:
        raise InvalidInput(f"tool {tool_name}: mapping names {sorted(extra)}, which compensation "
                           f"{comp.name} does not take (it takes: {', '.join(comp.params)})")
    required = {n for n, f in comp.args_model.model_fields.items() if f.is_required()}
    missing = required - set(mapping)
    if missing:
        raise InvalidInput(f"tool {tool_name}: compensation {comp.name} needs {sorted(missing)}, "
                           "which the mapping does not provide")


def _args_model(f: Callable[..., Any], tool_name: str,
                ) -> tuple[type[BaseModel], tuple[str, ...], bool]:
    sig = inspect.signature(f)
    try:
        hints = get_type_hints(f)
    except (NameError, TypeError) as exc:
        raise InvalidInput(f"tool {tool_name}: cannot resolve type hints ({exc})") from exc
    fields: dict[str, Any] = {}
    takes_ctx = False
    for pname, p in sig.parameters.items():
        if pname == CTX_PARAM:
            takes_ctx = True
            continue
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise InvalidInput(f"tool {tool_name}: parameter {pname} must be a plain "
                               "keyword parameter (no *args, **kwargs or positional-only)")
        default = ... if p.default is p.empty else p.default
        fields[pname] = (hints.get(pname, Any), default)
    model = create_model(f"{tool_name}_args", __config__=ConfigDict(extra="forbid"),
                         **fields)
    return model, tuple(fields), takes_ctx
