"""A fast first look at a tool call's arguments against the tool's input schema.

The gateway checks every call's arguments before it logs or runs anything (an
argument error rolls nothing back). jsonschema does that right but slowly: it
builds a validator per subschema it descends into, about 60 us a call in the
gateway's measurements, most of a call's decision time. Most tools' schemas
use a small subset of JSON Schema (object, properties, required, scalar and
array types, additionalProperties true/false), so :func:`compile_check` turns
such a schema into a plain Python predicate. It only ever says "valid" when
jsonschema would; when it says no, or the schema uses anything more, the
caller asks jsonschema, which has the last word and the error message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Check = Callable[[Any], bool]

# keywords that never change whether an instance is valid (jsonschema checks
# "format" only when given a format checker; the gateway gives none)
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$schema", "$id",
                          "$comment", "format", "deprecated", "readOnly", "writeOnly"})
_KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties", "items"})


_TYPES: dict[str, Check] = {
    "string": lambda x: isinstance(x, str),
    # 1.0 is an integer from draft 6 on, not in draft 4: left to jsonschema
    "integer": lambda x: isinstance(x, int) and not isinstance(x, bool),
    "number": lambda x: isinstance(x, int | float) and not isinstance(x, bool),
    "boolean": lambda x: isinstance(x, bool),
    "object": lambda x: isinstance(x, dict),
    "array": lambda x: isinstance(x, list),
    "null": lambda x: x is None,
}


def compile_check(schema: Any) -> Check | None:
    """A predicate that is True only for instances ``schema`` accepts, or None when
    the schema uses more than the subset this module understands."""
    if schema is True or schema == {}:
        return lambda _: True
    if not isinstance(schema, Mapping):
        return None
    if any(k not in _KEYWORDS and k not in _ANNOTATIONS for k in schema):
        return None
    checks: list[Check] = []
    kind = schema.get("type")
    if kind is not None:
        kinds = [kind] if isinstance(kind, str) else kind
        if not isinstance(kinds, list) or not kinds or any(k not in _TYPES for k in kinds):
            return None
        tests = [_TYPES[k] for k in kinds]
        checks.append(tests[0] if len(tests) == 1 else lambda x: any(t(x) for t in tests))
    obj = _object_check(schema)
    if obj is None:
        return None
    if obj is not _NOTHING:
        checks.append(obj)
    if "items" in schema:
        item = compile_check(schema["items"])
        if item is None:
            return None
        checks.append(lambda x: not isinstance(x, list) or all(item(v) for v in x))
    if len(checks) == 1:
        return checks[0]
    return lambda x: all(c(x) for c in checks)


def _nothing(_: Any) -> bool:
    return True


_NOTHING: Check = _nothing


def _object_check(schema: Mapping[str, Any]) -> Check | None:
    """The check of properties / required / additionalProperties (applied to objects
    only, as JSON Schema does); ``_NOTHING`` when the schema has none of them."""
    props = schema.get("properties", {})
    required = schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if not isinstance(props, Mapping) or not isinstance(required, list) \
            or not all(isinstance(r, str) for r in required) or not isinstance(extra, bool):
        return None
    if not props and not required and extra:
        return _NOTHING
    compiled: dict[str, Check] = {}
    for name, sub in props.items():
        prop = compile_check(sub)
        if prop is None:
            return None
        compiled[name] = prop
    need = tuple(required)

    def check(x: Any) -> bool:
        if not isinstance(x, dict):
            return True
        for name in need:
            if name not in x:
                return False
        for name, value in x.items():
            sub = compiled.get(name)
            if sub is None:
                if not extra:
                    return False
            elif not sub(value):
                return False
        return True
    return check
