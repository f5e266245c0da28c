"""Verification on demand, in a thread, with the last result kept for the page;
and one saga's chain checked as its page loads.

A full verification reads every chain, so it never runs inside a request:
:meth:`VerifyStatus.start` starts it in a thread (one at a time) and the
verify page shows the last finished result while the next one runs. One
saga's chain is a read the size of the page's own (:func:`chain_of`), so the
saga page checks it on every load; the ledger's cross-checks stay with the
full verification.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from saga_store import SagaError, keys
from saga_store.errors import AnchorMismatch
from saga_store.log.ledger import read_anchor
from saga_store.log.store import EventStore
from saga_store.verify.checker import Verifier

log = logging.getLogger("saga_store.console")


@dataclass
class Result:
    ok: bool
    chains: int
    events: int
    failures: list[dict[str, Any]]
    warnings: list[str]
    started_ms: int
    took_ms: int
    anchor: dict[str, Any] | None = None
    error: str | None = None


@dataclass(frozen=True)
class ChainVerdict:
    ok: bool
    events: int
    seq: int | None = None  # the first bad event's
    reason: str | None = None
    detail: str = ""


def chain_of(store: EventStore, saga_id: str) -> ChainVerdict:
    """The hash chain of one saga, checked link by link: intact, or its first bad seq."""
    report = Verifier(store.log, jobs=1).check(saga_id)
    return ChainVerdict(report.ok, report.events, report.first_bad_seq, report.reason,
                        report.detail)


@dataclass
class VerifyStatus:
    store: EventStore
    anchor_file: str | None = None
    last: Result | None = None
    running: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def start(self) -> bool:
        """Start a verification unless one is running; True if this call started it."""
        with self._lock:
            if self.running:
                return False
            self.running = True
        threading.Thread(target=self._run, name="saga-console-verify", daemon=True).start()
        return True

    def wait(self, timeout_s: float = 60.0) -> Result | None:
        """Wait for the running verification (tests, scripts); the last result."""
        deadline = time.monotonic() + timeout_s
        while self.running and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.last

    def ledger_head(self) -> dict[str, Any]:
        head = self.store.ledger.record_root() if self.store.log.layout.version >= 2 \
            else self.store.log.head(keys.LEDGER_ID)
        pending = sum(self.store.ledger.backlog().values())
        return {"seq": head.seq, "hash": head.hash.hex(), "pending": pending}

    def _run(self) -> None:
        began, t0 = time.time_ns() // 1_000_000, time.monotonic()
        try:
            self.last = self._verify(began, t0)
        except (SagaError, redis.RedisError, OSError) as exc:
            self.last = Result(False, 0, 0, [], [], began, int((time.monotonic() - t0) * 1000),
                               error=f"could not verify: {exc}")
        except Exception as exc:  # a thread's error would otherwise vanish
            log.exception("console: verification failed")
            self.last = Result(False, 0, 0, [], [], began, int((time.monotonic() - t0) * 1000),
                               error=f"could not verify: {type(exc).__name__}: {exc}")
        finally:
            self.running = False

    def _verify(self, began: int, t0: float) -> Result:
        with contextlib.suppress(redis.ResponseError):  # a read-only user cannot seal
            self.store.ledger.flush()
        # one process: forking a server that runs threads could copy a held lock
        result = Verifier(self.store.log, jobs=1).verify()
        anchor = self._anchor() if self.anchor_file else None
        ok = result.ok and (anchor is None or bool(anchor["ok"]))
        return Result(
            ok, result.chain_count, result.events,
            [{"chain": c.chain_id, "seq": c.first_bad_seq, "reason": c.reason,
              "detail": c.detail} for c in result.failures[:50]],
            [f"{c.chain_id}: {w}" for c in result.chains for w in c.warnings][:50],
            began, int((time.monotonic() - t0) * 1000), anchor)

    def _anchor(self) -> dict[str, Any]:
        assert self.anchor_file is not None
        try:
            doc = read_anchor(Path(self.anchor_file).read_bytes())
            warnings = self.store.ledger.check_anchor(doc)
            return {"ok": True, "seq": doc.get("seq"), "warnings": warnings}
        except AnchorMismatch as exc:
            return {"ok": False, "reason": str(exc)}
        except (OSError, SagaError) as exc:
            return {"ok": False, "reason": f"cannot read anchor {self.anchor_file}: {exc}"}
