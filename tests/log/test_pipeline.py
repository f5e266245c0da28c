"""The step path's lean pipeline: redis-py's replies, one connection per
thread, dropped with the thread."""

from __future__ import annotations

import gc
import os
import threading

import pytest
import redis

from saga_store.log.pipeline import lean
from saga_store.testing import assert_eventually

pytestmark = pytest.mark.real_redis


def test_replies_match_redis_py_and_errors_come_back_in_place(client: redis.Redis) -> None:
    p = lean(client)
    p.set("k", "v")
    p.incr("k")  # not an integer
    p.get("k")
    p.time()
    ok, err, got, now = p.execute(raise_on_error=False)
    assert (ok, got) == (True, b"v")
    assert isinstance(err, redis.ResponseError)
    assert isinstance(now, tuple)  # redis-py's TIME callback applied: (seconds, micros)
    assert len(now) == 2
    p.incr("k")
    with pytest.raises(redis.ResponseError):
        p.execute()
    p.get("k")
    assert p.execute() == [b"v"]  # the connection is still in step after errors


def test_one_connection_per_thread_closed_when_the_thread_ends(client: redis.Redis) -> None:
    def connected() -> int:
        return len(client.client_list())
    before = connected()

    def work() -> None:
        for _ in range(5):
            p = lean(client)
            p.ping()
            assert p.execute() == [True]
    threads = [threading.Thread(target=work) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    gc.collect()
    assert_eventually(lambda: connected() <= before, timeout=10,
                      what="the threads' connections to close")


def test_a_forked_child_makes_its_own_connection(client: redis.Redis) -> None:
    """Sharing the parent's socket would mix the two processes' replies."""
    p = lean(client)
    p.client_id()
    (parent_id,) = p.execute()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its connection's id, then leave at once
        try:
            c = lean(client)
            c.client_id()
            os.write(write, str(c.execute()[0]).encode())
        finally:
            os._exit(0)
    os.close(write)
    child_id = int(os.read(read, 64))
    os.waitpid(pid, 0)
    again = lean(client)
    again.client_id()
    assert again.execute() == [parent_id]  # the parent keeps its own
    assert child_id != parent_id
