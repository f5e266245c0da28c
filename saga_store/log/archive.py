"""Retention that keeps the proof: ``saga archive`` moves closed sagas out of Redis.

A run, holding a lock on the archive folder:

1. clears what a run killed before its manifest left (temporary files, and
   segments no manifest lists: their sagas are still in Redis);
2. finishes the removals of earlier runs: a saga a manifest lists, whose log is
   still in Redis and the ledger has no tombstone of (a run killed after its
   manifest);
3. picks the sagas whose ledger close (chained, not pending: a pending close is
   checked against the saga's log when it is sealed, so the log must outlive it)
   is older than the cut-off and that have no tombstone: committed, compensated
   or needs_attention, never one running, compensating or stuck;
4. reads each one's entries, verifies its chain and holds its head to the close,
   and writes them to segments, then the manifest (:mod:`saga_store.log.segments`);
   a saga that does not verify is left in Redis and reported;
5. removes each saga with ``archive.lua``: in one script, if its head is still
   the close it was archived at, its tombstone goes onto its bucket's ledger
   pending list and its keys go (log, meta, lease, driver, secrets, blobs; its
   index entries). So no saga is removed without its segment and tombstone, and
   a rerun never archives one twice;
6. moves out of Redis the prefix of each ledger chain whose sagas are all
   archived, up to a head the root chain recorded
   (:mod:`saga_store.log.ledger_cut`): written to a ledger segment the same
   manifest lists, then cut; the cuts a killed run's manifest lists are made
   first, before the ledger is read.

Removing needs UNLINK, which the worker and agent ACL users lack on purpose: an
operator runs it with an admin user. It needs layout 3, where the pending list
shares the saga's slot. What it leaves in Redis: the saga's events in its
agent's context stream (``ss:ctx:{A}``, shared by the agent's sagas) and its
explicit idempotency records (they expire on their own retention).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from saga_store import keys
from saga_store.errors import IntegrityError, InvalidInput, StoreUnavailable
from saga_store.faults import fault
from saga_store.log import context_trim, ledger_cut
from saga_store.log import segments as seg
from saga_store.log.canonical import canonical
from saga_store.log.events import EventKind as K
from saga_store.log.ledger import CLOSING_KINDS, Ledger
from saga_store.log.removal import Close, Remover
from saga_store.log.scripts import RENEW_LEASE, TAKE_OVER_LEASE
from saga_store.log.stream import EMPTY, SagaLog, body_and_hash, command, release_lease, stamp_of
from saga_store.verify.checker import ChainChecker

BATCH = 500  # sagas read, or removed, per round trip
PER_SEGMENT = 10_000  # sagas per segment file
LEASE_MS = 60_000  # renewed every batch: a run killed holds other runs off this long
_BLOB = re.compile(rb'"\$blob":"sha256:([0-9a-f]{64})"')
_DURATION = re.compile(r"(\d{1,9})([smhd])")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration(text: str, what: str = "--closed-before") -> int:
    """``7d``, ``12h``, ``30m``, ``45s`` in milliseconds."""
    m = _DURATION.fullmatch(text.strip())
    if m is None:
        raise InvalidInput(f"{what}={text!r}: use a whole number and a unit, e.g. 7d, 12h, "
                           "30m or 45s", field=what)
    return int(m[1]) * _UNIT_MS[m[2]]


@dataclass
class ArchiveReport:
    written: int = 0  # sagas written to this run's segments
    removed: int = 0  # sagas removed from Redis (this run's and earlier runs')
    resumed: int = 0  # of those, listed by an earlier run's manifest
    events: int = 0
    bytes: int = 0  # of the segment files written
    segments: list[str] = field(default_factory=list)
    manifest: str | None = None
    cleared: list[str] = field(default_factory=list)  # files a killed run left
    skipped: dict[str, str] = field(default_factory=dict)  # saga -> why it stays
    due: int = 0  # of a dry run: sagas it would archive, and earlier runs' to finish
    unfinished: int = 0
    ledger_entries: int = 0  # ledger entries moved out of Redis (this run's cuts)
    ledger_cuts: int = 0  # ledger chains cut (this run's, and earlier runs' finished)
    context_events: int = 0  # context events older than the cut-off, trimmed

    def to_dict(self) -> dict[str, Any]:
        return {"due": self.due, "unfinished": self.unfinished, "written": self.written,
                "removed": self.removed, "resumed": self.resumed,
                "events": self.events, "bytes": self.bytes, "segments": self.segments,
                "manifest": self.manifest, "cleared": self.cleared, "skipped": self.skipped,
                "ledger_entries": self.ledger_entries, "ledger_cuts": self.ledger_cuts,
                "context_events": self.context_events}


class Archiver:
    """Archives a store's closed sagas into ``folder`` (see the module's doc)."""

    def __init__(self, log: SagaLog, folder: Path, *, batch: int = BATCH,
                 per_segment: int = PER_SEGMENT) -> None:
        if log.layout.version < 3:
            raise InvalidInput(f"'saga archive' needs layout 3 (this store is layout "
                               f"{log.layout.record()}): run 'saga migrate --to 3' first")
        if batch < 1 or per_segment < 1:
            raise InvalidInput("--batch and the segment size must be at least 1")
        self.log, self.folder = log, folder
        self.batch, self.per_segment = batch, per_segment
        self.ledger = Ledger(log)
        self.report = ArchiveReport()
        self.remover = Remover(log, batch, self.report.skipped, tick=self._renew)
        # who holds the lease: a run killed on this host is known gone by its pid
        self.token = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"

    def run(self, closed_before_ms: int, *, dry_run: bool = False) -> ArchiveReport:
        """Archive every saga closed before ``closed_before_ms`` (Unix ms); with
        ``dry_run``, only count them (and what earlier runs left), writing nothing."""
        if dry_run:
            listed = self._listed() if self.folder.is_dir() else seg.Listed()
            closes, stoned, _ = self._ledger()
            stoned |= listed.cut_sagas
            self.report.due = sum(c.ts < closed_before_ms and sid not in stoned
                                  and sid not in listed.sagas for sid, c in closes.items())
            self.report.unfinished = len(listed.sagas.keys() - stoned)
            return self.report
        self._may_remove()
        self.folder.mkdir(parents=True, exist_ok=True)
        with self._locked(), self._leased():
            listed = self._clear_leftovers()
            self.ledger.flush()
            self._cut(list(listed.cuts.values()), listed.digests)  # a killed run's
            closes, stoned, reads = self._ledger()
            stoned |= listed.cut_sagas
            self._remove(self._unfinished(listed.sagas, stoned), resumed=True)
            picks = [c for sid, c in sorted(closes.items())
                     if c.ts < closed_before_ms and sid not in stoned
                     and sid not in listed.sagas]
            cuts = ledger_cut.plan(self.log, reads, listed.cuts, self.report.skipped)
            done, cut = self._write(picks, cuts)
            self._remove(done)
            self._cut(cut, None)
            self.ledger.seal_many(sorted({self.log.layout.ledger_of(c.saga_id) for c in done}))
            # the agents' context feeds: what is older than the cut-off (see context_trim)
            self.report.context_events += context_trim.trim(self.log, closed_before_ms)[1]
        return self.report

    def _may_remove(self) -> None:
        self.remover.probe()

    # -- reading the ledger -----------------------------------------------

    def _ledger(self) -> tuple[dict[str, Close], set[str], dict[str, ledger_cut.ChainRead]]:
        """The chained closes by saga, the sagas with a tombstone (chained or pending),
        and each ledger chain as read (after its base)."""
        closes: dict[str, Close] = {}
        stoned: set[str] = set()
        present = self.ledger.present()
        held = ledger_cut.bases(self.log, present)
        reads = {c: ledger_cut.read_chain(self.log, c, held.get(c, EMPTY))
                 for c in present}
        for ev in (e.ev for read in reads.values() for e in read.entries):
            data = ev.get("data") or {}
            sid = data.get("saga_id")
            if ev.get("kind") == K.LEDGER_CLOSED and isinstance(sid, str):
                closes.setdefault(sid, Close(sid, str(data["state"]), int(data["seq"]),
                                             str(data["hash"]), int(ev.get("ts", 0))))
            elif ev.get("kind") == K.LEDGER_ARCHIVED and isinstance(sid, str):
                stoned.add(sid)
        stoned.update(b["data"]["saga_id"] for b in self.ledger.pending()
                      if b["kind"] == K.LEDGER_ARCHIVED)
        return closes, stoned, reads

    def _cut(self, cuts: list[dict[str, Any]], digests: dict[str, str] | None) -> None:
        """Make ``cuts`` in Redis, ``batch`` chains a round trip. ``digests``: of an
        earlier run's cuts, each ledger segment held to its manifest first (a
        changed file cuts nothing)."""
        if digests is not None:  # an earlier run's: only those not made yet
            held = ledger_cut.bases(self.log, [c["chain"] for c in cuts])
            cuts = [c for c in cuts if held.get(c["chain"], EMPTY).seq < c["to"]]
        for name in sorted({c["segment"] for c in cuts}) if digests is not None else []:
            path = self.folder / name
            if not path.exists() or seg.file_digest(path) != (digests or {}).get(name):
                raise IntegrityError(f"ledger segment {name} is missing or changed since its "
                                     "manifest listed it; nothing was cut: run 'saga verify "
                                     f"--archive {self.folder}'")
        for i in range(0, len(cuts), self.batch):
            self._renew()
            self.report.ledger_cuts += ledger_cut.apply(self.log, cuts[i:i + self.batch])
            fault("archive_cutting")

    # -- one run at a time --------------------------------------------------

    @contextlib.contextmanager
    def _leased(self) -> Iterator[None]:
        """Hold the store's archive lease: two runs (into two folders) would pick
        the same sagas, and the loser's manifest would list sagas the winner's
        tombstones name."""
        if not self.log.redis.set(keys.ARCHIVE_LEASE, self.token, nx=True, px=LEASE_MS) \
                and not self._take_over():
            raise InvalidInput(f"another 'saga archive' is running on this store (it holds "
                               f"{keys.ARCHIVE_LEASE}); let it finish, or if it was killed, "
                               f"run again within {LEASE_MS // 1000} s")
        try:
            yield
        finally:
            release_lease(self.log.redis, keys.ARCHIVE_LEASE, self.token)

    def _take_over(self) -> bool:
        """Take the lease from a run of this host whose process is gone (killed)."""
        raw = self.log.redis.get(keys.ARCHIVE_LEASE)
        holder = raw.decode() if isinstance(raw, bytes) else str(raw)
        host, _, rest = holder.partition(":")
        pid = rest.partition(":")[0]
        if host != socket.gethostname() or not pid.isdigit():
            return False
        try:
            os.kill(int(pid), 0)
            return False  # alive (or another user's process of that pid)
        except ProcessLookupError:
            pass
        except PermissionError:
            return False
        return bool(self.log.redis.eval(TAKE_OVER_LEASE, 1, keys.ARCHIVE_LEASE, holder,
                                        self.token, LEASE_MS))

    def _renew(self) -> None:
        if not self.log.redis.eval(RENEW_LEASE, 1, keys.ARCHIVE_LEASE, self.token, LEASE_MS):
            raise StoreUnavailable("this run lost the archive lease to another run; nothing "
                                   "is half-done: run 'saga archive' again to finish")

    # -- the folder ---------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.folder / ".lock", "a") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise InvalidInput(f"another 'saga archive' is writing to {self.folder}; let "
                                   "it finish, then run again") from None
            yield

    def _clear_leftovers(self) -> seg.Listed:
        """Drop what a killed run left that no manifest lists; return what the
        manifests list."""
        listed = self._listed()
        for path in self.folder.iterdir():
            if path.name.startswith(seg.TMP_PREFIX) or (
                    (path.match(seg.SEGMENTS) or path.match(seg.LEDGER_SEGMENTS))
                    and path.name not in listed.digests):
                path.unlink()
                self.report.cleared.append(path.name)
        return listed

    def _listed(self) -> seg.Listed:
        return seg.listed(self.folder, self.log.chain)

    def _unfinished(self, listed: dict[str, tuple[dict[str, Any], dict[str, str]]],
                    stoned: set[str]) -> list[Close]:
        """The sagas earlier manifests list that still await removal, each held to
        its segment file as it was listed (a changed file removes nothing)."""
        out, checked = [], {}
        for sid, (entry, digests) in sorted(listed.items()):
            if sid in stoned:
                continue
            name = entry["segment"]
            if name not in checked:
                path = self.folder / name
                checked[name] = path.exists() and seg.file_digest(path) == digests[name]
            if not checked[name]:
                raise IntegrityError(f"segment {name} is missing or changed since its manifest "
                                     f"listed it; nothing was removed: run 'saga verify "
                                     f"--archive {self.folder}'")
            close = Close(sid, str(entry["state"]), int(entry["seq"]), str(entry["hash"]),
                          segment=digests[name])
            self._plan_keys(close, self._steps_of(sid))
            out.append(close)
        return out

    def _steps_of(self, saga_id: str) -> list[int]:
        """The steps of ``saga_id`` that asked for an approval (their index members)."""
        return [b.get("step", -1) for b in self.log.bodies(saga_id)
                if b.get("kind") == K.APPROVAL_REQUESTED]

    # -- writing segments ---------------------------------------------------

    def _write(self, picks: list[Close], cuts: list[ledger_cut.Cut],
               ) -> tuple[list[Close], list[dict[str, Any]]]:
        """Write ``picks`` to segments, ``cuts`` to a ledger segment, and the run's
        manifest; returns the sagas written and the cuts as the manifest lists them."""
        run = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + os.urandom(3).hex()
        done: list[Close] = []
        entries: list[dict[str, Any]] = []
        segs: list[dict[str, Any]] = []
        for n, start in enumerate(range(0, len(picks), self.per_segment)):
            name = f"seg-{run}-{n:04d}.jsonl.gz"
            kept: list[Close] = []
            digest = seg.write_atomic(self.folder, name,
                                      self._lines(picks[start:start + self.per_segment], kept),
                                      gz=True)
            if not kept:
                (self.folder / name).unlink()
                continue
            size = (self.folder / name).stat().st_size
            fault("archive_after_segment")
            segs.append({"name": name, "sha256": digest, "bytes": size, "sagas": len(kept),
                         "events": sum(c.events for c in kept)})
            for c in kept:
                entries.append({"saga_id": c.saga_id, "segment": name, "state": c.state,
                                "seq": c.seq, "hash": c.hash, "events": c.events})
                c.segment = digest
            done += kept
            self.report.segments.append(name)
            self.report.bytes += size
        lsegs, listed_cuts = self._write_cuts(run, cuts)
        if not done and not listed_cuts:
            return [], []
        chains = {self.log.layout.ledger_of(c.saga_id) for c in done}
        root = self.ledger.record_root()
        doc: dict[str, Any] = {
            **seg.FORMAT, "mode": self.log.chain.mode, "layout": self.log.layout.record(),
            "run": run, "created_ms": time.time_ns() // 1_000_000, "segments": segs,
            "sagas": entries, "ledger_segments": lsegs, "cuts": listed_cuts,
            "root": [root.seq, root.hash.hex()],
            "heads": {c: [h.seq, h.hash.hex()] for c, h in sorted(self.ledger.heads().items())
                      if c in chains}}
        doc["sig"] = seg.sign(self.log.chain, doc)
        name = f"manifest-{run}.json"
        seg.write_atomic(self.folder, name, [canonical(doc) + b"\n"], gz=False)
        self.report.manifest = name
        self.report.written = len(done)
        self.report.ledger_entries = sum(c.seq - c.start + 1 for c in cuts)
        fault("archive_after_manifest")
        return done, listed_cuts

    def _write_cuts(self, run: str, cuts: list[ledger_cut.Cut],
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The ledger segment of ``cuts`` (their entries, as chained), written; its
        listing and the cuts', for the manifest."""
        if not cuts:
            return [], []
        name = f"ledger-{run}.jsonl.gz"
        self._renew()
        digest = seg.write_atomic(self.folder, name, ledger_cut.lines_of(cuts), gz=True)
        size = (self.folder / name).stat().st_size
        fault("archive_after_ledger_segment")
        self.report.bytes += size
        return ([{"name": name, "sha256": digest, "bytes": size,
                  "entries": sum(c.seq - c.start + 1 for c in cuts)}],
                [c.to_dict(name) for c in cuts])

    def _lines(self, picks: list[Close], kept: list[Close]) -> Iterator[bytes]:
        """The segment's lines, a batch of sagas at a time; each saga that verifies
        and ends at its ledger close goes into ``kept``."""
        for i in range(0, len(picks), self.batch):
            self._renew()
            batch = picks[i:i + self.batch]
            pipe: Any = self.log.raw.pipeline(transaction=False)
            for c in batch:
                pipe.execute_command("XRANGE", self.log.keys.log(c.saga_id), "-", "+")
            for c, rows in zip(batch, pipe.execute(), strict=True):
                lines = self._saga_lines(c, rows)
                if lines:
                    kept.append(c)
                    yield b"".join(lines)  # one gzip write per saga, not per entry

    def _saga_lines(self, c: Close, rows: list[Any]) -> list[bytes]:
        if not rows:
            self.report.skipped[c.saga_id] = "its log is not in Redis"
            return []
        checker = ChainChecker(self.log.chain, c.saga_id)
        lines: list[bytes] = []
        blobs: set[str] = set()
        steps: list[int] = []
        for eid, fields in rows:
            body, h = body_and_hash(fields)
            stamp = stamp_of(fields)
            checker.feed(body, h, eid=eid, stamp=stamp)
            lines.append(seg.entry_line(c.saga_id, keys.seq_of_entry_id(eid), body, h, stamp))
            blobs.update(m.decode() for m in _BLOB.findall(body))
            if b'"approval_requested"' in body:
                steps.append(orjson.loads(body).get("step", -1))
        rep = checker.finish()
        if not rep.ok:
            self.report.skipped[c.saga_id] = f"its chain does not verify at seq " \
                f"{rep.first_bad_seq} ({rep.reason}): run 'saga verify'"
            return []
        if (rep.head_seq, rep.head_hash.hex()) != (c.seq, c.hash) \
                or CLOSING_KINDS.get(rep.last_kind) != c.state:
            self.report.skipped[c.saga_id] = f"its log ends at seq {rep.head_seq}, not at the " \
                f"close the ledger recorded (seq {c.seq}): run 'saga verify'"
            return []
        for digest in sorted(blobs):
            raw = command(self.log.raw, "GET", self.log.keys.blob(c.saga_id, digest))
            if raw is not None:
                lines.append(seg.blob_line(c.saga_id, digest, raw))
        c.events = rep.events
        self.report.events += rep.events
        self._plan_keys(c, steps, blobs)
        return lines

    def _plan_keys(self, c: Close, steps: list[int], blobs: set[str] | None = None) -> None:
        self.remover.plan_keys(c, steps, blobs)

    def _remove(self, todo: list[Close], *, resumed: bool = False) -> None:
        self.remover.remove(todo, resumed=resumed)
        self.report.removed, self.report.resumed = self.remover.removed, self.remover.resumed
