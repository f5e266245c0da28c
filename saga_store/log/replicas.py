"""Waiting for replicas after an append (``SAGA_WAIT_REPLICAS``).

Redis replicates asynchronously: the master acknowledges a write before any
replica has it, so a failover can lose appends the old master acknowledged.
``WAIT N timeout`` blocks the calling connection until N replicas acknowledged
that connection's writes so far, or the timeout passed, and returns how many
did. It goes right after the append's script call, on the same connection;
an append fewer replicas confirmed is not done (see
:meth:`saga_store.log.stream.PreparedAppend.confirmed`).
"""

from __future__ import annotations

from typing import Any

from saga_store import keys
from saga_store.errors import StoreUnavailable
from saga_store.settings import Settings


class WaitLost(Exception):
    """The reply a WAIT gets when the node that took the write before it is gone or
    no longer serves its slot (a failover, a reshard) before the WAIT answered.
    Sent again anywhere else it would count replicas of another node, for another
    connection's writes, and confirm what no replica holds: so it is not sent
    again, and the append it follows is not confirmed."""


def queue_wait(pipe: Any, settings: Settings) -> bool:
    """Queue the WAIT on ``pipe`` if the settings ask for one; whether they did."""
    if settings.wait_replicas:
        pipe.execute_command("WAIT", settings.wait_replicas, settings.wait_timeout_ms)
    return bool(settings.wait_replicas)


def shortfall(chain_id: str, acked: Any, settings: Settings) -> StoreUnavailable | None:
    """The error an append to ``chain_id`` that landed amounts to when its WAIT's
    reply ``acked`` (a count, or the WAIT's error) falls short; None if it does not."""
    if isinstance(acked, WaitLost):
        return StoreUnavailable(
            f"append to {chain_id} is not confirmed: the node that took it failed over or "
            f"gave up its slot before {settings.wait_replicas} replicas (SAGA_WAIT_REPLICAS) "
            f"acknowledged it ({acked}); it may be lost. {_look(chain_id)}")
    if isinstance(acked, Exception):
        return StoreUnavailable(
            f"append to {chain_id} is on the master but not confirmed: WAIT failed "
            f"({acked}); grant this Redis user WAIT (+wait; the users 'saga acl' prints "
            "have it), or unset SAGA_WAIT_REPLICAS")
    if int(acked) >= settings.wait_replicas:
        return None
    return StoreUnavailable(
        f"append to {chain_id} is on the master but not confirmed: {acked} of "
        f"{settings.wait_replicas} replicas (SAGA_WAIT_REPLICAS) acknowledged it within "
        f"{settings.wait_timeout_ms} ms (SAGA_WAIT_TIMEOUT_MS), so a failover could lose "
        f"it; check the replicas (INFO replication: connected_slaves, lag). It may stand: "
        f"{_look(chain_id)}")


def _look(chain_id: str) -> str:
    """What to do about an append that may or may not stand."""
    return "the sealer sends it again" if keys.is_ledger(chain_id) else (
        f"an append sent again finds itself, and a plan submitted again with "
        f"saga_id={chain_id} attaches to the saga if it stands (never submit it under a "
        f"new id: that is a second saga); 'saga show {chain_id}' says where it is")
