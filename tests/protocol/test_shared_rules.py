"""The rules the workers and the MCP gateway share, and the one unwind loop they
both drive, table-driven without Redis."""

from __future__ import annotations

from typing import Any

import pytest

from saga_store.approval.policy import Decision, Verdict
from saga_store.log.events import EventKind as K
from saga_store.protocol import build, unwind, unwinding
from saga_store.protocol.delivery import Act, gate, last_approval
from saga_store.protocol.forward import Leftover, failure_unwinds, left_over
from saga_store.protocol.outcome import Outcome
from saga_store.protocol.vocab import OutcomeKind, Reversibility, Status
from tests.protocol.test_protocol_core import FAILED, Tools, done, intent, saga

R, F, D = Reversibility, OutcomeKind.FAILED, OutcomeKind.IN_DOUBT


@pytest.mark.parametrize(("kind", "rev", "session", "unwinds"), [
    (OutcomeKind.SUCCEEDED, R.COMPENSABLE, False, False),
    (F, R.COMPENSABLE, False, True),
    (F, R.READONLY, False, True),  # a worker's saga unwinds on any failure
    (F, R.READONLY, True, False),  # a session goes on after a failed read
    (D, R.READONLY, True, True),  # a read in doubt blocks the commit: it unwinds
    (F, R.IRREVERSIBLE, True, True),
    (F, "unknown", True, True),
])
def test_the_failure_rule(kind: OutcomeKind, rev: str, session: bool, unwinds: bool) -> None:
    """Whether an outcome unwinds its saga, on workers and in a gateway session."""
    assert failure_unwinds(kind, rev, session=session) is unwinds


def verdict(decision: Decision) -> Verdict:
    return Verdict(decision, "rule r", production=False)


@pytest.mark.parametrize(("approval", "decision", "act", "error"), [
    (None, Decision.ALLOW, None, None),
    (None, Decision.DENY, Act.FAIL, "denied by policy (rule r)"),
    (None, Decision.REQUIRE_APPROVAL, Act.GATE, None),
    ((K.APPROVAL_REQUESTED, {}), Decision.REQUIRE_APPROVAL, Act.AWAIT, None),
    ((K.APPROVAL_GRANTED, {"by": "ana"}), Decision.REQUIRE_APPROVAL, None, None),
    ((K.APPROVAL_DENIED, {"by": "ana", "reason": "no"}), Decision.REQUIRE_APPROVAL,
     Act.FAIL, "denied by ana: no"),
])
def test_the_gate(approval: Any, decision: Decision, act: Act | None, error: str | None,
                  ) -> None:
    """The one gate: the policy first, then a person's decision from the log."""
    got = gate(approval, lambda: verdict(decision))
    assert (got.act if got else None) == act
    assert (got.outcome.error if got and got.outcome else None) == error


def test_a_folded_steps_approval_is_what_the_gate_reads() -> None:
    """A decision folded into a step reads back as the event the gate takes."""
    st = saga(intent(0), build.approval_requested(0, "reserve", {"p": 1}),
              build.approval_decided(0, False, {"by": "ana"}))
    assert last_approval(st.steps[0]) == (K.APPROVAL_DENIED, {"by": "ana"})
    assert gate(last_approval(st.steps[0]), lambda: verdict(Decision.ALLOW)) is not None


@pytest.mark.parametrize(("events", "left"), [
    ([*done(0)], Leftover.COMMIT),
    ([*done(0), intent(1)], Leftover.UNWIND),  # a call with no outcome: undone
    ([*done(0), FAILED], Leftover.UNWIND),
    ([*done(0), build.saga_committed()], Leftover.CLOSE),
])
def test_what_a_session_left_by_its_driver_becomes(events: list[build.Item],
                                                    left: Leftover) -> None:
    assert left_over(saga(*events)) is left


@pytest.mark.parametrize(("events", "kinds"), [
    ([*done(0)], [K.SAGA_FAILED]),
    ([*done(0), FAILED, build.saga_stuck(0, "e", "h")], [K.SAGA_RESUMED]),
    ([*done(0), FAILED], []),
])
def test_an_unwind_opens_failed_or_resumed(events: list[build.Item], kinds: list[str]) -> None:
    assert [k for k, _ in unwind.opening(saga(*events), "why")] == kinds


def drive(loop: unwinding.Unwinding, state: Any, answers: dict[str, list[Outcome]],
          ) -> tuple[list[Any], Any]:
    """Run the loop as a driver would, folding its writes into ``state``; each
    call's outcome comes from ``answers`` by tool, in order."""
    asked: list[Any] = []
    answer = None
    while True:
        try:
            req = loop.send(answer)
        except StopIteration as stop:
            return asked, stop.value
        answer = None
        if isinstance(req, unwinding.Write):
            for kind, fields in req.items:
                state.apply({"kind": kind, "seq": state.seq + 1, **{
                    k: v for k, v in fields.items() if v is not None}})
        else:
            asked.append(req)
            if not isinstance(req, unwinding.Wait):
                tool = req.tool if isinstance(req, unwind.Probe) else req.undo.tool
                answer = answers[tool].pop(0)


def test_the_loop_probes_retries_with_jitter_and_closes(monkeypatch: pytest.MonkeyPatch,
                                                        ) -> None:
    """Probe first, then compensate with a back-off between tries (jittered), then close."""
    monkeypatch.setattr("random.random", lambda: 0.25)
    st = saga(*done(0), intent(1), build.step_started(1, 1),
              build.step_outcome(1, D, error="t"), FAILED)
    asked, end = drive(unwinding.unwinding(st, Tools(probe="p")), st, {
        "p": [Outcome.succeeded({"id": 7})],  # it happened: undone with what it made
        "release": [Outcome.failed("503"), Outcome.succeeded({}), Outcome.succeeded({})]})
    probe, comp1, wait, comp2, comp3 = asked
    assert probe == unwind.Probe(1, "p", {"x": 1}, "key1")
    assert (comp1.step, comp1.attempt, comp1.args, comp2.attempt, comp3.step) == (
        1, 1, {"id": 7}, 2, 0)
    assert wait == unwinding.Wait(0.5 * 0.75)  # Tools' backoff of try 1, times 0.75
    assert end == unwind.Close(build.saga_closed_unwound([]), [])
    assert st.status is Status.COMPENSATING
