"""A compensation's mapping, checked against the listed tools' schemas when the
tools are listed, so a mapping that can never make a valid call is found at
start-up, not in the middle of an unwind.

What is checked (only where the schemas say enough to be sure):

- the compensation tool is among the server's tools;
- every argument it requires is mapped, and, when it takes no others
  (``additionalProperties: false``), nothing else is;
- a ``$.input.<field>`` path names an argument of the forward tool, and a
  ``$.output.structuredContent.<field>`` path a field of its output schema;
- a value's type, where both ends declare one: a list (``[*]``) into a list,
  a string argument into a string parameter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from saga_store.mcp.declared import Compensation
from saga_store.protocol.mapping import parts_of


def mapping_problem(tool: Any, comp: Compensation, tools: Mapping[str, Any]) -> str | None:
    """Why ``comp`` (the undo of ``tool``) can never make a valid call, or None."""
    target = tools.get(comp.tool)
    if target is None:
        return f"its compensation tool {comp.tool!r} is not among the server's tools"
    schema = _schema(getattr(target, "input_schema", None))
    props = _schema(schema.get("properties"))
    required = schema.get("required") or []
    missing = [r for r in required if isinstance(r, str) and r not in comp.args]
    if missing:
        return f"{comp.tool} requires {missing}, which the mapping does not give"
    if props and schema.get("additionalProperties") is False:
        extra = [p for p in comp.args if p not in props]
        if extra:
            return f"{comp.tool} takes no argument {extra}"
    for param, path in comp.args.items():
        made, problem = _source(tool, path)
        if problem:
            return problem
        wanted = _types(_schema(props.get(param)))
        if made and wanted and not (made & wanted or (made == {"integer"} and "number" in wanted)):
            return (f"{path} gives {'/'.join(sorted(made))} but {comp.tool}'s {param} takes "
                    f"{'/'.join(sorted(wanted))}")
    return None


def _source(tool: Any, path: str) -> tuple[set[str], str | None]:
    """The JSON types ``path`` can give (empty: unknown), or why it names nothing."""
    parts = parts_of(path)
    if parts[0] == "input":
        schema, rest = _schema(getattr(tool, "input_schema", None)), parts[1:]
        where = f"an argument of {tool.name}"
    elif len(parts) > 2 and parts[1] == "structuredContent":
        schema, rest = _schema(getattr(tool, "output_schema", None)), parts[2:]
        where = f"a field of {tool.name}'s output schema"
    else:
        return set(), None
    props = _schema(schema.get("properties"))
    if not props:
        return set(), None
    if rest[0] not in props:
        return set(), f"{path}: {rest[0]!r} is not {where}"
    if "*" in rest:
        return {"array"}, None
    return (_types(_schema(props[rest[0]])) if len(rest) == 1 else set()), None


def _schema(x: Any) -> dict[str, Any]:
    return x if isinstance(x, dict) else {}


def _types(schema: Mapping[str, Any]) -> set[str]:
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list) and all(isinstance(k, str) for k in kind):
        return set(kind)
    return set()
