"""Tools for the console tests: a step that waits until the test opens its gate,
so a test can watch a saga while it is running and then let it finish."""

from __future__ import annotations

import os
import time
from typing import Any

from saga_store import Reversibility, tool


def gate_path(gate: str) -> str:
    return f"{os.environ['SAGA_TEST_LEDGER']}.gate-{gate}"


@tool(reversibility=Reversibility.READONLY, timeout=60)
def wait_for_gate(gate: str) -> dict[str, Any]:
    """Return once the test created the gate's file (a real outside event)."""
    deadline = time.monotonic() + 55
    while not os.path.exists(gate_path(gate)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"gate {gate} was never opened")
        time.sleep(0.02)
    return {"gate": gate, "opened": True}
