"""A tool that raises what only a process's end should (SystemExit,
KeyboardInterrupt, GeneratorExit, a BaseException of its own) has one outcome on
every driver: its step, or its compensation, is logged in doubt (failed, for a
compensation) after that one run, and nothing runs it again blind. Runs are
counted in the test's own ledger, never read from the log."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from saga_store import Registry, SagaStore, Settings
from saga_store.errors import SagaError
from saga_store.log.events import EventKind as K
from saga_store.protocol.state import Status
from saga_store.testing import assert_eventually
from saga_store.testing.workers import workers
from saga_store.verify.checker import Verifier

from ..timing_tools import runs

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
TOOLS = "tests.timing_tools"
RAISED = ("SystemExit", "KeyboardInterrupt", "GeneratorExit", "Custom")


@pytest.fixture
def store(client: redis.Redis) -> SagaStore:
    return SagaStore(client, Registry.from_modules(TOOLS),
                     Settings(lease_ms=1000, client_lease_s=1.0))


def _final(store: SagaStore, sid: str) -> object:
    return assert_eventually(lambda: (st := store.state(sid)).final and st, timeout=60,
                             what=f"saga {sid} to end")


def _kinds(store: SagaStore, sid: str) -> list[str]:
    return [ev["kind"] for ev in store.events.log.bodies(sid)]


@pytest.mark.parametrize(("kind", "tool"), [("rq", "raises"), ("rq", "raises_async"),
                                            ("async", "raises"), ("async", "raises_async")])
def test_a_step_whose_tool_raises_a_base_exception_is_in_doubt_after_one_run(
        store: SagaStore, worker_env: dict[str, str], ledger: Path, tmp_path: Path,
        kind: str, tool: str) -> None:
    """Each kind of BaseException, on each worker and kind of tool: the step is in
    doubt after one run (the worker alive, the saga unwound), never run again."""
    ids = {what: store.submit([{"tool": tool, "args": {"what": what}}],
                              agent_id=f"agent-{i}") for i, what in enumerate(RAISED)}
    log = tmp_path / "worker.log"
    with workers(worker_env, TOOLS, log=log, kind=kind) as [w]:
        ended = {what: _final(store, sid) for what, sid in ids.items()}
        assert w.alive, log.read_text()
    for what, sid in ids.items():
        st = ended[what]
        assert st.status is Status.COMPENSATED, (what, st.status)  # type: ignore[attr-defined]
        step = st.steps[0]  # type: ignore[attr-defined]
        assert step.status.value == "in_doubt", (what, step.status)
        assert what in (step.error or ""), step.error
        assert runs(what) == 1, (what, runs(what))
        assert _kinds(store, sid).count(K.STEP_STARTED) == 1
        assert Verifier(store.events.log).check(sid).ok


@pytest.mark.parametrize("kind", ["rq", "async"])
def test_a_compensation_that_raises_a_base_exception_has_one_outcome(
        store: SagaStore, worker_env: dict[str, str], ledger: Path, kind: str) -> None:
    """The compensator: a compensation (one attempt allowed) that raises any kind of
    BaseException is logged failed after its one run, and the saga waits for a
    person; it never runs again."""
    ids = {what: store.submit([{"tool": "undone_by_raising", "args": {"what": what}},
                               {"tool": "fails_now", "args": {}}], agent_id=f"agent-{i}")
           for i, what in enumerate(RAISED)}
    with workers(worker_env, TOOLS, kind=kind) as [w]:
        for what, sid in ids.items():
            assert_eventually(lambda sid=sid: store.state(sid).status is Status.STUCK,
                              timeout=60, what=f"the unwind of {what} to be stuck")
        assert w.alive
    for what, sid in ids.items():
        kinds = _kinds(store, sid)
        assert kinds.count(K.COMPENSATION_INTENT) == 1, kinds
        assert kinds.count(K.COMPENSATION_FAILED) == 1, kinds
        assert what in (store.state(sid).steps[0].error or "")
        assert runs(what) == 1, (what, runs(what))


@pytest.mark.parametrize("what", RAISED)
def test_inline_a_base_exception_from_a_tool_is_in_doubt_and_ctrl_c_still_stops_the_caller(
        store: SagaStore, ledger: Path, what: str) -> None:
    """The inline executor (the user's own process): the step is logged in doubt
    after one run; a KeyboardInterrupt or SystemExit then reaches the caller (Ctrl+C
    still stops the program), any other kind fails the call as in doubt. A later
    recovery unwinds the saga without running the tool again."""
    saga = store.saga(agent_id="agent-inline", executor="inline")
    passed_on = (KeyboardInterrupt, SystemExit) if what in ("KeyboardInterrupt",
                                                            "SystemExit") else SagaError
    with pytest.raises(passed_on):
        saga.call("raises", {"what": what})
    st = store.state(saga.saga_id)
    assert st.steps[0].status.value == "in_doubt", st.steps[0]
    assert runs(what) == 1
    ended = assert_eventually(  # once the lease the step left lapses
        lambda: store.recover("agent-inline") >= 0 and (s := store.state(saga.saga_id)).final
        and s, timeout=30, interval=0.2, what="the recovery to unwind the saga")
    assert ended.status is Status.COMPENSATED
    assert runs(what) == 1
