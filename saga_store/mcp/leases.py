"""The leases of the sagas one MCP gateway works on.

Every saga a gateway works on is leased to it with the saga's own lease key
(``ss:{S}:lease``, the key and fencing the workers use): a second gateway for
the same downstream leaves it alone, and a gateway that lost it writes nothing
more to it (every append carries the lease, in ``acquire`` mode).

The lease is taken in the saga's opening append, or claimed from a gateway
that left it; kept by every append and by :meth:`Leases.renew`, a third of a
lease apart; given up when the saga closes or the gateway ends.

Renewing and taking over are scripts on the one lease key
(``lua/renew_lease.lua``, ``lua/take_over_lease.lua``).
"""

from __future__ import annotations

import logging
from typing import Any

import redis

from saga_store.keys import SagaKeys
from saga_store.log.scripts import RENEW_LEASE, TAKE_OVER_LEASE
from saga_store.log.stream import Lease, command, release_lease
from saga_store.mcp.holders import holder_gone, holder_token
from saga_store.protocol.vocab import LeaseMode

log = logging.getLogger("saga_store.gateway")


class Leases:
    """What one gateway holds: a token of its own and the sagas leased to it."""

    def __init__(self, client: Any, kind: str, ttl_ms: int, names: SagaKeys) -> None:
        self.redis, self.ttl_ms, self.names = client, ttl_ms, names
        self.token = holder_token(kind)
        self.lease = Lease(self.token, LeaseMode.ACQUIRE, ttl_ms)  # what every append carries
        self.held: set[str] = set()

    def claim(self, saga_id: str) -> bool:
        """Lease a saga another gateway left: True if it is this gateway's now, False
        if a holder that may still be running has it."""
        key = self.names.lease(saga_id)
        taken = bool(self.redis.set(key, self.token, nx=True, px=self.ttl_ms))
        if not taken:
            holder = command(self.redis, "GET", key)
            if holder is None:  # it lapsed just now
                taken = bool(self.redis.set(key, self.token, nx=True, px=self.ttl_ms))
            elif holder_gone(holder.decode()):
                taken = bool(command(self.redis, "EVAL", TAKE_OVER_LEASE, 1, key, holder,
                                     self.token, self.ttl_ms))
        if taken:
            self.held.add(saga_id)
        return taken

    def renew(self) -> None:
        """Keep every lease held; say so if another holder has one of them now (the
        next append to that saga from here is fenced off)."""
        if not self.held:
            return
        pipe = self.redis.pipeline(transaction=False)
        held = sorted(self.held)
        for sid in held:
            pipe.eval(RENEW_LEASE, 1, self.names.lease(sid), self.token, self.ttl_ms)
        kept = pipe.execute()
        for sid, ok in zip(held, kept, strict=True):
            if not ok:
                log.warning("saga %s: another gateway holds its lease now; this gateway "
                            "writes nothing more to it", sid)

    def close_on(self, pipe: Any, saga_id: str) -> None:
        """Queue on ``pipe`` the release of a saga that closed."""
        release_lease(pipe, self.names.lease(saga_id), self.token)
        self.held.discard(saga_id)

    def lost(self, saga_id: str) -> bool:
        """Whether another holder has the saga's lease now."""
        holder = command(self.redis, "GET", self.names.lease(saga_id))
        return holder is not None and holder.decode() != self.token

    def release(self) -> None:
        """Give up every lease held (the next gateway takes those sagas at once)."""
        for sid in sorted(self.held):
            try:
                release_lease(self.redis, self.names.lease(sid), self.token)
            except redis.RedisError as exc:  # then the lease lapses on its own
                log.warning("could not release the lease of saga %s: %s", sid, exc)
        self.held.clear()
