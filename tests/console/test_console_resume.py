"""Resuming a stuck saga records who did it, and their note, in the
``saga_resumed`` event: from the CLI (``--by``, else SAGA_OPERATOR) and from
the console's confirmation; the saga page's event table shows them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from saga_store.cli.main import cli

from saga_store import SagaStore, Status
from saga_store.log.events import EventKind as K
from saga_store.testing import assert_eventually
from saga_store.testing.workers import workers

from ..console_helpers import console
from .test_console_actions import STUCK, confirm, confirmation, kinds

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]


def _stuck_again(store: SagaStore, sid: str, times: int) -> None:
    assert_eventually(lambda: kinds(store, sid).count(K.SAGA_STUCK) == times
                      and store.state(sid).status is Status.STUCK,
                      timeout=60, what=f"the unwind of {sid} to be stuck ({times})")


def _resumed(store: SagaStore, sid: str) -> list[dict[str, Any]]:
    return [e["data"] for e in store.events.log.bodies(sid) if e["kind"] == K.SAGA_RESUMED]


def test_resume_records_who_from_the_cli_and_the_console(
        saga_store: SagaStore, worker_env: dict[str, str], ledger: Path) -> None:
    sid = saga_store.submit(STUCK, agent_id="agent-r")
    env = {k: worker_env[k] for k in ("SAGA_REDIS_URL", "SAGA_HMAC_KEY", "SAGA_HMAC_KEY_FILE")}
    with workers(worker_env, "tests.ledger_tools"):
        _stuck_again(saga_store, sid, 1)
        res = CliRunner().invoke(cli, ["resume", sid, "--by", "ravi", "--note",
                                       "B's service is back"], env=env)
        assert res.exit_code == 0, res.output
        _stuck_again(saga_store, sid, 2)
        res = CliRunner().invoke(cli, ["resume", sid], env={**env, "SAGA_OPERATOR": "sam"})
        assert res.exit_code == 0, res.output
        _stuck_again(saga_store, sid, 3)
        tc = console(saga_store, operator="olivia")
        ask = confirmation(tc, sid, "resume")
        done = confirm(tc, ask, "resume", sid, by="olivia", why="restarted B")
        assert "unwind resumed by olivia" in done.text
        _stuck_again(saga_store, sid, 4)
    got = [(d.get("by"), d.get("note")) for d in _resumed(saga_store, sid)]
    assert got == [("ravi", "B's service is back"), ("sam", None), ("olivia", "restarted B")]
    page = tc.get(f"/sagas/{sid}").text
    rows = re.findall(r'<tr class="unwind k-saga_resumed">(.*?)</tr>', page, re.S)
    assert len(rows) == 3
    assert "resumed by ravi: B&#39;s service is back; after" in rows[0]
    assert "resumed by sam; after" in rows[1]
    assert "resumed by olivia: restarted B; after" in rows[2]
