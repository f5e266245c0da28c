"""Redis ACL users for workers and agents (Redis 7 selectors).

Neither user can delete or trim anything of Saga Store's: no DEL, UNLINK,
XDEL, XTRIM, FLUSHALL, FLUSHDB, CONFIG, SCRIPT FLUSH, KEYS or SHUTDOWN. Log
streams (``ss:*:log``) take XADD and reads only; the keys that live briefly
(leases, secrets, idempotency claims) are retired by expiry, which is why the
code never sends DEL for them. Lua scripts run with the caller's rights, so the
append script cannot be used to get around this. The one list either user may
shorten is the ledger's pending list, a queue: writers push their ledger
entries there and the sealer trims off what it has chained.

RQ's own bookkeeping (``rq:*``) is RQ's: a worker may delete its own RQ keys
(RQ removes its worker entry and finished jobs), never ``ss:*`` ones.

An agent user may open sagas whose ids start with its prefix, append to them,
enqueue their steps, read them and its own context stream, and read the
ledger (ids and hashes only); it cannot read other agents' sagas.

What ACLs cannot stop: ``XADD ... MAXLEN`` is XADD, so a user allowed to append
could trim a stream's head. ``saga verify`` reports that (``missing_entry`` at
seq 0), and a cut tail shows against the ledger or an anchor.
"""

from __future__ import annotations

from saga_store import keys
from saga_store.errors import InvalidInput
from saga_store.ids import check_id

FORBIDDEN = ["del", "unlink", "xdel", "xtrim", "flushall", "flushdb", "config", "script|flush",
             "keys", "shutdown", "swapdb", "move", "rename", "renamenx", "restore", "migrate",
             "debug", "module", "acl", "bgrewriteaof", "bgsave", "save", "failover",
             "replicaof", "slaveof", "sort", "copy"]
CONNECTION = ["+ping", "+hello", "+auth", "+info", "+client|setname", "+client|getname",
              "+client|id", "+select", "+time", "+script|load", "+script|exists"]
# the writes Saga Store makes to keys that are not logs
SIDE_WRITES = ["+hset", "+hsetnx", "+hincrby", "+set", "+pexpire", "+expire", "+zadd", "+zrem",
               "+sadd", "+srem", "+xadd"]
SCRIPTS = ["+evalsha", "+eval"]
P = keys.PREFIX  # every pattern below is of the key schema in keys.py
LEDGER_QUEUE = (f"~{P}:ledger:{{*}}:pending", "+rpush", "+ltrim", "+lpop")


def worker_rules() -> list[str]:
    """Rules (after ``ACL SETUSER name reset``) for ``saga worker`` processes."""
    side = [f"~{P}:{{*}}:meta", f"~{P}:{{*}}:lease", f"~{P}:{{*}}:driver",
            f"~{P}:{{*}}:secrets",
            f"~{P}:{{*}}:blob:*", f"~{P}:idem:*", f"~{P}:ctx:*", f"~{P}:active",
            f"~{P}:needs_attention", f"~{P}:approvals",
            f"~{P}:gateway:*",  # the MCP gateway runs calls like a worker: it uses this user
            f"~{P}:ledger:{{*}}:meta", f"~{P}:ledger:{{*}}:lease",
            f"~{P}:ledger:{{*}}:rejected"]
    return [
        # RQ's keys and channels: RQ's own bookkeeping, including its deletes
        "resetchannels", "&rq:*", "~rq:*", "+@all", "-@dangerous", *CONNECTION,
        *[f"-{c}" for c in FORBIDDEN if c not in ("del", "unlink")],
        # Saga Store's keys: read all, run the append script, append to logs only
        _selector(f"%R~{P}:*", "+@read", "-keys", *SCRIPTS, "+scan", "+watch"),
        _selector(f"~{P}:*", *SCRIPTS),
        _selector(f"~{P}:*:log", "+xadd"),
        _selector(*side, *SIDE_WRITES),
        _selector(*LEDGER_QUEUE),
    ]


def agent_rules(agent_id: str, saga_prefix: str) -> list[str]:
    """Rules for an agent that submits sagas with ids starting ``saga_prefix``."""
    check_id(agent_id, "agent_id")
    if not saga_prefix or any(c in saga_prefix for c in "*?[]\\{}: \n"):
        raise InvalidInput("a saga prefix needs at least one character and no glob or key "
                           "characters (* ? [ ] \\ { } : space); for example 'agent-a-'",
                           field="saga_prefix")
    mine = f"{P}:{{{saga_prefix}*}}"
    return [
        "resetchannels", "&rq:*", "-@all", *CONNECTION,
        # enqueue steps: RQ's job hash and queue list, nothing else of RQ's
        "~rq:job:*", "~rq:queue:*", "~rq:queues", "+hset", "+expire", "+rpush", "+sadd",
        "+hget", "+hgetall", "+llen",
        _selector(f"%R~{mine}:*", f"%R~{P}:ledger:*", f"%R~{P}:ctx:{{{agent_id}}}", "+@read",
                  "-keys", "-scan"),
        _selector(f"~{mine}:*", f"~{P}:ledger:*", *SCRIPTS),
        _selector(f"~{mine}:log", f"~{P}:ledger:{{*}}:log", "+xadd"),
        _selector(f"~{mine}:meta", f"~{mine}:lease", f"~{mine}:driver", f"~{mine}:secrets",
                  f"~{mine}:blob:*",
                  f"~{P}:ledger:{{*}}:meta", f"~{P}:ledger:{{*}}:lease",
                  f"~{P}:ledger:{{*}}:rejected", f"~{P}:idem:*",
                  f"~{P}:active",
                  *SIDE_WRITES),
        _selector(*LEDGER_QUEUE),
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
