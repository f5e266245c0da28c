"""'saga ls' lists from the ledger's newest page with what a person asks first;
'saga show --follow' and 'saga ls --follow' stream what lands until Ctrl-C."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import orjson
import pytest
import redis
from click.testing import CliRunner, Result
from saga_store.cli.main import cli

from saga_store import keys
from saga_store.log.events import EventKind as K
from saga_store.log.store import EventStore
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
