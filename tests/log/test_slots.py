"""The slot check itself: it sees what a cluster would refuse, and lets pass
what a cluster runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from saga_store import keys
from saga_store.testing import slots

pytestmark = pytest.mark.real_redis


@pytest.fixture
def checked(redis_url: str, tmp_path: Path) -> Iterator[tuple[redis.Redis, slots.SlotLog]]:
    log = slots.install(tmp_path / "slots.log")
    try:
        c = redis.Redis.from_url(redis_url)
        c.ping()  # its connection is made now, while the check is on
    finally:
        slots.uninstall()
    yield c, log
    c.close()


def test_a_script_over_two_slots_is_recorded_and_one_over_one_tag_is_not(
        checked: tuple[redis.Redis, slots.SlotLog]) -> None:
    """EVAL with keys of two sagas is a violation; with one saga's keys it is not."""
    c, log = checked
    c.eval("return 1", 2, keys.saga_log("a-1"), keys.saga_meta("a-1"))
    assert log.violations() == []
    c.eval("return 1", 2, keys.saga_log("a-1"), keys.saga_log("b-2"))
    assert len(log.violations()) == 1
    assert "EVAL spans 2 slots" in log.violations()[0]


def test_a_transaction_over_two_slots_is_recorded_but_rqs_own_pass(
        checked: tuple[redis.Redis, slots.SlotLog]) -> None:
    """MULTI/EXEC mixing slots is a violation, with its WATCH too; RQ's keys alone pass."""
    c, log = checked
    with c.pipeline() as pipe:
        pipe.watch(keys.saga_log("a-1"))
        pipe.multi()
        pipe.sadd(keys.NEEDS_ATTENTION, "a-1")
        pipe.execute()
    assert len(log.violations()) == 1
    assert "MULTI/EXEC" in log.violations()[0]
    pipe = c.pipeline(transaction=True)
    pipe.rpush("rq:queue:x", "j")
    pipe.hset("rq:job:j", "status", "queued")
    pipe.execute()
    assert len(log.violations()) == 1
