"""Verification of chains, the ledger, and saga invariants.

One :class:`ChainChecker` judges one chain event by event, whatever the
events come from (Redis or an exported file). It stops at the first bad seq
and names a reason class:

    missing_entry   a seq is absent (deleted entry)
    head_trimmed    the chain does not start at seq 0 (of a ledger chain whose
                    prefix was archived: at the base it records, a head the
                    root chain recorded)
    bad_entry_id    an entry id that is not 0-(seq+1)
    broken_link     prev is not the previous hash (edited prev, insert, swap)
    hash_mismatch   the hash does not cover the body (edited payload or hash,
                    or a rewrite without the HMAC key)
    seq_mismatch    the body's seq is not its position (replay, swap)
    wrong_chain     the body names another saga (splice)
    bad_version     unknown schema version, or lower than earlier events
    bad_body        the body is not a valid event
    invariant       a saga invariant does not hold (see invariants.py)
    tail_cut        the ledger closed the saga at a later seq than it has
    rewritten       the saga's head differs from the one the ledger recorded
    saga_deleted    the ledger opened a saga that no longer exists
    unregistered    a saga with events that the ledger never opened
    ledger_conflict the ledger holds two different openings or closes of the saga
    forged_close    the ledger closed the saga at an event that is not its close
    rejected_entry  the sealer set aside ledger entries no saga's chain bears out
    phase_mismatch  an entry's phase stamp (what the append script decides by)
                    is not what the event kinds up to it make it
    projection      the saga's cached state or phase (``ss:{S}:meta``) is not
                    the fold of its log (the sweeper rebuilds it)
    wrong_bucket    a ledger chain holds an entry of a saga of another bucket
    root_mismatch   the root chain recorded a ledger chain's head that the chain
                    does not hold (a bucket's tail was cut or rewritten)
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import tempfile
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import orjson

from saga_store import keys
from saga_store.log import ledger_cut
from saga_store.log.canonical import canonical
from saga_store.log.chain import Chain
from saga_store.log.events import KNOWN_KINDS, SCHEMA_VERSION
from saga_store.log.events import EventKind as K
from saga_store.log.layout import LEGACY, ROOT, V1, Layout, bucket_chain
from saga_store.log.ledger import CLOSING_KINDS, Ledger
from saga_store.log.stream import (
    EMPTY,
    PHASE_AFTER,
    STATUS_AFTER,
    Head,
    SagaLog,
    body_and_hash,
    stamp_of,
)
from saga_store.protocol.vocab import Phase, Status
from saga_store.verify.invariants import Invariants
from saga_store.verify.live import settle

Progress = Callable[[int], None]


@dataclass
class ChainReport:
    chain_id: str
    ok: bool = True
    events: int = 0
    first_bad_seq: int | None = None
    reason: str | None = None
    detail: str = ""
    head_seq: int = -1
    head_hash: bytes = b""
    first_hash: bytes = b""
    base: Head = EMPTY  # of a ledger chain whose prefix was archived: where it starts
    last_kind: str | None = None
    status: Status | None = None  # the fold's state and phase (of a saga's chain)
    phase: Phase | None = None
    warnings: list[str] = field(default_factory=list)

    def fail(self, seq: int, reason: str, detail: str) -> None:
        if self.ok:
            self.ok, self.first_bad_seq, self.reason, self.detail = False, seq, reason, detail

    def to_dict(self) -> dict[str, Any]:
        return {"chain": self.chain_id, "ok": self.ok, "events": self.events,
                "first_bad_seq": self.first_bad_seq, "reason": self.reason,
                "detail": self.detail, "head_seq": self.head_seq,
                "head_hash": self.head_hash.hex(), "warnings": self.warnings}


class ChainChecker:
    """Checks one chain; feed entries in stored order, then read ``report``."""

    __slots__ = ("chain_id", "expect", "expect_eid", "invariants", "last", "link", "phase",
                 "prev", "prev_hex", "report", "stamped", "start", "status", "version")

    def __init__(self, chain: Chain, chain_id: str) -> None:
        self.chain_id = chain_id
        self.link = chain.link
        self.prev = chain.genesis(chain_id)
        self.prev_hex = self.prev.hex()
        self.expect = 0
        self.expect_eid = b"0-1"
        self.version = 0
        self.invariants = None if keys.is_ledger(chain_id) else Invariants()
        self.report = ChainReport(chain_id)
        self.last: dict[str, Any] = {}  # the last event that passed
        self.phase = Phase.FORWARD  # what the kinds so far make it, and the state
        self.status = Status.RUNNING
        self.stamped = False  # entries carry their phase from some point on, then always
        self.start = 0

    def from_base(self, base: Head) -> ChainChecker:
        """Start after ``base``, the last entry of an archived prefix (a ledger
        chain's): the next entry must be seq base+1 and link to base's hash."""
        if base.seq >= 0:
            self.prev, self.prev_hex = base.hash, base.hash.hex()
            self.start = self.expect = base.seq + 1
            self.expect_eid = b"0-%d" % (base.seq + 2)
            self.report.base = base
        return self

    def feed(self, body: bytes, h: bytes, *, eid: bytes | None = None,
             ev: dict[str, Any] | None = None, stamp: bytes | None = None) -> bool:
        """Check the next entry as stored in Redis; False once the chain is bad.

        ``eid`` is the stored entry id; ``ev`` the parsed body, if the caller has it;
        ``stamp`` the entry's phase field (None for entries written before it).
        """
        rep, n = self.report, self.expect
        if not rep.ok:
            return False
        if eid is not None and eid != self.expect_eid:
            return self._bad_position(n, keys.seq_of_entry_id(eid))
        if self.link(self.prev, body) != h:
            rep.fail(n, "hash_mismatch", "hash does not match the event's bytes and its prev"
                     + ("" if n else " (at seq 0: written with another SAGA_HMAC_KEY than "
                        "this one, or with none, or edited)"))
            return False
        if not self._accept(n, body, h, ev):
            return False
        if stamp is None:
            if self.stamped:
                rep.fail(n, "phase_mismatch", "entry lacks the phase stamp entries before it "
                         "carry")
                return False
        elif stamp != self.phase.encode():
            rep.fail(n, "phase_mismatch", f"entry is stamped {stamp.decode(errors='replace')!r}"
                     f" but its events make the saga {self.phase!r}: the append script would "
                     "decide by a phase the log does not bear out")
            return False
        else:
            self.stamped = True
        return True

    def feed_export(self, body: bytes, h_hex: str, prev_hex: str, ev: dict[str, Any]) -> bool:
        """Check the next event of an export, whose prev and hash are hex text.

        Comparing text with the digest's lower-case hex (never decoding the text)
        also holds the export to its canonical spelling.
        """
        rep, n = self.report, self.expect
        if not rep.ok:
            return False
        if prev_hex != self.prev_hex:
            why = "does not start from the genesis of this chain" if n == 0 else \
                "prev is not the hash of the event before"
            rep.fail(n, "broken_link", why)
            return False
        digest = self.link(self.prev, body)
        if digest.hex() != h_hex:
            rep.fail(n, "hash_mismatch", "hash does not match the event's bytes and its prev")
            return False
        self.prev_hex = h_hex
        return self._accept(n, body, digest, ev)

    def _accept(self, n: int, body: bytes, h: bytes, ev: dict[str, Any] | None) -> bool:
        if ev is None:
            try:
                ev = orjson.loads(body)
            except orjson.JSONDecodeError:
                self.report.fail(n, "bad_body", "body is not JSON")
                return False
        if not self._check_body(n, ev):
            return False
        kind = ev["kind"]
        if kind in STATUS_AFTER:
            self.status = STATUS_AFTER[kind]
        self.phase = PHASE_AFTER.get(kind, self.phase)
        self.last = ev
        if n == 0:
            self.report.first_hash = h
        self.prev = h
        self.expect = n + 1
        self.expect_eid = b"0-%d" % (n + 2)
        return True

    def _bad_position(self, n: int, pos: int) -> bool:
        if pos < 0:
            self.report.fail(n, "bad_entry_id", "entry id is not of the form 0-(seq+1)")
        elif n == self.start:
            self.report.fail(n, "head_trimmed", f"chain starts at seq {pos}, not {n}" + (
                f" (after its archived prefix's last entry, seq {n - 1})" if n else ""))
        else:
            self.report.fail(n, "missing_entry", f"seq {n} is missing; next stored is {pos}")
        return False

    def finish(self) -> ChainReport:
        """The report, with the head and counts filled in."""
        rep = self.report
        rep.events = self.expect - self.start
        if self.expect > self.start:
            rep.head_seq, rep.head_hash = self.expect - 1, self.prev
            rep.last_kind = self.last.get("kind")
            rep.status, rep.phase = self.status, self.phase
        return rep

    def _check_body(self, n: int, ev: Any) -> bool:
        rep = self.report
        try:
            kind, seq, sid, v = ev["kind"], ev["seq"], ev["saga_id"], ev["v"]
        except (KeyError, TypeError):
            rep.fail(n, "bad_body", "event lacks kind, seq, saga_id or v")
            return False
        if seq != n:
            rep.fail(n, "seq_mismatch", f"event says seq {seq!r} at position {n}")
            return False
        if sid != self.chain_id:
            rep.fail(n, "wrong_chain", f"event belongs to saga {sid!r}")
            return False
        if v != self.version:
            if not isinstance(v, int) or not 1 <= v <= SCHEMA_VERSION or v < self.version:
                rep.fail(n, "bad_version", f"schema version {v!r} after {self.version}")
                return False
            self.version = v
        if kind not in KNOWN_KINDS:
            rep.fail(n, "bad_body", f"unknown event kind {kind!r}")
            return False
        if self.invariants is not None:
            why = self.invariants.feed(kind, ev.get("step"), ev.get("data"))
            if why:
                rep.fail(n, "invariant", why)
                return False
        return True


@dataclass
class LedgerView:
    """What the ledger says about each saga."""

    opened: dict[str, bytes] = field(default_factory=dict)  # saga -> first hash
    closed: dict[str, tuple[int, bytes]] = field(default_factory=dict)  # saga -> (seq, hash)
    conflicts: dict[str, str] = field(default_factory=dict)  # saga -> what disagrees
    closed_as: dict[str, str] = field(default_factory=dict)  # saga -> the state it closed in
    opened_as: dict[str, bytes] = field(default_factory=dict)  # saga -> its opening's digest
    closed_whole: dict[str, bytes] = field(default_factory=dict)  # saga -> its close's digest
    where: dict[str, set[str]] = field(default_factory=dict)  # saga -> ledger chains of it
    # saga -> its tombstone: (seq, hash) of the close it was archived at, and the
    # digest of the segment holding it (see saga_store.log.archive)
    archived: dict[str, tuple[int, bytes, str]] = field(default_factory=dict)
    # a view of some buckets only (a store verified a group of buckets at a time):
    # (the store's number of buckets, the buckets kept); entries of other buckets'
    # sagas are left out, and those found in a bucket's chain noted as astray
    only: tuple[int, frozenset[int]] | None = None
    astray: dict[str, str] = field(default_factory=dict)  # saga -> a chain not its own
    cut: set[str] = field(default_factory=set)  # ledger chains with an archived prefix

    def merge(self, other: LedgerView) -> None:
        """Take in what another part of the same ledger said (parallel checks)."""
        for sid, chains in other.where.items():
            self.where.setdefault(sid, set()).update(chains)
        for sid, first in other.opened.items():
            if self.opened.setdefault(sid, first) != first:
                self.conflicts[sid] = "the ledger opened this saga twice, differently"
        for sid, end in other.closed.items():
            if self.closed.setdefault(sid, end) != end:
                self.conflicts[sid] = "the ledger closed this saga twice, differently"
        for sid, state in other.closed_as.items():
            self.closed_as.setdefault(sid, state)
        for mine, theirs in ((self.opened_as, other.opened_as),
                             (self.closed_whole, other.closed_whole)):
            for sid, whole in theirs.items():
                if mine.setdefault(sid, whole) != whole:
                    self.conflicts[sid] = "the ledger holds two different entries of it"
        for sid, why in other.conflicts.items():
            self.conflicts.setdefault(sid, why)
        for sid, stone in other.archived.items():
            self.archived.setdefault(sid, stone)
        for sid, chain in other.astray.items():
            self.astray.setdefault(sid, chain)

    def note(self, ev: dict[str, Any], chain: str = LEGACY) -> str | None:
        """Fold one ledger event of ``chain``; returns a reason if it is malformed.
        The same entry twice is one fact (a debt paid twice, see
        :mod:`saga_store.ledger`); two entries that disagree are a conflict the
        saga's check reports."""
        data = ev.get("data")
        sid = data.get("saga_id") if isinstance(data, dict) else None
        if not isinstance(data, dict) or not isinstance(sid, str):
            return "ledger entry without a saga_id"
        if self.only is not None and keys.bucket_of(sid, self.only[0]) not in self.only[1]:
            if chain != LEGACY:  # the legacy chain holds every bucket's old sagas
                self.astray.setdefault(sid, chain)
            return None  # judged with its own bucket's group
        self.where.setdefault(sid, set()).add(chain)
        try:
            if ev["kind"] == K.LEDGER_OPENED:
                first = bytes.fromhex(str(data["first"]))
                whole = _digest(data)  # the agent and every field, not the hash alone
                if self.opened.setdefault(sid, first) != first \
                        or self.opened_as.setdefault(sid, whole) != whole:
                    self.conflicts[sid] = "the ledger opened this saga twice, differently"
            elif ev["kind"] == K.LEDGER_CLOSED:
                end = (int(data["seq"]), bytes.fromhex(str(data["hash"])))
                whole = _digest(data)
                if self.closed.setdefault(sid, end) != end \
                        or self.closed_whole.setdefault(sid, whole) != whole:
                    self.conflicts[sid] = "the ledger closed this saga twice, differently"
                self.closed_as.setdefault(sid, str(data.get("state")))
            elif ev["kind"] == K.LEDGER_ARCHIVED:
                self.archived.setdefault(sid, (int(data["seq"]), bytes.fromhex(
                    str(data["hash"])), str(data["segment"])))
        except (KeyError, TypeError, ValueError):
            return f"malformed ledger entry for saga {sid}"
        return None


def _digest(data: dict[str, Any]) -> bytes:
    """What a ledger entry says, as 32 bytes: two entries of a saga are compared
    by it. Not the canonical bytes themselves: orjson hands them back in a buffer
    of about 4 KB, which, kept for every entry, made verify's memory 8 KB a saga."""
    return hashlib.sha256(canonical(data)).digest()


def cross_check(rep: ChainReport, view: LedgerView, layout: Layout = V1) -> None:
    """Judge a verified saga chain against what the ledger recorded of it."""
    sid = rep.chain_id
    if not rep.ok:
        return
    if sid in view.conflicts:
        rep.fail(0, "ledger_conflict", view.conflicts[sid])
        return
    mine = layout.ledger_of(sid)
    astray = sorted(view.where.get(sid, set()) - {mine, LEGACY})
    if astray:
        rep.fail(0, "wrong_bucket", f"ledger chain {astray[0]} holds an entry of this saga, "
                 f"whose bucket's chain is {mine}: it was pushed there by hand")
        return
    if sid in view.archived:
        archived_check(rep, view)
        return
    if rep.events == 0:
        if sid in view.opened:
            rep.fail(0, "saga_deleted", "the ledger opened this saga but its log is gone")
        return
    if sid not in view.opened:
        if rep.events == 1:
            rep.warnings.append("not in the ledger: its opening was interrupted")
        else:
            rep.fail(0, "unregistered", "saga has events but the ledger never opened it")
        return
    if view.opened[sid] != rep.first_hash:
        rep.fail(0, "rewritten", "first event differs from the one the ledger recorded")
        return
    closed = view.closed.get(sid)
    if closed is None:
        if rep.last_kind in CLOSING_KINDS:  # its cut would go unseen until the close is in
            rep.warnings.append("closed, but the ledger has no close for it yet (a writer "
                                "killed before writing it; a worker's sweeper writes it)")
        return
    seq, h = closed
    if rep.head_seq < seq:
        rep.fail(rep.head_seq + 1, "tail_cut",
                 f"the ledger closed this saga at seq {seq}, the log ends at {rep.head_seq}")
    elif rep.head_seq > seq:
        rep.fail(seq + 1, "invariant", f"events after the ledger closed the saga at seq {seq}")
    elif rep.head_hash != h:
        rep.fail(seq, "rewritten", "final hash differs from the one the ledger recorded")
    elif CLOSING_KINDS.get(rep.last_kind) != view.closed_as.get(sid):
        rep.fail(seq, "forged_close", f"the ledger closed this saga at seq {seq} as "
                 f"{view.closed_as.get(sid)}, but that event is a {rep.last_kind}: the "
                 "close was not written by the saga's own close")


def archived_check(rep: ChainReport, view: LedgerView) -> None:
    """Judge a saga the ledger says was archived: its log must be gone (the script
    that pushed the tombstone removed it), and the tombstone must name the close the
    ledger recorded, so the ledger still proves how the saga ended. Its events are
    checked offline, in the archive (``saga verify --archive``)."""
    seq, h, _ = view.archived[rep.chain_id]
    sid = rep.chain_id
    if rep.events:
        rep.fail(0, "ledger_conflict", "the ledger says this saga was archived, but its log "
                 "is still in Redis")
    elif sid not in view.closed and sid not in view.opened \
            and view.where.get(sid, set()) & view.cut:
        return  # its opening and close moved out with its chain's archived prefix
    elif view.closed.get(sid) != (seq, h):
        rep.fail(seq, "forged_close", f"the ledger's tombstone of this saga names seq {seq}, "
                 "which is not the close the ledger recorded")


def archived_reports(view: LedgerView, present: set[str]) -> list[ChainReport]:
    """The verdicts on the archived sagas whose logs are gone, without reading
    Redis for each (an archive may hold millions): only the failures are returned."""
    out = []
    for sid in sorted(view.archived.keys() - present):
        rep = ChainReport(sid)
        archived_check(rep, view)
        if not rep.ok:
            out.append(rep)
    return out


def archived_since(reports: list[ChainReport],
                   reread_ledger: Callable[[list[str]], Callable[[ChainReport], None]]) -> None:
    """Judge again each saga whose log was gone though the ledger, as read before
    it, had no tombstone of it: ``saga archive`` may have removed it in between
    (the tombstone and the removal are one script), so the ledger is read again,
    now, and holds the tombstone if that is what happened."""
    gone = [rep for rep in reports if rep.reason == "saga_deleted"]
    if not gone:
        return
    judge = reread_ledger([rep.chain_id for rep in gone])
    for rep in gone:
        rep.ok, rep.first_bad_seq, rep.reason, rep.detail = True, None, None, ""
        judge(rep)


def read_verified(log: SagaLog, saga_id: str) -> tuple[list[dict[str, Any]], Head, ChainReport]:
    """A saga's event bodies and head, and the verdict on its chain, from one read:
    what a driver needs before it acts on the log (a compensation's arguments come
    from it), so nobody without the HMAC key can make it act on forged events."""
    checker = ChainChecker(log.chain, saga_id)
    bodies: list[dict[str, Any]] = []
    head = EMPTY
    for rows in log.pages(saga_id):
        for eid, fields in rows:
            body, h = body_and_hash(fields)
            if checker.report.ok:
                checker.feed(body, h, eid=eid, stamp=stamp_of(fields))
            bodies.append(orjson.loads(body))
            head = Head(keys.seq_of_entry_id(eid), h)
    return bodies, head, checker.finish()


@dataclass
class VerifyResult:
    """The reports of a verification. ``chains`` holds every chain's report, or,
    of a store verified a group of buckets at a time (``counted`` set), the
    ledger's and those with a failure or a warning: a million sagas' reports
    would hold hundreds of MB. ``counted``: (chains, events) verified in all."""

    chains: list[ChainReport]
    counted: tuple[int, int] | None = None

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.chains)

    @property
    def chain_count(self) -> int:
        return len(self.chains) if self.counted is None else self.counted[0]

    @property
    def events(self) -> int:
        if self.counted is not None:
            return self.counted[1]
        return sum(c.events for c in self.chains)

    @property
    def failures(self) -> list[ChainReport]:
        return [c for c in self.chains if not c.ok]

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "chains": self.chain_count, "events": self.events,
                "failures": [c.to_dict() for c in self.failures],
                "warnings": [f"{c.chain_id}: {w}" for c in self.chains for w in c.warnings]}


@dataclass
class _Group:
    """Ledger chains verified together (all that may hold entries), and the buckets
    whose sagas the group judges (``only``: the store's number of buckets and
    these; None: every saga)."""

    chains: list[str]
    only: tuple[int, frozenset[int]] | None


class _Present:
    """The sagas in Redis by group, from one SCAN: in memory for one group, in a
    file a group for several (a million ids are about 90 MB as Python strings)."""

    def __init__(self, groups: list[_Group]) -> None:
        self._ids: list[str] = []
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._files: list[Any] = []
        self._group_of: dict[int, int] = {}
        if len(groups) > 1:
            self._dir = tempfile.TemporaryDirectory(prefix="saga-verify-")
            self._files = [open(os.path.join(self._dir.name, str(i)), "w+",  # noqa: SIM115
                                encoding="utf-8") for i in range(len(groups))]
            self._group_of = {b: i for i, g in enumerate(groups) if g.only is not None
                              for b in g.only[1]}
            self._buckets = next(g.only[0] for g in groups if g.only is not None)

    def scan(self, log: SagaLog) -> None:
        for sid in log.chain_ids():
            self.add(sid)

    def add(self, sid: str) -> None:
        if not self._files:
            self._ids.append(sid)
        else:
            self._files[self._group_of[keys.bucket_of(sid, self._buckets)]].write(sid + "\n")

    def of(self, group: int) -> list[str]:
        if not self._files:
            return self._ids
        fh = self._files[group]
        fh.seek(0)
        ids: list[str] = fh.read().split()
        fh.close()
        return ids

    def close(self) -> None:
        for fh in self._files:
            fh.close()
        if self._dir is not None:
            self._dir.cleanup()


class Verifier:
    """Verifies what is in Redis, across ``jobs`` processes for large logs."""

    PARALLEL_MIN_EVENTS = 200_000
    # ledger entries (two or three a saga) a group of buckets is verified with at
    # once: `saga verify` then peaks at about 85 MB of RSS, whatever the store's
    # size (benchmarks/RESULTS.md)
    GROUP_ENTRIES = 15_000

    def __init__(self, log: SagaLog, jobs: int | None = None) -> None:
        self.log = log
        self.jobs = jobs if jobs is not None else (os.cpu_count() or 1)
        # the ledger cuts the root chain records (chain, seq, hash hex), as last read
        self._cut_records: set[tuple[str, int, str]] = set()

    def check(self, chain_id: str, progress: Progress | None = None,
              view: LedgerView | None = None,
              seen: Callable[[int, dict[str, Any]], None] | None = None) -> ChainReport:
        """One chain's report; ``view`` takes in each entry of a ledger chain,
        ``seen`` each event that passed (its seq and body) as it is read. A ledger
        chain whose prefix was archived is read from its base; one cut again while
        it was read (by 'saga archive') is read again."""
        if not keys.is_ledger(chain_id):
            return self._check(chain_id, EMPTY, progress, view, seen)
        base = ledger_cut.bases(self.log, [chain_id]).get(chain_id, EMPTY)
        for _ in range(3):
            rep = self._check(chain_id, base, progress, view, seen)
            now = ledger_cut.bases(self.log, [chain_id]).get(chain_id, EMPTY)
            if rep.reason != "head_trimmed" or now == base:
                break
            base = now
        return rep

    def _check_bases_read_once(self, chains: list[str], progress: Progress | None,
                               view: LedgerView) -> list[ChainReport]:
        """:meth:`check` of each ledger chain, their bases read in one round trip
        before and one after (not two a chain): a chain cut while it was read, and
        failed for it, is checked again on its own."""
        before = ledger_cut.bases(self.log, chains)
        reports = [self._check(c, before.get(c, EMPTY), progress, view, None) for c in chains]
        after = ledger_cut.bases(self.log, chains)
        for i, c in enumerate(chains):
            if reports[i].reason == "head_trimmed" and after.get(c, EMPTY) != \
                    before.get(c, EMPTY):
                reports[i] = self.check(c, progress, view)
        return reports

    def _check(self, chain_id: str, base: Head, progress: Progress | None,
               view: LedgerView | None,
               seen: Callable[[int, dict[str, Any]], None] | None) -> ChainReport:
        checker = ChainChecker(self.log.chain, chain_id).from_base(base)
        feed = checker.feed
        for rows in self.log.pages(chain_id, max(base.seq + 1, 0)):
            for eid, fields in rows:
                if len(fields) == 6 and fields[0] == b"b" and fields[4] == b"p":
                    ok = feed(fields[1], fields[3], eid=eid, stamp=fields[5])
                else:
                    ok = feed(*body_and_hash(fields), eid=eid, stamp=stamp_of(fields))
                if not ok:
                    break
                if view is not None and (why := view.note(checker.last, chain_id)):
                    checker.report.fail(checker.expect - 1, "bad_body", why)
                    break
                if seen is not None:
                    seen(checker.expect - 1, checker.last)
            if progress is not None:
                progress(len(rows))
            if not checker.report.ok:
                break
        return checker.finish()

    def verify(self, saga_id: str | None = None, progress: Progress | None = None,
               ) -> VerifyResult:
        """Verify every chain (or one saga's and the ledger's) as Redis holds it,
        while writers may be at work: what is compared is read in an order, or as
        of one moment, that writers cannot make disagree (see
        :mod:`saga_store.verify.live`). A store of layout 2 or 3 larger than
        :data:`GROUP_ENTRIES` ledger entries is verified a group of buckets at a
        time: a saga is judged by its own bucket's ledger chain (and the legacy
        one), which hold all the ledger says of it, so what the check holds at
        once is a group's, not the store's."""
        ledger = Ledger(self.log)
        layout = self.log.layout
        # the root first: every ledger head it records is then held by the chains
        # read after it
        root = self._read_root() if layout.version >= 2 else None
        groups = [_Group(layout.chains(), None)]
        if saga_id is None and layout.version >= 2:
            groups = self._groups(ledger.present())
        # the sagas in Redis, each by its group (on disk when there are several);
        # read before the ledger, so a saga found here has its opening in the
        # ledger, chained or pending, by the time its group reads them
        found = None if saga_id is not None else _Present(groups)
        ledgers: dict[str, ChainReport] = {}
        kept: dict[str, ChainReport] = {}
        count, events, waiting = 0, 0, 0
        astray: dict[str, str] = {}
        try:
            if found is not None:
                found.scan(self.log)
            for i, group in enumerate(groups):
                ids = [saga_id] if saga_id is not None else found.of(i) if found else []
                part, reports, pending, view = self._verify_group(ledger, group, ids,
                                                                   found is not None,
                                                                   progress)
                waiting += pending
                for rep in part:
                    if rep.chain_id not in ledgers or (ledgers[rep.chain_id].ok
                                                       and not rep.ok):
                        ledgers[rep.chain_id] = rep  # the legacy chain is read by each
                for rep in reports:
                    count, events = count + 1, events + rep.events
                    if not rep.ok or rep.warnings:
                        kept[rep.chain_id] = rep
                for sid, chain in view.astray.items():
                    astray.setdefault(sid, chain)
        finally:
            if found is not None:
                found.close()
        for sid, chain in sorted(astray.items()):  # pushed into another bucket's chain
            rep = ChainReport(sid)
            rep.fail(0, "wrong_bucket", f"ledger chain {chain} holds an entry of this saga, "
                     f"whose bucket's chain is {layout.ledger_of(sid)}: it was pushed "
                     "there by hand")
            kept[sid] = rep
        first = next(iter(ledgers.values()), None) or ChainReport(
            layout.ledger_of(saga_id) if saga_id else LEGACY)
        ledgers.setdefault(first.chain_id, first)
        if waiting:
            first.warnings.append(f"{waiting} ledger entries written, not yet chained "
                                  "(a worker's sweeper chains them)")
        rejected = ledger.rejected()
        if rejected:
            entry, why = rejected[0]
            first.fail(first.head_seq + 1, "rejected_entry",
                       f"{len(rejected)} pending ledger entries were set aside by the "
                       "sealer because their sagas' chains do not bear them out (forged, "
                       "or the log was cut or rewritten since they were written); the "
                       f"first ({why}): {entry[:160]!r}")
        chains = list(ledgers.values())
        roots = [self._check_root(*root, chains)] if root is not None else []
        if root is None:
            for rep in chains:
                if rep.base.seq >= 0:
                    rep.fail(rep.base.seq + 1, "head_trimmed", "the chain starts after an "
                             "archived prefix, but this store has no root chain to hold it")
        sagas = sorted(kept.values(), key=lambda rep: rep.chain_id)
        if len(groups) == 1 and not astray:  # every report is at hand: keep them all
            return VerifyResult([*chains, *roots, *reports])
        return VerifyResult([*chains, *roots, *sagas],
                            (len(chains) + len(roots) + count,
                             sum(c.events for c in (*chains, *roots)) + events))

    def _verify_group(self, ledger: Ledger, group: _Group, ids: list[str], whole: bool,
                      progress: Progress | None,
                      ) -> tuple[list[ChainReport], list[ChainReport], int, LedgerView]:
        """One group's ledger chains and sagas: their reports, how many of its ledger
        entries wait to be chained, and its view of the ledger. ``ids``: the sagas
        found in Redis (``whole``: the group's; else the one saga asked about)."""
        layout = self.log.layout
        # entries written and not yet chained; read first, so an entry chained while
        # this runs is seen in one place or the other
        pending = ledger.pending_by_chain(group.chains)
        # the chains that hold entries now, after that read: a chain made since
        # holds what was pending then
        ledgers, view = self._check_ledgers(ledger.present(group.chains), progress,
                                            group.only)
        view.cut = {rep.chain_id for rep in ledgers if rep.base.seq >= 0}
        for chain, bodies in pending.items():
            for body in bodies:
                view.note(body, chain)
        gone: list[ChainReport] = []
        if whole:
            present = set(ids)
            ids = sorted(present | (set(view.opened) - set(view.archived)))
            gone = archived_reports(view, present)
        reports = [*self._check_many(ids, progress), *gone]
        judged = all(rep.ok for rep in ledgers)  # a saga is held to a sound ledger only
        if judged:
            for rep in reports:
                cross_check(rep, view, layout)

        def again(sid: str) -> ChainReport:
            rep = self.check(sid)
            if judged:
                cross_check(rep, view, layout)
            return rep
        settle(self.log, reports, again, lambda sids: self._reread(sids, view, ledgers))
        archived_since(reports, lambda sids: self._reread(sids, view, ledgers))
        return ledgers, reports, sum(map(len, pending.values())), view

    def _groups(self, present: list[str]) -> list[_Group]:
        """The buckets in groups of about :data:`GROUP_ENTRIES` ledger entries (by
        the lengths now of the chains in ``present``), each with the legacy chain;
        one group, with nothing left out, for a store that small."""
        layout = self.log.layout
        pipe = self.log.redis.pipeline(transaction=False)
        for c in present:
            pipe.xlen(keys.ledger_log(c))
        sizes = dict(zip(present, pipe.execute() if present else [], strict=True))
        if sum(sizes.values()) <= self.GROUP_ENTRIES:
            return [_Group(layout.chains(), None)]
        groups: list[_Group] = []
        buckets: list[int] = []
        held = 0
        for b in range(layout.buckets):
            buckets.append(b)
            held += sizes.get(bucket_chain(b), 0)
            if held >= self.GROUP_ENTRIES or b == layout.buckets - 1:
                groups.append(_Group([LEGACY, *(bucket_chain(x) for x in buckets)],
                                     (layout.buckets, frozenset(buckets))))
                buckets, held = [], 0
        return groups

    def _reread(self, saga_ids: list[str], view: LedgerView, ledgers: list[ChainReport],
                ) -> Callable[[ChainReport], None]:
        """Read again, now, the ledger chains of ``saga_ids`` (their pending entries,
        then their chains), into ``view``; a chain that no longer verifies replaces
        its report. Returns the cross-check of a saga against the ledger so read."""
        layout = self.log.layout
        chains = sorted({layout.ledger_of(sid) for sid in saga_ids})
        pending = Ledger(self.log).pending_by_chain()  # first, as in verify()
        known = {rep.chain_id: i for i, rep in enumerate(ledgers)}
        for c in chains:
            rep = self.check(c, None, view)
            if c in known:
                ledgers[known[c]] = rep
            else:
                ledgers.append(rep)
        for c in chains:
            for body in pending.get(c, []):
                view.note(body, c)
        view.cut |= {rep.chain_id for rep in ledgers if rep.base.seq >= 0}
        judged = all(rep.ok for rep in ledgers)

        def judge(rep: ChainReport) -> None:
            if judged:
                cross_check(rep, view, layout)
        return judge

    def _check_ledgers(self, chains: list[str], progress: Progress | None,
                       only: tuple[int, frozenset[int]] | None = None,
                       ) -> tuple[list[ChainReport], LedgerView]:
        """Every ledger chain's report and what they say of the sagas (of the
        buckets ``only`` names, if given). Chains are independent: with many events
        they are checked in parallel, each child returning its reports and its part
        of the view."""
        view = LedgerView(only=only)
        if not self._parallel(chains, keys.ledger_log):
            return self._check_bases_read_once(chains, progress, view), view
        by_id: dict[str, ChainReport] = {}
        for reports, part in self._fork(partial(_check_ledger_chunk, only=only), chains):
            view.merge(part)
            for rep in reports:
                by_id[rep.chain_id] = rep
                if progress is not None:
                    progress(rep.events)
        return [by_id[c] for c in chains], view

    def _read_root(self) -> tuple[ChainReport, list[tuple[int, str, int, str]]]:
        """The root chain's report, and the ledger heads it records, from one read:
        (root seq, ledger chain, its seq, its hash)."""
        recorded: list[tuple[int, str, int, str]] = []
        cuts: set[tuple[str, int, str]] = set()
        self._cut_records = cuts

        def heads(at: int, body: dict[str, Any]) -> None:
            for chain, (seq, h) in (body.get("data") or {}).get("heads", {}).items():
                recorded.append((at, str(chain), int(seq), str(h)))
            cuts.update(ledger_cut.recorded_cuts(body))
        return self.check(ROOT, seen=heads), recorded

    def _check_root(self, root: ChainReport, recorded: list[tuple[int, str, int, str]],
                    ledgers: list[ChainReport]) -> ChainReport:
        """Each ledger chain held to every head the root (read before them) recorded."""
        if not root.ok:
            return root
        known = {rep.chain_id: rep for rep in ledgers}
        self._hold_bases(ledgers, recorded)
        # a chain cut since it was read: what the root recorded up to its new base
        # is in the archive now ('saga verify --archive' holds it there)
        cut = ledger_cut.bases(self.log, sorted(known))
        pipe: Any = self.log.raw.pipeline(transaction=False)
        for _, chain, seq, _ in recorded:
            eid = keys.entry_id(max(seq, 0))
            pipe.execute_command("XRANGE", keys.ledger_log(chain), eid, eid)
        for (at, chain, seq, h), rows in zip(recorded, pipe.execute() if recorded else [],
                                             strict=True):
            rep = known.get(chain)
            base = rep.base if rep is not None else EMPTY
            if seq < base.seq or (not rows and seq <= cut.get(chain, EMPTY).seq
                                  and rep is not None and rep.ok):
                continue
            if seq == base.seq:
                if base.hash.hex() != h:
                    root.fail(at, "root_mismatch", f"the root recorded another hash for "
                              f"{chain} at seq {seq} than the base its archived prefix ends at")
                    break
                continue
            if rep is None or rep.head_seq < seq or not rows:
                ends = rep.head_seq if rep is not None else -1
                root.fail(at, "root_mismatch", f"the root recorded {chain} at seq {seq}; that "
                          f"chain ends at seq {ends}: its tail was cut, or Redis lost it")
                break
            if body_and_hash(rows[0][1])[1].hex() != h:
                root.fail(at, "root_mismatch", f"the root recorded another hash for {chain} "
                          f"at seq {seq}: that chain was rewritten")
                break
        return root

    def _hold_bases(self, ledgers: list[ChainReport],
                    recorded: list[tuple[int, str, int, str]]) -> None:
        """Fail each ledger chain that starts at a base (its prefix archived) the root
        never recorded a cut at (``saga archive`` records each cut in the root before
        it makes it): a prefix cut by hand, or a base made up, even at a head the
        root recorded. The root is read again once if need be: a cut made while
        this ran is recorded after the root was read."""
        cuts = set(self._cut_records)
        again = False
        for rep in ledgers:
            b = rep.base
            if b.seq < 0 or (rep.chain_id, b.seq, b.hash.hex()) in cuts:
                continue
            if not again:
                again = True
                self._read_root()
                cuts |= self._cut_records
                if (rep.chain_id, b.seq, b.hash.hex()) in cuts:
                    continue
            rep.ok = True  # this verdict overrides any other on the chain
            rep.first_bad_seq = rep.reason = None
            rep.fail(b.seq + 1, "head_trimmed", f"the chain starts after seq {b.seq}, at a "
                     "base the root chain never recorded a cut at: its prefix was cut by "
                     "hand, or its base (ss:ledger:{...}:base) was set by hand")

    def _check_many(self, ids: list[str], progress: Progress | None) -> list[ChainReport]:
        if not self._parallel(ids, self.log.keys.log):
            return [self.check(sid, progress) for sid in ids]
        by_id: dict[str, ChainReport] = {}
        for reports in self._fork(_check_chunk, ids):
            for rep in reports:
                by_id[rep.chain_id] = rep
                if progress is not None:
                    progress(rep.events)
        return [by_id[sid] for sid in ids]

    def _parallel(self, ids: list[str], key: Callable[[str], str]) -> bool:
        """Whether checking ``ids`` is worth forking for: enough chains and events."""
        pool = getattr(self.log.redis, "connection_pool", None)  # None: a cluster's nodes
        kwargs = getattr(pool, "connection_kwargs", {})
        # not embedded (its store lives in this process), nor a cluster (its client
        # is not one to inherit across a fork)
        if self.jobs < 2 or len(ids) < 2 * self.jobs or "server" in kwargs or pool is None:
            return False
        pipe = self.log.redis.pipeline(transaction=False)
        for cid in ids:
            pipe.xlen(key(cid))
        return bool(sum(pipe.execute()) >= self.PARALLEL_MIN_EVENTS)

    def _fork(self, work: Callable[[list[str]], Any], ids: list[str]) -> list[Any]:
        """``work`` over ``ids`` split across forked processes. A child inherits this
        verifier (redis-py reopens connections after a fork); only chain ids go to
        it and only reports come back."""
        chunks = [ids[i::self.jobs] for i in range(self.jobs)]
        ctx = mp.get_context("fork")
        with ProcessPoolExecutor(self.jobs, mp_context=ctx, initializer=_adopt,
                                 initargs=(self,)) as pool:
            futures = [pool.submit(work, c) for c in chunks]
            return [fut.result() for fut in futures]


_child: list[Verifier] = []


def _adopt(verifier: Verifier) -> None:
    _child.append(verifier)


def _check_chunk(ids: list[str]) -> list[ChainReport]:
    return [_child[0].check(sid) for sid in ids]


def _check_ledger_chunk(chains: list[str], only: tuple[int, frozenset[int]] | None = None,
                        ) -> tuple[list[ChainReport], LedgerView]:
    view = LedgerView(only=only)
    return [_child[0].check(c, None, view) for c in chains], view
