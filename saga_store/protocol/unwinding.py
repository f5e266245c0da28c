"""The unwind loop, written once: work that yields what its driver must do.

:func:`unwinding` asks :func:`~saga_store.protocol.unwind.next_action` again
and again and yields each thing to do, as the step driver's work does
(``workers/invoke.py``): a :class:`Write` of events, a
:class:`~saga_store.protocol.unwind.Probe` or a
:class:`~saga_store.protocol.unwind.Compensate` call, a :class:`Wait` before a
compensation's next try. The driver does the I/O and sends the answer back at
the ``yield``: nothing for a write (it appended the events and applied them to
the state it passed in), the call's :class:`~saga_store.protocol.outcome.Outcome`
for a probe or a compensation, nothing for a wait. The loop returns the
:class:`~saga_store.protocol.unwind.Close` to append (or the
:class:`~saga_store.protocol.unwind.Done` that ends it).

The workers' compensator drives it on a worker (calls through the registry,
writes under its lease), the MCP gateway on its event loop (calls through the
downstream server): so both try, probe, key and back off alike, with the same
jitter.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from saga_store.protocol import unwind
from saga_store.protocol.build import Item
from saga_store.protocol.outcome import Outcome
from saga_store.protocol.state import SagaState


@dataclass(frozen=True)
class Write:
    """Append ``items`` and apply them to the state. ``settles``: the compensation
    whose outcome they record (``outcome``), for the driver's count of it."""

    items: list[Item]
    settles: unwind.Compensate | None = None
    outcome: Outcome | None = None


@dataclass(frozen=True)
class Wait:
    """Wait ``seconds`` (a back-off, jittered) before the compensation's next try."""

    seconds: float


Request = Write | unwind.Probe | unwind.Compensate | Wait
Unwinding = Generator[Request, Any, "unwind.Close | unwind.Done"]


def jittered(seconds: float, draw: Callable[[], float] | None = None) -> float:
    """A back-off between half and one and a half times ``seconds`` (``draw``: in
    [0, 1), :func:`random.random` by default): retries of many sagas failing at
    once don't march in step."""
    return seconds * (0.5 + (draw or random.random)())


def unwinding(state: SagaState, tools: unwind.Catalogue) -> Unwinding:
    """Unwind ``state`` (kept current by the driver's writes) to its close, or to
    where it stops (stuck, or not unwinding): see the module's docstring."""
    probed: set[int] = set()  # asked in this pass without a verdict: compensated
    while True:
        act = unwind.next_action(state, tools, frozenset(probed))
        if isinstance(act, unwind.Append):
            yield Write(act.items)
        elif isinstance(act, unwind.Probe):
            probed.add(act.step)
            found: Outcome = yield act
            items = unwind.probed(act, found.result if found.ok else None)
            if items:
                yield Write(items)
        elif isinstance(act, unwind.Compensate):
            yield Write([act.intent])
            outcome: Outcome = yield act
            items, retry_in = unwind.compensated(state, act, outcome, tools.resume_hint)
            yield Write(items, act, outcome)
            if retry_in is not None:
                yield Wait(jittered(retry_in))
        else:
            return act
