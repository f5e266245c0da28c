"""Workers note their kind and concurrency as they register: an RQ worker and
an asyncio worker side by side show as such on the console's workers page and
in ``saga workers --json``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner
from saga_store.cli.main import cli

from saga_store import SagaStore
from saga_store.ops import fleet
from saga_store.testing import assert_eventually
from saga_store.testing.workers import ASYNC_CONCURRENCY, WorkerProcess

from ..console_helpers import console

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
TOOLS = "tests.ledger_tools"


def test_an_rq_and_an_asyncio_worker_show_their_kind_and_concurrency(
        saga_store: SagaStore, client: redis.Redis, worker_env: dict[str, str],
        ledger: Path) -> None:
    procs = [WorkerProcess(worker_env, TOOLS, kind=k).start() for k in ("rq", "async")]
    try:
        live = assert_eventually(
            lambda: (found := [w for w in fleet.registered(client) if w.live])
            and len(found) == 2 and found, timeout=30, what="both workers to register")
        assert sorted((w.kind, w.concurrency) for w in live) == [
            ("asyncio", ASYNC_CONCURRENCY), ("rq", 1)]
        page = console(saga_store).get("/workers").text
        cells = re.findall(r'<td class="kind">([^<]*)</td>', page)
        assert sorted(cells) == [f"asyncio, {ASYNC_CONCURRENCY} at once", "rq, 1 at once"]
        env = {k: worker_env[k] for k in ("SAGA_REDIS_URL", "SAGA_HMAC_KEY",
                                          "SAGA_HMAC_KEY_FILE")}
        res = CliRunner().invoke(cli, ["workers", "--json"], env=env)
        assert res.exit_code == 0, res.output
        got = json.loads(res.output)["workers"]
        assert sorted((w["kind"], w["concurrency"]) for w in got) == [
            ("asyncio", ASYNC_CONCURRENCY), ("rq", 1)]
        res = CliRunner().invoke(cli, ["workers"], env=env)
        assert f"asyncio/{ASYNC_CONCURRENCY}" in res.output
        assert "rq/1" in res.output
    finally:
        for p in procs:
            p.kill()
