"""The store's layout: how its ledger is split, recorded in Redis when the store
is created, so every process, whatever its settings, agrees.

Layout 1 (stores written before buckets): one ledger chain, ``ledger``.
Layout 2: sagas fall into a fixed number of buckets (``SAGA_BUCKETS`` when the
store is created, default 1,024); each bucket has its own ledger chain
(``ledger:<n>``, keys ``ss:ledger:{b<n>}:...``, one hash tag per bucket, so on
Redis Cluster the ledger's work spreads over every master), and a root chain
(``ledger:root``) records the buckets' heads; ``saga anchor`` signs the root.
Layout 3 (the default for a store created now, ``SAGA_LAYOUT``): as 2, and a
saga's own keys and its bucket's indexes carry the bucket's hash tag too (see
:class:`keys.SagaKeys`); ``saga migrate --to 3`` moves a store of layout 2
(:mod:`saga_store.log.rekey`).

A store of layout 1 keeps working as it is; ``saga migrate`` moves it to layout
2 without rewriting anything: its one chain stays, frozen, as the ``ledger``
chain the root's first entry records, and new entries go to the buckets.

    ss:layout   string  "<version> <buckets>", e.g. "3 1024" (absent: layout 1 if
                        a ledger exists, else nothing was written yet)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from saga_store import keys
from saga_store.errors import InvalidInput

DEFAULT_BUCKETS = 1024
VERSIONS = (1, 2, 3)
DEFAULT_VERSION = 3  # of a store created now (SAGA_LAYOUT)
MAX_BUCKETS = 16384  # as many as Redis Cluster has slots: more would share them
LEGACY = "ledger"  # the one ledger chain of layout 1 (kept, frozen, after a migration)
ROOT = "ledger:root"


@dataclass(frozen=True, slots=True)
class Layout:
    version: int
    buckets: int

    def bucket_of(self, saga_id: str) -> int:
        return keys.bucket_of(saga_id, self.buckets)

    def ledger_of(self, saga_id: str) -> str:
        """The ledger chain that takes ``saga_id``'s entries from now on."""
        return LEGACY if self.version < 2 else bucket_chain(self.bucket_of(saga_id))

    def chains(self) -> list[str]:
        """Every ledger chain entries may be written to, legacy first (of layout 2,
        the legacy chain is only read: it holds what was written before a migration;
        and drained: a process of an older release may still push to it)."""
        if self.version < 2:
            return [LEGACY]
        return [LEGACY, *(bucket_chain(b) for b in range(self.buckets))]

    def record(self) -> str:
        return f"{self.version} {self.buckets}"

    def keys(self) -> keys.SagaKeys:
        """The names of sagas' keys and indexes in this layout."""
        return keys.SagaKeys(self.version, self.buckets)


V1 = Layout(1, 1)


def bucket_chain(bucket: int) -> str:
    return f"ledger:{bucket}"


def names_of(client: Any) -> keys.SagaKeys:
    """The key names of the store on ``client`` (one read of its layout; for tools
    that have no :class:`~saga_store.log.stream.SagaLog` to ask)."""
    return load(client, create=False).keys()


def check_version(value: Any, var: str = "SAGA_LAYOUT") -> int:
    """A layout a new store may be created with: 2 or 3."""
    if str(value).strip() not in ("2", "3"):
        raise InvalidInput(f"{var}={value!r}: use 2 or 3 (the layout a new store is created "
                           "with; an existing store keeps its own: see 'saga migrate')",
                           field=var)
    return int(value)


def check_buckets(value: Any, var: str = "SAGA_BUCKETS") -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if not 1 <= n <= MAX_BUCKETS:
        raise InvalidInput(f"{var}={value!r}: use a whole number of buckets from 1 to "
                           f"{MAX_BUCKETS} (e.g. {DEFAULT_BUCKETS}); it is fixed when the "
                           "store is created", field=var)
    return n


def parse(raw: bytes | str | None) -> Layout | None:
    if raw is None:
        return None
    text = raw.decode() if isinstance(raw, bytes) else raw
    parts = text.split()
    try:
        version, buckets = int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise InvalidInput(f"{keys.LAYOUT} holds {text[:40]!r}, not '<version> <buckets>'; "
                           "it was changed by hand: put back what 'saga migrate --status' "
                           "expects") from None
    if version not in VERSIONS or not 1 <= buckets <= MAX_BUCKETS:
        raise InvalidInput(f"{keys.LAYOUT} holds layout {text[:40]!r}, which this release "
                           "does not know; upgrade Saga Store")
    return Layout(version, buckets)


def load(client: Any, buckets: int = DEFAULT_BUCKETS, *, create: bool = True,
         version: int = DEFAULT_VERSION) -> Layout:
    """The store's layout: as recorded; else layout 1 if a ledger of that layout
    exists; else (a new store) layout ``version`` with ``buckets``, recorded (SET NX:
    of two processes creating the store at once, the first one's holds) unless
    ``create`` is False or this user may not write it."""
    raw = client.get(keys.LAYOUT)
    found = parse(raw)
    if found is not None:
        return found
    if client.exists(keys.LEDGER_LOG) or client.exists(keys.LEDGER_PENDING):  # two slots
        return V1
    fresh = Layout(version, buckets)
    if not create:
        return fresh
    try:
        client.set(keys.LAYOUT, fresh.record(), nx=True)
    except Exception as exc:  # a read-only user or replica: it reads what others create
        text = str(exc)
        if not ("NOPERM" in text or "no permissions" in text.lower()
                or "read only replica" in text or "READONLY" in text):
            raise
        return fresh
    return parse(client.get(keys.LAYOUT)) or fresh
