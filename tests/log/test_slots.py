"""The slot check itself: it sees what a cluster would refuse, and lets pass
what a cluster runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from saga_store.keys import SagaKeys
from saga_store.log.layout import names_of
from saga_store.testing import slots

pytestmark = pytest.mark.real_redis


@pytest.fixture
def checked(client: redis.Redis, redis_url: str,
            tmp_path: Path) -> Iterator[tuple[redis.Redis, slots.SlotLog]]:
    """A client under the slot check, on the Redis ``client`` flushed (and recorded
    the test's layout in: the keys below are named by it)."""
    log = slots.install(tmp_path / "slots.log")
    try:
        c = redis.Redis.from_url(redis_url)
        c.ping()  # its connection is made now, while the check is on
    finally:
        slots.uninstall()
    yield c, log
    c.close()


def elsewhere(names: SagaKeys, key: str) -> str:
    """A saga (of ids like "b-2") whose log lies in another slot than ``key``, and
    its ``needs_attention`` set too: of layout 3, sagas of one bucket share a slot."""
    return next(sid for sid in (f"b-{n}" for n in range(2, 1000))
                if key_slot(key.encode()) not in (key_slot(names.log(sid).encode()),
                                                  key_slot(names.needs_attention(sid).encode())))


def test_a_script_over_two_slots_is_recorded_and_one_over_one_tag_is_not(
        checked: tuple[redis.Redis, slots.SlotLog]) -> None:
    """EVAL with keys of two sagas is a violation; with one saga's keys it is not."""
    c, log = checked
    names = names_of(c)
    c.eval("return 1", 2, names.log("a-1"), names.meta("a-1"))
    assert log.violations() == []
    c.eval("return 1", 2, names.log("a-1"), names.log(elsewhere(names, names.log("a-1"))))
    assert len(log.violations()) == 1
    assert "EVAL spans 2 slots" in log.violations()[0]


def test_a_transaction_over_two_slots_is_recorded_but_rqs_own_pass(
        checked: tuple[redis.Redis, slots.SlotLog]) -> None:
    """MULTI/EXEC mixing slots is a violation, with its WATCH too; RQ's keys alone pass."""
    c, log = checked
    names = names_of(c)
    other = elsewhere(names, names.log("a-1"))
    with c.pipeline() as pipe:
        pipe.watch(names.log("a-1"))
        pipe.multi()
        pipe.sadd(names.needs_attention(other), other)
        pipe.execute()
    assert len(log.violations()) == 1
    assert "MULTI/EXEC" in log.violations()[0]
    pipe = c.pipeline(transaction=True)
    pipe.rpush("rq:queue:x", "j")
    pipe.hset("rq:job:j", "status", "queued")
    pipe.execute()
    assert len(log.violations()) == 1
