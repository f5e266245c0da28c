"""An anchor file, read strictly: ``saga verify --anchor`` holds the ledger to it,
so a document whose fields cannot describe a ledger head is refused
(:class:`InvalidInput`, exit 2) before Redis is read, never taken as a check
that passed.

An anchor, as ``saga anchor`` writes it (canonical JSON)::

    {"v": 1, "chain": "ledger:root", "seq": 41, "hash": "<64 hex>",
     "ts": 1764950400000, "mode": "sha256", "sig": null}

``chain`` is ``ledger:root`` (a store in buckets) or ``ledger`` (one chain; an
anchor written before buckets has no ``chain`` and means it); ``seq`` is the
head's seq, -1 (with ``hash`` "") for a ledger that was empty; ``mode`` the
chain's hash (``sha256`` or ``hmac-sha256``); ``sig`` the HMAC signature in
hex, or null when no key was configured.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from saga_store.errors import InvalidInput
from saga_store.log.layout import LEGACY, ROOT, Layout

VERSION = 1
MODES = ("sha256", "hmac-sha256")
REQUIRED = ("v", "seq", "hash", "ts", "mode")
KNOWN = frozenset({*REQUIRED, "chain", "sig"})
_HEX64 = re.compile(r"[0-9a-f]{64}")
_MAKE = "make one with 'saga anchor --out FILE'"
MAX_SEQ = 1 << 53  # a seq beyond what canonical JSON carries exactly was never written


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_anchor(text: bytes) -> dict[str, Any]:
    """The anchor document in ``text``, each field checked; raises
    :class:`InvalidInput` naming the first field that is wrong."""
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"anchor file is not JSON ({exc}); {_MAKE}") from exc
    if not isinstance(doc, dict):
        raise InvalidInput(f"anchor file must hold a JSON object; {_MAKE}")
    missing = [k for k in REQUIRED if k not in doc]
    if missing:
        raise InvalidInput(f"anchor file lacks {', '.join(missing)}: it is not an anchor, "
                           f"or it was cut; {_MAKE}")
    unknown = sorted(str(k)[:40] for k in set(doc) - KNOWN)
    if unknown:
        raise InvalidInput(f"anchor file has fields no anchor has ({', '.join(unknown)}); "
                           f"{_MAKE}")
    v, seq, h = doc["v"], doc["seq"], doc["hash"]
    if not _int(v) or v != VERSION:
        raise InvalidInput(f"anchor version {v!r} is not one this release knows ({VERSION}); "
                           f"upgrade Saga Store, or {_MAKE}")
    if not _int(seq) or not -1 <= seq < MAX_SEQ:
        raise InvalidInput(f"anchor seq {seq!r} is not a ledger seq (a whole number from 0, "
                           f"or -1 for an empty ledger); {_MAKE}")
    if not isinstance(h, str) or not (_HEX64.fullmatch(h) if seq >= 0 else h == ""):
        want = "64 lower-case hex digits" if seq >= 0 else '"" (the anchor of an empty ledger)'
        raise InvalidInput(f"anchor hash {str(h)[:80]!r} is not {want}; {_MAKE}")
    if not _int(doc["ts"]) or not 0 < doc["ts"] < MAX_SEQ:
        raise InvalidInput(f"anchor ts {doc['ts']!r} is not a time in ms since 1970; {_MAKE}")
    if doc["mode"] not in MODES:
        raise InvalidInput(f"anchor mode {str(doc['mode'])[:40]!r} is not one of "
                           f"{', '.join(MODES)}; {_MAKE}")
    chain = doc.get("chain", LEGACY)
    if chain not in (LEGACY, ROOT):
        raise InvalidInput(f"anchor chain {str(chain)[:40]!r} is not the ledger ({LEGACY!r}) "
                           f"or its root ({ROOT!r}); {_MAKE}")
    sig = doc.get("sig")
    if sig is not None and (not isinstance(sig, str) or not _HEX64.fullmatch(sig)):
        raise InvalidInput(f"anchor sig {str(sig)[:80]!r} is not an HMAC-SHA256 in hex (64 "
                           f"lower-case digits) nor null; {_MAKE}")
    return doc


def fits(doc: dict[str, Any], layout: Layout) -> None:
    """Refuse an anchor over a root chain for a store that has none (one ledger
    chain: layout 1): it was taken of another store (check SAGA_REDIS_URL and
    SAGA_NAMESPACE). The other way round is sound: an anchor of one chain, taken
    before ``saga migrate``, still holds the chain the root recorded."""
    if doc.get("chain", LEGACY) == ROOT and layout.version < 2:
        raise InvalidInput("the anchor is over the root chain of a store in buckets; this "
                           "store has one ledger chain (layout 1): it is another store's "
                           "anchor (check SAGA_REDIS_URL and SAGA_NAMESPACE)")
