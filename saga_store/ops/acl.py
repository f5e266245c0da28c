"""Redis ACL users for workers and agents (Redis 7 selectors).

Neither user can delete or trim anything of Saga Store's: no DEL, UNLINK,
XDEL, XTRIM, FLUSHALL, FLUSHDB, CONFIG, SCRIPT FLUSH, KEYS or SHUTDOWN. Log
streams (``ss:*:log``) take XADD and reads only; the keys that live briefly
(leases, secrets, idempotency claims) are retired by expiry, which is why the
code never sends DEL for them. Lua scripts run with the caller's rights, so the
append script cannot be used to get around this.

RQ's own bookkeeping is RQ's: a worker may delete its own RQ keys (RQ removes
its worker entry and finished jobs), never ``ss:*`` ones. A worker user is
its namespace's (``SAGA_NAMESPACE``): of RQ's keys it is granted those of its
namespace's two queues (``rq:queue:<q>``, its intermediate list, and RQ's
per-queue keys ``rq:<kind>:<q>``: registries, locks, workers), its jobs
(``rq:<kind>:<ns>-saga-step-*`` and ``-saga-comp-*``: hash, results,
executions), its workers (``rq:worker:<ns>.*``, whose names carry the
namespace, and their channels ``rq:pubsub:<ns>.*``). RQ's few keys that all
namespaces share are granted for the commands RQ sends them only: SADD and
SREM on ``rq:workers``, reads of ``rq:suspended``, ``rq:groups`` and
``rq:rl-keys``, SET on ``rq:clean_groups``. Queue names (``<ns>-saga-steps``)
and job ids are whole names or end in ``-``, and a namespace never contains
``saga-step`` or ``saga-comp`` (keys.namespace), so no namespace's patterns
cover another's. Of the default namespace ``ss`` the names have no prefix
(``saga-steps``, ``saga-step-*``).

An agent user owns a namespace: the sagas whose ids start ``<agent>_`` (the
ids its store makes), their keys (``ss:{<agent>_*}:*``: log, meta, leases,
secrets, blobs), its index of sagas in flight and its explicit keys' records
(``ss:{<agent>_}:*``), its context stream, and the RQ jobs of its sagas
(``rq:job:saga-step-<agent>_*``, ``rq:job:saga-comp-<agent>_*``). An agent id
of letters, digits and ``-`` never contains ``_``, so no namespace covers
another's: agent ``a`` does not cover ``a-b``. Outside it the agent may only
add: push its jobs' ids onto the two queues, push ledger entries onto the
pending list (the sealer chains only what the sagas' own chains bear out and
sets the rest aside, which ``saga verify`` reports), and add names to
``ss:agents`` and a bucket's ``ss:{b<n>}:agents`` (the sweepers' lists of indexes:
they read only names an agent can own, and drop from an index what is not that
agent's). It cannot read other agents'
sagas, write the ledger chain, trim the pending list, or touch the shared
index of sagas in flight, other agents' jobs or records.

What ACLs cannot stop: ``XADD ... MAXLEN`` is XADD, so a user allowed to append
could trim a stream's head. ``saga verify`` reports that (``missing_entry`` at
seq 0), and a cut tail shows against the ledger or an anchor.
"""

from __future__ import annotations

from saga_store import keys
from saga_store.errors import InvalidInput
from saga_store.execution.jobs import (
    COMP_JOB,
    COMPENSATION_QUEUE,
    STEP_JOB,
    STEP_QUEUE,
    WORKER_PREFIX,
)
from saga_store.ids import SCOPED_AGENT, check_id

FORBIDDEN = ["del", "unlink", "xdel", "xtrim", "flushall", "flushdb", "config", "script|flush",
             "keys", "shutdown", "swapdb", "move", "rename", "renamenx", "restore", "migrate",
             "debug", "module", "acl", "bgrewriteaof", "bgsave", "save", "failover",
             "replicaof", "slaveof", "sort", "copy"]
CONNECTION = ["+ping", "+hello", "+auth", "+info", "+client|setname", "+client|getname",
              "+client|id", "+select", "+time", "+script|load", "+script|exists",
              "+wait"]  # SAGA_WAIT_REPLICAS: an append waits for replicas on its connection
# the writes Saga Store makes to keys that are not logs
SIDE_WRITES = ["+hset", "+hsetnx", "+hincrby", "+set", "+pexpire", "+expire", "+zadd", "+zrem",
               "+sadd", "+srem", "+xadd"]
SCRIPTS = ["+evalsha", "+eval"]
P = keys.PREFIX  # every pattern below is of the key schema in keys.py
QUEUE_PREFIX = "rq:queue:"
LEDGER_QUEUE = (f"~{P}:ledger:{{*}}:pending", "+rpush", "+ltrim", "+lpop")


def rq_patterns() -> list[str]:
    """Patterns of the RQ keys of this namespace's queues, jobs and workers."""
    queues = (STEP_QUEUE, COMPENSATION_QUEUE)
    return [*(f"~{QUEUE_PREFIX}{q}" for q in queues),
            *(f"~{QUEUE_PREFIX}{q}:*" for q in queues),  # its intermediate list
            *(f"~rq:*:{q}" for q in queues),  # rq:wip:<q>, rq:workers:<q>, ...
            *(f"~rq:*:{j}*" for j in (STEP_JOB, COMP_JOB)),  # rq:job:<id>, rq:results:<id>
            f"~rq:worker:{WORKER_PREFIX}*"]


def worker_rules() -> list[str]:
    """Rules (after ``ACL SETUSER name reset``) for ``saga worker`` processes."""
    # a saga's keys: ss:{S}:meta (layout 2) and ss:{b<n>}:S:meta (layout 3)
    saga = [f"~{P}:{tag}:{suffix}" for suffix in ("meta", "lease", "driver", "secrets",
                                                  "blob:*")
            for tag in ("{*}", "{b*}:*")]
    side = [*saga, f"~{P}:{{*}}:active", f"~{P}:{{*}}:idem:*", f"~{P}:agents",
            # of layout 3: an agent's index in a bucket, and the bucket's agents
            f"~{P}:{{b*}}:*_:active", f"~{P}:{{*}}:agents",
            f"~{P}:idem:*", f"~{P}:ctx:*", f"~{P}:active",
            f"~{P}:needs_attention", f"~{P}:approvals",
            f"~{P}:{{*}}:needs_attention", f"~{P}:{{*}}:approvals",  # a bucket's (layout 3)
            f"~{P}:sweep:*",  # the sweepers' leases on groups of buckets (layout 3)
            f"~{P}:sweeper:last",  # what the last sweep did (the console shows it)
            f"~{P}:gateway:*",  # the MCP gateway runs calls like a worker: it uses this user
            f"~{P}:ledger:{{*}}:meta", f"~{P}:ledger:{{*}}:lease",
            f"~{P}:ledger:{{*}}:rejected",
            f"~{P}:layout"]  # recorded by whoever first writes to a new store
    return [
        # its namespace's RQ keys and channels: RQ's own bookkeeping, its deletes too
        "resetchannels", f"&rq:pubsub:{WORKER_PREFIX}*", *rq_patterns(), "+@all",
        "-@dangerous", *CONNECTION, *[f"-{c}" for c in FORBIDDEN if c not in ("del", "unlink")],
        # RQ's keys every namespace shares, for what RQ's worker does with them only
        _selector("~rq:workers", "+sadd", "+srem"),
        _selector("%R~rq:suspended", "%R~rq:groups", "%R~rq:rl-keys", "+exists", "+get",
                  "+smembers"),
        _selector("~rq:clean_groups", "+set"),
        # Saga Store's keys: read all, run the append script, append to logs only
        _selector(f"%R~{P}:*", "+@read", "-keys", *SCRIPTS, "+scan", "+watch"),
        _selector(f"~{P}:*", *SCRIPTS),
        _selector(f"~{P}:*:log", "+xadd"),
        _selector(*side, *SIDE_WRITES),
        _selector(*LEDGER_QUEUE),
    ]


def agent_rules(agent_id: str) -> list[str]:
    """Rules for one agent: it drives the sagas of its namespace (see above)."""
    check_id(agent_id, "agent_id")
    if not SCOPED_AGENT.fullmatch(agent_id):
        raise InvalidInput(f"agent id {agent_id[:40]!r} cannot own a namespace: an agent "
                           "with its own Redis user needs an id of 1-64 letters, digits and "
                           "'-' (no '_': it ends the namespace)", field="agent_id")
    # its sagas' keys, and its own keys: ss:{A_...}:... (layout 2), and under any
    # bucket's tag, ss:{b<n>}:A_...:... (layout 3); the ':' after the tag and no '}'
    # or ':' in a saga id keep another agent's keys out of either pattern
    mine = (f"{P}:{{{agent_id}_*}}", f"{P}:{{b*}}:{agent_id}_*")
    jobs = (f"~rq:job:{STEP_JOB}{agent_id}_*", f"~rq:job:{COMP_JOB}{agent_id}_*")

    def of(*suffixes: str, read: bool = False) -> list[str]:
        return [f"{'%R' if read else ''}~{m}:{s}" for m in mine for s in suffixes]
    return [
        "resetchannels", "-@all", *CONNECTION,
        _selector(*of("*", read=True), f"%R~{P}:ledger:{{*}}:log",
                  f"%R~{P}:ledger:{{*}}:pending", f"%R~{P}:layout",
                  f"%R~{P}:ctx:{{{agent_id}}}", "+@read", "-keys", "-scan"),
        # its scripts write its sagas' keys and, of layout 3, its bucket's ledger list
        _selector(*of("*"), f"~{P}:ledger:{{*}}:pending", *SCRIPTS),
        _selector(*of("log"), f"~{P}:ctx:{{{agent_id}}}", "+xadd"),
        # each kind of key takes only the writes of its type (no SET over a log)
        _selector(*of("lease", "driver", "blob:*"), "+set", "+pexpire"),
        _selector(*of("meta", "secrets", "idem:*"), "+hset", "+hsetnx", "+pexpire", "+expire"),
        _selector(*of("active"), "+zadd", "+zrem"),
        _selector(f"~{P}:agents", f"~{P}:{{b*}}:agents", "+sadd"),
        _selector(f"~{P}:ledger:{{*}}:pending", "+rpush"),
        # its steps' jobs: their hashes, and their ids pushed on the queues
        _selector(*jobs, "+hset", "+expire", "+hget", "+hgetall"),
        _selector(f"~{QUEUE_PREFIX}{STEP_QUEUE}", f"~{QUEUE_PREFIX}{COMPENSATION_QUEUE}",
                  "+rpush", "+llen"),
    ]


def _selector(*rules: str) -> str:
    return "(" + " ".join(rules) + ")"


def setuser_args(user: str, rules: list[str]) -> list[str]:
    """Arguments for ``ACL SETUSER``: reset first (no password, so nobody can log in
    as the user until one is set with ``ACL SETUSER user >password``)."""
    return [user, "reset", *rules, "on"]


def setuser_line(user: str, rules: list[str]) -> str:
    """The ``ACL SETUSER`` command as one line for redis-cli."""
    return "ACL SETUSER " + " ".join(
        f"'{a}'" if any(c in a for c in "(){}*&~% ") else a for a in setuser_args(user, rules))
