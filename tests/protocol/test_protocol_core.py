"""The protocol core, table-driven: folded state + input -> events and follow-ups.
No Redis, no processes: each case runs in microseconds."""

from __future__ import annotations

from typing import Any

import pytest

from saga_store.approval.policy import Decision, Verdict
from saga_store.errors import MappingError
from saga_store.log.events import EventKind as K
from saga_store.protocol import build, unwind
from saga_store.protocol.delivery import Act, StepView, ToolFacts, on_delivery
from saga_store.protocol.forward import commit_blocker, outcome_events
from saga_store.protocol.mapping import resolve, resolve_all
from saga_store.protocol.outcome import Outcome
from saga_store.protocol.state import SagaState, StepState, fold
from saga_store.protocol.sweep import Sweep, on_sweep
from saga_store.protocol.vocab import Follow, OutcomeKind, Status

SID = "S1"


def saga(*items: build.Item) -> SagaState:
    """A folded saga: saga_started, then ``items`` in order."""
    evs: list[dict[str, Any]] = [{"kind": K.SAGA_STARTED, "seq": 0, "agent_id": "a"}]
    for kind, fields in items:
        evs.append({"kind": kind, "seq": len(evs), **{k: v for k, v in fields.items()
                                                        if v is not None}})
    return fold(SID, evs)


def intent(n: int, tool: str = "reserve", rev: str = "compensable", **args: Any) -> build.Item:
    return build.step_intent(n, tool, args or {"x": n}, rev, f"call_{n}", f"key{n}")


def done(n: int, **result: Any) -> list[build.Item]:
    return [intent(n), build.step_started(n, 1),
            build.step_outcome(n, OutcomeKind.SUCCEEDED, result=result or {"id": n})]


class Tools:
    resume_hint = "resume it"

    def __init__(self, probe: str | None = None, attempts: int = 3,
                 irreversible: frozenset[str] = frozenset()) -> None:
        self.probe, self.attempts, self.irreversible = probe, attempts, irreversible

    def undo_of(self, st: StepState) -> unwind.Undo | str:
        if st.tool in self.irreversible:
            return "tool is irreversible"
        return unwind.Undo("release", {"id": "$.output.id"}, self.attempts, lambda a: 0.5 * a)

    def probe_of(self, st: StepState) -> unwind.Probing | None:
        return unwind.Probing(self.probe, {"x": "$.input.x"}) if self.probe else None


FAILED = build.saga_failed("step 2 failed")


@pytest.mark.parametrize(("events", "tools", "want"), [
    # nothing to unwind, or not unwinding at all
    ([], Tools(), unwind.Done(Status.RUNNING)),
    ([*done(0), build.saga_committed()], Tools(), unwind.Done(Status.COMMITTED)),
    # a step announced but never started: failed, it never runs
    ([*done(0), intent(1), FAILED], Tools(),
     unwind.Append([build.step_outcome(1, OutcomeKind.FAILED, error=unwind.CANCELLED)])),
    # a step started with no outcome: in doubt
    ([*done(0), intent(1), build.step_started(1, 1), FAILED], Tools(),
     unwind.Append([build.step_outcome(1, OutcomeKind.IN_DOUBT, error=unwind.STOPPED)])),
    # in doubt with a probe: ask it first
    ([*done(0), intent(1), build.step_started(1, 1),
      build.step_outcome(1, OutcomeKind.IN_DOUBT, error="t"), FAILED], Tools(probe="p"),
     unwind.Probe(1, "p", {"x": 1}, "key1")),
    # irreversible: not compensable, and the saga will need a person
    ([*done(0), FAILED], Tools(irreversible=frozenset({"reserve"})),
     unwind.Append([build.not_compensable(0, "tool is irreversible")])),
    # every step settled: close, naming what could not be undone
    ([*done(0), FAILED, build.not_compensable(0, "irreversible")], Tools(),
     unwind.Close(build.saga_closed_unwound(["step 0 (reserve)"]), ["step 0 (reserve)"])),
    ([*done(0), FAILED, build.compensation_intent(0, "release", 1, "k", {"id": 0}),
      build.compensation_succeeded(0, "release", "call_0", {}, "reserve")], Tools(),
     unwind.Close(build.saga_closed_unwound([]), [])),
    # a stuck saga waits for a person
    ([*done(0), FAILED, build.saga_stuck(0, "e", "h")], Tools(), unwind.Done(Status.STUCK)),
], ids=["running", "committed", "cancel-intent", "started-in-doubt", "probe-first",
        "irreversible", "close-attention", "close-compensated", "stuck"])
def test_next_action(events: list[build.Item], tools: Tools, want: unwind.Action) -> None:
    assert unwind.next_action(saga(*events), tools) == want


def test_compensations_run_last_step_first_with_the_one_key_derivation() -> None:
    st = saga(*done(0), *done(1), *done(2, id=22), FAILED)
    act = unwind.next_action(st, Tools())
    assert isinstance(act, unwind.Compensate)
    assert (act.step, act.attempt, act.args) == (2, 1, {"id": 22})
    assert act.key == unwind.step_compensation_key(st, st.steps[2])
    assert act.intent == build.compensation_intent(2, "release", 1, act.key, {"id": 22})


@pytest.mark.parametrize(("attempt", "outcome", "kinds", "retry_in"), [
    (1, Outcome.succeeded({"ok": 1}), [K.COMPENSATION_SUCCEEDED], None),
    (1, Outcome.failed("503"), [K.COMPENSATION_FAILED], 0.5),
    (2, Outcome.failed("503"), [K.COMPENSATION_FAILED], 1.0),
    (3, Outcome.failed("503"), [K.COMPENSATION_FAILED, K.SAGA_STUCK], None),
])
def test_a_failing_compensation_is_retried_with_backoff_then_stuck(
        attempt: int, outcome: Outcome, kinds: list[str], retry_in: float | None) -> None:
    st = saga(*done(0), FAILED)
    act = unwind.Compensate(0, unwind.Undo("release", {}, 3, lambda a: 0.5 * a), attempt,
                            "k", {}, build.compensation_intent(0, "release", attempt, "k", {}))
    items, delay = unwind.compensated(st, act, outcome, "resume it")
    assert [k for k, _ in items] == kinds
    assert delay == retry_in


def test_retries_count_from_the_last_resume() -> None:
    st = saga(*done(0), FAILED, *[x for a in (1, 2, 3) for x in (
        build.compensation_intent(0, "release", a, "k", {}),
        build.compensation_failed(0, "503", a))], build.saga_stuck(0, "503", "h"),
        build.saga_resumed("503"))
    act = unwind.next_action(st, Tools())
    assert isinstance(act, unwind.Compensate)
    assert act.attempt == 4
    items, delay = unwind.compensated(st, act, Outcome.failed("503"), "h")
    assert [k for k, _ in items] == [K.COMPENSATION_FAILED]
    assert delay is not None


def test_a_mapping_that_cannot_resolve_leaves_the_saga_stuck_for_a_person() -> None:
    st = saga(intent(0), build.step_started(0, 1),
              build.step_outcome(0, OutcomeKind.SUCCEEDED, result={"held": 1}), FAILED)
    act = unwind.next_action(st, Tools())
    assert isinstance(act, unwind.Append)
    assert [k for k, _ in act.items] == [K.COMPENSATION_INTENT, K.COMPENSATION_FAILED,
                                         K.SAGA_STUCK]
    assert "saga resolve S1 0" in act.items[-1][1]["data"]["hint"]
    stuck = saga(intent(0), build.step_started(0, 1),
                 build.step_outcome(0, OutcomeKind.SUCCEEDED, result={"held": 1}), FAILED,
                 *act.items)
    assert unwind.resolvable(stuck, 0) is None
    assert unwind.resolvable(stuck, 1) == "saga S1 has no step 1"
    resolved = saga(intent(0), build.step_started(0, 1),
                    build.step_outcome(0, OutcomeKind.SUCCEEDED, result={"held": 1}), FAILED,
                    *act.items, build.compensation_resolved(0, "ana", "by hand", 1),
                    build.saga_resumed("x"))
    assert unwind.next_action(resolved, Tools()) == unwind.Close(
        build.saga_closed_unwound(["step 0 (reserve)"]), ["step 0 (reserve)"])


@pytest.mark.parametrize(("result", "kinds"), [
    ({"happened": False}, [K.STEP_FAILED]), ({"id": 3}, [K.STEP_SUCCEEDED]), (None, [])])
def test_a_probe_settles_an_in_doubt_step(result: Any, kinds: list[str]) -> None:
    assert [k for k, _ in unwind.probed(unwind.Probe(1, "p"), result)] == kinds


NEXT = build.step_intent(1, "b", {}, "compensable", None, "k1")


@pytest.mark.parametrize(("outcome", "unwinding", "plan", "kinds", "follow"), [
    (Outcome.succeeded({}), False, None, [K.STEP_SUCCEEDED], Follow.NONE),
    (Outcome.succeeded({}), False, [{}, {}], [K.STEP_SUCCEEDED, K.STEP_INTENT], Follow.NEXT),
    (Outcome.succeeded({}), False, [{}], [K.STEP_SUCCEEDED, K.SAGA_COMMITTED],
     Follow.COMMITTED),
    (Outcome.failed("x"), False, [{}, {}], [K.STEP_FAILED, K.SAGA_FAILED], Follow.COMPENSATE),
    (Outcome.in_doubt("t"), False, None, [K.STEP_IN_DOUBT, K.SAGA_FAILED], Follow.COMPENSATE),
    (Outcome.succeeded({}, postcondition_failed="p"), False, [{}],
     [K.STEP_SUCCEEDED, K.SAGA_FAILED], Follow.COMPENSATE),
    (Outcome.succeeded({}), True, [{}, {}], [K.STEP_SUCCEEDED], Follow.COMPENSATE),
], ids=["caller-driven", "plan-next", "plan-commit", "failed", "in-doubt", "postcondition",
        "late-outcome"])
def test_outcome_events(outcome: Outcome, unwinding: bool, plan: list[dict[str, Any]] | None,
                        kinds: list[str], follow: Follow) -> None:
    items, got = outcome_events(0, {"tool": "a"}, outcome, unwinding=unwinding, plan=plan,
                                next_intent=lambda n, p: NEXT)
    assert ([k for k, _ in items], got) == (kinds, follow)


@pytest.mark.parametrize(("events", "blocker"), [
    (done(0), None),
    ([*done(0), intent(1)], "step 1 (reserve) is intent, not succeeded"),
    ([intent(0, rev="readonly"), build.step_outcome(0, OutcomeKind.FAILED, error="x")], None),
    ([intent(0), build.step_outcome(0, OutcomeKind.FAILED, error="x")],
     "step 0 (reserve) is failed, not succeeded"),
])
def test_the_one_commit_rule(events: list[build.Item], blocker: str | None) -> None:
    assert commit_blocker(saga(*events)) == blocker


ALLOW = Verdict(Decision.ALLOW, "default", False)
ASK = Verdict(Decision.REQUIRE_APPROVAL, "PRODUCTION", True)


def facts(verdict: Verdict = ALLOW, blind: bool = True) -> ToolFacts:
    return ToolFacts(3, blind, lambda: verdict)


@pytest.mark.parametrize(("view", "tool", "act"), [
    (StepView(), facts(), Act.STALE),
    (StepView(intent={}, outcome={"kind": "step_succeeded"}), facts(), Act.DUPLICATE),
    (StepView(intent={}, unwinding=True), facts(), Act.CANCELLED),
    (StepView(intent={}), None, Act.FAIL),
    (StepView(intent={}, started=3), facts(), Act.FAIL),
    (StepView(intent={}), facts(ASK), Act.GATE),
    (StepView(intent={}, approval=(K.APPROVAL_REQUESTED, {})), facts(ASK), Act.AWAIT),
    (StepView(intent={}, approval=(K.APPROVAL_DENIED, {"by": "bo"})), facts(ASK), Act.FAIL),
    (StepView(intent={}, approval=(K.APPROVAL_GRANTED, {})), facts(ASK), Act.START),
    (StepView(intent={}, started=1), facts(ASK), Act.START),  # it passed its gate once
    (StepView(intent={}, started=1), facts(blind=False), Act.FAIL),
    (StepView(intent={}), facts(), Act.START),
], ids=["stale", "duplicate", "cancelled", "unknown-tool", "dead-letter", "gate", "await",
        "denied", "granted", "restarted", "in-doubt-after-crash", "start"])
def test_on_delivery(view: StepView, tool: ToolFacts | None, act: Act) -> None:
    assert on_delivery(view, tool, "no tool named x").act is act


def test_a_dead_lettered_step_is_in_doubt_not_failed() -> None:
    """Its attempts died mid-call: any of them may have had its effect, and a failed
    step is never undone."""
    decided = on_delivery(StepView(intent={}, started=3), facts())
    assert decided.outcome is not None
    assert decided.outcome.kind is OutcomeKind.IN_DOUBT
    assert "dead-lettered" in (decided.outcome.error or "")


def test_a_denial_names_who_and_why() -> None:
    got = on_delivery(StepView(intent={}, approval=(K.APPROVAL_DENIED,
                                                    {"by": "bo", "reason": "no"})), facts())
    assert got.outcome == Outcome.failed("denied by bo: no")
    assert on_delivery(StepView(intent={}, started=2), facts()).attempt == 3


@pytest.mark.parametrize(("events", "lease", "driver", "what", "steps"), [
    ([], 0, None, Sweep.RETIRE, []),
    ([*done(0), build.saga_committed()], 0, None, Sweep.RETIRE, []),
    ([intent(0)], 500, None, Sweep.WAIT, []),
    ([intent(0)], 0, None, Sweep.REDELIVER, [(0, 1, "key0")]),
    ([intent(0)], 0, 0, Sweep.REDELIVER, [(0, 1, "key0")]),  # its step first
    ([*done(0)], 0, None, Sweep.IDLE, []),
    ([*done(0)], 0, 900, Sweep.IDLE, []),  # its caller's lease still runs
    ([*done(0)], 0, 0, Sweep.ABANDON, []),  # its caller is gone
    ([*done(0)], 0, -2, Sweep.ABANDON, []),  # no lease at all
    ([*done(0), FAILED], 0, 0, Sweep.UNWIND, []),
    ([*done(0), FAILED, build.saga_stuck(0, "e", "h")], 0, None, Sweep.HOLD, []),
])
def test_on_sweep(events: list[build.Item], lease: int, driver: int | None, what: Sweep,
                  steps: list[tuple[int, int, str]]) -> None:
    state = saga(*events) if events else SagaState(SID)
    got = on_sweep(state, lease, driver)
    assert (got.what, got.steps) == (what, steps)


@pytest.mark.parametrize(("path", "want"), [
    ("$.input.a", 1), ("$.output.b.c", 2), ("$.input.items[*].name", ["x", "y"]),
    ("$.input.items.1.name", "y"), ("$.output.list[*]", [1, 2])])
def test_mappings_resolve_static_paths(path: str, want: Any) -> None:
    args = {"a": 1, "items": [{"name": "x"}, {"name": "y"}]}
    assert resolve(path, args, {"b": {"c": 2}, "list": [1, 2]}) == want


@pytest.mark.parametrize("path", ["$.input.nope", "$.output.b.x", "input.a", "$.other.a",
                                  "$.input", "$.input.a[*]"])
def test_a_mapping_that_does_not_resolve_says_so(path: str) -> None:
    with pytest.raises(MappingError):
        resolve_all({"p": path}, {"a": 1}, {"b": {"c": 2}})
