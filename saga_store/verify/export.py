"""Export to JSONL and offline verification of an export.

Line 1 is a header ``{"export": "saga-store", "v": 1, "mode": ...}``; every
other line is one full event envelope (with ``prev`` and ``hash`` in hex), in
canonical form, each saga's events together and in order, the ledger last.
Verifying a file needs no Redis: the body is recovered by removing ``prev``
and ``hash`` and encoding canonically, which is how it was hashed.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import IO, Any

import orjson

from saga_store import keys
from saga_store.errors import CannotVerify, InvalidInput
from saga_store.log.canonical import canonical
from saga_store.log.chain import Chain
from saga_store.log.layout import LEGACY, ROOT, V1, Layout, parse
from saga_store.log.ledger import Ledger
from saga_store.log.stream import SagaLog
from saga_store.verify.checker import (
    ChainChecker,
    ChainReport,
    LedgerView,
    Progress,
    VerifyResult,
    cross_check,
)

HEADER = {"export": "saga-store", "v": 1}
PARALLEL_MIN_BYTES = 32 << 20


def export(log: SagaLog, out: IO[bytes], saga_ids: Iterable[str] | None = None) -> int:
    """Write the given sagas (default: all) and the whole ledger; returns events written."""
    ledger = Ledger(log)
    ledger.flush()  # chain what is pending, so the file holds it
    ids = sorted(set(log.chain_ids())) if saga_ids is None else list(saga_ids)
    out.write(canonical({**HEADER, "mode": log.chain.mode,
                         "layout": log.layout.record()}) + b"\n")
    n = 0
    roots = [ROOT] if log.layout.version >= 2 else []
    for cid in [*ids, *ledger.present(), *roots]:
        for entry in log.entries(cid):
            out.write(canonical(entry.event()) + b"\n")
            n += 1
    return n


def verify_file(path: str | Path, chain: Chain, progress: Progress | None = None,
                jobs: int | None = None) -> VerifyResult:
    """Verify an export offline, over ``jobs`` processes for large files.

    Raises :class:`InvalidInput` if it is not an export, :class:`CannotVerify`
    if it was chained in another mode (key) than ``chain``.
    """
    with open(path, "rb") as fh:
        header = fh.readline()
        layout = _check_header(header, chain)
        start, size = len(header), os.fstat(fh.fileno()).st_size
        jobs = jobs if jobs is not None else (os.cpu_count() or 1)
        bounds = _chain_aligned_bounds(fh, start, size, jobs) if size > PARALLEL_MIN_BYTES \
            else [start, size]
    ranges = list(itertools.pairwise(bounds))
    if len(ranges) == 1:
        parts = [_verify_range(str(path), chain.key, *ranges[0], progress)]
    else:
        with ProcessPoolExecutor(len(ranges), mp_context=mp.get_context("fork")) as pool:
            futures = [pool.submit(_verify_range, str(path), chain.key, a, b) for a, b in ranges]
            parts = [f.result() for f in futures]
        if progress is not None:
            progress(sum(r.events for part in parts for r in part[0].values()))
    return _merge(parts, path, chain, progress, layout)


# A part: the chains checked in one byte range, what the ledger said, a broken line.
Part = tuple[dict[str, ChainReport], LedgerView, ChainReport | None]


def _merge(parts: list[Part], path: str | Path, chain: Chain,
           progress: Progress | None, layout: Layout = V1) -> VerifyResult:
    reports: dict[str, ChainReport] = {}
    for chains, _, _ in parts:
        if reports.keys() & chains.keys():
            # a saga split across ranges: the export is not grouped; check it whole
            return verify_file(path, chain, progress, jobs=1)
        reports.update(chains)
    view = LedgerView()
    for _, v, _ in parts:
        view.merge(v)
    broken = [b for _, _, b in parts if b is not None]
    ledgers = [reports.pop(c) for c in sorted(reports) if keys.is_ledger(c)] or \
        [ChainReport(LEGACY)]
    for _, rep in sorted(reports.items()):
        if all(led.ok for led in ledgers):
            cross_check(rep, view, layout)
    return VerifyResult([*broken[:1], *ledgers, *(r for _, r in sorted(reports.items()))])


def _verify_range(path: str, key: bytes | None, start: int, end: int,
                  progress: Progress | None = None) -> Part:
    chain = Chain(key)
    checkers: dict[str, ChainChecker] = {}
    view = LedgerView()
    broken: ChainReport | None = None
    count = 0
    with open(path, "rb") as fh:
        fh.seek(start)
        for line in fh:
            if start >= end:
                break
            start += len(line)
            if _check_line(line, checkers, chain, view):
                count += 1
                if progress is not None and count % 10_000 == 0:
                    progress(10_000)
                continue
            # a damaged line is an integrity failure of the export, not a usage error
            broken = ChainReport(f"{Path(path).name}@{start - len(line)}")
            broken.fail(-1, "bad_body", "line is not an exported event")
            break
    if progress is not None:
        progress(count % 10_000)
    return {cid: c.finish() for cid, c in checkers.items()}, view, broken


def _check_line(line: bytes, checkers: dict[str, ChainChecker], chain: Chain,
                view: LedgerView) -> bool:
    """Feed one export line to its chain's checker; False if it is not an event at all."""
    try:
        ev: dict[str, Any] = orjson.loads(line)
        cid, prev, h = ev["saga_id"], ev.pop("prev"), ev.pop("hash")
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return False
    if not isinstance(cid, str) or not isinstance(prev, str) or not isinstance(h, str):
        return False
    checker = checkers.get(cid)
    if checker is None:
        checker = checkers[cid] = ChainChecker(chain, cid)
    if (checker.feed_export(canonical(ev), h, prev, ev) and keys.is_ledger(cid)
            and cid != ROOT and (why := view.note(ev, cid))):
        checker.report.fail(checker.expect - 1, "bad_body", why)
    return True


def _chain_aligned_bounds(fh: IO[bytes], start: int, size: int, jobs: int) -> list[int]:
    """Byte offsets splitting the events into ``jobs`` ranges, each cut where one
    chain's lines end and the next one's begin."""
    bounds = [start]
    for i in range(1, jobs):
        fh.seek(max(bounds[-1], start + (size - start) * i // jobs))
        fh.readline()  # to the next line start
        cut, last_id = fh.tell(), None
        for line in iter(fh.readline, b""):
            try:
                sid = orjson.loads(line).get("saga_id")
            except (orjson.JSONDecodeError, AttributeError):
                sid = None
            if last_id is not None and sid != last_id:
                break
            last_id = sid
            cut += len(line)
        if cut < size:
            bounds.append(cut)
    bounds.append(size)
    return bounds


def _check_header(line: bytes, chain: Chain) -> Layout:
    """The export's layout, once its header is checked (exports made before
    layouts were recorded are of layout 1)."""
    try:
        head = orjson.loads(line)
    except orjson.JSONDecodeError:
        head = None
    if not isinstance(head, dict) or head.get("export") != "saga-store":
        raise InvalidInput("not a Saga Store export (first line is not the export header); "
                           "make one with 'saga export FILE.jsonl'")
    if head.get("mode") != chain.mode:
        raise CannotVerify(f"export was made in {head.get('mode')} mode but this verifier uses "
                           f"{chain.mode}; set SAGA_HMAC_KEY / SAGA_HMAC_KEY_FILE to match")
    return parse(head.get("layout")) or V1
