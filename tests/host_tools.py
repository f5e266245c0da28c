"""Tools for the multi-host tests: each call writes to the test's own ledger which
host ran it (its hostname), so a test tells from its ledger, not from the log,
where a step ran and where it ran again. The ledger tools come along for plans
with real effects around the slow step."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from saga_store import Reversibility, StepContext, tool

from .ledger_tools import (  # noqa: F401  # registered with this module's tools
    charge_payment,
    effect,
    effects,
    refund_payment,
    release_inventory,
    reserve_inventory,
)


@tool(reversibility=Reversibility.READONLY, timeout=3)
def host_sleep(seconds: float, ctx: StepContext) -> dict[str, Any]:
    """Sleep on this host: ``started`` once per attempt, ``slept`` once per key."""
    host = socket.gethostname()
    effect("started", f"{ctx.idempotency_key}:{ctx.attempt}:{host}", host)
    time.sleep(seconds)
    effect("slept", ctx.idempotency_key, host)
    return {"host": host}


def gate(host: str) -> Path:
    """While this file exists, :func:`host_hold` on ``host`` waits."""
    return Path(os.environ["SAGA_TEST_LEDGER"] + f".hold-{host}")


@tool(reversibility=Reversibility.READONLY, timeout=10)
def host_hold(ctx: StepContext) -> dict[str, Any]:
    """A call that runs as long as the test holds its host's gate (at most 8 s):
    ``started`` per attempt, ``returned`` per attempt as it returns, ``held`` once
    per key (the effect, honouring the key)."""
    host = socket.gethostname()
    effect("started", f"{ctx.idempotency_key}:{ctx.attempt}:{host}", host)
    deadline = time.monotonic() + 8
    while gate(host).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    effect("held", ctx.idempotency_key, host)
    effect("returned", f"{ctx.idempotency_key}:{ctx.attempt}:{host}", host)
    return {"host": host}

