"""The sagas list: newest first, filtered, a page at a time.

Ids come from the ledger's opening entries, read backwards (XREVRANGE) in
chunks, never the whole ledger; entries written but not yet chained (the
pending list, about a second's worth) come first. Filters on agent and time
use the ledger entry itself, the state filter the cached projection in
``ss:{S}:meta`` (one pipelined HGET per chunk). Only the sagas on the page
shown are folded from their logs, and what they show is the fold.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import orjson

from saga_store import SagaState, keys
from saga_store.log.events import EventKind as K
from saga_store.log.store import EventStore
from saga_store.log.stream import body_and_hash, command

from . import states

CHUNK = 200
MAX_SCAN = 5000  # ledger entries one request reads at most, however selective the filter


@dataclass(frozen=True)
class Filters:
    state: str | None = None
    agent: str | None = None
    since_ms: int | None = None  # when the ledger recorded the saga's opening
    until_ms: int | None = None


@dataclass
class Row:
    saga_id: str
    state: str
    agent_id: str | None
    created_ms: int | None
    duration_ms: int | None
    steps: int
    events: int = 0  # from the log as folded, never the cached meta
    updated_ms: int | None = None
    conversation_id: str | None = None
    shown: states.Shown | None = None  # the state in an operator's words

    @classmethod
    def of(cls, st: SagaState, now_ms: int) -> Row:
        end = st.updated_ts if st.final else now_ms
        duration = end - st.created_ts if st.created_ts is not None and end else None
        return cls(st.saga_id, str(st.status), st.agent_id, st.created_ts, duration,
                   len(st.steps), st.seq + 1, st.updated_ts, st.conversation_id,
                   states.shown(st))


@dataclass
class Page:
    rows: list[Row]
    next_cursor: str | None  # ledger seq to continue below, or None at the end
    scanned: int


@dataclass(frozen=True)
class Opening:
    saga_id: str
    agent_id: str | None
    ts: int
    seq: int  # ledger seq; -1 for an entry still pending


def _opening(body: dict[str, Any], seq: int) -> Opening | None:
    data = body.get("data") or {}
    sid = data.get("saga_id")
    if body.get("kind") != K.LEDGER_OPENED or not isinstance(sid, str):
        return None
    return Opening(sid, data.get("agent_id"), int(body.get("ts") or 0), seq)


def _pending(store: EventStore) -> list[Opening]:
    found = (_opening(b, -1) for b in reversed(store.ledger.pending()))
    return [o for o in found if o is not None]


def _chunk(store: EventStore, below: int | None) -> tuple[list[Opening], int | None]:
    """Up to CHUNK ledger entries before seq ``below`` (newest first), and the seq
    to continue below (None once the start is reached)."""
    top = "+" if below is None else keys.entry_id(below - 1)
    if below is not None and below <= 0:
        return [], None
    rows = command(store.log.raw, "XREVRANGE", keys.LEDGER_LOG, top, "-", "COUNT", CHUNK)
    out = []
    for eid, fields in rows:
        seq = keys.seq_of_entry_id(eid)
        found = _opening(orjson.loads(body_and_hash(fields)[0]), seq)
        if found is not None:
            out.append(found)
    last = keys.seq_of_entry_id(rows[-1][0]) if rows else 0
    return out, (last if len(rows) == CHUNK and last > 0 else None)


def _states(store: EventStore, openings: list[Opening]) -> list[str | None]:
    pipe = store.redis.pipeline(transaction=False)
    for o in openings:
        pipe.hget(store.keys.meta(o.saga_id), "state")
    return [v.decode() if isinstance(v, bytes) else v for v in pipe.execute()]


def list_page(store: EventStore, filters: Filters, cursor: int | None = None,
              limit: int = 25) -> Page:
    """One page of sagas, newest first. ``cursor`` is a ledger seq from an earlier
    page's ``next_cursor``; the first page (None) also shows pending entries."""
    if store.log.layout.version >= 2:
        return _bucketed_page(store, filters, cursor, limit)
    chosen: list[Opening] = []
    seen: set[str] = set()
    scanned = 0
    below = cursor
    batch = _pending(store) if cursor is None else []
    more = True
    while len(chosen) <= limit and scanned < MAX_SCAN:
        if not batch:
            if not more:
                break
            batch, below = _chunk(store, below)
            more = below is not None
            if not batch and not more:
                break
        scanned += len(batch)
        wanted = [o for o in batch if o.saga_id not in seen and _matches(o, filters)]
        seen.update(o.saga_id for o in batch)
        if filters.state and wanted:
            wanted = [o for o, s in zip(wanted, _states(store, wanted), strict=True)
                      if s == filters.state]
        chosen.extend(wanted)
        if filters.since_ms is not None and batch and batch[-1].ts < filters.since_ms:
            more = False  # the ledger is in order: everything older is out of range
        batch = []
    shown = chosen[:limit]
    if len(chosen) > limit and shown[-1].seq >= 0:
        nxt: int | None = shown[-1].seq
    elif len(chosen) > limit:
        # the page ended among pending entries: go on from the chained ones (entries
        # that were pending past this page are chained meanwhile, above this point,
        # and show on the first page instead)
        nxt = store.log.head(keys.LEDGER_ID).seq + 1
    else:
        nxt = below if more and scanned >= MAX_SCAN else None
    now = time.time_ns() // 1_000_000
    rows = [Row.of(store.state(o.saga_id), now) for o in shown]
    return Page(rows, str(nxt) if nxt is not None else None, scanned)


def _bucketed_page(store: EventStore, filters: Filters, cursor: int | None,
                   limit: int) -> Page:
    """A page of a store whose ledger is split into buckets: the newest openings of
    each bucket's chain (read backwards, as for one chain), merged by time.
    ``cursor`` is a time (ms): the page holds sagas opened before it, and runs past
    ``limit`` to keep sagas opened in the same millisecond together, so none falls
    between two pages. An entry that is not an event is passed over ('saga
    verify' reports it)."""
    want = limit + 1
    found = [o for o in (_opening(b, 0) for b in store.ledger.pending()) if o is not None]
    scanned = len(found)
    for chain in store.ledger.present():
        top: bytes | str = "+"
        kept = 0
        while kept < want and scanned < MAX_SCAN:
            rows = command(store.log.raw, "XREVRANGE", keys.ledger_log(chain), top, "-",
                           "COUNT", min(CHUNK, want))
            scanned += len(rows)
            for _eid, fields in rows:
                try:
                    o = _opening(orjson.loads(body_and_hash(fields)[0]), 0)
                except orjson.JSONDecodeError:
                    continue
                if o is not None and (cursor is None or o.ts < cursor) and _matches(o, filters):
                    found.append(o)
                    kept += 1
            if len(rows) < min(CHUNK, want):
                break
            top = b"(" + rows[-1][0]
    seen: set[str] = set()
    openings = []
    # newest first; of one millisecond, by id (ids one process made then increase)
    for o in sorted(found, key=lambda o: (o.ts, o.saga_id), reverse=True):
        if o.saga_id not in seen and _matches(o, filters):
            seen.add(o.saga_id)
            openings.append(o)
    if filters.state and openings:
        openings = [o for o, st in zip(openings, _states(store, openings), strict=True)
                    if st == filters.state]
    shown = openings[:limit]
    if len(openings) > limit:
        shown += [o for o in openings[limit:] if o.ts == shown[-1].ts]
    nxt = shown[-1].ts if len(openings) > len(shown) else None
    now = time.time_ns() // 1_000_000
    rows_out = [Row.of(store.state(o.saga_id), now) for o in shown]
    return Page(rows_out, str(nxt) if nxt is not None else None, scanned)


def _matches(o: Opening, f: Filters) -> bool:
    if f.agent and o.agent_id != f.agent:
        return False
    if f.since_ms is not None and o.ts and o.ts < f.since_ms:
        return False
    return not (f.until_ms is not None and o.ts > f.until_ms)
