"""Shared benchmark plumbing: a private redis-server, timing, medians."""

from __future__ import annotations

import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from saga_store.testing import RedisServer


def python_of(checkout: str) -> str:
    """The interpreter to run a checkout with in an A/B benchmark: its own ``.venv``
    if it has one, else this one. Two checkouts must not share an editable install:
    it maps ``saga_store.workers`` and ``saga_store.cli`` to one checkout's
    ``workers/`` and ``cli/``, so both sides would run the same workers."""
    own = Path(checkout) / ".venv" / "bin" / "python"
    return str(own) if own.exists() else sys.executable


def bench_redis() -> RedisServer:
    """A private Redis with AOF (fsync every second, the production setting we document)."""
    return RedisServer(appendfsync="everysec").start()


def median_of(runs: int, fn: Callable[[], float]) -> tuple[float, list[float]]:
    values = [fn() for _ in range(runs)]
    return statistics.median(values), values


def percentile(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def machine() -> dict[str, Any]:
    redis_version = subprocess.run(["redis-server", "--version"], capture_output=True,
                                   text=True, check=False).stdout.split()[2]
    return {"python": platform.python_version(), "cpus": __import__("os").cpu_count(),
            "redis": redis_version, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


PAYLOAD_300 = {"result": {"text": "x" * 278}}  # 300 bytes of canonical JSON
