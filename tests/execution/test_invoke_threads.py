"""A sync tool called off the main thread (the asyncio worker's step threads, the
inline executor) runs on the calling thread; the watchdog keeps the caller's lease
while it runs, over every try and back-off, and never once the invoke has ended
(the outcome's append releases the lease then: a late renewal would take it back
for a stale token). A call past its timeout is in doubt however it ends."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from saga_store.workers import watchdog as wd
from saga_store.workers.invoke import Invoker
from saga_store.workers.watchdog import TICK_S, Watchdog

from saga_store import Registry, tool
from saga_store.errors import StepError
from saga_store.protocol.outcome import Outcome
from saga_store.protocol.vocab import OutcomeKind
from saga_store.tools.spec import RetryPolicy, StepContext

CTX = StepContext(idempotency_key="k", saga_id="s-1", step=0, attempt=1)
CALLS: list[int] = []


@tool(timeout=0.2)
def slow(seconds: float) -> dict[str, Any]:
    CALLS.append(1)
    time.sleep(seconds)
    return {"thread": threading.get_ident()}


@tool(timeout=0.1, retry=RetryPolicy(max_attempts=3, backoff_s=0.05))
def late_failure(seconds: float) -> dict[str, Any]:
    """Times out, then raises a retryable error (a read timeout after the server
    committed, say)."""
    CALLS.append(1)
    time.sleep(seconds)
    raise StepError("upstream read timed out", retryable=True)


@tool(timeout=5, retry=RetryPolicy(max_attempts=3, backoff_s=0.25, max_backoff_s=0.25))
def flaky(seconds: float) -> dict[str, Any]:
    CALLS.append(1)
    time.sleep(seconds)
    if len(CALLS) < 3:
        raise StepError("try again", retryable=True)
    return {"tries": len(CALLS)}


REGISTRY = Registry([slow, late_failure, flaky])


def _off_main(fn: Any) -> Any:
    """``fn()`` on a thread other than the main one; what it returned."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(20)
    return out[0]


def _invoke(tool_name: str, seconds: float, renew: Any = None, every_s: float = 0.1,
            invoker: Invoker | None = None) -> Outcome:
    inv = invoker or Invoker(Watchdog())
    keepalive = (renew, every_s) if renew is not None else None
    return inv.invoke(REGISTRY.get(tool_name), {"seconds": seconds}, CTX, keepalive=keepalive)


@pytest.fixture(autouse=True)
def _calls() -> None:
    CALLS.clear()


def test_a_call_past_its_timeout_is_in_doubt_once_it_returns_renewed_meanwhile() -> None:
    """0.5 s against a 0.2 s timeout, renewals 0.1 s apart: several renewals while it
    runs, none after it returned; in doubt, and only once the call came back."""
    renewals: list[float] = []
    started = time.monotonic()
    outcome = _off_main(lambda: _invoke("slow", 0.5, lambda: renewals.append(time.monotonic())))
    returned = time.monotonic()
    assert outcome.kind is OutcomeKind.IN_DOUBT
    assert returned - started >= 0.5
    assert len(renewals) >= 3, renewals
    time.sleep(5 * TICK_S)
    assert all(at < returned for at in renewals), (renewals, returned)


def test_a_call_that_raises_after_its_timeout_is_in_doubt_and_not_retried() -> None:
    """An error that comes after the timeout says nothing of what the call did: in
    doubt, one call, even though the error is retryable."""
    outcome = _off_main(lambda: _invoke("late_failure", 0.3))
    assert outcome.kind is OutcomeKind.IN_DOUBT
    assert len(CALLS) == 1


def test_the_lease_is_kept_over_every_try_and_the_back_offs_between_them() -> None:
    """Three tries of 0.15 s with 0.25 s back-offs, renewals 0.2 s apart: no try is
    long enough for a renewal of its own, but the invoke is, and the lease is renewed
    through it."""
    renewals: list[float] = []
    outcome = _off_main(lambda: _invoke("flaky", 0.15, lambda: renewals.append(1), 0.2))
    assert outcome.kind is OutcomeKind.SUCCEEDED
    assert outcome.result == {"tries": 3}
    assert len(renewals) >= 3, renewals


def test_a_renewal_under_way_when_the_call_returns_finishes_before_the_outcome() -> None:
    """A renewal that takes long (a slow Redis) is waited for before the call's outcome
    is handed back, so the outcome's append always comes after the last renewal."""
    done: list[float] = []

    def slow_renew() -> None:
        time.sleep(0.3)
        done.append(time.monotonic())

    def call() -> float:
        _invoke("slow", 0.15, slow_renew)
        return time.monotonic()

    outcome_at = _off_main(call)
    assert done, "the renewal ran"
    assert outcome_at >= done[-1]


def test_a_sync_call_runs_on_the_calling_thread_with_no_thread_made_for_it() -> None:
    """The call runs where it was made: no thread started per call (a thread's start
    and two hand-overs cost about a fifth of a no-op step's round trip)."""
    invoker = Invoker(Watchdog())
    for _ in range(3):
        ident, outcome = _off_main(lambda: (threading.get_ident(),
                                            _invoke("slow", 0.0, invoker=invoker)))
        assert outcome.kind is OutcomeKind.SUCCEEDED
        assert outcome.result == {"thread": ident}


def test_renewals_stuck_on_an_unreachable_redis_hold_up_no_other_calls() -> None:
    """Forty calls share a watchdog and their renewals hang (their sagas' master is
    failing over); another call's lease is still renewed on time."""
    dog = Watchdog()
    hanging, stuck, renewed = threading.Semaphore(0), threading.Event(), []

    def hang() -> None:
        hanging.release()
        stuck.wait(10)

    def call(renew: Any, seconds: float) -> None:
        Invoker(dog).invoke(REGISTRY.get("slow"), {"seconds": seconds}, CTX,
                            keepalive=(renew, 0.1))

    blocked = [threading.Thread(target=call, args=(hang, 1.5)) for _ in range(40)]
    for t in blocked:
        t.start()
    for _ in blocked:
        assert hanging.acquire(timeout=10)
    healthy = threading.Thread(target=call, args=(lambda: renewed.append(1), 0.6))
    healthy.start()
    healthy.join(10)
    stuck.set()
    for t in blocked:
        t.join(10)
    assert len(renewed) >= 3, renewed


def test_a_thread_that_cannot_be_started_is_tried_again_next_tick(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No thread to be had for a renewer (the process is at its limit): the watchdog
    lives on and starts one at a later tick."""
    real, refused = threading.Thread, []

    class OnceRefused(real):  # type: ignore[misc,valid-type]
        def start(self) -> None:
            if self.name == "saga-renew" and not refused:
                refused.append(1)
                raise RuntimeError("can't start new thread")
            super().start()

    monkeypatch.setattr(wd.threading, "Thread", OnceRefused)
    renewals: list[int] = []
    outcome = _off_main(lambda: _invoke("slow", 0.5, lambda: renewals.append(1)))
    assert outcome.kind is OutcomeKind.IN_DOUBT
    assert refused == [1]
    assert len(renewals) >= 2, renewals


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_forgets_the_parents_calls(tmp_path: Path) -> None:
    """A process forked while a call runs renews nothing of it: the call and its lease
    are the parent's."""
    dog = Watchdog()
    child_log = tmp_path / "child.log"
    started = threading.Event()

    def renew() -> None:
        started.set()
        with child_log.open("a") as f:
            f.write(f"{os.getpid()}\n")

    t = threading.Thread(target=lambda: Invoker(dog).invoke(
        REGISTRY.get("slow"), {"seconds": 1.0}, CTX, keepalive=(renew, 0.1)))
    t.start()
    assert started.wait(5)
    pid = os.fork()
    if pid == 0:  # the child: one call of its own starts its watchdog again
        try:
            Invoker(dog).invoke(REGISTRY.get("slow"), {"seconds": 0.0}, CTX)
            time.sleep(0.5)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    t.join(10)
    assert status == 0
    pids = {int(line) for line in child_log.read_text().split()}
    assert pids == {os.getpid()}
