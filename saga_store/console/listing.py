"""The sagas list: newest first, filtered, a page at a time.

Ids come from the ledger's opening entries, read backwards (XREVRANGE) in
chunks, never the whole ledger; entries written but not yet chained (the
pending list, about a second's worth) come first. Filters on agent and time
use the ledger entry itself, the state filter the cached projection in
``ss:{S}:meta`` (one pipelined HGET per chunk). Only the sagas on the page
shown are folded from their logs, and what they show is the fold.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from saga_store import SagaState, keys
from saga_store.log.events import EventKind as K
from saga_store.log.store import EventStore
from saga_store.log.stream import body_and_hash, command

from . import states

CHUNK = 200
MAX_SCAN = 5000  # ledger entries one page reads at most, however selective the filter
FIRST_LOOK = 100  # openings the first read of a bucketed ledger aims to hold, all chains
STATE_BATCH = 200  # openings whose cached state is read in one round trip
_OPENED = b'"kind":"%s"' % K.LEDGER_OPENED.encode()  # as canonical JSON spells it


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
    """A page of a store whose ledger is split into buckets: openings merged from
    every bucket's chain, newest first (:func:`newest`). ``cursor`` is a time (ms):
    the page holds sagas opened before it, and runs past ``limit`` to keep sagas
    opened in the same millisecond together, so none falls between two pages. A
    page reads at most about MAX_SCAN ledger entries: past that it ends early,
    its cursor where the reading stopped (a millisecond is read whole first)."""
    scan = Scan(budget=MAX_SCAN)
    shown: list[Opening] = []
    more = False
    for o in newest(store, filters, below=cursor, scan=scan):
        if len(shown) >= limit and o.ts != shown[-1].ts:
            more = True
            break
        shown.append(o)
    nxt = shown[-1].ts if more else scan.cut
    now = time.time_ns() // 1_000_000
    rows_out = [Row.of(store.state(o.saga_id), now) for o in shown]
    return Page(rows_out, str(nxt) if nxt is not None else None, scan.read)


@dataclass
class Scan:
    """How much of the ledger a listing read, and where it was cut short (a
    budget of None reads as far as the listing goes)."""

    budget: int | None = None
    read: int = 0
    stop_after: int | None = None  # the ms after which a spent listing stops
    cut: int | None = None  # where it stopped early: the next page starts below it

    @property
    def spent(self) -> bool:
        return self.budget is not None and self.read >= self.budget


class _Chain:
    """One ledger chain read backwards (newest first), a chunk at a time."""

    __slots__ = ("buf", "done", "key", "size", "top")

    def __init__(self, chain: str, size: int) -> None:
        self.key = keys.ledger_log(chain)
        self.top: bytes | str = "+"
        self.buf: deque[Opening] = deque()
        self.done = False
        self.size = size

    def queue(self, pipe: Any) -> None:
        pipe.execute_command("XREVRANGE", self.key, self.top, "-", "COUNT", self.size)

    def take(self, rows: list[Any], below: int | None) -> int:
        """Take in a chunk read by :meth:`queue`; returns how many entries it held."""
        for _eid, fields in rows:
            body = body_and_hash(fields)[0]
            if _OPENED not in body:  # a close: not listed, no need to parse
                continue
            try:
                o = _opening(orjson.loads(body), 0)
            except orjson.JSONDecodeError:
                continue  # not an event ('saga verify' reports it)
            if o is not None and (below is None or o.ts < below):
                self.buf.append(o)
        if len(rows) < self.size:
            self.done = True
        else:
            self.top = b"(" + rows[-1][0]
            self.size = min(self.size * 2, CHUNK)
        return len(rows)


def _order(o: Opening) -> tuple[int, str, str]:
    """Newest is greatest: by time, then (of one millisecond) by the id's own part
    (what follows the agent's prefix: ids one process made then increase), then
    the whole id."""
    return o.ts, o.saga_id.rpartition("_")[2], o.saga_id


class _Head:
    """A chain's newest unlisted opening, ordered for a heap that pops the newest
    first (see :func:`_order`)."""

    __slots__ = ("chain", "key")

    def __init__(self, chain: _Chain) -> None:
        self.chain = chain
        self.key = _order(chain.buf[0])

    def __lt__(self, other: _Head) -> bool:
        return self.key > other.key


def newest(store: EventStore, filters: Filters, below: int | None = None,
           scan: Scan | None = None) -> Iterator[Opening]:
    """Every saga's opening that ``filters`` keeps, newest first, each once: the
    pending entries and every ledger chain, each chain read backwards a chunk at a
    time and merged by time (a chain holds its entries in the order they were
    written). Only as much of each chain is read as the listing consumes; chains
    that run dry are read again together, in one round trip. ``below``: only
    sagas opened before this time (ms)."""
    scan = scan if scan is not None else Scan()
    pending = [o for o in (_opening(b, 0) for b in store.ledger.pending()) if o is not None
               and (below is None or o.ts < below)]
    scan.read += len(pending)
    chains = store.ledger.present()
    size = max(4, min(CHUNK, 2 * FIRST_LOOK // max(len(chains), 1) + 4))
    first = _Chain("pending", 0)  # what is written, not yet chained: newest of all
    first.buf.extend(sorted(pending, key=_order, reverse=True))
    first.done = True
    readers = [first, *(_Chain(c, size) for c in chains)]
    heap: list[_Head] = []
    _read(store, readers, below, scan, heap)
    seen: set[str] = set()
    batch: list[Opening] = []
    while heap:
        head = heapq.heappop(heap)
        o = head.chain.buf.popleft()
        if head.chain.buf:
            heapq.heappush(heap, _Head(head.chain))
        elif not head.chain.done:
            _read(store, [head.chain], below, scan, heap)
        if filters.since_ms is not None and o.ts < filters.since_ms:
            break  # newest first: everything after is older still
        if scan.stop_after is not None and o.ts < scan.stop_after:
            scan.cut = scan.stop_after  # every opening from that ms on was looked at
            break
        if scan.spent and scan.stop_after is None:
            scan.stop_after = o.ts  # out of budget: end once this ms is read whole
        if o.saga_id in seen or not _matches(o, filters):
            continue
        seen.add(o.saga_id)
        batch.append(o)
        if len(batch) >= STATE_BATCH or not filters.state:
            yield from _with_state(store, batch, filters)
            batch = []
    yield from _with_state(store, batch, filters)


def _read(store: EventStore, chains: list[_Chain], below: int | None, scan: Scan,
          heap: list[_Head]) -> None:
    """Read the next chunk of each of ``chains`` (one round trip), again for those
    whose chunk held no opening, until each has one or is done; push each onto
    ``heap``."""
    todo = [c for c in chains if not c.done]
    while todo:
        pipe: Any = store.log.raw.pipeline(transaction=False)
        for c in todo:
            c.queue(pipe)
        for c, rows in zip(todo, pipe.execute(), strict=True):
            scan.read += c.take(rows, below)
        todo = [c for c in todo if not c.buf and not c.done]
    for c in chains:
        if c.buf:
            heapq.heappush(heap, _Head(c))


def _with_state(store: EventStore, batch: list[Opening], filters: Filters) -> list[Opening]:
    if not filters.state or not batch:
        return batch
    return [o for o, st in zip(batch, _states(store, batch), strict=True)
            if st == filters.state]


def _matches(o: Opening, f: Filters) -> bool:
    if f.agent and o.agent_id != f.agent:
        return False
    if f.since_ms is not None and o.ts and o.ts < f.since_ms:
        return False
    return not (f.until_ms is not None and o.ts > f.until_ms)
