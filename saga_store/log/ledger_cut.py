"""Archiving the ledger chains' prefixes (``saga archive``): what makes the
store's memory flat when sagas are archived, since every saga otherwise leaves
its opening, close and tombstone in its bucket's ledger chain for good.

A run plans, for each ledger chain, a cut at seq k where:

- every saga with an entry in ``0 .. k`` has been archived (its tombstone is
  chained, in ``0 .. k`` or after k) and has no entry in another chain (a saga
  opened in the chain of layout 1 before a migration keeps both chains whole).
  A saga's tombstone may stay in Redis after its opening and close are cut:
  under steady load a bucket never has a point where every saga before it is
  archived, since the sagas opened within the retention window always sit
  between a saga's opening and its tombstone. ``saga verify`` accepts such a
  tombstone without the close, in a chain with an archived prefix (only sagas
  already archived are ever cut);
- the root chain recorded (k, hash_k) as the chain's head: the cut point is
  then held by the root, which ``saga anchor`` signs, so a base made up by
  whoever trims a chain by hand shows in ``saga verify``;
- k is not the chain's last entry: appends find the head with XREVRANGE, and
  an empty stream would read as a new chain.

The entries ``base+1 .. k``, exactly as chained, go to a ledger segment
(``ledger-<run>.jsonl.gz``, one line per entry: ``{"chain", "seq", "b", "h"}``)
that the run's signed manifest lists with each cut (chain, from, to, hash, and
the sagas it takes out of the ledger). Only then does ``lua/ledger_cut.lua``
check that the entry at k still has hash_k, record the chain's base (k,
hash_k) in ``ss:ledger:{b<n>}:base`` and XTRIM the prefix (entry ids are
``0-<seq+1>``: MINID ``0-<k+2>``), in one script. A run killed before the
manifest leaves a ledger segment that no manifest lists, cleared by the next
run, and nothing cut; one killed after it leaves cuts the manifest promises,
which the next run makes before it reads the ledger (the script is a no-op for
a cut already made). So no entry leaves Redis before a signed manifest lists
it, and none is archived twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis

from saga_store import keys
from saga_store.errors import ConflictError, IntegrityError, InvalidInput, StoreUnavailable
from saga_store.faults import fault
from saga_store.log.events import EventKind as K
from saga_store.log.events import body_dict
from saga_store.log.layout import ROOT
from saga_store.log.scripts import source
from saga_store.log.stream import EMPTY, Head, SagaLog, body_and_hash, command

LEDGER_CUT = source("ledger_cut")
ROOT_PAGE = 64  # root entries read per round trip, newest first


def parse_base(raw: Any) -> Head:
    """A chain's base as stored (``"<seq> <hash hex>"``); EMPTY if none, or if it
    is not one (the verifier then reads the chain as starting at seq 0)."""
    if raw is None:
        return EMPTY
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    seq, _, hex_ = text.partition(" ")
    try:
        return Head(int(seq), bytes.fromhex(hex_))
    except ValueError:
        return Head(-2, b"")  # not a base: never matches a head the root recorded


def bases(log: SagaLog, chains: list[str]) -> dict[str, Head]:
    """The base of each of ``chains`` that has one (one pipelined read)."""
    pipe: Any = log.raw.pipeline(transaction=False)
    for c in chains:
        pipe.execute_command("GET", keys.ledger_base(c))
    return {c: parse_base(raw) for c, raw in zip(chains, pipe.execute() if chains else [],
                                                 strict=True) if raw is not None}


@dataclass
class Entry:
    """One chained ledger entry as a run read it."""

    seq: int
    body: bytes
    hash: bytes
    ev: dict[str, Any]


@dataclass
class ChainRead:
    """A ledger chain as a run read it: its base, and its entries after it."""

    base: Head = EMPTY
    entries: list[Entry] = field(default_factory=list)


def read_chain(log: SagaLog, chain: str, base: Head) -> ChainRead:
    out = ChainRead(base)
    for rows in log.pages(chain, base.seq + 1):
        for eid, fields in rows:
            body, h = body_and_hash(fields)
            out.entries.append(Entry(keys.seq_of_entry_id(eid), body, h, orjson.loads(body)))
    return out


@dataclass
class Cut:
    """A ledger chain's prefix ``start .. seq`` moved to the archive."""

    chain: str
    start: int
    seq: int
    hash: str
    sagas: list[str]
    lines: list[bytes] = field(default_factory=list, repr=False)

    def to_dict(self, segment: str) -> dict[str, Any]:
        return {"chain": self.chain, "segment": segment, "from": self.start, "to": self.seq,
                "hash": self.hash, "sagas": self.sagas}


def cut_points(read: ChainRead, elsewhere: set[str]) -> set[int]:
    """The seqs the chain may be cut at: each ends a prefix (after the base) whose
    sagas are all archived (a tombstone chained after the saga's last opening: an
    id opened again after its archive is a saga of its own, not archived), and is
    not the chain's last."""
    last_open: dict[Any, int] = {}
    last_stone: dict[Any, int] = {}
    for e in read.entries:
        sid = (e.ev.get("data") or {}).get("saga_id")
        if e.ev.get("kind") == K.LEDGER_OPENED:
            last_open[sid] = e.seq
        elif e.ev.get("kind") == K.LEDGER_ARCHIVED:
            last_stone[sid] = e.seq
    stoned = {sid for sid, at in last_stone.items() if at > last_open.get(sid, -1)}
    points = set()
    for e in read.entries[:-1]:
        sid = (e.ev.get("data") or {}).get("saga_id")
        if not isinstance(sid, str) or sid not in stoned or sid in elsewhere:
            break
        points.add(e.seq)
    return points


def recorded_heads(log: SagaLog, want: dict[str, tuple[int, set[int]]]) -> dict[str, Head]:
    """For each chain of ``want`` (chain -> (its base's seq, the seqs it may be cut
    at)), the latest head the root recorded at one of those seqs, if any. The root
    is read newest first, until every chain is settled: a chain's heads only grow,
    so the first recorded at one of its seqs is the latest, and one at or below
    its base ends the search."""
    open_ = dict(want)
    found: dict[str, Head] = {}
    top: bytes | str = "+"
    while open_:
        rows = command(log.raw, "XREVRANGE", keys.ledger_log(ROOT), top, "-", "COUNT", ROOT_PAGE)
        for _eid, fields in rows:
            body = orjson.loads(body_and_hash(fields)[0])
            for chain, rec in ((body.get("data") or {}).get("heads") or {}).items():
                if chain not in open_:
                    continue
                low, points = open_[chain]
                seq, h = int(rec[0]), str(rec[1])
                if seq <= low:
                    del open_[chain]
                elif seq in points:
                    found[chain] = Head(seq, bytes.fromhex(h))
                    del open_[chain]
        if len(rows) < ROOT_PAGE:
            break
        top = b"(" + rows[-1][0]
    return found


def plan(log: SagaLog, reads: dict[str, ChainRead], last_cuts: dict[str, dict[str, Any]],
         skipped: dict[str, str]) -> list[Cut]:
    """The cuts this run makes (see the module's doc). ``last_cuts``: each chain's
    latest cut the archive folder's manifests list; a chain whose base in Redis is
    not that cut (cut into another folder, or by hand) is left as it is, and
    named in ``skipped``."""
    where: dict[str, set[str]] = {}
    for chain, read in reads.items():
        for e in read.entries:
            sid = (e.ev.get("data") or {}).get("saga_id")
            if isinstance(sid, str):
                where.setdefault(sid, set()).add(chain)
    elsewhere = {s for s, cs in where.items() if len(cs) > 1}
    want: dict[str, tuple[int, set[int]]] = {}
    for chain, read in reads.items():
        if not read.entries or chain == ROOT:
            continue
        prior = last_cuts.get(chain)
        held = Head(int(prior["to"]), bytes.fromhex(prior["hash"])) if prior else EMPTY
        if read.base != held:
            skipped[chain] = (f"its base in Redis is seq {read.base.seq}, but this folder's "
                              f"last cut of it is seq {held.seq}: archive into the folder "
                              "that holds its earlier entries, or run 'saga verify'")
            continue
        points = cut_points(read, elsewhere)
        if points:
            want[chain] = (read.base.seq, points)
    cuts = []
    for chain, head in sorted(recorded_heads(log, want).items()) if want else []:
        read = reads[chain]
        taken = read.entries[:head.seq - read.base.seq]
        if taken[-1].seq != head.seq:
            raise IntegrityError(f"ledger chain {chain} is not contiguous after seq "
                                 f"{read.base.seq}: run 'saga verify'")
        if taken[-1].hash != head.hash:
            skipped[chain] = (f"the root recorded another hash for seq {head.seq} than the "
                              "chain holds: not cut; run 'saga verify'")
            continue
        cuts.append(Cut(chain, taken[0].seq, head.seq, head.hash.hex(),
                        sorted({e.ev["data"]["saga_id"] for e in taken}),
                        [line(chain, e) for e in taken]))
    return cuts


def line(chain: str, e: Entry) -> bytes:
    return orjson.dumps({"chain": chain, "seq": e.seq, "b": e.body.decode(),
                         "h": e.hash.hex()}) + b"\n"


def lines_of(cuts: list[Cut]) -> Iterator[bytes]:
    for c in cuts:
        yield b"".join(c.lines)


CUTS_PER_ENTRY = 100  # cut records per root entry, as ledger.ROOT_HEADS heads


def record(log: SagaLog, cuts: list[dict[str, Any]]) -> None:
    """Write each cut into the root chain (a ``ledger_heads`` entry whose ``cuts``
    name each chain's new base, seq and hash) before it is made: ``saga verify``
    takes a chain's base only where the root records a cut at it, so a prefix
    trimmed by hand, or a base set by hand at a head the root recorded, fails
    (with an HMAC key nobody without it can write such a record)."""
    moved = sorted((c["chain"], [int(c["to"]), str(c["hash"])]) for c in cuts)
    for _ in range(8):
        head = log.head(ROOT)
        entries = [body_dict(ROOT, 0, K.LEDGER_HEADS,
                             data={"heads": {}, "cuts": dict(moved[i:i + CUTS_PER_ENTRY])})
                   for i in range(0, len(moved), CUTS_PER_ENTRY)]
        try:
            log.append(ROOT, entries, head)
            return
        except ConflictError:
            continue  # a root record of heads went in first: append after it
    raise StoreUnavailable("the root chain kept moving; is something rewriting it?")


def recorded_cuts(body: dict[str, Any]) -> Iterator[tuple[str, int, str]]:
    """The cuts a root entry records: (chain, seq, hash hex)."""
    for chain, rec in ((body.get("data") or {}).get("cuts") or {}).items():
        yield str(chain), int(rec[0]), str(rec[1])


def apply(log: SagaLog, cuts: list[dict[str, Any]]) -> int:
    """Make ``cuts`` (as a manifest lists them) in Redis, one script each, in one
    round trip, once the root chain records them (:func:`record`); returns how
    many were made now (not made before). Raises :class:`IntegrityError` if one
    is refused: the chain no longer holds what was archived."""
    if not cuts:
        return 0
    record(log, cuts)
    fault("archive_cut_recorded")
    try:
        sha = log.raw.script_load(LEDGER_CUT)
    except redis.exceptions.NoPermissionError as exc:
        raise InvalidInput(f"this Redis user may not run the ledger cut script ({exc}): "
                           "run 'saga archive' with an admin user") from exc
    pipe: Any = log.raw.pipeline(transaction=False)
    for c in cuts:
        pipe.execute_command("EVALSHA", sha, 2, keys.ledger_log(c["chain"]),
                             keys.ledger_base(c["chain"]), int(c["to"]),
                             bytes.fromhex(c["hash"]), c["hash"])
    made = 0
    for c, reply in zip(cuts, pipe.execute(raise_on_error=False), strict=True):
        if isinstance(reply, Exception):
            raise IntegrityError(f"ledger chain {c['chain']}: cutting at seq {c['to']} "
                                 f"failed: {reply}; run 'saga archive' again")
        status, what = int(reply[0]), reply[1]
        text = what.decode() if isinstance(what, bytes) else str(what)
        if status != 1:
            if text.startswith("noperm"):
                raise InvalidInput(f"this Redis user may not trim the ledger ({text}): run "
                                   "'saga archive' with an admin user")
            raise IntegrityError(f"ledger chain {c['chain']} not cut at seq {c['to']}: {text}; "
                                 "run 'saga verify'")
        made += text == "cut"
    return made
