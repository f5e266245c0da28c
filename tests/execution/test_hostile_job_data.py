"""Hostile job data: a job hash whose ``data`` is a zip bomb is refused without
being inflated, in the decoder and in a real worker, which then goes on with
the next saga."""

from __future__ import annotations

import tracemalloc
import zlib
from pathlib import Path

import orjson
import pytest
import redis

from saga_store.client.api import SagaStore
from saga_store.execution import jobs
from saga_store.protocol.state import Status
from saga_store.testing import assert_eventually
from saga_store.testing.workers import WorkerProcess, workers

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
TOOLS = "tests.ledger_tools"
MiB = 1 << 20
PLAN = [{"tool": "reserve_inventory", "args": {"sku": "Z", "qty": 1}}]


def zip_bomb(inflated: int) -> bytes:
    """zlib of ``inflated`` zero bytes, built a MiB at a time so the test itself
    never holds what the bomb inflates to."""
    deflater = zlib.compressobj(9)
    chunk = bytes(MiB)
    parts = [deflater.compress(chunk) for _ in range(inflated // MiB)]
    return b"".join(parts) + deflater.flush()


def test_a_zip_bomb_is_refused_without_inflating_it() -> None:
    """zlib of 50 MB of zeros (about 50 KB) decodes to None, allocating under 1 MiB."""
    bomb = zip_bomb(50 * MiB)
    tracemalloc.start()
    try:
        assert jobs.decode(bomb) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MiB, f"decoding the bomb allocated {peak / MiB:.1f} MiB"
    assert len(bomb) < jobs.MAX_JOB_DATA  # the length check let it by: the inflate cap held


def test_job_data_up_to_the_cap_decodes_and_past_it_is_refused() -> None:
    """The cap is on the inflated JSON: exactly MAX_JOB_DATA bytes is a job, one more is
    not; raw data longer than the cap is refused before inflating."""
    body = orjson.dumps([jobs.STEP_FUNC, None, ["01M8Q7MTHMG2KCVRH5MMK3YGPB", 0, 1], {}])
    at_cap = body + b" " * (jobs.MAX_JOB_DATA - len(body))
    assert jobs.decode(zlib.compress(at_cap)) == (jobs.STEP_FUNC,
                                                  ["01M8Q7MTHMG2KCVRH5MMK3YGPB", 0, 1])
    assert jobs.decode(at_cap) is not None  # plain JSON, not compressed: also ours
    assert jobs.decode(zlib.compress(at_cap + b" ")) is None
    assert jobs.decode(at_cap + b" ") is None
    assert jobs.decode(zlib.compress(body)[:-4]) is None  # a cut stream


def _peak_rss(worker: WorkerProcess) -> int:
    """The worker process's peak resident memory so far, in bytes (VmHWM)."""
    assert worker.proc is not None
    status = Path(f"/proc/{worker.proc.pid}/status").read_text()
    line = next(ln for ln in status.splitlines() if ln.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def test_a_worker_refuses_a_zip_bomb_job_and_runs_the_next_one(
        saga_store: SagaStore, client: redis.Redis, worker_env: dict[str, str],
        ledger: Path, tmp_path: Path) -> None:
    """A zip-bomb job queued between two sagas is refused and counted as not ours; the
    worker's peak memory grows by under 16 MiB and the saga behind it commits."""
    log = tmp_path / "worker.log"
    with workers(worker_env, TOOLS, log=log) as (worker,):
        first = saga_store.submit(PLAN, agent_id="agent-z")
        assert saga_store.wait(first, timeout=60).status is Status.COMMITTED
        before = _peak_rss(worker)  # warmed up: imports done, one saga run
        client.hset(jobs.job_key("zip-bomb"), mapping={
            "data": zip_bomb(50 * MiB), "origin": jobs.STEP_QUEUE, "status": "queued"})
        client.rpush(jobs.queue_key(jobs.STEP_QUEUE), "zip-bomb")
        second = saga_store.submit(PLAN, agent_id="agent-z")
        assert saga_store.wait(second, timeout=60).status is Status.COMMITTED
        assert_eventually(lambda: "refused job zip-bomb" in log.read_text(), timeout=10,
                          what="the worker's refusal line")
        grew = _peak_rss(worker) - before
        assert worker.alive
    assert "Traceback" not in log.read_text()
    assert grew < 16 * MiB, f"the worker's peak memory grew by {grew / MiB:.1f} MiB"
