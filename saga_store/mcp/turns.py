"""The calls of one gateway session, in turns.

A mutating call runs alone, after every call that arrived before it (a saga's
steps are undone last first, so their order is the arrival order). Reads run
together: a read waits only for the mutating calls that arrived before it (so
it sees what they did), never for another read. A read that must roll the
session back (its outcome is in doubt) first becomes a mutating call: it waits
for the reads beside it, ahead of every call still waiting.

Taking a free turn does not yield to the event loop (an anyio Lock costs 4% of
a gateway call), and a caller cancelled while waiting never strands the ones
behind it.
"""

from __future__ import annotations

from collections import deque
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CURRENT", "Turn", "Turns"]


@dataclass(eq=False)
class Turn:
    """One call's turn: ``shared`` while it is a read."""

    shared: bool
    held: bool = False
    event: Any = field(default=None, repr=False)  # an anyio Event while it waits


# the turn of the call the current task serves (each tools/call is its own task;
# the gateway sets and resets it around a call)
CURRENT: ContextVar[tuple[Turns, Turn] | None] = ContextVar("saga_gateway_turn", default=None)


class Turns:
    def __init__(self) -> None:
        self.writing = False
        self.reading = 0
        self.waiting: deque[Turn] = deque()  # first come, first served

    def _free(self, turn: Turn) -> bool:
        return not self.writing and (turn.shared or self.reading == 0)

    def _enter(self, turn: Turn) -> None:
        turn.held = True
        if turn.shared:
            self.reading += 1
        else:
            self.writing = True

    async def take(self, shared: bool = False) -> Turn:
        """Wait for a turn: a read's (``shared``) or a mutating call's."""
        turn = Turn(shared)
        if not self.waiting and self._free(turn):
            self._enter(turn)
        else:
            await self._wait(turn, first=False)
        return turn

    async def exclusive(self, turn: Turn) -> None:
        """Make a read's turn a mutating call's: wait for the other reads to end,
        ahead of every call that waits."""
        if not turn.shared:
            return
        self.reading -= 1
        turn.shared, turn.held = False, False
        if not self.writing and self.reading == 0:
            self._enter(turn)
            return
        self._wake()  # a waiting call might be free now (none is: reads still run)
        await self._wait(turn, first=True)

    async def _wait(self, turn: Turn, *, first: bool) -> None:
        import anyio
        turn.event = anyio.Event()
        if first:
            self.waiting.appendleft(turn)
        else:
            self.waiting.append(turn)
        try:
            await turn.event.wait()
        except BaseException:
            if turn.event.is_set():  # handed the turn, then cancelled: pass it on
                self.give(turn)
            else:
                self.waiting.remove(turn)
                self._wake()  # those behind it may be free now
            raise

    def give(self, turn: Turn) -> None:
        """End a turn (once: a turn already given, or never held, gives nothing)."""
        if not turn.held:
            return
        turn.held = False
        if turn.shared:
            self.reading -= 1
        else:
            self.writing = False
        self._wake()

    def _wake(self) -> None:
        """Hand turns to waiting calls, first come first served, while they are free."""
        while self.waiting and self._free(self.waiting[0]):
            turn = self.waiting.popleft()
            self._enter(turn)
            turn.event.set()


async def exclusive_now() -> None:
    """Make the current task's turn (if a read's) a mutating call's."""
    held = CURRENT.get()
    if held is not None:
        await held[0].exclusive(held[1])
