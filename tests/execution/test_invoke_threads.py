"""A sync tool called off the main thread (the asyncio worker's step threads, the
inline executor) runs on the calling thread; a watchdog renews the caller's lease
while it runs, and never once it has returned (the outcome's append has released
the lease by then: a late renewal would take it back for a stale token)."""

from __future__ import annotations

import threading
import time
from typing import Any

from saga_store.workers.invoke import Invoker, Watchdog

from saga_store import Registry, tool
from saga_store.protocol.outcome import Outcome
from saga_store.protocol.vocab import OutcomeKind
from saga_store.tools.spec import StepContext

CTX = StepContext(idempotency_key="k", saga_id="s-1", step=0, attempt=1)


@tool(timeout=0.2)
def slow(seconds: float) -> dict[str, Any]:
    time.sleep(seconds)
    return {"thread": threading.get_ident()}


REGISTRY = Registry([slow])


def _off_main(invoker: Invoker, seconds: float, renew: Any, every_s: float) -> Outcome:
    out: list[Outcome] = []
    t = threading.Thread(target=lambda: out.append(invoker.invoke(
        REGISTRY.get("slow"), {"seconds": seconds}, CTX, keepalive=(renew, every_s))))
    t.start()
    t.join(10)
    return out[0]


def test_a_call_past_its_timeout_is_in_doubt_once_it_returns_renewed_meanwhile() -> None:
    """0.5 s against a 0.2 s timeout, renewals 0.1 s apart: several renewals while it
    runs, none after it returned; in doubt, and only once the call came back."""
    renewals: list[float] = []
    started = time.monotonic()
    outcome = _off_main(Invoker(), 0.5, lambda: renewals.append(time.monotonic()), 0.1)
    returned = time.monotonic()
    assert outcome.kind is OutcomeKind.IN_DOUBT
    assert returned - started >= 0.5
    assert len(renewals) >= 3, renewals
    time.sleep(5 * Watchdog.TICK_S)
    assert all(at < returned for at in renewals), (renewals, returned)


def test_a_renewal_under_way_when_the_call_returns_finishes_before_the_outcome() -> None:
    """A renewal that takes long (a slow Redis) is waited for before the call's outcome
    is handed back, so the outcome's append always comes after the last renewal."""
    done: list[float] = []

    def slow_renew() -> None:
        time.sleep(0.3)
        done.append(time.monotonic())

    outcome_at: list[float] = []
    invoker = Invoker()
    t = threading.Thread(target=lambda: (invoker.invoke(
        REGISTRY.get("slow"), {"seconds": 0.15}, CTX, keepalive=(slow_renew, 0.1)),
        outcome_at.append(time.monotonic())))
    t.start()
    t.join(10)
    assert done, "the renewal ran"
    assert outcome_at[0] >= done[-1]


def test_a_sync_call_runs_on_the_calling_thread_with_no_thread_made_for_it() -> None:
    """The call runs where it was made: no thread started per call (a thread's start
    and two hand-overs cost about 150 us a step)."""
    invoker = Invoker()
    results: list[tuple[int, Outcome]] = []

    def call() -> None:
        results.append((threading.get_ident(), invoker.invoke(
            REGISTRY.get("slow"), {"seconds": 0.0}, CTX)))

    for _ in range(3):
        t = threading.Thread(target=call)
        t.start()
        t.join(10)
    for ident, outcome in results:
        assert outcome.kind is OutcomeKind.SUCCEEDED
        assert outcome.result == {"thread": ident}


def test_a_renewal_stuck_on_an_unreachable_redis_holds_up_no_other_calls() -> None:
    """Two calls share a worker's watchdog; the first one's renewal hangs (its saga's
    master is failing over); the second call's lease is still renewed on time."""
    watchdog = Watchdog()
    hanging, stuck, renewed = threading.Event(), threading.Event(), []

    def hang() -> None:
        hanging.set()
        stuck.wait(5)

    def call(renew: Any, seconds: float) -> None:
        Invoker(watchdog).invoke(REGISTRY.get("slow"), {"seconds": seconds}, CTX,
                                 keepalive=(renew, 0.1))

    first = threading.Thread(target=call, args=(hang, 1.0))
    first.start()
    assert hanging.wait(5)
    second = threading.Thread(target=call, args=(lambda: renewed.append(1), 0.6))
    second.start()
    second.join(10)
    stuck.set()
    first.join(10)
    assert len(renewed) >= 3, renewed
