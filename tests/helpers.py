"""Test helpers: build sagas, and tamper with stored streams as an attacker
with write access to Redis would (read, change, rewrite)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import redis

from saga_store import keys
from saga_store.log.canonical import canonical
from saga_store.log.chain import Chain
from saga_store.log.events import EventKind as K
from saga_store.log.layout import names_of
from saga_store.log.store import ChainWriter, EventStore

Entry = tuple[bytes, dict[bytes, bytes]]


def committed_saga(store: EventStore, steps: int = 3, agent: str = "agent-1") -> ChainWriter:
    """A saga of ``steps`` succeeded steps, committed: 2 + 3*steps events."""
    w = store.open(agent, conversation_id="conv-1")
    for n in range(steps):
        w.append(K.STEP_INTENT, step=n, tool=f"tool_{n}", tool_call_id=f"call-{n}",
                 data={"args": {"n": n, "pad": "x" * 40}, "reversibility": "compensable"})
        w.append(K.STEP_STARTED, step=n, attempt=1)
        w.append(K.STEP_SUCCEEDED, step=n, data={"result": {"ok": n}})
    w.append(K.SAGA_COMMITTED)
    return w


def read_stream(client: redis.Redis, key: str) -> list[Entry]:
    return [(eid, dict(f)) for eid, f in client.xrange(key)]


def write_stream(client: redis.Redis, key: str, entries: list[Entry]) -> None:
    client.delete(key)
    for eid, fields in entries:
        client.xadd(key, fields, id=eid)  # type: ignore[arg-type]  # checked at run time


def tamper(client: redis.Redis, chain_id: str, fn: Callable[[list[Entry]], list[Entry]]) -> None:
    key = names_of(client).chain_log(chain_id)
    write_stream(client, key, fn(read_stream(client, key)))


def edit_body(entry: Entry, fn: Callable[[dict[str, Any]], None], chain: Chain | None = None,
              prev: bytes | None = None) -> Entry:
    """Change an entry's body; with ``chain`` and ``prev``, re-hash it as a forger
    without the HMAC key would."""
    eid, f = entry
    body = orjson.loads(f[b"b"])
    fn(body)
    f = dict(f)
    f[b"b"] = canonical(body)
    if chain is not None and prev is not None:
        f[b"h"] = chain.link(prev, f[b"b"])
    return eid, f


def rehash_from(entries: list[Entry], start: int, chain: Chain, chain_id: str) -> list[Entry]:
    """Recompute hashes from ``start`` on, as a forger with SHA-256 would."""
    out = list(entries)
    for i in range(start, len(out)):
        eid, f = out[i]
        prev = out[i - 1][1][b"h"] if i > 0 else chain.genesis(chain_id)
        out[i] = (eid, {**f, b"h": chain.link(prev, f[b"b"])})
    return out


def ledger_entries(log: Any) -> list[dict[str, Any]]:
    """Every ledger entry, chained or pending, of every ledger chain."""
    from saga_store.log.ledger import Ledger
    ledger = Ledger(log)
    return [*ledger.bodies(), *ledger.pending()]


class LedgerKeys:
    """The keys of the ledger chain that takes ``saga_id``'s entries (None: of a
    store whose ledger has one bucket, that bucket's)."""

    def __init__(self, log: Any, saga_id: str | None = None) -> None:
        layout = log.layout
        if saga_id is None:
            assert layout.version < 2 or layout.buckets == 1, "name the saga: many buckets"
            self.chain = layout.chains()[-1]
        else:
            self.chain = layout.ledger_of(saga_id)
        self.log, self.pending = keys.ledger_log(self.chain), keys.ledger_pending(self.chain)
        self.lease, self.rejected = keys.ledger_lease(self.chain), keys.ledger_rejected(self.chain)


def commit_from_threads(client: redis.Redis, settings: Any, threads: int = 8,
                        each: int = 30) -> list[str]:
    """``threads`` threads, each with its own store on ``client``'s pool, commit
    ``each`` one-step sagas at once; returns their ids."""
    import threading
    made: list[str] = []
    lock = threading.Lock()

    def work() -> None:
        own = EventStore(redis.Redis(connection_pool=client.connection_pool), settings)
        for _ in range(each):
            w = committed_saga(own, steps=1)
            with lock:
                made.append(w.saga_id)
    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return made
