"""What the sweeper does with a saga whose look is due, decided without I/O.

A saga in ``ss:active`` is looked at once its score (a time) has passed: a
lease that lapsed means its worker died. :func:`on_sweep` says what follows
from the folded log and the lease's time left.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from saga_store.protocol.state import SagaState
from saga_store.protocol.vocab import Approval, Status


class Sweep(StrEnum):
    RETIRE = "retire"  # final (or no log at all): leaves ss:active, after its ledger debts
    WAIT = "wait"  # a live lease covers it: look again when it can lapse
    UNWIND = "unwind"  # unwinding with nobody at it: queue the compensation
    REDELIVER = "redeliver"  # steps with no outcome and nobody at them: queue them again
    IDLE = "idle"  # waiting on its agent or a person: look again much later
    ABANDON = "abandon"  # driven by a caller whose lease lapsed: abort it, unwind
    HOLD = "hold"  # stuck: a person must act; look again after a lease


@dataclass(frozen=True)
class Swept:
    what: Sweep
    steps: list[tuple[int, int, str]] = field(default_factory=list)  # (step, intent seq, key)


def client_driven(state: SagaState) -> bool:
    """Whether the saga's caller drives it call by call (``with store.saga()``) under
    a client lease (its opening says so: sagas opened before there were client
    leases have none), as opposed to a plan the workers run or a gateway session."""
    return not state.plan and state.executor is None and state.client_lease_ms is not None


def on_sweep(state: SagaState, lease_left_ms: int, driver_left_ms: int | None = None,
             ) -> Swept:
    """What to do with ``state`` when its look is due; ``lease_left_ms`` is the
    lease's PTTL (<= 0: nobody holds it), ``driver_left_ms`` that of a
    client-driven saga's caller (<= 0: it made no call and no keepalive for the
    client lease; None: not client-driven)."""
    if state.final or state.seq < 0:
        return Swept(Sweep.RETIRE)
    if lease_left_ms > 0:
        return Swept(Sweep.WAIT)
    if state.status is Status.COMPENSATING:
        return Swept(Sweep.UNWIND)
    if state.status is Status.RUNNING:
        steps = [(st.step, st.intent_seq, st.idem_key) for st in state.steps.values()
                 if not st.finished and st.idem_key and st.approval is not Approval.REQUESTED]
        if steps:
            return Swept(Sweep.REDELIVER, steps)
        if driver_left_ms is not None and driver_left_ms <= 0:
            return Swept(Sweep.ABANDON)
        return Swept(Sweep.IDLE)
    return Swept(Sweep.HOLD)
