"""The console's pages against a real Redis: the list (newest first, filters,
paging that folds only the page shown), a saga's timeline, history and
export, the live feed, and verification status."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from saga_store.cli.main import cli

from saga_store import SagaStore, Status
from saga_store.log.events import EventKind as K
from saga_store.testing import assert_eventually
from saga_store.testing.workers import workers

from ..console_helpers import console, post_form
from ..helpers import committed_saga, edit_body, tamper

STORY = [{"tool": "reserve_inventory", "args": {"sku": "LAPTOP-15", "qty": 1}},
         {"tool": "charge_payment", "args": {"amount_cents": 1_200_000,
                                             "card_number": "4111222233334444"}},
         {"tool": "update_crm_record", "args": {"customer": "c-9", "note": "slow"}}]


def _ids(html: str) -> list[str]:
    return re.findall(r'href="/sagas/([0-9A-Za-z_-]+)"', html)


def test_list_is_newest_first_pages_and_filters(saga_store: SagaStore) -> None:
    made = [committed_saga(saga_store.events, 1, agent=f"agent-{i % 2}").saga_id
            for i in range(7)]
    running = saga_store.events.open("agent-1").saga_id
    newest_first = [running, *reversed(made)]
    tc = console(saga_store)
    seen: list[str] = []
    url = "/sagas"
    while True:
        page = tc.get(url)
        assert page.status_code == 200
        ids = _ids(page.text)
        assert len(ids) <= 3
        seen += ids
        older = re.search(r'id="older" href="([^"]+)"', page.text)
        if older is None:
            break
        url = older.group(1).replace("&amp;", "&")
    assert seen == newest_first
    assert _ids(tc.get("/sagas?agent=agent-0").text) == [s for s in newest_first
                                                         if s in made[::2]][:3]
    assert _ids(tc.get("/sagas?state=running").text) == [running]
    assert _ids(tc.get("/sagas?state=committed&agent=agent-1").text) == \
        [made[5], made[3], made[1]]
    assert _ids(tc.get("/sagas?since=2999-01-01T00:00").text) == []
    assert _ids(tc.get("/sagas?until=2000-01-01T00:00").text) == []
    first = tc.get("/sagas").text
    assert "committed" in first
    assert "running" in first
    assert "agent-1" in first
    assert tc.get("/sagas?state=nonsense").status_code == 400


def test_only_the_page_shown_is_read(saga_store: SagaStore, client: redis.Redis) -> None:
    """An old saga whose log is damaged breaks only the page that shows it: the
    pages before it never read it."""
    old = committed_saga(saga_store.events, 1).saga_id
    for _ in range(6):
        committed_saga(saga_store.events, 1)
    tamper(client, old, lambda es: [(es[0][0], {**es[0][1], b"b": b"not json"}), *es[1:]])
    tc = console(saga_store, page_size=3)
    assert tc.get("/sagas").status_code == 200
    cursor = re.search(r'id="older" href="/sagas\?cursor=(\d+)"', tc.get("/sagas").text)
    assert cursor is not None
    second = tc.get(f"/sagas?cursor={cursor.group(1)}")
    assert second.status_code == 200
    last = re.search(r'id="older" href="/sagas\?cursor=(\d+)"', second.text)
    assert last is not None
    broken = tc.get(f"/sagas?cursor={last.group(1)}")
    assert broken.status_code == 500
    assert f"saga verify --saga {old}" in broken.text


@pytest.mark.real_redis
def test_saga_page_draws_the_unwind_and_the_export_verifies(
        saga_store: SagaStore, worker_env: dict[str, str], ledger: Path,
        tmp_path: Path) -> None:
    with workers(worker_env, "tests.ledger_tools"):
        sid = saga_store.submit(STORY, agent_id="checkout-bot")
        st = saga_store.wait(sid, timeout=60)
    assert st.status is Status.COMPENSATED
    tc = console(saga_store)
    page = tc.get(f"/sagas/{sid}")
    assert page.status_code == 200
    html = page.text
    for lane in ("#0 reserve_inventory", "#1 charge_payment", "#2 update_crm_record",
                 "undo #1 refund_payment", "undo #0 release_inventory"):
        assert lane in html
    # the unwind runs back over the steps: refund drawn before release
    assert html.index("undo #1 refund_payment") < html.index("undo #0 release_inventory")
    assert 'class="bar in-doubt"' in html
    assert 'class="mark probe"' in html
    assert 'class="bar compensated"' in html
    assert "unwind begins" in html
    assert "rolled back: this call was undone" in html  # the history the agent sees
    assert "4111222233334444" not in html
    anthropic = tc.get(f"/sagas/{sid}?format=anthropic").text
    assert "tool_use" in anthropic
    export = tc.get(f"/sagas/{sid}/export.jsonl")
    assert export.status_code == 200
    assert "attachment" in export.headers["content-disposition"]
    assert "4111222233334444" not in export.text
    path = tmp_path / "saga.jsonl"
    path.write_bytes(export.content)
    from click.testing import CliRunner
    res = CliRunner().invoke(cli, ["verify", "--file", str(path)],
                             env={"SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": ""})
    assert res.exit_code == 0, res.output
    assert tc.get("/sagas/NOSUCHSAGA").status_code == 404


def _events(lines: Iterator[str]) -> list[dict[str, Any]]:
    """Parse SSE lines into events until the stream's end event."""
    out: list[dict[str, Any]] = []
    kind = ""
    for line in lines:
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: ") and kind == "update":
            out.append(orjson.loads(line[6:]))
        elif line.startswith("data: ") and kind == "end":
            return out
    return out


def test_live_feed_sends_each_change_until_the_saga_ends(saga_store: SagaStore) -> None:
    w = saga_store.events.open("agent-live")
    tc = console(saga_store)
    page = tc.get(f"/sagas/{w.saga_id}")
    assert 'data-live="1"' in page.text
    connected = threading.Event()

    def write() -> None:
        assert connected.wait(10)
        w.append(K.STEP_INTENT, step=0, tool="reserve", tool_call_id="c0",
                 data={"args": {"sku": "A"}, "reversibility": "compensable"})
        w.append(K.STEP_STARTED, step=0, attempt=1)
        w.append(K.STEP_SUCCEEDED, step=0, data={"result": {"ok": True}})
        w.append(K.SAGA_COMMITTED)

    writer = threading.Thread(target=write)
    writer.start()
    with tc.stream("GET", f"/sagas/{w.saga_id}/live?after={w.head.seq}") as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = resp.iter_lines()
        assert next(lines).startswith("retry:")
        connected.set()
        updates = _events(lines)
    writer.join()
    assert updates, "no update arrived"
    last = updates[-1]
    assert (last["state"], last["final"], last["seq"]) == ("committed", True, 4)
    assert "#0 reserve" in str(last["html"])
    assert [u["seq"] for u in updates] == sorted(u["seq"] for u in updates)
    done = tc.get(f"/sagas/{w.saga_id}")
    assert 'data-live="0"' in done.text


def test_verify_runs_on_demand_and_checks_the_anchor(saga_store: SagaStore,
                                                     client: redis.Redis,
                                                     tmp_path: Path) -> None:
    w = committed_saga(saga_store.events, 2)
    anchor = tmp_path / "anchor.json"
    anchor.write_bytes(orjson.dumps(saga_store.events.ledger.anchor()))
    tc = console(saga_store, anchor_file=str(anchor))
    assert "not verified since the console started" in tc.get("/verify").text
    res = post_form(tc, "/verify", "/verify/run")
    assert res.status_code == 303
    status = tc.app.state.verify  # type: ignore[attr-defined]  # Starlette's app state is untyped
    assert_eventually(lambda: status.last is not None and not status.running,
                      what="the verification to finish")
    page = tc.get("/verify").text
    head = saga_store.events.ledger.record_root()  # the page shows the root's head
    assert "intact" in page
    assert f"seq {head.seq}" in page
    assert head.hash.hex() in page
    assert "consistent at ledger seq" in page
    tamper(client, w.saga_id, lambda es: [es[0], edit_body(es[1], lambda b: b.update(
        step=7)), *es[2:]])
    post_form(tc, "/verify", "/verify/run")
    assert_eventually(lambda: not status.running and status.last is not None
                      and not status.last.ok, what="the second verification")
    page = tc.get("/verify").text
    assert "INTEGRITY FAILURE" in page
    assert "hash_mismatch" in page
    assert w.saga_id in page
