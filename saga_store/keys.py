"""Every Redis key Saga Store uses, in one place.

All keys of one saga share one hash tag, so every script touches a single Redis
Cluster slot: ``{<saga_id>}`` of layouts 1 and 2 (below), its bucket's ``{b<n>}``
of layout 3, shared with the bucket's indexes and ledger keys (``SagaKeys``
names them; every key user asks it).

    ss:{S}:log            stream   the saga's events; entry id 0-(seq+1);
                                   fields b (canonical body), h (hash, 32 raw
                                   bytes; prev is the entry before's h) and p
                                   (the saga's phase after the entry)
    ss:{S}:meta           hash     cached projection: agent_id, state, phase,
                                   seq, created_ms, updated_ms (rebuildable)
    ss:{S}:lease          string   the lease: its holder's fencing token, PX-expiring
    ss:{S}:driver         string   a client-driven saga's client lease, PX-expiring
    ss:{S}:blob:<sha256>  string   large payload stored by content hash
    ss:{S}:secrets        hash     secret tool arguments by step, and the salt
                                   of their digests (never in the log)
    ss:layout             string   the store's layout, "<version> <buckets>" (layout.py)
    ss:archive:lease      string   the lease of the one 'saga archive' run at a time
                                   (log/archive.py), PX-expiring
    ss:sweep:<g>          string   the lease of the sweeper of bucket group g (layout 3)
    ss:sweeper:last       hash     the last sweep of any worker: at_ms (Redis time),
                                   by (worker), indexes looked at, jobs queued
    ss:ledger:{b<n>}:...  the same five keys for bucket n's ledger chain (layout 2;
                                   its chain id is "ledger:<n>")
    ss:ledger:{root}:log  stream   the root chain: the buckets' heads, recorded
                                   by anchors and sweepers (layout 2)
    ss:ledger:{ledger}:log stream  the ledger chain (one entry per saga open/close;
                                   of layout 2, the chain written before migrating)
    ss:ledger:{ledger}:pending list  ledger entries written, not yet chained (the
                                   sealer chains them in batches)
    ss:ledger:{ledger}:lease string  the sealer's lease
    ss:ledger:{ledger}:rejected stream  pending entries the sealer refused to chain
                                   (their saga's chain does not bear them out), with why
    ss:ledger:{ledger}:base string  "<seq> <hash hex>": the chain's last entry
                                   'saga archive' moved out (its prefix 0 .. seq is
                                   in the archive); absent: the chain starts at seq 0
    ss:{<A>_}:idem:<key>  hash     dedupe record of an explicit idempotency key
                                   given in any saga of agent A (A owns a namespace)
    ss:idem:{<A>:<key>}   hash     the same, for an agent A that owns no namespace
                                   (an id with '_' or other characters)
    ss:idem:{<key>}       hash     the same, for a saga of no agent
    ss:{<A>_}:active      zset     ss:active for agent A's sagas, so an agent user
                                   writes no index but its own (layout 3 keeps it
                                   per bucket: ss:{b<n>}:<A>_:active, and lists the
                                   bucket's agents in ss:{b<n>}:agents)
    ss:agents             set      agents with an index of their own (the sweeper
                                   looks at each)
    ss:ctx:{<agent_id>}   stream   context-sync events for one agent
    ss:active             zset     sagas with work in flight, scored by the time
                                   (ms) after which the sweeper looks at them
    ss:needs_attention    set      sagas that ended needing a person
    ss:attention:acks     stream   who acknowledged such a saga, when and why
    ss:gateway:{<id>}     set      sagas an MCP gateway for one downstream has open
    ss:approvals          zset     gated steps awaiting a decision, "<saga>:<step>",
                                   scored by their deadline (ms)

The ledger key does not begin with ``ss:{`` so no saga id can collide with it.
No key here is ever deleted: leases, secrets and idempotency claims expire
(``PEXPIRE key 0`` retires one at once), so ACL users need no DEL (see acl.py).
The one exception is ``saga archive``, an operator's command with an admin
user, which removes a closed saga's keys together with writing its tombstone
(``log/archive.py``).
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Mapping

from saga_store.errors import InvalidInput
from saga_store.ids import SCOPED_AGENT, agent_of

DEFAULT_NAMESPACE = "ss"
NAMESPACE = re.compile(r"[a-z][a-z0-9-]{0,31}")


def namespace(value: str | None = None) -> str:
    """The key namespace (``SAGA_NAMESPACE``, default ``ss``): several deployments,
    or the demo, share one Redis without seeing each other's sagas, ledger or
    queues. Read once, when this module is first imported."""
    ns = value if value is not None else os.environ.get("SAGA_NAMESPACE") or DEFAULT_NAMESPACE
    # its job ids start "<ns>-saga-step-": a namespace "shop-saga-step-x" would have
    # its jobs under shop's ACL pattern (rq:job:shop-saga-step-*; see ops/acl.py)
    if not NAMESPACE.fullmatch(ns) or "saga-step" in ns or "saga-comp" in ns:
        raise InvalidInput(f"SAGA_NAMESPACE={ns!r}: use 1-32 lower-case letters, digits and "
                           "'-', starting with a letter, without 'saga-step' or 'saga-comp' "
                           "(e.g. 'shop-prod')", field="SAGA_NAMESPACE")
    return ns


PREFIX = namespace()
# RQ's keys are RQ's (rq:queue:*, rq:job:*): a namespace other than the default
# names its queues and jobs apart there
RQ_PREFIX = "" if PREFIX == DEFAULT_NAMESPACE else f"{PREFIX}-"
LEDGER_ID = "ledger"
LEDGER_LOG = f"{PREFIX}:ledger:{{{LEDGER_ID}}}:log"
LEDGER_PENDING = f"{PREFIX}:ledger:{{{LEDGER_ID}}}:pending"
LEDGER_LEASE = f"{PREFIX}:ledger:{{{LEDGER_ID}}}:lease"
LEDGER_REJECTED = f"{PREFIX}:ledger:{{{LEDGER_ID}}}:rejected"


LAYOUT = f"{PREFIX}:layout"
ARCHIVE_LEASE = f"{PREFIX}:archive:lease"
AGENTS = f"{PREFIX}:agents"


def ledger_tag(chain_id: str) -> str:
    """The hash tag of a ledger chain's keys: ``ledger`` (the legacy chain),
    ``root``, or ``b<n>`` for bucket n (``ledger:<n>``)."""
    if chain_id == LEDGER_ID:
        return LEDGER_ID
    return "root" if chain_id == "ledger:root" else f"b{chain_id.partition(':')[2]}"


def is_ledger(chain_id: str) -> bool:
    """Whether ``chain_id`` names a ledger chain (saga ids never contain ':')."""
    return chain_id == LEDGER_ID or chain_id.startswith("ledger:")


def ledger_log(chain_id: str) -> str:
    return f"{PREFIX}:ledger:{{{ledger_tag(chain_id)}}}:log"


def ledger_pending(chain_id: str) -> str:
    return f"{PREFIX}:ledger:{{{ledger_tag(chain_id)}}}:pending"


def ledger_lease(chain_id: str) -> str:
    return f"{PREFIX}:ledger:{{{ledger_tag(chain_id)}}}:lease"


def ledger_rejected(chain_id: str) -> str:
    return f"{PREFIX}:ledger:{{{ledger_tag(chain_id)}}}:rejected"


def ledger_base(chain_id: str) -> str:
    return f"{PREFIX}:ledger:{{{ledger_tag(chain_id)}}}:base"


def active_for(saga_id: str) -> str:
    """The index of sagas in flight that ``saga_id`` belongs in: its agent's own
    (``ss:{<agent>_}:active``) for an id in an agent's namespace, else ss:active."""
    agent = agent_of(saga_id)
    return ACTIVE if agent is None else agent_active(agent)


def agent_active(agent: str) -> str:
    return f"{PREFIX}:{{{agent}_}}:active"


def idem_for(agent_id: str | None, key: str) -> str:
    """The dedupe record of an explicit key given in one of ``agent_id``'s sagas.

    The scope is the agent, whatever form its sagas' ids take (auto ids
    ``<agent>_<ULID>``, ids a plan or the caller chose, a gateway's sessions): an
    agent's keys are its own, as an account's are at a payment provider, so the
    same key in any of its sagas names the same call. An agent that owns a
    namespace keeps its records there (its Redis user writes only those); another
    agent's records carry its id in their name. A saga of no agent (none is made
    by this package, but a hand-written log may have one) uses the store's scope.
    """
    if agent_id is None:
        return idem(key)
    if SCOPED_AGENT.fullmatch(agent_id):
        return agent_idem(agent_id, key)
    # check_id keeps ':', '{' and '}' out of agent ids, so no two agents' names meet
    return f"{PREFIX}:idem:{{{agent_id}:{key}}}"


def agent_idem(agent: str, key: str) -> str:
    return f"{PREFIX}:{{{agent}_}}:idem:{key}"














ACTIVE = f"{PREFIX}:active"
NEEDS_ATTENTION = f"{PREFIX}:needs_attention"
APPROVALS = f"{PREFIX}:approvals"
ATTENTION_ACKS = f"{PREFIX}:attention:acks"


def bucket_of(saga_id: str, buckets: int) -> int:
    """A saga's bucket: CRC-32 of its id, modulo the number of buckets (its keys'
    tag of layout 3, and its ledger chain of layouts 2 and 3)."""
    return zlib.crc32(saga_id.encode()) % buckets


class SagaKeys:
    """The names of a saga's keys and of the indexes it is listed in, by the
    store's layout (``log/layout.py``): every key user asks the store's
    ``keys`` (``EventStore.keys``, ``SagaLog.keys``), never builds a name itself.

    Of layouts 1 and 2 a saga's keys carry the saga's own hash tag
    (``ss:{S}:log``) and the indexes are global (``ss:active``, ``ss:approvals``,
    ``ss:needs_attention``). Of layout 3 a saga's keys and its bucket's indexes
    carry the bucket's hash tag, the one its ledger chain's keys carry, so one
    script writes a saga, the indexes it is in and its ledger entry together:

        ss:{b<n>}:<S>:log (:meta, :lease, :driver, :secrets, :blob:<sha256>)
        ss:{b<n>}:active            bucket n's sagas in flight (of no agent's namespace;
                                    an agent's stay in its own ss:{<A>_}:active, the
                                    one key of that kind its Redis user may write)
        ss:{b<n>}:approvals         gated steps awaiting a decision
        ss:{b<n>}:needs_attention   sagas that ended needing a person
    """

    __slots__ = ("buckets", "version")

    def __init__(self, version: int = 2, buckets: int = 1) -> None:
        self.version = version
        self.buckets = buckets

    @property
    def bucketed(self) -> bool:
        """Whether a saga's keys, its indexes and its ledger entries share a slot."""
        return self.version >= 3

    def bucket_of(self, saga_id: str) -> int:
        return bucket_of(saga_id, self.buckets)

    def bucket_tag(self, bucket: int) -> str:
        return f"{PREFIX}:{{b{bucket}}}"

    def base(self, saga_id: str) -> str:
        if self.version < 3:
            return f"{PREFIX}:{{{saga_id}}}"
        return f"{self.bucket_tag(self.bucket_of(saga_id))}:{saga_id}"

    def log(self, saga_id: str) -> str:
        return f"{self.base(saga_id)}:log"

    def meta(self, saga_id: str) -> str:
        return f"{self.base(saga_id)}:meta"

    def lease(self, saga_id: str) -> str:
        return f"{self.base(saga_id)}:lease"

    def driver(self, saga_id: str) -> str:
        """The lease of a client-driven saga's caller (see ``Saga.keepalive``)."""
        return f"{self.base(saga_id)}:driver"

    def secrets(self, saga_id: str) -> str:
        return f"{self.base(saga_id)}:secrets"

    def blob(self, saga_id: str, digest_hex: str) -> str:
        return f"{self.base(saga_id)}:blob:{digest_hex}"

    def chain_log(self, chain_id: str) -> str:
        """The stream that holds the chain ``chain_id`` (a saga id, or a ledger chain)."""
        return ledger_log(chain_id) if is_ledger(chain_id) else self.log(chain_id)

    def saga_of_log(self, key: str) -> str | None:
        """The saga id whose log ``key`` is (None for any other key)."""
        if self.version < 3:
            return saga_id_from_log_key(key)
        m = _BUCKETED_LOG.fullmatch(key)
        return m[1] if m and key.startswith(f"{PREFIX}:") else None

    def log_pattern(self) -> str:
        """A SCAN pattern that matches every saga's log (and may match more: check
        each with :meth:`saga_of_log`)."""
        return f"{PREFIX}:{{*}}:log" if self.version < 3 else f"{PREFIX}:{{b*}}:*:log"

    def active(self, saga_id: str) -> str:
        """The index of sagas in flight that ``saga_id`` belongs in: its agent's own
        for an id in an agent's namespace (an agent user writes no index but its own).
        Of layout 3 every index is its bucket's, under the saga's own hash tag: an
        agent's sagas of bucket n in ``ss:{b<n>}:<agent>_:active``. So the index
        lives on the node that holds the saga's log, and a failover that loses a
        saga's close loses the close's leaving of the index with it (a replica
        holds a prefix of what its master took): no saga comes back running with
        no index entry for a sweeper to find."""
        agent = agent_of(saga_id)
        if self.version < 3:
            return active_for(saga_id)
        if agent is not None:
            return self.agent_active(self.bucket_of(saga_id), agent)
        return self.shared_active(self.bucket_of(saga_id))

    def agent_active(self, bucket: int, agent: str) -> str:
        """Agent ``agent``'s index of its sagas in flight of one bucket (layout 3)."""
        return f"{self.bucket_tag(bucket)}:{agent}_:active"

    def agents_list(self, saga_id: str) -> str:
        """Where the agent of ``saga_id`` is listed for the sweepers: ``ss:agents``,
        of layout 3 its bucket's ``ss:{b<n>}:agents``."""
        return AGENTS if self.version < 3 else f"{self.bucket_tag(self.bucket_of(saga_id))}:agents"

    def bucket_agents(self, bucket: int) -> str:
        """The agents with an index in bucket ``bucket`` (layout 3)."""
        return f"{self.bucket_tag(bucket)}:agents"

    def shared_active(self, bucket: int) -> str:
        """The index of sagas in flight of no agent's namespace, of one bucket (of
        layouts 1 and 2, the only one)."""
        return ACTIVE if self.version < 3 else f"{self.bucket_tag(bucket)}:active"

    def approvals(self, saga_id: str) -> str:
        """The index of gated steps awaiting a decision that ``saga_id``'s go in."""
        if self.version < 3:
            return APPROVALS
        return f"{self.bucket_tag(self.bucket_of(saga_id))}:approvals"

    def needs_attention(self, saga_id: str) -> str:
        """The set of ended sagas needing a person that ``saga_id`` goes in."""
        if self.version < 3:
            return NEEDS_ATTENTION
        return f"{self.bucket_tag(self.bucket_of(saga_id))}:needs_attention"

    def all_buckets(self) -> range:
        """Every bucket whose indexes may hold something (one, of layouts 1 and 2)."""
        return range(self.buckets if self.version >= 3 else 1)

    def all_approvals(self, buckets: list[int] | None = None) -> list[str]:
        """Every index of gated steps awaiting a decision (of layout 3, those of
        ``buckets`` only, if given)."""
        if self.version < 3:
            return [APPROVALS]
        return [f"{self.bucket_tag(b)}:approvals"
                for b in (self.all_buckets() if buckets is None else buckets)]

    def all_needs_attention(self) -> list[str]:
        """Every set of sagas that ended needing a person."""
        if self.version < 3:
            return [NEEDS_ATTENTION]
        return [f"{self.bucket_tag(b)}:needs_attention" for b in self.all_buckets()]

    def all_active(self, agents: list[str], buckets: list[int] | None = None,
                   in_buckets: Mapping[int, list[str]] | None = None,
                   ) -> list[tuple[str, str | None]]:
        """Every index of sagas in flight, with the agent it is of (None: a shared
        one), given the agents listed in ``ss:agents`` (their indexes of before
        layout 3 kept agents' indexes under the saga's bucket) and, of layout 3, the
        agents listed in each bucket (``in_buckets``); ``buckets``: of the
        buckets' indexes, only those buckets' (of layout 3; None: all)."""
        shared = self.all_buckets() if buckets is None or self.version < 3 else buckets
        listed = in_buckets or {}
        return [*((self.shared_active(b), None) for b in shared),
                *((self.agent_active(b, a), a) for b in shared for a in listed.get(b, ())),
                *((agent_active(a), a) for a in agents)]


_BUCKETED_LOG = re.compile(r"[a-z][a-z0-9-]*:\{b\d+\}:([^{}:]+):log")


SWEEPER_LAST = f"{PREFIX}:sweeper:last"  # the last sweep: when, by whom, what it found


def sweep_lease(group: int) -> str:
    """The lease of the sweeper looking at a group of buckets' indexes (layout 3)."""
    return f"{PREFIX}:sweep:{group}"


def idem(key: str) -> str:
    return f"{PREFIX}:idem:{{{key}}}"


def gateway_sagas(gateway_id: str) -> str:
    return f"{PREFIX}:gateway:{{{gateway_id}}}"


def agent_ctx(agent_id: str) -> str:
    return f"{PREFIX}:ctx:{{{agent_id}}}"




def saga_id_from_log_key(key: str) -> str | None:
    if key.startswith(f"{PREFIX}:{{") and key.endswith("}:log"):
        return key[len(PREFIX) + 2 : -5]
    return None


def entry_id(seq: int) -> str:
    """Stream entry id of event ``seq``: Redis itself then refuses out-of-order ids."""
    return f"0-{seq + 1}"


def seq_of_entry_id(entry: bytes | str) -> int:
    text = entry.decode() if isinstance(entry, bytes) else entry
    ms, _, n = text.partition("-")
    if ms != "0" or not n.isdigit():
        return -1
    return int(n) - 1
