"""The gateway's per-session turns: mutating calls run one at a time in arrival
order, reads beside each other but never beside a mutating call that arrived
before them, and a caller cancelled while waiting never strands the ones behind it."""

from __future__ import annotations

import anyio
import pytest

from saga_store.mcp.turns import Turns


def _run(calls: list[tuple[str, bool]], turns: Turns | None = None,
         upgrade: str | None = None) -> list[str]:
    """Run the calls, each arriving before the next, each holding its turn across two
    event-loop yields; ``upgrade`` names a read that turns exclusive while it runs."""
    async def go() -> list[str]:
        t, ran = turns or Turns(), []

        async def call(name: str, shared: bool) -> None:
            turn = await t.take(shared)
            try:
                ran.append(f"{name} in")
                await anyio.sleep(0.01)
                if name == upgrade:
                    await t.exclusive(turn)
                    ran.append(f"{name} alone")
                    await anyio.sleep(0.01)
                ran.append(f"{name} out")
            finally:
                t.give(turn)

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                for name, shared in calls:
                    tg.start_soon(call, name, shared)
                    await anyio.sleep(0)  # each arrives before the next
        assert (t.writing, t.reading, list(t.waiting)) == (False, 0, [])
        return ran
    return anyio.run(go)


def test_mutating_calls_take_turns_in_arrival_order() -> None:
    assert _run([("a", False), ("b", False), ("c", False)]) == [
        "a in", "a out", "b in", "b out", "c in", "c out"]


def test_reads_run_together_and_a_mutating_call_waits_for_the_reads_before_it() -> None:
    ran = _run([("r1", True), ("r2", True), ("w", False), ("r3", True)])
    assert ran[:2] == ["r1 in", "r2 in"]  # together
    # w starts only when both reads are out; r3, arriving after w, waits for it
    assert ran.index("w in") > max(ran.index("r1 out"), ran.index("r2 out"))
    assert ran.index("r3 in") > ran.index("w out")


def test_a_read_waits_for_a_mutating_call_that_arrived_before_it() -> None:
    assert _run([("w", False), ("r", True)]) == ["w in", "w out", "r in", "r out"]


def test_a_read_made_exclusive_waits_for_the_other_reads_ahead_of_waiting_calls() -> None:
    ran = _run([("r1", True), ("r2", True), ("w", False)], upgrade="r1")
    # r1 is alone only once r2 is out, and before w (which waited first) is in
    assert ran.index("r1 alone") > ran.index("r2 out")
    assert ran.index("r1 alone") < ran.index("w in")
    assert ran.index("w in") > ran.index("r1 out")


@pytest.mark.parametrize("when", ["waiting", "handed the turn"])
def test_a_cancelled_waiter_passes_the_turn_on(when: str) -> None:
    async def go() -> tuple[bool, Turns]:
        turns, ran_a, ran_b = Turns(), anyio.Event(), anyio.Event()
        held = await turns.take()
        scope_a = anyio.CancelScope()

        async def a() -> None:
            with scope_a:
                turn = await turns.take()
                ran_a.set()
                turns.give(turn)

        async def b() -> None:
            turn = await turns.take()
            ran_b.set()
            turns.give(turn)

        async with anyio.create_task_group() as tg:
            tg.start_soon(a)
            await anyio.sleep(0)
            tg.start_soon(b)
            await anyio.sleep(0)  # a, then b, wait for the turn
            if when == "handed the turn":
                turns.give(held)  # a holds the turn now, but has not run yet
                scope_a.cancel()
            else:
                scope_a.cancel()
                await anyio.sleep(0)
                turns.give(held)
            with anyio.fail_after(5):
                await ran_b.wait()
        return ran_a.is_set(), turns
    ran_a, turns = anyio.run(go)
    assert (turns.writing, turns.reading, list(turns.waiting)) == (False, 0, [])
    if when == "waiting":
        assert not ran_a


def test_a_cancelled_read_behind_a_mutating_call_lets_later_reads_run() -> None:
    """A mutating call waits behind a read; the read ahead of it ends; a cancelled
    waiter in the middle of the queue does not hold the others."""
    async def go() -> list[str]:
        turns, ran = Turns(), []
        r = await turns.take(shared=True)
        scope = anyio.CancelScope()

        async def w() -> None:
            with scope:
                turn = await turns.take()
                ran.append("w")
                turns.give(turn)

        async def r2() -> None:
            turn = await turns.take(shared=True)
            ran.append("r2")
            turns.give(turn)

        async with anyio.create_task_group() as tg:
            tg.start_soon(w)
            await anyio.sleep(0)
            tg.start_soon(r2)
            await anyio.sleep(0)
            assert ran == []  # r2 waits behind w, which waits behind r
            scope.cancel()
            with anyio.fail_after(5):
                while not ran:
                    await anyio.sleep(0)
            turns.give(r)
        return ran
    assert anyio.run(go) == ["r2"]
