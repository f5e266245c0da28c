"""Tools for one test: this worker's sweep pauses at its approval-deadline check
(and says so in a file), so a SIGTERM lands inside a sweep every time."""

from __future__ import annotations

import os
import time
from typing import Any

from saga_store.workers import sweeper as _sweeper

from saga_store import tool

_real = _sweeper.approvals


class _Paused:
    def __getattr__(self, name: str) -> Any:
        return getattr(_real, name)

    @staticmethod
    def expire_due(*args: Any, **kwargs: Any) -> Any:
        flag = os.environ.get("SAGA_TEST_SWEEP_FLAG")
        if flag:
            with open(flag, "w"):
                pass
            time.sleep(30)  # the window the test's SIGTERM lands in
        return _real.expire_due(*args, **kwargs)


_sweeper.approvals = _Paused()  # type: ignore[assignment]


@tool
def nothing() -> dict[str, Any]:
    return {}
