"""Export to JSONL and offline verification of an export.

Line 1 is a header ``{"export": "saga-store", "v": 1, "mode": ...}``; every
other line is one full event envelope (with ``prev`` and ``hash`` in hex), in
canonical form, each saga's events together and in order, the ledger last.
Verifying a file needs no Redis: the body is recovered by removing ``prev``
and ``hash`` and encoding canonically, which is how it was hashed.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

import orjson

from . import keys
from .canonical import canonical
from .chain import Chain
from .errors import CannotVerify, InvalidInput
from .log import SagaLog
from .verify import ChainChecker, ChainReport, LedgerView, Progress, VerifyResult, cross_check

HEADER = {"export": "saga-store", "v": 1}


def export(log: SagaLog, out: IO[bytes], saga_ids: Iterable[str] | None = None) -> int:
    """Write the given sagas (default: all) and the whole ledger; returns events written."""
    ids = sorted(set(log.chain_ids())) if saga_ids is None else list(saga_ids)
    out.write(canonical({**HEADER, "mode": log.chain.mode}) + b"\n")
    n = 0
    for cid in [*ids, keys.LEDGER_ID]:
        for entry in log.entries(cid):
            out.write(canonical(entry.event()) + b"\n")
            n += 1
    return n


def verify_file(path: str | Path, chain: Chain, progress: Progress | None = None,
                ) -> VerifyResult:
    """Verify an export offline. Raises :class:`InvalidInput` if it is not an export."""
    checkers: dict[str, ChainChecker] = {}
    view = LedgerView()
    broken: ChainReport | None = None
    with open(path, "rb") as fh:
        _check_header(fh.readline(), chain)
        count = 0
        for lineno, line in enumerate(fh, start=2):
            try:
                ev: dict[str, Any] = orjson.loads(line)
                cid = ev["saga_id"]
                prev, h = bytes.fromhex(ev.pop("prev")), bytes.fromhex(ev.pop("hash"))
                if not isinstance(cid, str):
                    raise TypeError(cid)
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
                # a damaged line is an integrity failure of the export, not a usage error
                broken = ChainReport(f"{Path(path).name}:{lineno}")
                broken.fail(-1, "bad_body", "line is not an exported event")
                break
            checker = checkers.get(cid)
            if checker is None:
                checker = checkers[cid] = ChainChecker(chain, cid)
            pos = checker.expect if checker.report.ok else -1
            if (checker.feed(pos, canonical(ev), prev, h, ev) and cid == keys.LEDGER_ID
                    and (why := view.note(ev))):
                checker.report.fail(checker.expect - 1, "bad_body", why)
            count += 1
            if progress is not None and count % 10_000 == 0:
                progress(10_000)
    if progress is not None:
        progress(count % 10_000)
    ledger = checkers.pop(keys.LEDGER_ID, ChainChecker(chain, keys.LEDGER_ID)).report
    reports = [ledger] if broken is None else [broken, ledger]
    for _, checker in sorted(checkers.items()):
        if ledger.ok:
            cross_check(checker.report, view)
        reports.append(checker.report)
    return VerifyResult(reports)


def _check_header(line: bytes, chain: Chain) -> None:
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
