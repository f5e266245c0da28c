"""Checks of the Redis settings that decide whether the log survives.

Measured on this kind of machine: a ``kill -9`` of Redis with snapshots only
lost every acknowledged write since the last snapshot; with ``appendonly yes``
(``everysec`` or ``always``) it lost none. An evicting ``maxmemory-policy``
can drop log keys outright.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

EVICTING = {"allkeys-lru", "allkeys-lfu", "allkeys-random", "volatile-lru", "volatile-lfu",
            "volatile-random", "volatile-ttl"}


@dataclass(frozen=True)
class Finding:
    setting: str
    value: str
    ok: bool
    advice: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"setting": self.setting, "value": self.value, "ok": self.ok,
                "advice": self.advice}


def examine(client: redis.Redis) -> list[Finding]:
    """What matters for durability, read from the server; unreadable settings
    (an ACL without CONFIG) are reported as unknown, never as fine."""
    out: list[Finding] = []
    info = client.info("server")
    version = str(info.get("redis_version", "?"))
    major = int(version.split(".")[0]) if version[:1].isdigit() else 0
    out.append(Finding("redis_version", version, major >= 6,
                       "" if major >= 6 else "use Redis 6.2 or newer (BLMOVE, ACLs)"))
    try:
        conf = {k: str(v) for k, v in client.config_get("*").items()}
    except redis.ResponseError:
        return [*out, Finding("config", "unreadable", False,
                              "this user may not run CONFIG: check the settings below by hand "
                              "(appendonly yes, maxmemory-policy noeviction)")]
    aof = conf.get("appendonly", "?")
    out.append(Finding("appendonly", aof, aof == "yes",
                       "" if aof == "yes" else "set 'appendonly yes': with snapshots only, "
                       "a crash loses acknowledged appends"))
    fsync = conf.get("appendfsync", "?")
    out.append(Finding("appendfsync", fsync, fsync in ("everysec", "always"),
                       "" if fsync in ("everysec", "always") else
                       "set 'appendfsync everysec' (or 'always')"))
    policy = conf.get("maxmemory-policy", "?")
    out.append(Finding("maxmemory-policy", policy, policy not in EVICTING,
                       "" if policy not in EVICTING else
                       "set 'maxmemory-policy noeviction': this policy can evict log keys"))
    return out


def persistent(findings: list[Finding]) -> bool:
    return all(f.ok for f in findings if f.setting in ("appendonly", "appendfsync", "config"))
