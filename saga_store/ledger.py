"""The ledger: a global chain with one entry when a saga opens and one when it
closes (its final seq and head hash). It makes deleting a whole saga, or
cutting a closed saga's tail, detectable. The ledger's own tail is protected
by anchors exported out of Redis.

Ledger entries are independent facts, so a writer that loses the CAS re-reads
the head and appends again: that is its decision made anew, not a blind retry.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import orjson

from . import keys
from .canonical import canonical
from .errors import AnchorMismatch, ConflictError, InvalidInput, StoreUnavailable
from .events import EventKind, body_dict
from .log import Head, SagaLog, body_and_hash, command

MAX_CAS_ROUNDS = 200


class Ledger:
    def __init__(self, log: SagaLog) -> None:
        self.log = log
        self._head: Head | None = None
        self._lock = threading.Lock()

    def _append(self, kind: str, saga_id: str, data: dict[str, Any]) -> Head:
        with self._lock:
            head = self._head or self.log.head(keys.LEDGER_ID)
            for _ in range(MAX_CAS_ROUNDS):
                body = body_dict(keys.LEDGER_ID, 0, kind, data={"saga_id": saga_id, **data})
                try:
                    head = self.log.append(keys.LEDGER_ID, [body], head)
                except ConflictError as exc:
                    head = exc.head
                    continue
                self._head = head
                return head
        raise StoreUnavailable("ledger append kept losing the race; is something rewriting it?")

    def opened(self, saga_id: str, agent_id: str, first_hash: bytes) -> Head:
        return self._append(EventKind.LEDGER_OPENED, saga_id,
                            {"agent_id": agent_id, "first": first_hash.hex()})

    def closed(self, saga_id: str, state: str, head: Head) -> Head:
        return self._append(EventKind.LEDGER_CLOSED, saga_id,
                            {"state": state, "seq": head.seq, "hash": head.hash.hex()})

    # -- anchors ---------------------------------------------------------

    def anchor(self) -> dict[str, Any]:
        """The ledger head as a small signed document to keep outside Redis."""
        head = self.log.head(keys.LEDGER_ID)
        doc: dict[str, Any] = {
            "v": 1, "chain": keys.LEDGER_ID, "seq": head.seq, "hash": head.hash.hex(),
            "ts": time.time_ns() // 1_000_000, "mode": self.log.chain.mode,
        }
        doc["sig"] = self.log.chain.sign(canonical(doc))
        return doc

    def check_anchor(self, doc: dict[str, Any]) -> list[str]:
        """Raise :class:`AnchorMismatch` if the ledger is behind or forked from
        ``doc``; return warnings (e.g. an unsigned anchor) otherwise."""
        try:
            seq, want = int(doc["seq"]), str(doc["hash"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidInput(f"anchor file is not an anchor ({exc}); "
                               "make one with 'saga anchor'") from exc
        warnings = []
        sig = doc.get("sig")
        unsigned = {k: v for k, v in doc.items() if k != "sig"}
        if sig and self.log.chain.key is None:
            warnings.append("anchor is signed but no HMAC key is configured: signature not checked")
        elif sig and not self.log.chain.check_signature(canonical(unsigned), str(sig)):
            raise AnchorMismatch("anchor signature does not match the configured key: "
                                 "the anchor file was altered or the key is wrong")
        elif not sig and self.log.chain.key is not None:
            warnings.append("anchor is unsigned: anyone could have written it")
        if seq < 0:
            return warnings
        rows = command(
            self.log.raw, "XRANGE", keys.LEDGER_LOG, keys.entry_id(seq), keys.entry_id(seq))
        if not rows:
            have = self.log.head(keys.LEDGER_ID).seq
            raise AnchorMismatch(
                f"log behind anchor: ledger ends at seq {have}, anchor has seq {seq}; "
                "Redis lost data or was rolled back")
        if body_and_hash(rows[0][1])[1].hex() != want:
            raise AnchorMismatch(
                f"ledger forked from anchor at seq {seq}: history was rewritten after the anchor")
        return warnings


def read_anchor(text: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"anchor file is not JSON ({exc}); make one with 'saga anchor'") from exc
    if not isinstance(doc, dict):
        raise InvalidInput("anchor file must hold a JSON object; make one with 'saga anchor'")
    return doc
