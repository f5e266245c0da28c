"""Archiving on a schedule (``saga archive --every``): the operator's process,
with an admin Redis user, runs :class:`~saga_store.log.archive.Archiver` every
interval until told to stop, and counts what it moved.

It is not the workers' sweepers' job: their ACL user may not UNLINK (on
purpose), and an archive folder on each worker host would scatter the archive.

    saga_archived_sagas_total   sagas moved out of Redis (their segments written,
                                their keys removed with their tombstones)
    saga_archived_bytes_total   bytes of segment files written
    saga_archive_runs_total     runs, by outcome (ok, failed: Redis unreachable)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis
from prometheus_client import CollectorRegistry, Counter

from saga_store.errors import StoreUnavailable
from saga_store.log.archive import ArchiveReport

log = logging.getLogger("saga_store.retention")


class ArchiveMetrics:
    """The archive's counters, on an injected registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.sagas = Counter("saga_archived_sagas", "Sagas moved out of Redis into the archive",
                             registry=registry)
        self.bytes = Counter("saga_archived_bytes", "Bytes of archive segments written",
                             registry=registry)
        self.runs = Counter("saga_archive_runs", "Archive runs, by outcome", ["outcome"],
                            registry=registry)
        for outcome in ("ok", "failed"):
            self.runs.labels(outcome)

    def record(self, report: ArchiveReport) -> None:
        self.sagas.inc(report.removed)
        self.bytes.inc(report.bytes)
        self.runs.labels("ok").inc()


def every(run: Callable[[int], ArchiveReport], retention_ms: int, interval_s: float,
          metrics: ArchiveMetrics, stop: threading.Event) -> int:
    """Call ``run(cut-off)`` every ``interval_s`` until ``stop`` is set; returns the
    runs made. A run that finds Redis unreachable is counted and tried again next
    time; any other error (a user without the rights, a manifest that does not
    verify) ends the loop: it would fail the same way every time."""
    runs = 0
    while not stop.is_set():
        try:
            metrics.record(run(time.time_ns() // 1_000_000 - retention_ms))
        except (StoreUnavailable, redis.ConnectionError, redis.TimeoutError) as exc:
            metrics.runs.labels("failed").inc()
            log.warning("archive run failed, trying again in %.0f s: %s", interval_s, exc)
        runs += 1
        stop.wait(interval_s)
    return runs
