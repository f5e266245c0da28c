"""Move a store of layout 2 to layout 3 (``saga migrate --to 3``): every saga's
keys renamed under its bucket's hash tag, the shared indexes split by bucket.

Nothing inside a key changes: a log keeps every entry, id and hash (a chain's
genesis is made from the saga's id, not its key), so every chain, the ledger
and anchors taken before verify as they did. The ledger is already in buckets
(layout 2), and the number of buckets stays what the store recorded.

Offline: processes read the layout once, so one still running with layout 2
would write the old names. Stop workers, gateways and clients first; the CLI
refuses while a worker is registered alive.

Each key is copied (DUMP, RESTORE with its time to live) before the old one is
deleted, and the layout is recorded last, so a run killed anywhere is finished
by the next one: a key still under its old name is copied again (REPLACE), an
index entry added again (the same score), and until the last write every
process still reads layout 2. Works on a Redis Cluster too: no command spans
two slots (a copy is two commands, one per key).
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from saga_store import keys
from saga_store.errors import InvalidInput
from saga_store.faults import fault
from saga_store.ids import SCOPED_AGENT, agent_of, check_saga_id, valid_id
from saga_store.log.layout import Layout
from saga_store.log.layout import parse as layout_of
from saga_store.log.scripts import TAKE_OVER_LEASE
from saga_store.log.stream import SagaLog
from saga_store.mcp.holders import holder_gone, holder_token

SAGA_SUFFIXES = ("log", "meta", "lease", "driver", "secrets")
MIGRATION_LOCK = f"{keys.PREFIX}:migrating"  # held by the one run at work
LOCK_MS = 120_000  # renewed before each batch
_BLOB = re.compile(r"blob:[0-9a-f]{64}")
BATCH = 200  # keys copied per round trip


def _old_saga_key(key: str) -> tuple[str, str] | None:
    """(saga id, suffix) of a layout-2 saga key ``ss:{S}:<suffix>``, else None (an
    agent's index ss:{A_}:active and its dedupe records keep their names)."""
    head = f"{keys.PREFIX}:{{"
    if not key.startswith(head):
        return None
    sid, sep, suffix = key[len(head):].partition("}:")
    if not sep or not valid_id(sid, check_saga_id):
        return None
    # exact suffixes: a key of layout 3 (ss:{b<n>}:S:log) has one more segment
    if suffix in SAGA_SUFFIXES or _BLOB.fullmatch(suffix):
        return sid, suffix
    return None


def move_to_3(log: SagaLog, *, dry_run: bool = False) -> dict[str, Any]:
    """Move the store on ``log`` from layout 2 to 3; returns what it did (or, with
    ``dry_run``, would do). Raises :class:`InvalidInput` for a store of another
    layout than 2 or 3 (a store of layout 1 is moved to 2 first: ``saga migrate``),
    and while another migration holds the store's lock.

    Of a store already of layout 3, it moves what a process left running with
    layout 2 wrote since (keys under old names, entries in the old indexes), but
    never over a key of the new name: that saga is reported, not overwritten."""
    r = log.redis
    raw = r.get(keys.LAYOUT)
    before = layout_of(raw)
    if before is None:
        raise InvalidInput("no layout is recorded here (no store, or one written before "
                           "ledger buckets): run 'saga migrate' first, then '--to 3'")
    out: dict[str, Any] = {"from": before.record(), "dry_run": dry_run}
    if before.version not in (2, 3):
        raise InvalidInput(f"layout {before.record()}: run 'saga migrate' (to layout 2) "
                           "first, then 'saga migrate --to 3'")
    target = Layout(3, before.buckets)
    old, new = keys.SagaKeys(2, before.buckets), target.keys()
    found: dict[str, list[str]] = defaultdict(list)
    for k in r.scan_iter(match=f"{keys.PREFIX}:{{*}}:*", count=1000):
        key = k.decode() if isinstance(k, bytes) else k
        parsed = _old_saga_key(key)
        if parsed is not None:
            found[parsed[0]].append(parsed[1])
    moves = [(f"{old.base(sid)}:{suffix}", f"{new.base(sid)}:{suffix}")
             for sid, suffixes in sorted(found.items()) for suffix in sorted(suffixes)]
    indexed = _index_entries(r, old, new)
    summary = {"to": target.record(), "sagas": len(found), "keys": len(moves),
               "indexed": len(indexed), "kept": []}
    if dry_run or (before.version == 3 and not moves and not indexed):
        return {**out, **summary, "changed": False}
    token = holder_token("migrate")
    if not _lock(r, token):
        raise InvalidInput("another 'saga migrate --to 3' is running on this store (its "
                           f"lock, {MIGRATION_LOCK}, lapses {LOCK_MS // 1000} s after it "
                           "stopped); wait for it, then run it again")
    try:
        kept = _move(r, moves, replace=before.version == 2, raw=raw, token=token)
        _move_indexes(r, new, indexed)
        fault("rekey_after_indexes")
        for src in (keys.ACTIVE, keys.APPROVALS, keys.NEEDS_ATTENTION, *_agent_indexes(r)):
            r.delete(src)
        # the layout last: until it is recorded every process reads the old names,
        # and a run killed before it is finished by the next one
        _still(r, raw, token)
        r.set(keys.LAYOUT, target.record())
    finally:
        _release(r, token)
    log.forget_layout()
    return {**out, **summary, "kept": kept, "changed": True}


def _lock(r: Any, token: str) -> bool:
    """Take the store's migration lock: free, or held by a run that is gone (a
    process of this host that no longer exists: a run killed part-way, which the
    next run finishes at once instead of waiting for the lock to lapse)."""
    if r.set(MIGRATION_LOCK, token, nx=True, px=LOCK_MS):
        return True
    held = r.get(MIGRATION_LOCK)
    if held is None:
        return bool(r.set(MIGRATION_LOCK, token, nx=True, px=LOCK_MS))
    return holder_gone(held.decode()) and bool(
        r.eval(TAKE_OVER_LEASE, 1, MIGRATION_LOCK, held, token, LOCK_MS))


def _still(r: Any, raw: Any, token: str) -> None:
    """Raise unless the layout is as this run read it and its lock is still its own
    (renewed): a run that lost either writes nothing more."""
    pipe = r.pipeline(transaction=False)
    pipe.get(keys.LAYOUT)
    pipe.get(MIGRATION_LOCK)
    layout_now, holder = pipe.execute()
    if layout_now != raw or holder is None or holder.decode() != token:
        raise InvalidInput(f"{keys.LAYOUT} or the migration's lock changed while the keys "
                           "moved (another migration?): run 'saga migrate --to 3' again")
    r.pexpire(MIGRATION_LOCK, LOCK_MS)


def _release(r: Any, token: str) -> None:
    held = r.get(MIGRATION_LOCK)
    if held is not None and held.decode() == token:
        r.pexpire(MIGRATION_LOCK, 0)


def _move(r: Any, moves: list[tuple[str, str]], *, replace: bool, raw: Any,
          token: str) -> list[str]:
    """Copy then drop each key, a batch at a time, checking before each batch that
    the run still holds the store; returns the keys kept under their old names
    (``replace`` False: their new name exists already)."""
    kept: list[str] = []
    for i in range(0, len(moves), BATCH):
        batch = moves[i:i + BATCH]
        _still(r, raw, token)
        refused = _copy(r, batch, replace)
        fault("rekey_after_copy")
        kept += refused
        _drop(r, [src for src, _ in batch if src not in refused])
    return kept


def _move_indexes(r: Any, new: keys.SagaKeys,
                  indexed: list[tuple[str, float | None, bytes]]) -> None:
    for dest, score, member in indexed:
        if score is None:
            r.sadd(dest, member)
            continue
        agent = agent_of(member.decode())
        if agent is not None and dest == new.active(member.decode()):
            r.sadd(new.agents_list(member.decode()), agent)  # listed first, as a schedule does
        r.zadd(dest, {member: score}, nx=True)  # a score the new index has stands


def _index_entries(r: Any, old: keys.SagaKeys, new: keys.SagaKeys,
                   ) -> list[tuple[str, float | None, bytes]]:
    """Where each entry of the shared indexes of layout 2 goes: (index, score or None
    for a set, member)."""
    out: list[tuple[str, float | None, bytes]] = []
    for member, score in r.zrange(keys.ACTIVE, 0, -1, withscores=True):
        sid = member.decode("utf-8", "replace")
        if valid_id(sid, check_saga_id):
            out.append((new.active(sid), score, member))
    for member, score in r.zrange(keys.APPROVALS, 0, -1, withscores=True):
        sid = member.decode("utf-8", "replace").rpartition(":")[0]
        if valid_id(sid, check_saga_id):
            out.append((new.approvals(sid), score, member))
    for member in r.smembers(keys.NEEDS_ATTENTION):
        sid = member.decode("utf-8", "replace")
        if valid_id(sid, check_saga_id):
            out.append((new.needs_attention(sid), None, member))
    for index in _agent_indexes(r):  # of layout 3 an agent's index is per bucket
        for member, score in r.zrange(index, 0, -1, withscores=True):
            sid = member.decode("utf-8", "replace")
            if valid_id(sid, check_saga_id) and new.active(sid) != index:
                out.append((new.active(sid), score, member))
    return out


def _agent_indexes(r: Any) -> list[str]:
    """The agents' indexes of before layout 3 (one per agent, ``ss:{<A>_}:active``)."""
    listed = {a.decode("utf-8", "replace") for a in r.smembers(keys.AGENTS)}
    return [keys.agent_active(a) for a in sorted(listed) if SCOPED_AGENT.fullmatch(a)]


def _copy(r: Any, moves: list[tuple[str, str]], replace: bool) -> list[str]:
    """Copy each key to its new name, with its time to live (``replace``: a copy
    made by a killed run is made again; else a key whose new name exists is left
    where it is, and returned)."""
    pipe = r.pipeline(transaction=False)
    for src, _ in moves:
        pipe.dump(src)
        pipe.pttl(src)
    got = pipe.execute()
    pipe = r.pipeline(transaction=False)
    sent = []
    for (src, dest), value, ttl in zip(moves, got[::2], got[1::2], strict=True):
        if value is None or int(ttl) == -2:  # expired meanwhile (a lease, a secret)
            continue
        pipe.restore(dest, max(int(ttl), 0), value, replace=replace)
        sent.append(src)
    refused = []
    for src, reply in zip(sent, pipe.execute(raise_on_error=False), strict=True):
        if isinstance(reply, Exception):
            if "BUSYKEY" not in str(reply):
                raise reply
            refused.append(src)
    return refused


def _drop(r: Any, sources: list[str]) -> None:
    pipe = r.pipeline(transaction=False)
    for src in sources:
        pipe.delete(src)
    pipe.execute()
