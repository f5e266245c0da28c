"""Retention for the agents' context streams (``ss:ctx:{A}``), run by ``saga
archive``: context events older than the retention cut-off go, except those
from when the agent's oldest saga still in flight began, which stay for it.

A context stream is a feed: an agent follows it to rebuild what it tells the
model, and reads a saga's state from its log when it needs more (``rebuild``,
``session.states()``). An event's entry id is Redis's clock when it was added,
so ``XTRIM MINID`` drops exactly what is older than a time. A saga still in
flight keeps its agent's stream from its first event on: the cut-off moves back
to a minute before that saga's first event (its writer's clock, which may run
behind Redis's by some seconds). Nothing else holds the events of an archived
saga: its log went to the archive, and the log, not the feed, is the record.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import orjson

from saga_store import keys
from saga_store.execution.enqueue import in_flight

SKEW_MS = 60_000  # how far a writer's clock may run behind Redis's


def trim(log: Any, closed_before_ms: int) -> tuple[int, int]:
    """Trim every agent's context stream to ``closed_before_ms`` (or to its oldest
    saga in flight); returns (streams trimmed, events removed)."""
    r = log.redis
    names = log.keys
    oldest: dict[str, int] = defaultdict(lambda: closed_before_ms)
    flying = in_flight(r, names)
    pipe = r.pipeline(transaction=False)
    for sid in flying:
        pipe.xrange(names.log(sid), count=1)
    for first in pipe.execute() if flying else []:
        if not first:
            continue
        opened = orjson.loads(first[0][1][b"b"])  # saga_started: its agent and time
        agent = opened.get("agent_id")
        if isinstance(agent, str):
            oldest[agent] = min(oldest[agent], int(opened.get("ts") or 0) - SKEW_MS)
    streams = removed = 0
    for key in r.scan_iter(match=keys.agent_ctx("*"), count=1000):
        name = key.decode() if isinstance(key, bytes) else key
        agent = name[len(keys.agent_ctx("")) - 1:-1]
        cut = max(oldest[agent], 0)
        gone = int(r.xtrim(name, minid=f"{cut}-0", approximate=False))
        if gone:
            streams += 1
            removed += gone
    return streams, removed
