"""What a saga waits for, in words, for ``saga run --wait``: a person's approval,
a retry, a step in doubt, an unwind. Printed to stderr as it changes, so a wait
that lasts is never silent about why (and ``--json``'s stdout stays one object)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import click

from saga_store.protocol.state import SagaState, StepState
from saga_store.protocol.vocab import CompStatus, Status, StepStatus


def _name(st: StepState) -> str:
    return f"step {st.step} ({st.tool or '?'})"


def _short(error: object, limit: int = 160) -> str:
    text = str(error)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def waiting_for(state: SagaState) -> str | None:
    """What ``state``'s saga is held by, or None while it simply runs (or is done)."""
    if state.final or state.status is Status.STUCK:
        return None
    sid = state.saga_id
    asks = [state.steps[n] for n in state.pending_approvals]
    if asks:
        return "; ".join(f"{_name(st)} waits for a person's approval: saga approve {sid} "
                         f"{st.step} (or saga deny {sid} {st.step} --reason ...)"
                         for st in asks)
    steps = sorted(state.steps.values(), key=lambda st: st.step, reverse=True)
    if state.status is Status.COMPENSATING:
        for st in steps:
            tries = st.compensation_attempts
            if st.compensation is CompStatus.FAILED:
                return (f"compensating: undoing {_name(st)} failed on try {tries} "
                        f"({_short(st.error)}); retrying")
            if st.compensation is CompStatus.INTENT:
                return f"compensating: undoing {_name(st)}" + (
                    f" (try {tries})" if tries > 1 else "")
        for st in steps:
            if st.status is StepStatus.IN_DOUBT:
                return (f"compensating; {_name(st)} is in doubt ({_short(st.error)}): "
                        "its probe decides whether to undo it")
        why = state.reason.get("reason") if isinstance(state.reason, dict) else state.reason
        return f"compensating ({_short(why)})" if why else "compensating"
    for st in steps:
        if st.status is StepStatus.IN_DOUBT:
            return f"{_name(st)} is in doubt ({_short(st.error)}); its probe decides"
        if st.status is StepStatus.STARTED and st.attempts > 1:
            why = f": the last try ended with {_short(st.error)}" if st.error else (
                ": the last delivery did not finish")
            return f"{_name(st)} is retrying (attempt {st.attempts}){why}"
    return None


class WaitReporter:
    """Called on every round of a wait: prints what the saga waits for to stderr
    each time that changes, and runs ``then`` (the no-worker warning)."""

    def __init__(self, state: SagaState, then: object = None) -> None:
        self.state, self.then = state, then
        self.last: str | None = None

    def __call__(self) -> None:
        now = waiting_for(self.state)
        if now is not None and now != self.last:
            click.echo(f"saga {self.state.saga_id}: {now}", err=True)
        self.last = now
        if callable(self.then):
            self.then()


def remaining(began: float, timeout: float) -> float:
    """What is left of ``timeout`` seconds counted from ``began`` (time.monotonic)."""
    return max(0.0, timeout - (time.monotonic() - began))


def process_started() -> float:
    """This process's start on the time.monotonic() clock (Linux's /proc; elsewhere,
    now): a --timeout then counts the interpreter's start and imports, as the person
    who typed the command does. A start over 10 s ago is a process that exec'd this
    one after work of its own: then now."""
    try:
        stat = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        age = uptime - int(stat[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
    except (OSError, ValueError, IndexError):
        return time.monotonic()
    return time.monotonic() - (age if 0.0 <= age <= 10.0 else 0.0)
