"""Durability switched off at run time: ``CONFIG SET appendonly no`` moves the
``saga_redis_durable`` gauge to 0 and logs one line, in the exporter and in a
real worker process; ``saga verify`` warns while Redis is not durable."""

from __future__ import annotations

import logging
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import redis
from click.testing import CliRunner
from prometheus_client import CollectorRegistry
from saga_store.cli.main import cli

from saga_store import Settings
from saga_store.errors import InvalidInput
from saga_store.log.store import EventStore
from saga_store.ops import acl
from saga_store.ops.durability import DurabilityWatch
from saga_store.ops.metrics import RedisCollector
from saga_store.testing import RedisServer, assert_eventually, free_port
from saga_store.testing.workers import workers

from ..helpers import committed_saga

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
ROOT = str(Path(__file__).resolve().parents[2])
NOT_DURABLE = "Redis is not durable"


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    """A Redis of this module's own: its tests turn AOF off and on."""
    with RedisServer() as srv:
        yield srv


def aof_on(client: redis.Redis) -> None:
    """AOF on, its first rewrite done (till then Redis refuses to shut down)."""
    client.config_set("appendonly", "yes")

    def rewritten() -> bool:
        info = client.info("persistence")
        return not (info["aof_rewrite_in_progress"] or info["aof_rewrite_scheduled"])
    assert_eventually(rewritten, timeout=30, what="the AOF rewrite to finish")


@pytest.fixture
def admin(server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server.url)
    client.flushdb()
    aof_on(client)
    client.config_set("appendfsync", "everysec")
    yield client
    aof_on(client)
    client.close()


class Clock:
    """A clock the test moves by hand, so every read of the watch is on purpose."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _scraper(client: redis.Redis, clock: Clock, log: logging.Logger
             ) -> tuple[CollectorRegistry, DurabilityWatch]:
    watch = DurabilityWatch(client, 30.0, log, clock)
    registry = CollectorRegistry()
    registry.register(RedisCollector(client, durability=watch))
    return registry, watch


def test_the_gauge_follows_appendonly_and_logs_each_change_once(
        admin: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    """AOF on: 1 and silence. Off: 0 at the next period, one warning however often it
    is scraped. On again: 1, one more line. Between periods, scrapes read nothing."""
    clock, log = Clock(), logging.getLogger("test.durability")
    registry, _ = _scraper(admin, clock, log)
    caplog.set_level(logging.INFO, logger="test.durability")
    assert registry.get_sample_value("saga_redis_durable") == 1
    assert caplog.records == []

    admin.config_set("appendonly", "no")
    assert registry.get_sample_value("saga_redis_durable") == 1  # read once per period
    for _ in range(3):
        clock.now += 30
        assert registry.get_sample_value("saga_redis_durable") == 0
    lines = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    assert lines[0].getMessage().startswith(NOT_DURABLE + " (appendonly=no")
    assert "set 'appendonly yes'" in lines[0].getMessage()

    aof_on(admin)
    clock.now += 30
    assert registry.get_sample_value("saga_redis_durable") == 1
    assert [r.getMessage() for r in caplog.records][1:] == [
        "Redis is durable again (appendonly=yes, appendfsync=everysec)"]


def test_fsync_off_is_not_durable_and_a_first_read_that_is_not_says_so(
        admin: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    """appendfsync no counts as not durable, and a watch that starts on such a Redis
    logs one line at its first read (a worker starting up)."""
    admin.config_set("appendfsync", "no")
    caplog.set_level(logging.INFO, logger="test.durability")
    watch = DurabilityWatch(admin, 30.0, logging.getLogger("test.durability"), Clock())
    assert watch.poll() is False
    assert watch.poll() is False  # not due again: no second read, no second line
    assert [r.getMessage() for r in caplog.records] == [
        "Redis is not durable (appendonly=yes, appendfsync=no): a crash of Redis now loses "
        "acknowledged appends; set 'appendfsync everysec' (or 'always'); see 'saga doctor'"]


def test_a_user_without_config_reads_aof_from_info_and_is_refused_once(
        admin: redis.Redis, server: RedisServer) -> None:
    """The worker ACL user may not run CONFIG: AOF on with fsync unknown counts as
    durable (1), AOF off as not (0), and CONFIG is tried only at the first read, so
    ACL LOG does not fill with the watch's refusals."""
    admin.execute_command("ACL", "SETUSER", *acl.setuser_args("watcher", acl.worker_rules()),
                          ">w-pass")
    admin.execute_command("ACL", "LOG", "RESET")
    user = redis.Redis.from_url(f"redis://watcher:w-pass@127.0.0.1:{server.port}/0")
    clock = Clock()
    registry, watch = _scraper(user, clock, logging.getLogger("test.durability"))
    assert registry.get_sample_value("saga_redis_durable") == 1
    assert {f.setting: f.value for f in watch.findings} == {"appendonly": "yes",
                                                            "appendfsync": "unknown"}
    admin.config_set("appendonly", "no")
    for _ in range(3):
        clock.now += 30
        assert registry.get_sample_value("saga_redis_durable") == 0
    refusals = [e for e in admin.acl_log() if e["username"] == "watcher"]
    assert [(e["object"], e["count"]) for e in refusals] == [("config|get", 1)]


def test_a_period_must_be_a_positive_number_of_seconds() -> None:
    assert Settings.from_env({"SAGA_DURABILITY_CHECK_S": "0.5"}).durability_check_s == 0.5
    assert Settings.from_env({}).durability_check_s == 30.0
    for bad in ("0", "-1", "soon", "nan", "inf"):
        with pytest.raises(InvalidInput, match="SAGA_DURABILITY_CHECK_S"):
            Settings.from_env({"SAGA_DURABILITY_CHECK_S": bad})


def _config_gets(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_config|get", {}).get("calls", 0))


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return str(r.read().decode())


def test_a_worker_notices_appendonly_turned_off_and_logs_it_once(
        admin: redis.Redis, server: RedisServer, ledger: Path, tmp_path: Path) -> None:
    """A real `saga worker` re-reads durability every SAGA_DURABILITY_CHECK_S: its
    /metrics goes from 1 to 0 and its log gets one line, not one per read."""
    port, log = free_port(), tmp_path / "worker.log"
    env = {**os.environ, "SAGA_REDIS_URL": server.url, "SAGA_TEST_LEDGER": str(ledger),
           "PYTHONPATH": ROOT, "SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": "",
           "SAGA_DURABILITY_CHECK_S": "0.2"}
    with workers(env, "tests.ledger_tools", "--metrics-port", str(port), log=log):
        assert_eventually(lambda: "saga_redis_durable 1.0" in _scrape(port), timeout=30,
                          what="the gauge at 1", swallow=(OSError,))
        admin.config_set("appendonly", "no")
        assert_eventually(lambda: "saga_redis_durable 0.0" in _scrape(port), timeout=30,
                          what="the gauge at 0")
        assert_eventually(lambda: NOT_DURABLE in log.read_text(), timeout=30,
                          what="the worker's warning")
        # several reads later (CONFIG GETs seen by Redis), still the one line
        seen = _config_gets(admin)
        assert_eventually(lambda: _config_gets(admin) >= seen + 5, timeout=30,
                          what="five more durability reads")
    text = log.read_text()
    assert text.count(NOT_DURABLE) == 1, text
    assert "saga_store.worker " + NOT_DURABLE + " (appendonly=no, appendfsync=everysec)" in text
    assert "Traceback" not in text


def _verify(url: str, *args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, ["verify", *args], env={
        "SAGA_REDIS_URL": url, "SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": ""})
    return res.exit_code, res.output


def test_verify_warns_while_redis_is_not_durable(admin: redis.Redis,
                                                 server: RedisServer) -> None:
    """Intact chains still exit 0, but plain verify says Redis is not durable and that
    only an anchor shows what a crash took; --json carries it under "redis"."""
    committed_saga(EventStore(admin, Settings()))
    code, out = _verify(server.url)
    assert (code, "not durable" in out) == (0, False), out
    admin.config_set("appendonly", "no")
    code, out = _verify(server.url)
    assert code == 0, out
    assert "warning: " + NOT_DURABLE + " (appendonly=no" in out
    assert "verify with --anchor FILE" in out
    assert "intact: 3 chains" in out  # the saga's, its ledger bucket's and the root
    code, out = _verify(server.url, "--json")
    doc = orjson.loads(out)
    assert (code, doc["ok"], doc["redis"]["durable"]) == (0, True, False)
    assert any(w.startswith("redis: " + NOT_DURABLE) for w in doc["warnings"])
