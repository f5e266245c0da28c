"""Retention for the agents' context streams (``ss:ctx:{A}``), run by ``saga
archive``: context events older than the retention cut-off go, except those
from the first event on of a saga still open, which stay for it.

A context stream is a feed: an agent follows it to rebuild what it tells the
model, and reads a saga's state from its log when it needs more (``rebuild``,
``session.states()``). An event's entry id is Redis's clock when it was added,
so ``XTRIM MINID`` drops exactly what is older than a time. Before trimming,
the events the cut-off would drop are read, and the cut-off moves back to the
first event of the first of their sagas that is not closed (its cached state
not final, whoever drives it: workers, an inline executor, an MCP gateway's
session): an open saga keeps its whole feed. Nothing else holds the events of
a closed saga: its log (or its archive) is the record, not the feed.
"""

from __future__ import annotations

from typing import Any

import orjson

from saga_store import keys
from saga_store.ids import check_saga_id, valid_id
from saga_store.protocol.vocab import FINAL

PAGE = 1000  # context events read per round trip, oldest first


def trim(log: Any, closed_before_ms: int) -> tuple[int, int]:
    """Trim every agent's context stream to ``closed_before_ms``, or to the first
    event of its oldest saga still open; returns (streams trimmed, events removed)."""
    r = log.redis
    streams = removed = 0
    for key in r.scan_iter(match=keys.agent_ctx("*"), count=1000):
        name = key.decode() if isinstance(key, bytes) else key
        cut = _cut(log, name, f"{max(closed_before_ms, 0)}-0")
        gone = int(r.xtrim(name, minid=cut, approximate=False))  # exact: not whole nodes
        if gone:
            streams += 1
            removed += gone
    return streams, removed


def _cut(log: Any, stream: str, cut: str) -> str:
    """``cut``, or the entry id of the first event, before it, of a saga not closed."""
    r, names = log.redis, log.keys
    first: dict[str, bytes] = {}  # saga -> the id of its first event before the cut
    start: bytes | str = "-"
    while True:
        rows = r.xrange(stream, start, f"({cut}", count=PAGE)
        for eid, fields in rows:
            try:
                sid = orjson.loads(fields[b"e"]).get("saga_id")
            except (KeyError, orjson.JSONDecodeError, AttributeError):
                continue  # not one of ours: goes with the others
            if isinstance(sid, str) and valid_id(sid, check_saga_id):
                first.setdefault(sid, eid)
        if len(rows) < PAGE:
            break
        start = b"(" + rows[-1][0]
    if not first:
        return cut
    ids = list(first)
    pipe = r.pipeline(transaction=False)
    for sid in ids:
        pipe.hget(names.meta(sid), "state")
    states = pipe.execute()
    open_ = [first[sid] for sid, st in zip(ids, states, strict=True)
             if st is not None and st.decode() not in FINAL]
    if not open_:
        return cut
    return min(open_, key=lambda eid: tuple(map(int, eid.split(b"-")))).decode()
