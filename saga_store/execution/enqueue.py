"""What a step or an unwind looks like on its way to a worker: the intent's
fields and the RQ jobs. Shared by the client, the workers and the sweeper."""

from __future__ import annotations

import time
from typing import Any

from saga_store.execution import jobs
from saga_store.execution.idempotency import step_key
from saga_store.protocol import build
from saga_store.protocol.build import Item
from saga_store.tools.spec import ToolSpec


def intent(saga_id: str, n: int, spec: ToolSpec, logged_args: dict[str, Any],
           tool_call_id: str | None, key: str | None = None, *, keyed: bool = False) -> Item:
    """A registered tool's ``step_intent``, keyed by default from (saga, tool, args)."""
    return build.step_intent(n, spec.name, logged_args, spec.reversibility, tool_call_id,
                             key or step_key(saga_id, spec.name, logged_args), keyed=keyed)


def enqueue_step(pipe: Any, queue: str, saga_id: str, step: int, intent_seq: int,
                 idem_key: str) -> None:
    jobs.push(pipe, queue, jobs.step_job_id(idem_key, intent_seq, saga_id), jobs.STEP_FUNC,
              [saga_id, step, intent_seq])


def enqueue_compensation(pipe: Any, saga_id: str) -> None:
    jobs.push(pipe, jobs.COMPENSATION_QUEUE, jobs.compensation_job_id(saga_id),
              jobs.COMPENSATE_FUNC, [saga_id])


def now_ms() -> int:
    return time.time_ns() // 1_000_000
