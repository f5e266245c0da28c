"""A saga's state in an operator's words, from its events alone: waiting for
approval, in doubt, retrying (attempt n of m when the tool's declaration is
known), compensating, stuck (on which step), and why, as text."""

from __future__ import annotations

from typing import Any

from saga_store import Registry
from saga_store.console.effects import undo_tools
from saga_store.console.states import reason_lines, shown
from saga_store.log.events import EventKind as K
from saga_store.protocol.state import fold

REGISTRY = Registry.from_modules("tests.ledger_tools")


def saga(*events: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    out = [{"seq": 0, "kind": K.SAGA_STARTED, "ts": 1, "agent_id": "a"}]
    for kind, fields in events:
        out.append({"seq": len(out), "kind": kind, "ts": len(out) + 1, **fields})
    return out


INTENT = (K.STEP_INTENT, {"step": 0, "tool": "reserve_inventory",
                          "data": {"args": {"sku": "A", "qty": 1},
                                   "reversibility": "compensable"}})


def words(events: list[dict[str, Any]], registry: Registry | None = REGISTRY) -> str:
    return shown(fold("s", events), registry, undo_tools(events)).text


def test_inside_running_the_log_tells_waiting_doubt_and_retries() -> None:
    asked = saga(INTENT, (K.APPROVAL_REQUESTED, {"step": 0, "tool": "reserve_inventory",
                                                 "data": {"reason": "policy"}}))
    assert words(asked) == "waiting for approval: step 0 (reserve_inventory)"
    assert shown(fold("s", asked)).key == "waiting_approval"
    again = saga(INTENT, (K.STEP_STARTED, {"step": 0, "attempt": 1}),
                 (K.STEP_STARTED, {"step": 0, "attempt": 2}))
    assert words(again) == "retrying step 0 (reserve_inventory), attempt 2 of 3"
    assert words(again, None) == "retrying step 0 (reserve_inventory), attempt 2"
    doubt = saga(INTENT, (K.STEP_STARTED, {"step": 0, "attempt": 1}),
                 (K.STEP_IN_DOUBT, {"step": 0, "data": {"error": "timeout"}}))
    assert words(doubt) == "in doubt: step 0 (reserve_inventory)"
    assert words(saga(INTENT)) == "running"


def test_an_unwind_says_what_it_retries_and_where_it_is_stuck() -> None:
    ran = [INTENT, (K.STEP_STARTED, {"step": 0, "attempt": 1}),
           (K.STEP_SUCCEEDED, {"step": 0, "data": {"result": {"reservation_id": "r"}}}),
           (K.SAGA_FAILED, {"data": {"reason": "step 1: boom"}})]
    assert words(saga(*ran)) == "compensating"
    failed_once = [*ran, (K.COMPENSATION_INTENT, {"step": 0, "tool": "release_inventory",
                                                  "attempt": 1}),
                   (K.COMPENSATION_FAILED, {"step": 0, "data": {"error": "503"}})]
    assert words(saga(*failed_once)) == ("compensating, retrying the undo of step 0 "
                                         "(reserve_inventory) by release_inventory: "
                                         "attempt 2 of 3")
    stuck = saga(*failed_once, (K.SAGA_STUCK, {"data": {
        "step": 0, "error": {"type": "HTTPError", "message": "503 from the warehouse"},
        "hint": "fix the warehouse, then 'saga resume s'"}}))
    state = fold("s", stuck)
    assert shown(state).text == "stuck undoing step 0 (reserve_inventory)"
    assert reason_lines(state) == [("error", "HTTPError: 503 from the warehouse"),
                                   ("what to do", "fix the warehouse, then 'saga resume s'")]
    assert reason_lines(fold("s", saga(*ran))) == [("why it unwinds", "step 1: boom")]
