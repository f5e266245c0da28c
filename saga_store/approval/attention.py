"""Sagas that ended needing a person, and acknowledging them.

A saga ends ``needs_attention`` when its unwind met something it could not
undo (an irreversible step, a step in doubt with no probe, a compensation
mapping that does not resolve). It sits in ``ss:needs_attention`` until a
person acknowledges it; the acknowledgement (who, when, what was done) goes
to the ``ss:attention:acks`` stream. The saga's own chain is closed and stays
as it is.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis

from saga_store import keys
from saga_store.errors import InvalidInput, NoSuchSaga, no_such_saga
from saga_store.ids import check_saga_id
from saga_store.log.pipeline import lean
from saga_store.log.stream import SagaLog
from saga_store.protocol.state import Status, fold

MAX_NAME = 128
MAX_NOTE = 2000


@dataclass
class Attention:
    """One saga waiting for a person: what its unwind could not undo."""

    saga_id: str
    agent_id: str | None
    needs_attention: list[str]
    updated_ts: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"saga_id": self.saga_id, "agent_id": self.agent_id,
                "needs_attention": self.needs_attention, "updated_ts": self.updated_ts}


def needing_attention(log: SagaLog) -> list[Attention]:
    """Sagas waiting for a person, by id."""
    # assignment: redis-py types the reply loosely
    pipe = log.redis.pipeline(transaction=False)
    for key in log.keys.all_needs_attention():
        pipe.smembers(key)
    members = {m for got in pipe.execute() for m in got}
    rows: list[Attention] = []
    for sid in sorted(m.decode() for m in members):
        st = fold(sid, log.bodies(sid))
        if st.status is not Status.NEEDS_ATTENTION:
            continue
        reason = st.reason if isinstance(st.reason, dict) else {}
        rows.append(Attention(sid, st.agent_id, list(reason.get("needs_attention") or []),
                              st.updated_ts))
    return rows


def acknowledge(client: redis.Redis, saga_id: str, by: str, note: str = "") -> None:
    """Record that ``by`` dealt with a saga that needed attention, and take it off
    the list (and the ``saga_sagas{state="needs_attention"}`` gauge), in one
    round trip, the record first. Not a transaction: the two keys live in two
    hash slots, which a Redis Cluster cannot write in one; should the list's
    write fail, the saga stays listed and a second acknowledgement records
    itself again, so no saga ever leaves the list unrecorded. Raises
    :class:`InvalidInput` if the saga is not on the list."""
    check_saga_id(saga_id)
    by = by.strip()
    if not by or len(by) > MAX_NAME or any(c in by for c in "\n\r"):
        raise InvalidInput(f"--by must name who acts (1-{MAX_NAME} characters, one line)",
                           field="by")
    log = SagaLog(client)
    if not client.exists(log.keys.log(saga_id)):
        raise NoSuchSaga(no_such_saga(saga_id))
    state = fold(saga_id, log.bodies(saga_id))
    if state.status is not Status.NEEDS_ATTENTION:  # the log decides, not the set
        raise InvalidInput(f"saga {saga_id} is {state.status}, not waiting for attention; "
                           "'saga attention' lists those that are")
    if not client.sismember(log.keys.needs_attention(saga_id), saga_id):
        raise InvalidInput(f"saga {saga_id} is not waiting for attention; "
                           "'saga attention' lists those that are")
    pipe = lean(client)
    pipe.xadd(keys.ATTENTION_ACKS, {"saga_id": saga_id, "by": by, "note": note[:MAX_NOTE],
                                    "at_ms": str(int(time.time() * 1000))})
    pipe.srem(log.keys.needs_attention(saga_id), saga_id)
    pipe.execute()
