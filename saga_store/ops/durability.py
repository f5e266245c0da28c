"""Watching, while processes run, whether Redis still persists every write.

``saga worker`` checks at start-up, but ``CONFIG SET appendonly no`` at run
time turns persistence off without a restart: a later crash of Redis then
loses acknowledged appends, and ``saga verify`` cannot see what is gone
without an anchor. A :class:`DurabilityWatch` re-reads the AOF settings once a
period (one ``CONFIG GET append*``, or one ``INFO persistence`` for a user
without CONFIG), logs one line when the answer changes (and at the first read
if Redis is not durable), and keeps the answer for the ``saga_redis_durable``
gauge.

Durable means: AOF on, and ``appendfsync`` ``everysec`` or ``always``, or
unknown. Unknown is what a user without CONFIG sees (``INFO`` shows whether
AOF is on, not how often it syncs); AOF on is then taken as durable, and
``saga doctor`` says to check the fsync setting by hand. On a Redis Cluster
every master is read (one round trip each), and the answer is durable only if
each of them is; a finding names its node (``host:port appendonly``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import redis

from saga_store.ops.cluster import is_cluster
from saga_store.ops.doctor import UNKNOWN, Finding, aof_findings, aof_settings, persistent

DEFAULT_CHECK_S = 30.0


class DurabilityWatch:
    """The last known answer to "does Redis persist every write?", re-read when
    due. ``log`` None: keep the answer, say nothing (another process logs)."""

    def __init__(self, client: redis.Redis, period_s: float = DEFAULT_CHECK_S,
                 log: logging.Logger | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client, self.period_s, self.log, self.clock = client, period_s, log, clock
        self.durable: bool | None = None  # None until a read succeeded
        self.findings: list[Finding] = []
        self._next = 0.0
        # a user refused CONFIG once is not asked again: each refusal lands in ACL LOG
        self._config = True

    def due(self) -> bool:
        return self.clock() >= self._next

    def check(self) -> bool:
        """Read the settings now; raises RedisError if Redis does not answer (the
        next read is then a period away, like any other)."""
        self._next = self.clock() + self.period_s
        findings = self._read()
        durable = persistent(findings)
        if self.log is not None and durable != self.durable and (
                self.durable is not None or not durable):
            self.log.warning("%s", describe(durable, findings, again=self.durable is not None))
        self.durable, self.findings = durable, findings
        return durable

    def _read(self) -> list[Finding]:
        """The AOF findings of the log's Redis: of each master, on a cluster."""
        if not is_cluster(self.client):
            conf = aof_settings(self.client, config=self._config)
            self._config = conf.get("appendfsync") != UNKNOWN
            return aof_findings(conf)
        nodes: Any = self.client
        out: list[Finding] = []
        for node in nodes.get_primaries():
            conf = aof_settings(nodes.get_redis_connection(node), config=self._config)
            self._config = self._config and conf.get("appendfsync") != UNKNOWN
            out += [dataclasses.replace(f, setting=f"{node.name} {f.setting}")
                    for f in aof_findings(conf)]
        return out

    def poll(self) -> bool | None:
        """The last known answer, read again first if a period has passed."""
        if self.due():
            self.check()
        return self.durable


def describe(durable: bool, findings: list[Finding], *, again: bool = False) -> str:
    """One line on Redis's durability: the settings, and what to do if it is not."""
    settings = ", ".join(f"{f.setting}={f.value}" for f in findings)
    if durable:
        return f"Redis is durable{' again' if again else ''} ({settings})"
    advice = "; ".join(f.advice for f in findings if not f.ok and f.advice)
    return (f"Redis is not durable ({settings}): a crash of Redis now loses acknowledged "
            f"appends; {advice}; see 'saga doctor'")
