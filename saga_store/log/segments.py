"""The archive's files: segments and manifests (``saga archive``, ``saga verify
--archive``).

A segment, ``seg-<run>-<n>.jsonl.gz``, is gzip'd JSON lines, each saga's lines
together and in order: one line per stored entry, exactly as chained,

    {"saga_id": S, "seq": n, "b": <canonical body, as text>, "h": <hash, hex>,
     "p": <the phase stamp, absent on entries written before stamps>}

then one line per large payload its events refer to by digest,
``{"saga_id": S, "blob": <sha256 hex>, "raw": <the payload's canonical text>}``.
A body is the very bytes that were hashed, so a chain verifies offline, with
the HMAC key if it was chained with one.

A ledger segment, ``ledger-<run>.jsonl.gz``, holds the prefixes of ledger
chains a run moved out of Redis (see :mod:`saga_store.log.ledger_cut`), one
line per entry, exactly as chained: ``{"chain": C, "seq": n, "b": <body>, "h":
<hash, hex>}``.

A manifest, ``manifest-<run>.json``, one per run, lists the segments (with the
SHA-256 of each file), the sagas (each one's segment and final head), the
ledger segment (``ledger_segments``) and its cuts (``cuts``: each chain's
``from`` .. ``to`` seqs, the hash at ``to``, and the sagas whose every ledger
entry it holds), and the ledger chains' and root's heads when they were
archived; it is signed with
HMAC-SHA256 under the store's key when one is configured. Only a segment that
a manifest lists counts: every file is written under a temporary name,
fsync'd and renamed, the manifest last, so a run killed part-way leaves nothing
half-written that counts, and the next run clears what it left.
"""

from __future__ import annotations

import gzip
import hashlib
import hmac
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from saga_store.errors import CannotVerify, IntegrityError, InvalidInput
from saga_store.log.canonical import canonical
from saga_store.log.chain import Chain

FORMAT = {"archive": "saga-store", "v": 1}
TAG = b"saga-store/archive/v1\x00"
SEGMENTS, MANIFESTS = "seg-*.jsonl.gz", "manifest-*.json"
LEDGER_SEGMENTS = "ledger-*.jsonl.gz"
TMP_PREFIX = ".tmp-"


def sign(chain: Chain, doc: dict[str, Any]) -> str | None:
    """The manifest's HMAC (over its canonical form without ``sig``); None without a key."""
    if chain.key is None:
        return None
    body = canonical({k: v for k, v in doc.items() if k != "sig"})
    return hmac.digest(chain.key, TAG + body, "sha256").hex()


def write_atomic(folder: Path, name: str, lines: Iterable[bytes], *, gz: bool) -> str:
    """Write ``lines`` to ``folder/name`` through a temporary name, fsync'd, then
    renamed (and the folder fsync'd): a reader sees all of it or nothing. Returns
    the file's SHA-256 (hex)."""
    tmp = folder / f"{TMP_PREFIX}{name}"
    with open(tmp, "wb") as fh:
        if gz:  # mtime 0: the same sagas make the same bytes
            with gzip.GzipFile(fileobj=fh, mode="wb", mtime=0, compresslevel=6) as z:
                for line in lines:
                    z.write(line)
        else:
            for line in lines:
                fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())
    digest = file_digest(tmp)
    os.replace(tmp, folder / name)
    fsync_dir(folder)
    return digest


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def entry_line(saga_id: str, seq: int, body: bytes, h: bytes, stamp: bytes | None) -> bytes:
    row: dict[str, Any] = {"saga_id": saga_id, "seq": seq, "b": body.decode(), "h": h.hex()}
    if stamp is not None:
        row["p"] = stamp.decode()
    return orjson.dumps(row) + b"\n"


def blob_line(saga_id: str, digest: str, raw: bytes) -> bytes:
    return orjson.dumps({"saga_id": saga_id, "blob": digest, "raw": raw.decode()}) + b"\n"


def read_manifest(path: Path, chain: Chain) -> dict[str, Any]:
    """A manifest, parsed and held to its format and mode. Raises
    :class:`InvalidInput` if it is not one, :class:`CannotVerify` if it was made
    in another mode (key) than ``chain``'s. Its signature is checked by
    :func:`signature_ok`."""
    try:
        doc = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise InvalidInput(f"{path}: not a readable archive manifest ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("archive") != FORMAT["archive"] \
            or not isinstance(doc.get("segments"), list) or not isinstance(doc.get("sagas"), list):
        raise InvalidInput(f"{path}: not a Saga Store archive manifest; make one with "
                           "'saga archive'")
    if doc.get("mode") != chain.mode:
        raise CannotVerify(f"{path.name} was made in {doc.get('mode')} mode but this verifier "
                           f"uses {chain.mode}; set SAGA_HMAC_KEY / SAGA_HMAC_KEY_FILE to match")
    return doc


def signature_ok(doc: dict[str, Any], chain: Chain) -> bool:
    """Whether the manifest's signature holds (without a key there is none to hold)."""
    want = sign(chain, doc)
    return want is None or hmac.compare_digest(want, str(doc.get("sig")))


def manifests(folder: Path) -> list[Path]:
    return sorted(folder.glob(MANIFESTS))


@dataclass
class Listed:
    """What a folder's manifests list."""

    # saga -> (its entry, its manifest's segment digests by name)
    sagas: dict[str, tuple[dict[str, Any], dict[str, str]]] = field(default_factory=dict)
    digests: dict[str, str] = field(default_factory=dict)  # every file listed, by name
    cuts: dict[str, dict[str, Any]] = field(default_factory=dict)  # chain -> its latest cut
    cut_sagas: set[str] = field(default_factory=set)  # sagas whose ledger entries moved out


def listed(folder: Path, chain: Chain) -> Listed:
    """Read every manifest of ``folder``; raises :class:`IntegrityError` if one's
    signature does not hold (nothing may be removed on its word)."""
    out = Listed()
    for path in manifests(folder):
        doc = read_manifest(path, chain)
        if not signature_ok(doc, chain):
            raise IntegrityError(f"{path} does not verify (its signature); nothing was "
                                 f"removed: run 'saga verify --archive {folder}'")
        digests = {s["name"]: s["sha256"] for s in doc["segments"]}
        out.digests.update(digests)
        out.digests.update({s["name"]: s["sha256"] for s in doc.get("ledger_segments", [])})
        for entry in doc["sagas"]:
            out.sagas[entry["saga_id"]] = (entry, digests)
        for cut in doc.get("cuts", []):
            if cut["to"] > out.cuts.get(cut["chain"], {"to": -1})["to"]:
                out.cuts[cut["chain"]] = cut
            out.cut_sagas.update(cut["sagas"])
    return out
