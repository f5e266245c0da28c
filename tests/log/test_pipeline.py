"""The step path's lean pipeline: redis-py's replies, one connection per
thread, dropped with the thread."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from saga_store.workers.invoke import Invoker, Send, Sends, Work, adrive

from saga_store.log.events import EventKind as K
from saga_store.log.pipeline import lean
from saga_store.log.store import ChainWriter, EventStore
from saga_store.testing import assert_eventually
from saga_store.verify.checker import Verifier

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


def test_group_commit_gives_each_work_on_the_loop_its_own_replies(redis_url: str) -> None:
    """The round trips of many works on one event loop go out in shared rounds (one
    per turn of the loop); each gets exactly its own replies (errors included, in
    place), as each alone would."""
    c = redis.Redis.from_url(redis_url)
    sends = Sends(c.connection_pool)
    wrong: list[str] = []

    def work(t: int) -> Work[None]:
        for i in range(100):
            pipe = lean(c)
            pipe.incr(f"n:{t}")
            pipe.set(f"v:{t}", f"{t}-{i}")
            pipe.get(f"v:{t}")
            pipe.hget(f"v:{t}", "x")  # wrong type: an error in its place
            got = yield Send(pipe)
            if got[0] != i + 1 or got[1] is not True or got[2] != f"{t}-{i}".encode() \
                    or not isinstance(got[3], redis.ResponseError):
                wrong.append(f"work {t} round trip {i}: {got!r}")

    async def main() -> None:
        with ThreadPoolExecutor(1) as pool:
            await asyncio.gather(*(adrive(work(t), Invoker(), pool, sends)
                                   for t in range(16)))
    asyncio.run(main())
    assert not wrong, wrong[:3]
    assert sends.batches == 16 * 100
    assert sends.rounds == 100  # the sixteen works' round trips went together each time
    assert c.get("n:15") == b"100"


def test_group_commit_answers_an_empty_batch_at_once(redis_url: str) -> None:
    """A batch with nothing queued gets no replies, at once, as execute() gives it."""
    c = redis.Redis.from_url(redis_url)
    sends = Sends(c.connection_pool)

    async def main() -> list[Any]:
        return await asyncio.wait_for(sends.send(lean(c)), 5)
    assert asyncio.run(main()) == []
    assert sends.rounds == 0


def test_group_commit_sends_no_health_check_between_rounds_in_flight(
        redis_url: str) -> None:
    """A client with a health-check interval: the group's connection, idle past it
    with a round unanswered, sends the next round without a PING. (The PING's reply
    would be the round's: redis-py takes the connection for broken and the round
    is sent again, so its INCR ran twice.)"""
    c = redis.Redis.from_url(redis_url, health_check_interval=1)
    sends = Sends(c.connection_pool)

    async def main() -> tuple[list[Any], list[Any]]:
        first = lean(c)
        first.incr("n")
        f1 = sends.send(first)
        await asyncio.sleep(0)  # the first round goes; its reply is not read yet
        time.sleep(1.2)  # the loop held up past the health-check interval
        second = lean(c)
        second.get("n")
        f2 = sends.send(second)
        return await asyncio.wait_for(f1, 5), await asyncio.wait_for(f2, 5)
    assert asyncio.run(main()) == ([1], [b"1"])


def test_group_commit_answers_rounds_in_flight_in_order(redis_url: str) -> None:
    """The loop does not wait for a round's replies: rounds sent in fifty turns in a
    row are in flight together, and each batch gets its own reply, in order."""
    c = redis.Redis.from_url(redis_url)
    sends = Sends(c.connection_pool)

    async def main() -> list[list[Any]]:
        futs = []
        for _ in range(50):
            pipe = lean(c)
            pipe.incr("k")
            futs.append(sends.send(pipe))
            await asyncio.sleep(0)  # the next turn: this round goes, unanswered
        return await asyncio.gather(*futs)
    assert asyncio.run(main()) == [[n] for n in range(1, 51)]
    assert sends.rounds == 50
    assert sends.deepest > 1


def test_group_commit_resends_every_round_in_flight_when_the_connection_drops(
        redis_url: str) -> None:
    """Redis drops the rounds' connection while rounds are in flight: every round
    not yet answered is sent again, whole, on a new connection, and each batch still
    gets its own replies, in order."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    c = redis.Redis.from_url(redis_url, retry=Retry(NoBackoff(), 3))
    sends = Sends(c.connection_pool)
    admin = redis.Redis.from_url(redis_url)
    recovered = []
    recover = sends._recover
    sends._recover = lambda: (recovered.append(len(sends._flying)), recover())[1]  # type: ignore[method-assign]

    async def main() -> list[list[Any]]:
        futs = []
        for i in range(50):
            pipe = lean(c)
            pipe.set(f"k{i}", f"v{i}")
            pipe.get(f"k{i}")
            futs.append(sends.send(pipe))
            await asyncio.sleep(0)
            if i == 25:
                for info in admin.client_list():
                    if info["id"] != str(admin.client_id()):
                        admin.client_kill_filter(_id=info["id"])
        return await asyncio.gather(*futs)
    assert asyncio.run(main()) == [[True, f"v{i}".encode()] for i in range(50)]
    assert recovered, "the dropped connection was never noticed"


def test_group_commit_sends_the_append_by_sha_and_rides_out_a_script_flush(
        store: EventStore) -> None:
    """Appends go by EVALSHA, the script loaded on the connection first; after SCRIPT
    FLUSH Redis answers NOSCRIPT, and the append goes again with the script's body:
    each lands once, and the chain verifies."""
    r = store.redis
    sends = Sends(r.connection_pool)

    def work(writer: ChainWriter) -> Work[None]:
        for n in range(3):
            if writer is writers[1] and n == 2:
                r.script_flush()
            call = writer.prepare([(K.STEP_INTENT, {"step": n, "tool": "t"})])
            pipe = lean(r)
            queued = call.queue(pipe)
            writer.applied(call, queued((yield Send(pipe))))

    async def main() -> None:
        with ThreadPoolExecutor(1) as pool:
            await asyncio.gather(*(adrive(work(w), Invoker(), pool, sends)
                                   for w in writers))
    writers = [store.open("a"), store.open("a")]
    before = r.info("commandstats")
    asyncio.run(main())
    after = r.info("commandstats")

    def calls(name: str) -> int:
        return int(after.get(f"cmdstat_{name}", {}).get("calls", 0)) - \
            int(before.get(f"cmdstat_{name}", {}).get("calls", 0))
    assert calls("evalsha") == 6  # every append by its digest first
    # the last round came after the flush: both its appends again, with the body
    assert calls("eval") == 2
    for w in writers:
        assert [e.get("step") for e in store.log.bodies(w.saga_id)] == [None, 0, 1, 2]
    assert Verifier(store.log).verify().ok


def test_group_commit_resends_a_round_cut_off_by_a_dropped_connection(
        redis_url: str) -> None:
    """The loop's connection is killed by Redis between rounds: the next round is
    refused, sent again whole on a new connection under the client's retry policy,
    and every work gets its replies."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    c = redis.Redis.from_url(redis_url, retry=Retry(NoBackoff(), 3))
    sends = Sends(c.connection_pool)
    admin = redis.Redis.from_url(redis_url)

    def work(key: str) -> Work[list[Any]]:
        pipe = lean(c)
        pipe.set(key, "1")
        first = yield Send(pipe)
        if key == "a":  # between the two rounds: drop every connection but the admin's
            for info in admin.client_list():
                if info["id"] != str(admin.client_id()):
                    admin.client_kill_filter(_id=info["id"])
        pipe = lean(c)
        pipe.incr(key)
        return [*first, *(yield Send(pipe))]

    async def main() -> list[list[Any]]:
        with ThreadPoolExecutor(1) as pool:
            return await asyncio.gather(*(adrive(work(k), Invoker(), pool, sends)
                                          for k in "abc"))
    assert asyncio.run(main()) == [[True, 2]] * 3
    assert sends.rounds == 2


def test_the_lean_pipeline_packs_every_command_as_redis_py_would(client: redis.Redis) -> None:
    """Its own packing (hiredis straight, without redis-py's pass over the
    arguments) makes the very bytes redis-py makes, and hands anything that pass
    would change (a command name with a space, a memoryview) to redis-py."""
    from saga_store.log.pipeline import pack
    conn = client.connection_pool.get_connection()
    try:
        stack = [(("SET", "k", "é"), {}), ((b"ZADD", b"z", 1.5, "m"), {}),
                 (("EVAL", "return 1", 0, 10**20, -3), {}),
                 (("XADD", "s", "0-1", "b", b"\0\xff"), {})]
        assert b"".join(pack(conn, stack)) == \
            b"".join(conn.pack_commands([args for args, _ in stack]))
        odd = [*stack, (("CLIENT SETNAME", "x"), {}), (("SET", "m", memoryview(b"v")), {})]
        assert b"".join(bytes(p) for p in pack(conn, odd)) == \
            b"".join(bytes(p) for p in conn.pack_commands([args for args, _ in odd]))
    finally:
        client.connection_pool.release(conn)
    pipe = lean(client)
    pipe.execute_command("SET", "k", "é")
    pipe.execute_command("ZADD", "z", 1.5, "m")
    pipe.execute_command("GET", "k")
    pipe.execute_command("ZSCORE", "z", "m")
    assert pipe.execute()[2:] == ["é".encode(), 1.5]
