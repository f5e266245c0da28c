"""'saga ls' lists from the ledger's newest page with what a person asks first;
'saga show --follow' and 'saga ls --follow' stream what lands until Ctrl-C."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest
import redis
from click.testing import CliRunner, Result
from saga_store.cli.main import cli

from saga_store import keys
from saga_store.ids import new_id
from saga_store.log.events import EventKind as K
from saga_store.log.events import body_dict
from saga_store.log.store import EventStore
from saga_store.log.stream import EMPTY
from saga_store.testing import assert_eventually, ctrl_c_reaches_it

from ..helpers import committed_saga, tamper

ROOT = Path(__file__).resolve().parents[2]


def run(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env={"SAGA_REDIS_URL": url, "SAGA_HMAC_KEY": "",
                                                    "SAGA_HMAC_KEY_FILE": ""})


def test_ls_shows_headers_created_duration_steps_and_the_logs_own_event_count(
        store: EventStore, client: redis.Redis, redis_url: str) -> None:
    """The event count is the log's, even when the cached meta says otherwise."""
    w = committed_saga(store)
    client.hset(store.keys.meta(w.saga_id), "seq", "3")  # a stale cache
    [row] = orjson.loads(run(redis_url, "ls", "--json").output)
    assert (row["saga_id"], row["state"], row["agent_id"]) == (w.saga_id, "committed",
                                                              "agent-1")
    assert (row["steps"], row["events"], row["seq"]) == (3, 11, 10)
    created = dt.datetime.fromisoformat(row["created"])
    assert created.utcoffset() == dt.timedelta(0)
    assert abs(created.timestamp() - dt.datetime.now(dt.UTC).timestamp()) < 60
    assert row["duration_ms"] >= 0
    res = run(redis_url, "ls")
    head, line = res.output.splitlines()
    assert head.split()[:3] == ["SAGA", "ID", "STATE"]
    assert "CREATED (UTC)" in head
    assert "DURATION" in head
    assert line.split()[0] == w.saga_id
    assert line.split()[-2:] == ["3", "11"]  # steps, events
    wide = run(redis_url, "ls", "--wide").output
    assert "CONVERSATION" in wide
    assert "conv-1" in wide


def test_ls_filters_by_agent_and_since(store: EventStore, redis_url: str) -> None:
    a = committed_saga(store, steps=1, agent="agent-a")
    b = committed_saga(store, steps=1, agent="agent-b")

    def ids(*args: str) -> list[str]:
        res = run(redis_url, "ls", "--json", *args)
        assert res.exit_code == 0, res.output
        return [r["saga_id"] for r in orjson.loads(res.output)]
    assert ids() == [b.saga_id, a.saga_id]
    assert ids("--agent", "agent-a") == [a.saga_id]
    assert ids("--since", "1h") == [b.saga_id, a.saga_id]
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")
    assert ids("--since", later) == []
    bad = run(redis_url, "ls", "--since", "yesterday")
    assert bad.exit_code == 2
    assert "give an age" in bad.output


def test_ls_with_a_limit_reads_only_the_newest_page_of_the_ledger(
        store: EventStore, client: redis.Redis, redis_url: str) -> None:
    """An unreadable ledger entry 250 sagas back does not stop 'saga ls --limit 5'
    (of one ledger chain, it is never read)."""
    opened = [store.open("agent-1").saga_id for _ in range(250)]
    chain = store.log.layout.ledger_of(opened[0])
    [(_, fields)] = client.xrange(keys.ledger_log(chain), count=1)
    assert orjson.loads(fields[b"b"])["data"]["saga_id"] == opened[0]
    tamper(client, chain,
           lambda es: [(es[0][0], {**es[0][1], b"b": b"{not json"}), *es[1:]])
    res = run(redis_url, "ls", "--limit", "5", "--json")
    assert res.exit_code == 0, res.output
    assert [r["saga_id"] for r in orjson.loads(res.output)] == opened[::-1][:5]


def _spawn(redis_url: str, *args: str) -> tuple[subprocess.Popen[bytes], list[str]]:
    env = {**os.environ, "SAGA_REDIS_URL": redis_url, "SAGA_HMAC_KEY": "",
           "SAGA_HMAC_KEY_FILE": "", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(  # our own argv, no shell
        [sys.executable, "-m", "saga_store.cli.main", *args], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=ctrl_c_reaches_it)
    lines: list[str] = []
    out = proc.stdout
    assert out is not None
    threading.Thread(target=lambda: lines.extend(ln.decode() for ln in out),
                     daemon=True).start()
    return proc, lines


@pytest.mark.real_redis
def test_show_follow_prints_events_as_they_land_and_ends_with_the_saga(
        store: EventStore, redis_url: str) -> None:
    w = store.open("agent-1")
    proc, lines = _spawn(redis_url, "show", w.saga_id, "--follow")
    try:
        assert_eventually(lambda: any("saga_started" in ln for ln in lines), timeout=15,
                          what="the timeline so far")
        w.append(K.STEP_INTENT, step=0, tool="tool_0", tool_call_id="c-0",
                 data={"args": {}, "reversibility": "compensable"})
        assert_eventually(lambda: any("step_intent" in ln for ln in lines), timeout=10,
                          what="the new event")
        w.append(K.STEP_STARTED, step=0, attempt=1)
        w.append(K.STEP_SUCCEEDED, step=0, data={"result": {}})
        w.append(K.SAGA_COMMITTED)
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()
    assert any("saga_committed" in ln for ln in lines)


@pytest.mark.real_redis
def test_ls_follow_shows_new_sagas_and_ctrl_c_ends_it_cleanly(
        store: EventStore, redis_url: str) -> None:
    before = committed_saga(store, steps=1)
    proc, lines = _spawn(redis_url, "ls", "--follow")
    try:
        assert_eventually(lambda: any(before.saga_id in ln for ln in lines), timeout=15,
                          what="the listing")
        new = store.open("agent-2")
        assert_eventually(lambda: any(new.saga_id in ln for ln in lines), timeout=10,
                          what="the new saga")
        new.append(K.SAGA_COMMITTED)
        assert_eventually(lambda: any(new.saga_id in ln and "committed" in ln
                                      for ln in lines), timeout=10, what="its commit")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()
    assert not any("Traceback" in ln for ln in lines)


def ledger_of_many(store: EventStore, n: int, t0: int, agent: str = "agent-old") -> list[str]:
    """``n`` sagas' openings written straight into their buckets' ledger chains, one
    millisecond apart from ``t0`` on (oldest first; their logs are not written: a
    fast path to a ledger of that size). Returns their ids, oldest first."""
    made = [f"{agent}_{new_id()}" for _ in range(n)]
    by_chain: dict[str, list[dict[str, object]]] = {}
    for k, sid in enumerate(made):
        by_chain.setdefault(store.log.layout.ledger_of(sid), []).append(body_dict(
            store.log.layout.ledger_of(sid), 0, K.LEDGER_OPENED, ts=t0 + k,
            data={"saga_id": sid, "agent_id": agent, "first": "00" * 32}))
    pipe = store.redis.pipeline(transaction=False)  # one fsync for all of them
    calls = [(c, c.queue(pipe)) for c in (store.log.prepare(chain, bodies, EMPTY)
                                          for chain, bodies in by_chain.items())]
    replies = pipe.execute()
    for call, queued in calls:
        call.result(queued(replies))
    return made


def opened(store: EventStore, agents: list[str]) -> list[str]:
    """A saga opened for each of ``agents``, in one round trip (their ledger
    entries left pending, as a worker's are, but for each 64th writer's seal)."""
    ops = [store.prepare_open(agent) for agent in agents]
    pipe = store.redis.pipeline(transaction=False)
    queued = [op.call.queue(pipe) for op in ops]
    replies = pipe.execute()
    pipe = store.redis.pipeline(transaction=False)
    for op, q in zip(ops, queued, strict=True):
        op.applied(q(replies), pipe, defer_ledger=True)
    replies = pipe.execute()
    for op in ops:
        op.ledger_written(replies)
    return [op.writer.saga_id for op in ops]


@pytest.mark.layout(buckets=1024)
def test_ls_limit_is_exact_past_thousands_of_ledger_entries(
        store: EventStore, redis_url: str) -> None:
    """20,000 older sagas in the ledger's 1,024 buckets, then 150 new ones: 'saga ls
    --limit 100' shows exactly the 100 newest, newest first, and a filter on the
    agent exactly the newest of that agent, however many entries lie between."""
    old = ledger_of_many(store, 20_000, time.time_ns() // 1_000_000 - 3_600_000)
    new = opened(store, ["agent-a" if k % 3 else "agent-b" for k in range(100)])
    store.ledger.flush()
    new += opened(store, ["agent-a" if k % 3 else "agent-b" for k in range(100, 150)])
    res = run(redis_url, "ls", "--json", "--limit", "100")
    assert res.exit_code == 0, res.output
    assert [r["saga_id"] for r in orjson.loads(res.output)] == new[::-1][:100]
    res = run(redis_url, "ls", "--json", "--limit", "40", "--agent", "agent-b")
    assert [r["saga_id"] for r in orjson.loads(res.output)] == \
        [s for s in new[::-1] if s.startswith("agent-b_")][:40]
    from saga_store.console.listing import Filters, list_page, newest

    # every opening, each once, newest first, across all 1,024 chains
    assert [o.saga_id for o in newest(store, Filters())] == new[::-1] + old[::-1]
    # and the console's pages, of 50 each (or more: a page keeps a millisecond
    # whole), walk the same order with no gap and no repeat
    walked: list[str] = []
    cursor: int | None = None
    while len(walked) < 150:
        page = list_page(store, Filters(), cursor, 50)
        assert len(page.rows) >= 50
        walked += [r.saga_id for r in page.rows]
        assert page.next_cursor is not None
        cursor = int(page.next_cursor)
    assert walked[:150] == new[::-1]
    assert walked[150:] == old[::-1][:len(walked) - 150]
