"""The operator's pages over sagas run by real workers: states in words in the
list, counts per state in the navigation (the metrics' gauges), the overview
(stuck, needing attention, the oldest approval), the workers and queues page,
and search by tool, idempotency key, error text and conversation id."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import redis

from saga_store import SagaStore, Status
from saga_store.approval import requests as approvals
from saga_store.log.events import EventKind as K
from saga_store.testing import assert_eventually
from saga_store.testing.workers import workers

from ..console_helpers import console
from ..helpers import committed_saga
from .test_console_actions import GATED, STUCK

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
TOOLS = "tests.ledger_tools"


def _attention(store: SagaStore, client: redis.Redis) -> str:
    w = store.events.open("agent-w")
    w.append(K.STEP_INTENT, step=0, tool="wire", data={"args": {}})
    w.append(K.STEP_STARTED, step=0, attempt=1)
    w.append(K.STEP_SUCCEEDED, step=0, data={"result": {}})
    w.append(K.SAGA_FAILED, data={"reason": "later step failed"})
    w.append(K.STEP_NOT_COMPENSABLE, step=0, data={"reason": "tool is irreversible"})
    w.append(K.SAGA_NEEDS_ATTENTION, data={"needs_attention": ["step 0 (wire)"]})
    client.sadd(store.events.keys.needs_attention(w.saga_id), w.saga_id)
    return w.saga_id


def _row(html: str, sid: str) -> str:
    at = html.index(f'href="/sagas/{sid}"')
    return html[at:html.index("</tr>", at)]


def test_states_counts_overview_workers_and_search(
        saga_store: SagaStore, client: redis.Redis, worker_env: dict[str, str],
        ledger: Path, tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text("")
    done = committed_saga(saga_store.events).saga_id  # conversation conv-1
    attention = _attention(saga_store, client)
    tc = console(saga_store, page_size=25)
    with workers({**worker_env, "SAGA_POLICY_FILE": str(policy)}, TOOLS, count=2) as procs:
        stuck = saga_store.submit(STUCK, agent_id="agent-s")
        gated = saga_store.submit(GATED, agent_id="agent-g")
        assert saga_store.wait(stuck, timeout=60).status is Status.STUCK
        assert_eventually(lambda: any(p.saga_id == gated for p in approvals.pending(saga_store)),
                          timeout=30, what="the gated step to wait")
        # RQ scores a failed job by when the registry forgets it: an hour from now
        client.zadd("rq:failed:saga-steps",
                    {"saga-step-dead-0-0123456789abcdef": time.time() + 3600})

        listing = tc.get("/sagas").text
        assert "waiting for approval: step 1 (send_email)" in _row(listing, gated)
        assert "stuck undoing step 1 (reserve_forgetful)" in _row(listing, stuck)
        assert "needs attention" in _row(listing, attention)
        assert_eventually(lambda: 'id="nav-approvals">1<' in tc.get("/sagas").text,
                          timeout=10, what="the navigation to count the approval")
        nav = tc.get("/sagas").text
        assert 'id="nav-attention">1<' in nav
        assert re.search(r'href="/sagas\?state=stuck"[^>]*>stuck 1<', nav)

        overview = tc.get("/overview").text
        tiles = overview[overview.index('id="by-state"'):overview.index("</section>")]
        assert re.search(r"<b>1</b>stuck", tiles)
        assert re.search(r"<b>1</b>waiting for approval", tiles)
        assert re.search(r"<b>1</b>needs attention", tiles)
        oldest = overview[overview.index('id="oldest-approval"'):]
        assert gated in oldest[:oldest.index("</p>")]
        assert "send_email" in oldest[:oldest.index("</p>")]
        assert "stuck undoing step 1 (reserve_forgetful)" in _row(overview, stuck)
        assert "could not undo step 0 (wire)" in _row(overview, attention)

        pids = {pid for p in procs for pid in p.pids()}
        assert_eventually(lambda: len(re.findall(r'<tr class="">', tc.get("/workers").text))
                          == 2, timeout=20, what="both workers to show")
        fleet = tc.get("/workers").text
        shown_pids = {int(p) for p in re.findall(r'<td class="num pid">(\d+)</td>', fleet)}
        assert len(shown_pids) == 2
        assert shown_pids <= pids
        assert "steps, unwinds" in fleet
        queues = fleet[fleet.index('id="queues"'):]
        assert "saga-steps" in queues
        assert "saga-step-dead-0-0123456789abcdef" in fleet  # the dead-lettered job
        # the sweepers' last pass: when, by which worker, what it found
        assert_eventually(lambda: re.search(r'id="last-sweep">last sweep [^<]* ago by',
                                            tc.get("/workers").text),
                          timeout=15, what="the workers page to show the last sweep")

    by_tool = tc.get("/search?by=tool&q=reserve_forgetful").text
    assert [stuck] == re.findall(r'<a class="mono" href="/sagas/([^"]+)"', by_tool)
    assert "found in the newest 4 read" in by_tool
    key = saga_store.state(gated).steps[1].idem_key
    assert key
    by_key = tc.get(f"/search?by=key&q={key[:12]}").text
    assert [gated] == re.findall(r'<a class="mono" href="/sagas/([^"]+)"', by_key)
    by_error = tc.get("/search?by=error&q=LATER STEP").text
    assert [attention] == re.findall(r'<a class="mono" href="/sagas/([^"]+)"', by_error)
    by_conv = tc.get("/search?by=conversation&q=conv-1").text
    assert [done] == re.findall(r'<a class="mono" href="/sagas/([^"]+)"', by_conv)
    # the saga that wrote to the CEO: a text in a step's arguments, any case
    by_args = tc.get("/search?by=args&q=CEO@Example").text
    assert [gated] == re.findall(r'<a class="mono" href="/sagas/([^"]+)"', by_args)
    assert tc.get("/search?by=nonsense&q=x").status_code == 400
