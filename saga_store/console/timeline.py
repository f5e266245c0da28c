"""A saga's timeline, drawn: what the saga page shows of its events.

Each forward step gets a lane (waiting for approval, then running, to its
outcome); the unwind follows with a lane per step it dealt with, in the order
it did so (last step first), so the drawing shows the compensations running
back over the steps. In-doubt outcomes, probes and approval decisions are
marks on their lanes. Geometry is computed here, in SVG user units, so the
template only draws it (no inline styles or scripts on the page).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from saga_store.log.events import EventKind as K

from .masking import short_json

WIDTH, LABEL_W, ROW_H, TOP = 960, 230, 26, 22
CHART_W = WIDTH - LABEL_W - 40  # room for the last tick's label


@dataclass
class Lane:
    label: str
    kind: str  # forward, unwind
    y: float = 0.0


@dataclass
class Bar:
    lane: int
    start: int
    end: int
    cls: str
    title: str
    x: float = 0.0
    width: float = 0.0
    y: float = 0.0


@dataclass
class Mark:
    lane: int
    at: int
    cls: str
    title: str
    x: float = 0.0
    y: float = 0.0


@dataclass
class EventRow:
    seq: int
    time: str
    offset: str
    step: int | None
    kind: str
    tool: str
    phase: str
    detail: str
    took: str


def _detail(kind: str, data: Any) -> str:
    """An event's data in one line; a person's name and note first, where the
    event records them, since the rest (a stuck reason) is cut to fit."""
    if kind == K.SAGA_RESUMED and isinstance(data, dict) and data.get("by"):
        who = f"resumed by {data['by']}" + (f": {data['note']}" if data.get("note") else "")
        return f"{who}; after {short_json(data.get('after'))}"
    return short_json(data)


@dataclass
class Timeline:
    lanes: list[Lane] = field(default_factory=list)
    bars: list[Bar] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    events: list[EventRow] = field(default_factory=list)
    span_ms: int = 0
    height: float = 0.0
    ticks: list[tuple[float, str]] = field(default_factory=list)
    unwind_x: float | None = None

    width: int = WIDTH
    label_w: int = LABEL_W


def utc(ms: int | None, with_date: bool = True) -> str:
    if ms is None:
        return ""
    t = dt.datetime.fromtimestamp(ms / 1000, dt.UTC)
    return t.strftime("%Y-%m-%d %H:%M:%S UTC" if with_date else "%H:%M:%S.%f")[
        : None if with_date else -3]


def duration(ms: int | None) -> str:
    """``ms`` as a person reads it: 840 ms, 2.4 s, 3 min 5 s, 2 h 10 min."""
    if ms is None:
        return ""
    if ms < 1000:
        return f"{ms} ms"
    s = ms / 1000
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60)} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60)} min"


_OUTCOME: dict[str, str] = {K.STEP_SUCCEEDED: "succeeded", K.STEP_FAILED: "failed",
            K.STEP_IN_DOUBT: "in_doubt"}
_UNWIND_KINDS = {K.COMPENSATION_INTENT, K.COMPENSATION_SUCCEEDED, K.COMPENSATION_FAILED,
                 K.STEP_NOT_COMPENSABLE}


class _Builder:
    def __init__(self, now_ms: int) -> None:
        self.tl = Timeline()
        self.now = now_ms
        self.forward: dict[int, int] = {}  # step -> lane
        self.unwind: dict[int, int] = {}
        self.open: dict[tuple[int, str], tuple[int, str]] = {}  # (lane, what) -> (ts, title)
        self.unwinding = False

    def lane(self, step: int, tool: str, unwind: bool) -> int:
        lanes = self.unwind if unwind else self.forward
        if step not in lanes:
            label = f"undo #{step} {tool}" if unwind else f"#{step} {tool}"
            self.tl.lanes.append(Lane(label[:34], "unwind" if unwind else "forward"))
            lanes[step] = len(self.tl.lanes) - 1
        return lanes[step]

    def start(self, lane: int, what: str, ts: int, title: str) -> None:
        self.open[(lane, what)] = (ts, title)

    def close(self, lane: int, what: str, ts: int, cls: str, title: str) -> int | None:
        began = self.open.pop((lane, what), None)
        if began is None:
            self.tl.marks.append(Mark(lane, ts, cls, title))
            return None
        self.tl.bars.append(Bar(lane, began[0], ts, cls, f"{began[1]}; {title}"))
        return ts - began[0]

    def event(self, ev: dict[str, Any], t0: int) -> None:
        kind, ts, n = ev["kind"], int(ev.get("ts") or t0), ev.get("step")
        raw = ev.get("data")
        data: dict[str, Any] = raw if isinstance(raw, dict) else {}
        tool = ev.get("tool") or ""
        took = None
        if kind == K.SAGA_FAILED:
            self.unwinding = True
            self.tl.unwind_x = ts
        if n is not None:
            took = self.step_event(kind, ts, n, tool, data)
        phase = "unwind" if kind in _UNWIND_KINDS or (self.unwinding and kind not in (
            K.SAGA_COMMITTED,)) else "forward"
        self.tl.events.append(EventRow(
            ev["seq"], utc(ts, with_date=False), f"+{duration(ts - t0)}", n,
            str(kind), tool, phase, _detail(kind, ev.get("data")), duration(took)))

    def step_event(self, kind: str, ts: int, n: int, tool: str,
                   data: dict[str, Any]) -> int | None:
        if kind == K.STEP_INTENT:
            self.lane(n, tool, unwind=False)
            return None
        if kind in _UNWIND_KINDS:
            lane = self.lane(n, tool or "", unwind=True)
            if kind == K.COMPENSATION_INTENT:
                self.start(lane, "comp", ts, f"compensation {tool} started")
                return None
            if kind == K.STEP_NOT_COMPENSABLE:
                self.tl.marks.append(Mark(lane, ts, "not-compensable",
                                          f"not compensable: {data.get('reason', '')}"))
                return None
            ok = kind == K.COMPENSATION_SUCCEEDED
            return self.close(lane, "comp", ts, "compensated" if ok else "comp-failed",
                              "compensated" if ok else "compensation failed")
        lane = self.lane(n, tool, unwind=False)
        if kind == K.APPROVAL_REQUESTED:
            self.start(lane, "approval", ts, f"approval requested: {data.get('reason', '')}")
        elif kind in (K.APPROVAL_GRANTED, K.APPROVAL_DENIED):
            granted = kind == K.APPROVAL_GRANTED
            who = f"{'approved' if granted else 'denied'} by {data.get('by', '?')}"
            return self.close(lane, "approval", ts, "approval" if granted else "denied", who)
        elif kind == K.STEP_STARTED:
            self.open.setdefault((lane, "run"), (ts, "started"))
        elif kind in _OUTCOME:
            if data.get("resolved_by") == "probe":
                self.tl.marks.append(Mark(lane, ts, "probe", f"probe: {_OUTCOME[kind]}"))
                return None
            return self.close(lane, "run", ts, _OUTCOME[kind].replace("_", "-"),
                              _OUTCOME[kind].replace("_", " "))
        return None

    def finish(self, t0: int, final: bool) -> Timeline:
        tl = self.tl
        end = max([b.end for b in tl.bars] + [m.at for m in tl.marks] + [t0])
        for (lane, what), (ts, title) in self.open.items():  # still running or waiting
            cls = "waiting" if what == "approval" else "running"
            tl.bars.append(Bar(lane, ts, end if final else max(end, self.now), cls,
                               f"{title}; {'waiting' if what == 'approval' else 'running'}"))
        last = max([b.end for b in tl.bars] + [end])
        tl.span_ms = max(1, last - t0)
        scale = CHART_W / tl.span_ms
        for i, lane_ in enumerate(tl.lanes):
            lane_.y = TOP + i * ROW_H
        for b in tl.bars:
            b.x = LABEL_W + (b.start - t0) * scale
            b.width = max(3.0, (b.end - b.start) * scale)
            b.y = tl.lanes[b.lane].y + 4
        for m in tl.marks:
            m.x, m.y = LABEL_W + (m.at - t0) * scale, tl.lanes[m.lane].y + ROW_H / 2
        if tl.unwind_x is not None:
            tl.unwind_x = LABEL_W + (tl.unwind_x - t0) * scale
        tl.ticks = [(LABEL_W + CHART_W * i / 4, f"+{duration(tl.span_ms * i // 4)}")
                    for i in range(5)]
        tl.height = TOP + max(1, len(tl.lanes)) * ROW_H + 8
        return tl


def build(events: list[dict[str, Any]], now_ms: int, final: bool) -> Timeline:
    """The timeline of a saga's events (bodies, in seq order)."""
    b = _Builder(now_ms)
    t0 = int(events[0].get("ts") or 0) if events else 0
    for ev in events:
        b.event(ev, t0)
    return b.finish(t0, final)
