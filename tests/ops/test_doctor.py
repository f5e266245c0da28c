"""'saga doctor' run as the deployment's own worker ACL user: what that user may not
read is a skip with how to check it by hand, not a failure; what it can read and
is wrong still fails."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import orjson
import pytest
import redis
from click.testing import CliRunner, Result
from saga_store.cli.main import cli

from saga_store.testing import RedisServer

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(60)]


def saga(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--redis-url", url, *args],
                              env={"SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": ""})


@pytest.fixture
def worker_url() -> Iterator[tuple[str, redis.Redis]]:
    """A durable Redis (AOF, fsync always) and the URL of the user 'saga acl worker'
    makes, applied as the deployment guide does."""
    with RedisServer() as srv:
        line = saga(srv.url, "acl", "worker")
        assert line.exit_code == 0
        for cmd in (line.output, "ACL SETUSER saga-worker >w-pass\n"):
            out = subprocess.run(["redis-cli", "-p", str(srv.port)], input=cmd, text=True,
                                 capture_output=True, timeout=30, check=True)
            assert out.stdout.strip() == "OK", out.stdout + out.stderr
        yield (f"redis://saga-worker:w-pass@127.0.0.1:{srv.port}/0",
               redis.Redis.from_url(srv.url))


def test_the_worker_user_gets_skips_and_exit_0_on_a_durable_redis(
        worker_url: tuple[str, redis.Redis]) -> None:
    url, _ = worker_url
    res = saga(url, "doctor")
    assert res.exit_code == 0, res.output
    out = res.output
    assert "skip appendfsync = unknown: this user may not run CONFIG GET; check by hand" in out
    assert "ok   appendonly = yes" in out
    assert "FIX" not in out


def test_what_the_worker_user_can_read_and_is_wrong_still_fails(
        worker_url: tuple[str, redis.Redis]) -> None:
    url, admin = worker_url
    admin.config_set("appendonly", "no")
    res = saga(url, "doctor", "--json")
    assert res.exit_code == 1, res.output
    found = {f["setting"]: f for f in orjson.loads(res.output)}
    assert found["appendonly"]["ok"] is False
    assert found["appendonly"]["skipped"] is False
    assert found["appendfsync"]["skipped"] is True
