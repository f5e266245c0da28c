"""Offline verification of an archive folder (``saga verify --archive DIR``).

Needs no Redis: each manifest's signature (with the HMAC key) and each listed
segment's SHA-256 must hold; each saga's chain must verify entry by entry and
end at the close its manifest lists; each large payload must match its
digest. Each ledger chain's archived prefixes (ledger segments, see
:mod:`saga_store.log.ledger_cut`) must link up, entry by entry, from genesis
through every cut, and each cut must end at the hash its manifest lists. With a
store (optional), each archived saga must also be in the store's ledger, or
in the archived prefixes: a close at that head, and a tombstone naming a
segment that holds it (or, not yet removed by a killed run, its log still
ending there); and each chain's last archived cut must be the base the store's
chain starts from (or, not yet made by a killed run, still in the chain).

Reasons, besides the chain checker's: ``bad_signature``, ``segment_digest``
(missing or changed file), ``bad_line`` (not an archive line), ``missing_saga``
(listed, not in its segment), ``unlisted_saga`` (in a segment, not listed),
``not_closed`` (the chain does not end at the listed close), ``blob_digest``,
``cut_mismatch`` (a ledger prefix does not end where its manifest says), and
against a store ``not_in_ledger`` / ``rewritten`` / ``no_tombstone`` /
``ledger_gap`` (the store's chain starts past what the archive holds).
"""

from __future__ import annotations

import gzip
import hashlib
import zlib
from pathlib import Path
from typing import Any

import orjson

from saga_store import keys
from saga_store.errors import InvalidInput
from saga_store.log import ledger_cut
from saga_store.log import segments as seg
from saga_store.log.chain import Chain
from saga_store.log.ledger import CLOSING_KINDS, Ledger
from saga_store.log.stream import EMPTY, Head, SagaLog, body_and_hash, command
from saga_store.verify.checker import ChainChecker, ChainReport, LedgerView, VerifyResult


def verify_archive(folder: Path, chain: Chain, log: SagaLog | None = None) -> VerifyResult:
    """Verify every manifest in ``folder`` and the segments it lists; with ``log``,
    also hold each archived saga to the store's ledger. Raises
    :class:`InvalidInput` if ``folder`` holds no manifest."""
    paths = seg.manifests(folder) if folder.is_dir() else []
    if not paths:
        raise InvalidInput(f"{folder}: no archive manifest here (manifest-*.json); make an "
                           "archive with 'saga archive --to DIR'")
    reports: list[ChainReport] = []
    listed: set[str] = set()
    archived: dict[str, tuple[dict[str, Any], set[str]]] = {}  # saga -> entry, digests
    prefixes = Prefixes(chain)
    docs = sorted(((seg.read_manifest(p, chain), p) for p in paths),
                  key=lambda dp: (int(dp[0].get("created_ms") or 0), dp[1].name))
    for doc, path in docs:  # in the order they were written: cuts follow each other
        rep = ChainReport(f"manifest {path.name}")
        reports.append(rep)
        if not seg.signature_ok(doc, chain):
            rep.fail(-1, "bad_signature", "the manifest's HMAC does not hold: it was changed "
                     "after it was written, or the key is not the store's")
            continue
        digests = {s["name"]: s["sha256"] for s in doc["segments"]}
        listed.update(digests)
        for ls in doc.get("ledger_segments", []):
            listed.add(ls["name"])
            prefixes.read(folder / ls["name"], ls["sha256"],
                          [c for c in doc.get("cuts", []) if c["segment"] == ls["name"]], rep)
        by_segment: dict[str, dict[str, dict[str, Any]]] = {}
        for entry in doc["sagas"]:
            by_segment.setdefault(entry["segment"], {})[entry["saga_id"]] = entry
            archived.setdefault(entry["saga_id"], (entry, set()))[1].add(
                digests.get(entry["segment"], ""))
        for name, want in digests.items():
            reports += _segment(folder / name, want, by_segment.get(name, {}), chain, rep)
    reports += prefixes.reports()
    for path in sorted([*folder.glob(seg.SEGMENTS), *folder.glob(seg.LEDGER_SEGMENTS)]):
        if path.name not in listed:
            reports[0].warnings.append(f"{path.name} is in no manifest (left by a run killed "
                                       "before its manifest; not part of the archive)")
    if log is not None:
        reports += _against_store(log, archived, prefixes.view)
        reports += prefixes.against_store(log)
    return VerifyResult(reports)


class Prefixes:
    """The archived prefixes of the ledger chains, read segment after segment:
    each chain's entries checked as one chain across its cuts."""

    def __init__(self, chain: Chain) -> None:
        self.chain = chain
        self.checkers: dict[str, ChainChecker] = {}
        self.view = LedgerView()  # what the archived entries say of the sagas

    def read(self, path: Path, want: str, cuts: list[dict[str, Any]],
             manifest: ChainReport) -> None:
        if not path.exists() or seg.file_digest(path) != want:
            manifest.fail(-1, "segment_digest", f"{path.name} is missing or its SHA-256 is not "
                          "the one the manifest lists")
            return
        try:
            with gzip.open(path, "rb") as fh:
                for n, line in enumerate(fh):
                    if not self._line(line):
                        manifest.fail(-1, "bad_line", f"{path.name} line {n + 1} is not an "
                                      "archived ledger entry")
                        return
        except (OSError, EOFError, zlib.error) as exc:
            manifest.fail(-1, "bad_line", f"{path.name} is not a readable gzip file: {exc}")
            return
        for cut in cuts:
            checker = self.checkers.get(cut["chain"])
            rep = checker.report if checker is not None else ChainReport(cut["chain"])
            if checker is None or (rep.ok and (checker.expect - 1, checker.prev.hex())
                                   != (cut["to"], cut["hash"])):
                manifest.fail(int(cut["to"]), "cut_mismatch", f"{path.name} does not hold "
                              f"{cut['chain']}'s entries up to seq {cut['to']} with the hash "
                              "its manifest lists")

    def _line(self, line: bytes) -> bool:
        try:
            row = orjson.loads(line)
            chain_id, seq = str(row["chain"]), int(row["seq"])
            body, h = row["b"].encode(), bytes.fromhex(row["h"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            return False
        if not keys.is_ledger(chain_id):
            return False
        checker = self.checkers.get(chain_id)
        if checker is None:
            checker = self.checkers[chain_id] = ChainChecker(self.chain, chain_id)
        if checker.feed(body, h, eid=b"0-%d" % (seq + 1)):
            self.view.note(checker.last, chain_id)
        return True

    def heads(self) -> dict[str, Head]:
        """Where each chain's archived prefix ends (its last cut)."""
        return {c: Head(k.expect - 1, k.prev) for c, k in self.checkers.items()
                if k.report.ok and k.expect}

    def reports(self) -> list[ChainReport]:
        out = []
        for c, checker in sorted(self.checkers.items()):
            rep = checker.finish()
            rep.chain_id = f"{c} (archived prefix)"
            out.append(rep)
        return out

    def against_store(self, log: SagaLog) -> list[ChainReport]:
        """Each chain's archived prefix held to the base the store's chain starts at."""
        ends = self.heads()
        chains = sorted({*ends, *log.layout.chains()})
        based = ledger_cut.bases(log, chains)
        out = []
        for c in chains:
            end, base = ends.get(c, EMPTY), based.get(c, EMPTY)
            if end == base:
                continue
            rep = ChainReport(f"{c} (store)")
            if base.seq > end.seq:
                rep.fail(end.seq + 1, "ledger_gap", f"the store's ledger chain {c} starts after "
                         f"seq {base.seq}, but this archive holds its entries only up to seq "
                         f"{end.seq}: entries were cut out of Redis that no archive here holds")
            elif base.seq == end.seq:
                rep.fail(end.seq, "rewritten", f"the store's ledger chain {c} starts after another "
                         f"entry at seq {end.seq} than the archive's")
            elif _holds(log, c, end):
                rep.warnings.append(f"archived up to seq {end.seq}, not cut in Redis yet: run "
                                    "'saga archive' again to finish")
            else:
                rep.fail(end.seq, "rewritten", f"the store's ledger chain {c} no longer holds "
                         f"the entry at seq {end.seq} its archived prefix ends at")
            out.append(rep)
        return out


def _holds(log: SagaLog, chain: str, head: Head) -> bool:
    eid = keys.entry_id(head.seq)
    rows = command(log.raw, "XRANGE", keys.ledger_log(chain), eid, eid)
    return bool(rows) and body_and_hash(rows[0][1])[1] == head.hash


def _segment(path: Path, want: str, sagas: dict[str, dict[str, Any]], chain: Chain,
             manifest: ChainReport) -> list[ChainReport]:
    """The reports of one segment's sagas (or the manifest's, failed, if the file
    is missing or changed)."""
    if not path.exists() or seg.file_digest(path) != want:
        manifest.fail(-1, "segment_digest", f"{path.name} is missing or its SHA-256 is not "
                      "the one the manifest lists")
        return []
    checkers: dict[str, ChainChecker] = {}
    blobs: dict[str, ChainReport] = {}
    try:
        with gzip.open(path, "rb") as fh:
            for n, line in enumerate(fh):
                if not _line(line, checkers, blobs, chain):
                    manifest.fail(-1, "bad_line", f"{path.name} line {n + 1} is not an "
                                  "archived entry")
                    return []
    except (OSError, EOFError, zlib.error) as exc:
        manifest.fail(-1, "bad_line", f"{path.name} is not a readable gzip file: {exc}")
        return []
    out = []
    for sid, checker in checkers.items():
        rep = checker.finish()
        entry = sagas.get(sid)
        if sid in blobs:
            rep.fail(-1, "blob_digest", blobs[sid].detail)
        if entry is None:
            rep.fail(-1, "unlisted_saga", f"in {path.name} but not in its manifest")
        elif (rep.head_seq, rep.head_hash.hex()) != (entry["seq"], entry["hash"]) \
                or CLOSING_KINDS.get(rep.last_kind) != entry["state"]:
            rep.fail(rep.head_seq, "not_closed", f"its chain ends at seq {rep.head_seq} "
                     f"({rep.last_kind}), not at the close its manifest lists (seq "
                     f"{entry['seq']}, {entry['state']})")
        out.append(rep)
    for sid in sorted(sagas.keys() - checkers.keys()):
        rep = ChainReport(sid)
        rep.fail(0, "missing_saga", f"its manifest lists it in {path.name}, which does not "
                 "hold it")
        out.append(rep)
    return out


def _line(line: bytes, checkers: dict[str, ChainChecker], blobs: dict[str, ChainReport],
          chain: Chain) -> bool:
    """Feed one segment line to its saga's checker; False if it is not a line at all."""
    try:
        row = orjson.loads(line)
        sid = row["saga_id"]
        if "blob" in row:
            raw = row["raw"].encode()
            if hashlib.sha256(raw).hexdigest() != row["blob"]:
                bad = blobs.setdefault(sid, ChainReport(sid))
                bad.fail(-1, "blob_digest", f"payload {row['blob'][:16]}... does not match "
                         "its digest")
            return True
        seq, body, h = int(row["seq"]), row["b"].encode(), bytes.fromhex(row["h"])
        stamp = row["p"].encode() if "p" in row else None
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return False
    checker = checkers.get(sid)
    if checker is None:
        checker = checkers[sid] = ChainChecker(chain, sid)
    checker.feed(body, h, eid=b"0-%d" % (seq + 1), stamp=stamp)
    return True


def _against_store(log: SagaLog, archived: dict[str, tuple[dict[str, Any], set[str]]],
                   view: LedgerView) -> list[ChainReport]:
    """Each archived saga held to the store's ledger (closes and tombstones,
    chained or pending; ``view``: what the archived ledger prefixes said)."""
    ledger = Ledger(log)
    for body in [*ledger.bodies(), *ledger.pending()]:
        view.note(body)
    pipe = log.redis.pipeline(transaction=False)
    ids = sorted(archived)
    for sid in ids:
        pipe.exists(log.keys.log(sid))
    out = []
    for sid, here in zip(ids, pipe.execute() if ids else [], strict=True):
        entry, digests = archived[sid]
        rep = ChainReport(f"{sid} (store)")
        end = (int(entry["seq"]), bytes.fromhex(entry["hash"]))
        stone = view.archived.get(sid)
        if sid not in view.closed:
            rep.fail(-1, "not_in_ledger", "the store's ledger has no close of this saga")
        elif view.closed[sid] != end:
            rep.fail(end[0], "rewritten", "the store's ledger closed it at another head than "
                     "the archived one")
        elif stone is None and not here:
            rep.fail(end[0], "no_tombstone", "gone from Redis, and the ledger has no tombstone")
        elif stone is None:
            rep.warnings.append("archived, still in Redis: run 'saga archive' again to finish")
        elif (stone[0], stone[1]) != end or stone[2] not in digests:
            rep.fail(end[0], "no_tombstone", "its tombstone names another head or segment")
        if not rep.ok or rep.warnings:
            out.append(rep)
    return out
