"""What a step or an unwind looks like on its way to a worker: the intent's
fields and the RQ jobs. Shared by the client, the workers and the sweeper."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from saga_store import keys
from saga_store.errors import InvalidInput
from saga_store.execution import jobs
from saga_store.execution.idempotency import step_key
from saga_store.ids import SCOPED_AGENT, agent_of, check_saga_id
from saga_store.keys import SagaKeys
from saga_store.log.layout import names_of
from saga_store.log.scripts import SCHEDULE
from saga_store.ops import tracing
from saga_store.protocol import build
from saga_store.protocol.build import Item
from saga_store.tools.spec import ToolSpec


def intent(saga_id: str, n: int, spec: ToolSpec, logged_args: dict[str, Any],
           tool_call_id: str | None, key: str | None = None, *, keyed: bool = False,
           trace: Mapping[str, str] | None = None) -> Item:
    """A registered tool's ``step_intent``, keyed by default from (saga, tool, args),
    with the caller's span context (``trace``, else the current one, if any)."""
    return build.step_intent(n, spec.name, logged_args, spec.reversibility, tool_call_id,
                             key or step_key(saga_id, spec.name, logged_args), keyed=keyed,
                             trace=trace or tracing.carrier())


def enqueue_step(pipe: Any, queue: str, saga_id: str, step: int, intent_seq: int,
                 idem_key: str, tool: str | None = None) -> None:
    """Queue a step's job; ``tool`` names it in the worker's log line."""
    what = f"saga {saga_id} step {step}" + (f" {tool}" if tool else "")
    jobs.push(pipe, queue, jobs.step_job_id(idem_key, intent_seq, saga_id), jobs.STEP_FUNC,
              [saga_id, step, intent_seq], what)


def enqueue_compensation(pipe: Any, saga_id: str) -> None:
    jobs.push(pipe, jobs.COMPENSATION_QUEUE, jobs.compensation_job_id(saga_id),
              jobs.COMPENSATE_FUNC, [saga_id], f"saga {saga_id} unwind")


def schedule(pipe: Any, names: SagaKeys, saga_id: str, after_ms: int, *,
             nx: bool = False) -> None:
    """Queue on ``pipe``: look at the saga ``after_ms`` from now by Redis's clock,
    as the sweepers do (in its index of sagas in flight: its agent's own, see
    :meth:`SagaKeys.active`; the agent is listed for the sweeper in the same trip).
    A time from this host's clock would put the look off by as much as it runs
    ahead. Two commands for an agent's saga, else one; the first replies 1 if the
    saga was added."""
    index = names.active(saga_id)
    pipe.eval(SCHEDULE, 1, index, saga_id, int(after_ms), "nx" if nx else "")
    if agent_of(saga_id) is not None:
        pipe.sadd(names.agents_list(saga_id), str(agent_of(saga_id)))


def unschedule(pipe: Any, names: SagaKeys, saga_id: str) -> None:
    """Queue on ``pipe``: the saga has no work in flight any more."""
    pipe.zrem(names.active(saga_id), saga_id)


def indexes(client: Any, names: SagaKeys, buckets: list[int] | None = None,
            ) -> list[tuple[str, str | None]]:
    """Every index of sagas in flight, with the agent it is of: the shared ones
    (None; of layout 3 one per bucket, those of ``buckets`` only if given), then
    each listed agent's. ``ss:agents`` takes any string from an agent
    user: only names an agent can own are read, the rest are ignored."""
    agents = _owners(client.smembers(keys.AGENTS))
    in_buckets: dict[int, list[str]] = {}
    if names.bucketed:
        shared = list(names.all_buckets()) if buckets is None else buckets
        pipe = client.pipeline(transaction=False)
        for b in shared:
            pipe.smembers(names.bucket_agents(b))
        for b, listed in zip(shared, pipe.execute(), strict=True):
            if listed:
                in_buckets[b] = _owners(listed)
    return names.all_active(agents, buckets, in_buckets)


def _owners(listed: Any) -> list[str]:
    """The names in an agents list that an agent can own (any string may be there:
    an agent user adds names)."""
    return sorted(a for a in {x.decode("utf-8", "replace") for x in listed}
                  if SCOPED_AGENT.fullmatch(a))


def belongs(saga_id: str, agent: str | None) -> bool:
    """Whether ``saga_id`` is one the index of ``agent`` (None: the shared one) may
    hold: a usable saga id, in that agent's namespace. The shared index may also
    hold agents' sagas written there before they had indexes of their own."""
    try:
        check_saga_id(saga_id)
    except InvalidInput:
        return False
    return agent is None or agent_of(saga_id) == agent


def in_flight(client: Any, names: SagaKeys | None = None) -> list[str]:
    """The ids of every saga with work in flight, from all indexes (entries that do
    not belong where they are are left out); ``names``: the store's key names (read
    from its layout if not given)."""
    found = indexes(client, names or names_of(client))
    pipe = client.pipeline(transaction=False)
    for index, _ in found:
        pipe.zrange(index, 0, -1)
    out = []
    for (_, agent), members in zip(found, pipe.execute(raise_on_error=False), strict=True):
        if isinstance(members, Exception):
            continue
        out += [sid for raw in members
                if belongs(sid := raw.decode("utf-8", "replace"), agent)]
    return out


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def server_ms(client: Any) -> int:
    """Redis's clock, in ms: for times that processes on other hosts compare, whose
    own clocks need not agree."""
    secs, micros = client.time()
    return int(secs) * 1000 + int(micros) // 1000
