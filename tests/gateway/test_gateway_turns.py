"""The gateway's per-session turns: calls run one at a time in arrival order, and
a caller cancelled while waiting never strands the ones behind it."""

from __future__ import annotations

import anyio
import pytest

from saga_store.mcp.gateway import Turns


def test_calls_take_turns_in_arrival_order() -> None:
    async def go() -> list[str]:
        turns, ran = Turns(), []

        async def call(name: str) -> None:
            await turns.take()
            try:
                ran.append(f"{name} in")
                await anyio.sleep(0.01)
                ran.append(f"{name} out")
            finally:
                turns.give()

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                for name in "abc":
                    tg.start_soon(call, name)
                    await anyio.sleep(0)  # each arrives before the next
        return ran
    assert anyio.run(go) == ["a in", "a out", "b in", "b out", "c in", "c out"]


@pytest.mark.parametrize("when", ["waiting", "handed the turn"])
def test_a_cancelled_waiter_passes_the_turn_on(when: str) -> None:
    async def go() -> tuple[bool, bool, bool]:
        turns, ran_a, ran_b = Turns(), anyio.Event(), anyio.Event()
        await turns.take()  # held here
        scope_a = anyio.CancelScope()

        async def a() -> None:
            with scope_a:
                await turns.take()
                ran_a.set()
                turns.give()

        async def b() -> None:
            await turns.take()
            ran_b.set()
            turns.give()

        async with anyio.create_task_group() as tg:
            tg.start_soon(a)
            await anyio.sleep(0)
            tg.start_soon(b)
            await anyio.sleep(0)  # a, then b, wait for the turn
            if when == "handed the turn":
                turns.give()  # a holds the turn now, but has not run yet
                scope_a.cancel()
            else:
                scope_a.cancel()
                await anyio.sleep(0)
                turns.give()
            with anyio.fail_after(5):
                await ran_b.wait()
        return ran_a.is_set(), turns.busy, bool(turns.waiting)
    ran_a, busy, waiting = anyio.run(go)
    assert (busy, waiting) == (False, False)  # b ran, and nothing holds the turn
    if when == "waiting":
        assert not ran_a
