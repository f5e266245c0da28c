"""A warm shutdown (SIGTERM) that lands while the worker sweeps stops the worker:
RQ raises StopRequested wherever the signal finds it, and a sweep's own
error handling must not take it for a failed sweep and carry on."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from saga_store.testing import assert_eventually
from saga_store.testing.workers import WorkerProcess

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(90)]


def test_a_sigterm_during_a_sweep_stops_the_worker(worker_env: dict[str, str],
                                                     tmp_path: Path) -> None:
    flag = tmp_path / "sweeping"
    env = {**worker_env, "SAGA_TEST_SWEEP_FLAG": str(flag)}
    worker = WorkerProcess(env, "tests.stop_during_sweep_tools", kind="rq",
                           log=tmp_path / "worker.log").start()
    try:
        assert_eventually(flag.exists, timeout=30, what="the worker to start a sweep")
        assert worker.proc is not None
        os.kill(worker.proc.pid, signal.SIGTERM)
        start = time.monotonic()
        try:
            worker.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail("the worker took the SIGTERM inside its sweep for a failed sweep "
                        "and went on; log:\n" + (tmp_path / "worker.log").read_text()[-2000:])
        assert time.monotonic() - start < 10
    finally:
        worker.kill()
