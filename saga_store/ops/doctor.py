"""Checks of the Redis settings that decide whether the log survives.

Measured on this kind of machine: a ``kill -9`` of Redis with snapshots only
lost every acknowledged write since the last snapshot; with ``appendonly yes``
(``everysec`` or ``always``) it lost none. An evicting ``maxmemory-policy``
can drop log keys outright.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import redis

from saga_store.ops.cluster import is_cluster

EVICTING = {"allkeys-lru", "allkeys-lfu", "allkeys-random", "volatile-lru", "volatile-lfu",
            "volatile-random", "volatile-ttl"}


@dataclass(frozen=True)
class Finding:
    """One setting: ``ok`` only when read and fine. ``skipped``: this user may not
    read it (an ACL without CONFIG or INFO, as recommended for workers), so it is
    neither fine nor known to be wrong; ``advice`` says how to check it by hand."""

    setting: str
    value: str
    ok: bool
    advice: str = ""
    skipped: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"setting": self.setting, "value": self.value, "ok": self.ok,
                "skipped": self.skipped, "advice": self.advice}


UNKNOWN = "unknown"


def examine(client: redis.Redis, wait_replicas: int = 0) -> list[Finding]:
    """What matters for durability, read from the server; unreadable settings
    (an ACL without CONFIG) are reported as unknown, never as fine. On a Redis
    Cluster, from every master, each setting named after its node (``host:port
    appendonly``); a replica's settings are its own, check them by hand. With
    ``wait_replicas`` (``SAGA_WAIT_REPLICAS``), whether each master has that
    many replicas connected."""
    if is_cluster(client):
        nodes: Any = client
        return [dataclasses.replace(f, setting=f"{node.name} {f.setting}")
                for node in nodes.get_primaries()
                for f in _examine_one(nodes.get_redis_connection(node), wait_replicas)]
    return _examine_one(client, wait_replicas)


def replica_finding(client: redis.Redis, wait_replicas: int) -> Finding:
    """Whether ``client``'s Redis has the ``wait_replicas`` replicas an append waits
    for: with fewer, every append waits its whole ``SAGA_WAIT_TIMEOUT_MS`` and is
    then reported not confirmed."""
    try:
        connected = int(client.info("replication").get("connected_slaves", 0))
    except redis.ResponseError:
        return Finding("wait_replicas", f"{wait_replicas} (replicas connected: {UNKNOWN})",
                       False, "this user may not run INFO; check by hand that the master "
                       f"has at least {wait_replicas} replicas connected", skipped=True)
    ok = connected >= wait_replicas
    return Finding("wait_replicas", f"{wait_replicas} (replicas connected: {connected})", ok,
                   "" if ok else
                   f"SAGA_WAIT_REPLICAS={wait_replicas} but only {connected} connected: every "
                   "append waits SAGA_WAIT_TIMEOUT_MS and is then reported not confirmed; "
                   "attach replicas (replicaof) or lower SAGA_WAIT_REPLICAS")


def _examine_one(client: redis.Redis, wait_replicas: int = 0) -> list[Finding]:
    out: list[Finding] = []
    info = client.info("server")
    version = str(info.get("redis_version", "?"))
    major = int(version.split(".")[0]) if version[:1].isdigit() else 0
    out.append(Finding("redis_version", version, major >= 6,
                       "" if major >= 6 else "use Redis 6.2 or newer (BLMOVE, ACLs)"))
    try:
        conf: dict[str, str] = {str(k): str(v) for k, v in client.config_get("*").items()}
    except redis.ResponseError:
        conf = _from_info(client)  # an ACL user without CONFIG (as recommended)
    out += aof_findings(conf)
    policy = conf.get("maxmemory-policy", "?")
    fine = policy not in EVICTING and policy not in (UNKNOWN, "?")
    if policy == UNKNOWN:
        out.append(Finding("maxmemory-policy", policy, False, "this user may not run INFO; "
                           "check by hand that maxmemory-policy is noeviction", skipped=True))
    else:
        out.append(Finding("maxmemory-policy", policy, fine, "" if fine else
                           "set 'maxmemory-policy noeviction': an evicting policy can drop "
                           "log keys"))
    if wait_replicas:
        out.append(replica_finding(client, wait_replicas))
    return out


def aof_settings(client: redis.Redis, *, config: bool = True) -> dict[str, str]:
    """``appendonly`` and ``appendfsync`` in one round trip, cheap enough to read
    every few seconds: ``CONFIG GET append*`` (one pattern, so Redis 6.2 takes it
    too), or, for a user without CONFIG or with ``config=False``, ``INFO
    persistence``, where ``appendfsync`` is unknown."""
    if config:
        try:
            return {str(k): str(v) for k, v in client.config_get("append*").items()}
        except redis.ResponseError:
            pass  # an ACL user without CONFIG (as recommended)
    try:
        persistence = client.info("persistence")
    except redis.ResponseError:
        return {"appendonly": UNKNOWN, "appendfsync": UNKNOWN}
    return {"appendonly": "yes" if int(persistence.get("aof_enabled", 0)) else "no",
            "appendfsync": UNKNOWN}


def aof_findings(conf: dict[str, str]) -> list[Finding]:
    """The ``appendonly`` and ``appendfsync`` findings of settings read by
    :func:`examine` or :func:`aof_settings`."""
    out: list[Finding] = []
    aof = conf.get("appendonly", "?")
    if aof == UNKNOWN:
        out.append(Finding("appendonly", aof, False, "this user may not run CONFIG GET or "
                           "INFO; check by hand that appendonly is yes", skipped=True))
    else:
        out.append(Finding("appendonly", aof, aof == "yes",
                           "" if aof == "yes" else "set 'appendonly yes': with snapshots "
                           "only, a crash loses acknowledged appends"))
    fsync = conf.get("appendfsync", "?")
    if fsync == UNKNOWN:
        out.append(Finding("appendfsync", fsync, False,
                           "this user may not run CONFIG GET; check by hand that "
                           "appendfsync is everysec or always", skipped=True))
    else:
        out.append(Finding("appendfsync", fsync, fsync in ("everysec", "always"),
                           "" if fsync in ("everysec", "always") else
                           "set 'appendfsync everysec' (or 'always')"))
    return out


def _from_info(client: redis.Redis) -> dict[str, str]:
    """The settings INFO shows (it needs no CONFIG right); appendfsync it does not."""
    conf = aof_settings(client, config=False)
    try:
        memory = client.info("memory")
    except redis.ResponseError:
        return {**conf, "maxmemory-policy": UNKNOWN}
    return {**conf, "maxmemory-policy": str(memory.get("maxmemory_policy", UNKNOWN))}


def persistent(findings: list[Finding]) -> bool:
    """AOF on, and fsync not known to be off (it cannot be read without CONFIG); on
    a cluster, on every node."""
    by_node: dict[str, dict[str, Finding]] = {}
    for f in findings:
        node, _, setting = f.setting.rpartition(" ")
        by_node.setdefault(node, {})[setting] = f
    return all(_persistent(seen) for seen in by_node.values())


def _persistent(seen: dict[str, Finding]) -> bool:
    aof, fsync = seen.get("appendonly"), seen.get("appendfsync")
    return (aof is not None and aof.ok and fsync is not None
            and (fsync.ok or fsync.value == UNKNOWN))
