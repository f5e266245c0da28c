"""``saga ls``: sagas newest first, a page of the ledger at a time (the console's
listing), and ``--follow`` to keep the newest page on screen as it changes."""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import click

from saga_store import keys
from saga_store.console.listing import Filters, Row, list_page, newest
from saga_store.ids import check_id
from saga_store.log.store import EventStore
from saga_store.protocol.state import Status

from .common import Context, emit_json, errors_to_exit, pass_ctx

STATES = [s.value for s in Status]
PAGE = 100
_AGO = re.compile(r"^(\d+)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


if TYPE_CHECKING:  # generic from click 8.2 on; the floor is 8.1
    _SinceBase = click.ParamType[int, Any]
else:
    _SinceBase = click.ParamType


class Since(_SinceBase):
    """``1h``, ``30m``, ``2d`` ago, or a UTC date and time (``2026-12-01T10:00``)."""

    name = "since"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip()
        m = _AGO.match(text)
        if m:
            return int((time.time() - int(m[1]) * _UNIT_S[m[2]]) * 1000)
        try:
            t = dt.datetime.fromisoformat(text)
        except ValueError:
            self.fail(f"{text!r}: give an age (30s, 15m, 1h, 2d) or a UTC date and time "
                      "(2026-12-01T10:00)", param, ctx)
        return int(t.replace(tzinfo=t.tzinfo or dt.UTC).timestamp() * 1000)


def rows(store: EventStore, filters: Filters, limit: int) -> Iterator[Row]:
    """Up to ``limit`` sagas (0: all), newest first: only the sagas shown are read.
    A ledger in buckets is read in one pass over every bucket's chain, merged by
    time, as far as the listing goes (paging by time would read the newest
    buckets' entries again for every page); one chain a page at a time."""
    if store.log.layout.version >= 2:
        now = time.time_ns() // 1_000_000
        for n, o in enumerate(newest(store, filters), 1):
            yield Row.of(store.state(o.saga_id), now)
            if n == limit:
                return
        return
    cursor: int | None = None
    given = 0
    while True:
        size = PAGE if not limit else min(PAGE, limit - given)
        page = list_page(store, filters, cursor, size)
        yield from page.rows
        given += len(page.rows)
        if page.next_cursor is None or (limit and given >= limit):
            return
        cursor = int(page.next_cursor)


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _took(ms: int | None) -> str:
    if ms is None:
        return "-"
    s = ms / 1000
    if s < 60:
        return f"{s:.1f}s"
    return f"{int(s // 60)}m{int(s % 60):02d}s" if s < 3600 else f"{s / 3600:.1f}h"


def to_dict(r: Row) -> dict[str, Any]:
    return {"saga_id": r.saga_id, "state": r.state, "agent_id": r.agent_id,
            "created": _iso(r.created_ms), "created_ms": r.created_ms,
            "duration_ms": r.duration_ms, "steps": r.steps, "events": r.events,
            "seq": r.events - 1, "updated_ms": r.updated_ms,
            "conversation_id": r.conversation_id}


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")


COLUMNS = (("SAGA ID", 26), ("STATE", 15), ("AGENT", 12), ("CREATED (UTC)", 19),
           ("DURATION", 8), ("STEPS", 5), ("EVENTS", 6))
WIDE = (("UPDATED (UTC)", 19), ("CONVERSATION", 0))


def widths(found: list[Row], wide: bool) -> list[tuple[str, int]]:
    """Each column's name and width: ids and agents as wide as the longest shown."""
    cols = list(COLUMNS + (WIDE if wide else ()))
    longest = {"SAGA ID": max((len(r.saga_id) for r in found), default=0),
               "AGENT": max((len(r.agent_id or "") for r in found), default=0)}
    return [(n, max(w, longest.get(n, 0))) for n, w in cols]


def header(cols: list[tuple[str, int]]) -> str:
    return " ".join(f"{name:<{w}}" if w else name for name, w in cols).rstrip()


def line(r: Row, cols: list[tuple[str, int]]) -> str:
    cells = [r.saga_id, r.state, r.agent_id or "", _when(r.created_ms), _took(r.duration_ms),
             str(r.steps), str(r.events)]
    if len(cols) > len(COLUMNS):
        cells += [_when(r.updated_ms), r.conversation_id or "-"]
    out = []
    for cell, (_, w) in zip(cells, cols, strict=True):
        out.append(f"{cell:>{w}}" if cell.isdigit() else f"{cell:<{w}}")
    return " ".join(out).rstrip()


@click.command("ls")
@click.option("--state", "state", type=click.Choice(STATES), envvar="SAGA_LS_STATE",
              help="Only sagas in this state.")
@click.option("--agent", "agent", default=None, envvar="SAGA_LS_AGENT",
              help="Only this agent's sagas.")
@click.option("--since", "since_ms", type=Since(), default=None, envvar="SAGA_LS_SINCE",
              help="Only sagas opened since: an age (30m, 1h, 2d) or a UTC date and time "
                   "(2026-12-01T10:00).")
@click.option("--limit", type=click.IntRange(0), default=100, show_default=True,
              envvar="SAGA_LS_LIMIT", help="At most this many, newest first (0: all).")
@click.option("--wide", is_flag=True, envvar="SAGA_LS_WIDE",
              help="Also the last event's time and the conversation.")
@click.option("--follow", "-f", "follow", is_flag=True, envvar="SAGA_LS_FOLLOW",
              help="Keep watching: print a saga again each time it changes (Ctrl-C stops).")
@click.option("--json", "as_json", is_flag=True, envvar="SAGA_JSON",
              help="Machine-readable output (with --follow: one object per line).")
@pass_ctx
def ls(ctx: Context, state: str | None, agent: str | None, since_ms: int | None, limit: int,
       wide: bool, follow: bool, as_json: bool) -> None:
    """List sagas, newest first: state, agent, created (UTC), duration, steps, events.

    Reads the ledger from its newest entry back (of a ledger in buckets, every
    bucket's chain, merged by time) and folds only the sagas it lists.
    """
    with errors_to_exit():
        store = ctx.store()
        filters = Filters(state, check_id(agent, "agent") if agent else None, since_ms)
        found = list(rows(store, filters, limit))
        if as_json and not follow:
            emit_json([to_dict(r) for r in found])
            return
        show = _printer(widths(found, wide), as_json)
        for r in found:
            show(r)
        if follow:
            _follow(store, filters, limit or PAGE, found, show)


def _printer(cols: list[tuple[str, int]], as_json: bool) -> Any:
    if as_json:
        import orjson
        return lambda r: click.echo(orjson.dumps(to_dict(r)).decode())
    state = {"header": False}

    def show(r: Row) -> None:
        if not state["header"]:
            click.echo(header(cols))
            state["header"] = True
        click.echo(line(r, cols))
    return show


def _follow(store: EventStore, filters: Filters, limit: int, shown: list[Row],
            show: Any) -> None:
    """Print each saga of the newest page again whenever its state or event count
    changes, until Ctrl-C. Woken by the ledger (XREAD BLOCK) or after a second; the
    page is read again only when the cached projections or the ledger moved."""
    seen = {r.saga_id: (r.state, r.events) for r in shown}

    def show_moved() -> None:
        for r in reversed(list(rows(store, filters, limit))):
            if seen.get(r.saga_id) != (r.state, r.events):
                seen[r.saga_id] = (r.state, r.events)
                show(r)
    bucketed = store.log.layout.version >= 2  # many ledger chains: look each second
    head = store.log.head(keys.LEDGER_ID).seq
    last = _pulse(store, list(seen))
    try:
        show_moved()  # what moved between the listing and the first pulse
        while True:
            if bucketed:
                time.sleep(1.0)
                woke = []
            else:
                woke = store.log.wait(keys.LEDGER_ID, head, 1000)
            if woke:
                head = keys.seq_of_entry_id(woke[-1].entry_id)
            now = _pulse(store, list(seen))
            if now == last and not woke:
                continue
            last = now
            show_moved()
    except KeyboardInterrupt:
        return


def _pulse(store: EventStore, ids: list[str]) -> list[Any]:
    """What changes when any listed saga or the ledger moves: each saga's cached
    state and seq, and the ledger's pending length (one round trip)."""
    pipe = store.redis.pipeline(transaction=False)
    for sid in ids:
        pipe.hmget(store.keys.meta(sid), "state", "seq")
    replies = list(pipe.execute())
    return [*replies, store.ledger.backlog(), store.ledger.heads()]


COMMANDS = [ls]
