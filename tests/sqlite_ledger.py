"""The tests' side-effect ledgers: SQLite files written by several worker
processes at once.

Turning a new file to WAL takes a lock that SQLite's busy timeout does not wait
for, so two processes opening a fresh ledger at the same moment made one of them
fail with "database is locked" (a tool call that failed for the test's own
bookkeeping). Each opening therefore sets the file up under an exclusive file
lock, one process at a time; the writes themselves wait on SQLite's timeout."""

from __future__ import annotations

import fcntl
import sqlite3
from collections.abc import Iterable


def connect(path: str, schema: Iterable[str], timeout: float = 30) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=timeout, isolation_level=None)
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        db.execute("PRAGMA journal_mode=WAL")
        for statement in schema:
            db.execute(statement)
    return db
