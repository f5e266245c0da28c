"""Sagas closed per minute over the last hour, for the overview: committed and
compensated, counted from the ledger's closing entries.

Every saga that ends gets a ``saga_closed`` entry in its ledger chain, with the
state it ended in and the time. Each chain is read backwards (XREVRANGE, a
chunk at a time, all chains in one round trip per chunk) until its entries are
older than the hour, plus the entries written and not yet chained; at most
``MAX_READ`` entries in all, so a busy hour is counted in part and the page
says so. Nothing is written: the closing path stays as it is.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from saga_store import keys
from saga_store.log.events import EventKind as K
from saga_store.log.store import EventStore
from saga_store.log.stream import body_and_hash

MINUTES = 60
CHUNK = 500
MAX_READ = 20_000
COUNTED = ("committed", "compensated")
_CLOSED = b'"kind":"%s"' % K.LEDGER_CLOSED.encode()  # as canonical JSON spells it


@dataclass
class Throughput:
    """Closes per minute, oldest minute first; ``start_ms`` is the first minute's."""

    start_ms: int
    per_minute: dict[str, list[int]] = field(default_factory=dict)
    read: int = 0
    partial: bool = False  # MAX_READ entries read before the hour's start

    def total(self, state: str) -> int:
        return sum(self.per_minute[state])

    def bars(self, width: int = 720, height: int = 80) -> list[dict[str, Any]]:
        """Stacked bars per minute (compensated on top), in SVG user units, so the
        template only draws them."""
        peak = max((sum(c) for c in zip(*self.per_minute.values(), strict=True)), default=0)
        step, out = width / MINUTES, []
        for m in range(MINUTES):
            y = float(height)
            for state in COUNTED:
                n = self.per_minute[state][m]
                if not n:
                    continue
                h = height * n / peak
                y -= h
                at = time.strftime("%H:%M", time.gmtime((self.start_ms + m * 60_000) / 1000))
                out.append({"x": round(m * step + 1, 1), "y": round(y, 1),
                            "w": round(step - 2, 1), "h": round(h, 1), "cls": state,
                            "title": f"{at} UTC: {n} {state}"})
        return out

    def add(self, body: dict[str, Any]) -> None:
        if body.get("kind") != K.LEDGER_CLOSED:
            return
        data = body.get("data") or {}
        state, ts = data.get("state"), int(body.get("ts") or 0)
        minute = (ts - self.start_ms) // 60_000
        if state in self.per_minute and 0 <= minute < MINUTES:
            self.per_minute[state][minute] += 1


def _body(fields: Any) -> dict[str, Any] | None:
    try:
        body = orjson.loads(body_and_hash(fields)[0])
    except orjson.JSONDecodeError:
        return None  # not an event ('saga verify' reports it)
    return body if isinstance(body, dict) else None


def last_hour(store: EventStore, now_ms: int | None = None) -> Throughput:
    """Committed and compensated closes of each of the last ``MINUTES`` minutes
    (the current one last, in part)."""
    now_ms = now_ms if now_ms is not None else time.time_ns() // 1_000_000
    start = (now_ms // 60_000 - MINUTES + 1) * 60_000
    out = Throughput(start, {s: [0] * MINUTES for s in COUNTED})
    for body in store.ledger.pending():
        out.add(body)
    tops: dict[str, bytes | str] = dict.fromkeys(store.ledger.present(), "+")
    while tops and out.read < MAX_READ:
        pipe: Any = store.log.raw.pipeline(transaction=False)
        for chain, top in tops.items():
            pipe.execute_command("XREVRANGE", keys.ledger_log(chain), top, "-", "COUNT", CHUNK)
        for (chain, _top), rows in zip(list(tops.items()), pipe.execute(), strict=True):
            out.read += len(rows)
            older = len(rows) < CHUNK
            for _eid, fields in rows:
                raw = body_and_hash(fields)[0]
                if _CLOSED not in raw:
                    continue  # an opening: its time says nothing about closes
                closed = _body(fields)
                if closed is None:
                    continue
                out.add(closed)
                older = older or int(closed.get("ts") or 0) < start
            if older:
                del tops[chain]  # the chain's start, or past the hour
            else:
                tops[chain] = b"(" + rows[-1][0]
    out.partial = bool(tops)
    return out
