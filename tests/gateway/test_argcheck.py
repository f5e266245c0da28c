"""The gateway's fast argument check never accepts what jsonschema rejects, and for
the subset it knows it agrees with jsonschema (so it does the work, not just the
fallback)."""

from __future__ import annotations

import math
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # the package ships no type hints
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from saga_store.mcp.argcheck import compile_check

SUBSET: list[dict[str, Any]] = [
    {"properties": {"key": {"title": "Key", "type": "string"},
                    "value": {"title": "Value", "type": "string"}},
     "required": ["key", "value"], "title": "putArguments", "type": "object"},
    {"type": "object", "additionalProperties": False,
     "$schema": "http://json-schema.org/draft-07/schema#",
     "properties": {"relations": {"type": "array", "items": {
         "type": "object", "additionalProperties": False, "required": ["from", "to"],
         "properties": {"from": {"type": "string"}, "to": {"type": "string"}}}}},
     "required": ["relations"]},
    {"type": "object", "properties": {"n": {"type": "integer"}, "x": {"type": "number"},
                                      "ok": {"type": "boolean"}, "none": {"type": "null"},
                                      "either": {"type": ["string", "null"]},
                                      "any": {}, "tags": {"type": "array",
                                                          "items": {"type": "string"}}}},
    {"type": "object"},
    {"required": ["a"]},
    {"type": "array", "items": {"type": ["integer", "string"]}},
]
OUTSIDE = [
    {"type": "string", "pattern": "^a"},
    {"$ref": "#/$defs/x", "$defs": {"x": {"type": "string"}}},
    {"anyOf": [{"type": "string"}, {"type": "integer"}]},
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": 1}}},
    {"type": "object", "additionalProperties": {"type": "string"}},
    {"type": "object", "properties": {"a": {"enum": [1, 2]}}},
    False,
]

scalars = st.none() | st.booleans() | st.integers(-5, 5) | \
    st.floats(allow_nan=False, allow_infinity=False, width=32) | \
    st.sampled_from(["", "a", "key", "from"])
names = st.sampled_from(["key", "value", "relations", "from", "to", "n", "x", "ok", "none",
                         "either", "any", "tags", "a", "extra"])
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(names, inner, max_size=4), max_leaves=12)


def _has_float(x: Any) -> bool:
    if isinstance(x, float):
        return True
    if isinstance(x, list):
        return any(_has_float(v) for v in x)
    if isinstance(x, dict):
        return any(_has_float(v) for v in x.values())
    return False


@pytest.mark.parametrize("schema", SUBSET, ids=range(len(SUBSET)))
@settings(max_examples=400, deadline=None)
@given(instance=json_values)
def test_the_fast_check_agrees_with_jsonschema(schema: dict[str, Any], instance: Any) -> None:
    fast = compile_check(schema)
    assert fast is not None
    valid = jsonschema.validators.validator_for(schema)(schema).is_valid(instance)
    if fast(instance):
        assert valid  # never lets through what jsonschema rejects
    if not _has_float(instance):
        assert fast(instance) == valid  # and, without floats, says the same


def test_whole_floats_are_left_to_jsonschema() -> None:
    """1.0 is an integer from draft 6 on, not in draft 4: the fast check says no and
    jsonschema, which knows the draft, decides."""
    check = compile_check({"type": "integer"})
    assert check is not None
    assert check(1)
    assert not check(1.0)
    assert not check(True)
    assert not check(math.pi)


@pytest.mark.parametrize("schema", OUTSIDE, ids=range(len(OUTSIDE)))
def test_what_it_does_not_know_it_leaves_to_jsonschema(schema: Any) -> None:
    assert compile_check(schema) is None
