"""Reading a server's ``_meta["dev.chronomcp/compensate"]``: the mcp-compensate
extension's form as written, the shorthand, and clear refusals of what is wrong."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mcp_types as types
import pytest

from saga_store.errors import InvalidInput
from saga_store.mcp.classify import Classification, classify, load_tools_map
from saga_store.mcp.declared import META_COMPENSATE, read_declared

SPEC = {"reversibility": "compensable",
        "compensation": {"toolName": "delete_record",
                         "parameterMapping": {"id": "$.output.structuredContent.id"},
                         "timeoutMs": 2500, "maxRetries": 4},
        "sideEffectScope": ["records"], "notes": "soft delete"}


def _tool(meta: Any, **kw: Any) -> Any:
    return types.Tool(name="create_record", input_schema={"type": "object"},
                      _meta={META_COMPENSATE: meta}, **kw)


def test_the_extensions_form_is_read_field_by_field() -> None:
    """toolName, parameterMapping, timeoutMs (per attempt) and maxRetries (after the
    first attempt) all reach the classification, with sideEffectScope and notes."""
    cls = classify(_tool(SPEC), {})
    assert (cls.reversibility, cls.source) == ("compensable", "_meta")
    assert cls.compensation is not None
    assert cls.compensation.tool == "delete_record"
    assert dict(cls.compensation.args) == {"id": "$.output.structuredContent.id"}
    assert (cls.compensation.timeout_s, cls.compensation.max_attempts) == (2.5, 5)
    assert (cls.scope, cls.notes) == (("records",), "soft delete")


def test_readonly_and_irreversible_declarations() -> None:
    """A declared read-only tool is the server's claim (the policy sees it as unknown
    unless it trusts server hints); a declared irreversible one is irreversible."""
    ro = classify(_tool({"reversibility": "readonly"}), {})
    assert (ro.reversibility, ro.mutating, ro.server_readonly) == ("readonly", False, True)
    assert (ro.for_policy(False), ro.for_policy(True)) == ("unknown", "readonly")
    irr = classify(_tool({"reversibility": "irreversible", "notes": "mail"}), {})
    assert (irr.reversibility, irr.compensation, irr.for_policy(False)) == (
        "irreversible", None, "irreversible")


def test_the_shorthand_still_reads_and_the_tools_map_wins() -> None:
    short = classify(_tool({"tool": "delete_record", "args": {"id": "$.input.x"}}), {})
    assert short.compensation is not None
    assert short.compensation.tool == "delete_record"
    local = Classification("irreversible", source="tools-map")
    assert classify(_tool(SPEC), {"create_record": local}) is local


@pytest.mark.parametrize(("raw", "says"), [
    ({"reversibility": "maybe"}, "reversibility must be readonly, compensable or"),
    ({"reversibility": "compensable"}, "needs compensation"),
    ({"reversibility": "readonly", "compensation": SPEC["compensation"]}, "only a compensable"),
    ({**SPEC, "compensation": {**SPEC["compensation"], "timeoutMs": 0}}, "timeoutMs"),
    ({**SPEC, "compensation": {**SPEC["compensation"], "maxRetries": -1}}, "maxRetries"),
    ({**SPEC, "compensation": {**SPEC["compensation"], "parameterMapping": {"id": "id"}}},
     "must map from"),
    ({**SPEC, "compensation": {**SPEC["compensation"], "tool_name": "x"}}, "unknown comp"),
    ({**SPEC, "sideEffectScope": "records"}, "sideEffectScope is a list"),
    ({**SPEC, "reversable": "x"}, "unknown field"),
    ("compensable", "must be an object"),
])
def test_a_declaration_that_does_not_read_says_what_is_wrong(raw: Any, says: str) -> None:
    with pytest.raises(InvalidInput, match=says):
        read_declared(raw, "create_record")


def test_a_declaration_that_does_not_read_leaves_the_tool_unclassified() -> None:
    assert classify(_tool({"reversibility": "maybe"}), {}).reversibility == "unknown"


def test_a_tools_map_compensation_takes_its_tries_and_their_time_limit(tmp_path: Path) -> None:
    good = tmp_path / "tools.toml"
    good.write_text('[tools.book]\ncompensation = { tool = "cancel", args = { id = '
                    '"$.input.id" }, timeout_s = 2.5, attempts = 5 }\n'
                    '[tools.plain]\ncompensation = { tool = "undo", args = {} }\n')
    classes = load_tools_map(good)
    book, plain = classes["book"].compensation, classes["plain"].compensation
    assert book is not None
    assert plain is not None
    assert (book.timeout_s, book.max_attempts) == (2.5, 5)
    assert (plain.timeout_s, plain.max_attempts) == (None, 3)
    for bad, says in (("timeout_s = 0", "timeout_s is a number of seconds above 0"),
                      ('timeout_s = "5s"', "timeout_s is a number of seconds above 0"),
                      ("attempts = 0", "attempts is a whole number from 1"),
                      ("attempts = 1.5", "attempts is a whole number from 1"),
                      ("retries = 2", "takes tool, args, timeout_s and attempts")):
        f = tmp_path / "bad.toml"
        f.write_text(f'[tools.book]\ncompensation = {{ tool = "cancel", args = {{}}, {bad} }}\n')
        with pytest.raises(InvalidInput, match=says):
            load_tools_map(f)
