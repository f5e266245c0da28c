"""The console in a real browser: headless Chromium (Debian's) driven by
Playwright against a console served by uvicorn, with real workers running the
sagas. It lists sagas, opens one, watches a running saga's page update as its
waiting step is let go, approves one step and denies another with a reason,
resolves a stuck saga's step from its page through the confirmation, and
opens the overview, workers and search pages.
Screenshots of each page go to the test's folder (and, when
SAGA_SCREENSHOTS_DIR is set, there too: that is how docs/screenshots/ is made).
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
import uvicorn

from saga_store import Registry, SagaStore, Settings, Status
from saga_store.approval import requests as approvals
from saga_store.console import ConsoleConfig, create_app
from saga_store.log.events import EventKind as K
from saga_store.testing import assert_eventually, free_port
from saga_store.testing.workers import workers

from ..console.test_console import STORY
from ..console.test_console_actions import STUCK
from ..console_tools import gate_path

CHROMIUM = "/usr/bin/chromium"
PROD = [{"tool": "charge_payment", "args": {"amount_cents": 500,
                                            "card_number": "4111222233334444"}},
        {"tool": "update_crm_record", "args": {"customer": "production-eu", "note": "vip"}}]
MAIL = [{"tool": "reserve_inventory", "args": {"sku": "DESK-2", "qty": 3}},
        {"tool": "send_email", "args": {"to": "ceo@example.com"}}]
HOOK = [{"tool": "emit_webhook", "args": {"event": "order.shipped"}},
        {"tool": "fail_always", "args": {"why": "carrier API down"}}]
LIVE = [{"tool": "reserve_inventory", "args": {"sku": "LAPTOP-15", "qty": 1}},
        {"tool": "wait_for_gate", "args": {"gate": "live"}},
        {"tool": "noop", "args": {"n": 3}}]


def _browser_or_skip() -> Any:
    if not os.path.exists(CHROMIUM):
        reason = f"{CHROMIUM} is missing (apt-get install chromium)"
        print(f"SKIP browser test: {reason}")
        pytest.skip(reason)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        reason = "playwright is not installed (pip install -e '.[dev]')"
        print(f"SKIP browser test: {reason}")
        pytest.skip(reason)
    return sync_playwright


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """The app on a loopback port, in a thread, for the length of the block."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    assert_eventually(lambda: server.started, timeout=20, what="the console to listen")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)


def _pending(store: SagaStore, sid: str) -> approvals.Pending:
    return assert_eventually(
        lambda: next((p for p in approvals.pending(store) if p.saga_id == sid), None),
        timeout=30, what=f"saga {sid} to wait for approval")


def _shots(tmp_path: Path) -> Any:
    copy_to = os.environ.get("SAGA_SCREENSHOTS_DIR")

    def shot(page: Any, name: str, full: bool = True) -> None:
        path = tmp_path / f"{name}.png"
        page.screenshot(path=str(path), full_page=full)
        if copy_to:
            Path(copy_to).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, Path(copy_to) / path.name)
    return shot


def _sagas(store: SagaStore) -> dict[str, str]:
    """Sagas of every kind the pages show, run by the workers."""
    made = {"committed": store.submit(MAIL[:1], agent_id="inventory-bot")}
    made["story"] = store.submit(STORY, agent_id="checkout-bot")
    made["hook"] = store.submit(HOOK, agent_id="shipping-bot")
    made["stuck"] = store.submit(STUCK, agent_id="warehouse-bot")
    _pending(store, made["hook"])
    approvals.decide(store, made["hook"], 0, grant=True, by="olivia")
    for name in ("committed", "story", "hook"):
        assert store.wait(made[name], timeout=60).final
    assert store.wait(made["stuck"], timeout=60).status is Status.STUCK
    made["prod"] = store.submit(PROD, agent_id="crm-bot")
    made["mail"] = store.submit(MAIL, agent_id="mail-bot")
    _pending(store, made["prod"])
    _pending(store, made["mail"])
    made["live"] = store.submit(LIVE, agent_id="live-bot")
    assert_eventually(lambda: store.state(made["live"]).steps.get(1) is not None
                      and store.state(made["live"]).steps[1].status == "started",
                      timeout=30, what="the live saga's step to wait at its gate")
    return made


@pytest.mark.real_redis
def test_the_console_in_a_real_browser(client: redis.Redis, worker_env: dict[str, str],
                                       ledger: Path, tmp_path: Path) -> None:
    sync_playwright = _browser_or_skip()
    store = SagaStore(client, Registry.from_modules("tests.ledger_tools",
                                                    "tests.console_tools"),
                      Settings(lease_ms=1000))
    policy = tmp_path / "policy.toml"
    policy.write_text("")
    shot = _shots(tmp_path)
    env = {**worker_env, "SAGA_POLICY_FILE": str(policy)}
    with workers(env, "tests.ledger_tools", "--tools", "tests.console_tools", count=2):
        made = _sagas(store)
        app = create_app(store, ConsoleConfig(operator="olivia", page_size=25))
        with serving(app) as base, sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            page.set_default_timeout(30_000)
            _list_and_open(page, base, made, shot)
            _watch_live(page, base, made["live"], shot)
            _decide(page, base, made, shot)
            _resolve_stuck(page, base, made["stuck"], shot)
            _attention_and_verify(page, base, made["hook"], shot)
            _operator_pages(page, base, made, shot)
            browser.close()
        assert store.wait(made["prod"], timeout=30).status is Status.COMMITTED
        assert store.wait(made["mail"], timeout=30).status is Status.COMPENSATED
    granted = [e for e in store.events.log.bodies(made["prod"])
               if e["kind"] == K.APPROVAL_GRANTED]
    denied = [e for e in store.events.log.bodies(made["mail"]) if e["kind"] == K.APPROVAL_DENIED]
    assert granted[0]["data"]["by"] == "olivia"
    assert (denied[0]["data"]["by"], denied[0]["data"]["reason"]) == ("olivia",
                                                                       "not to the CEO")
    resolved = [e for e in store.events.log.bodies(made["stuck"])
                if e["kind"] == K.COMPENSATION_RESOLVED]
    assert [(e["data"]["by"], e["data"]["note"]) for e in resolved] == [
        ("olivia", "released B by hand")]


def _list_and_open(page: Any, base: str, made: dict[str, str], shot: Any) -> None:
    page.goto(f"{base}/sagas")
    rows = page.locator("#sagas tbody tr")
    assert rows.count() == len(made)
    assert made["live"] in rows.nth(0).inner_text()  # newest first
    shot(page, "sagas")
    page.click(f'a[href="/sagas/{made["story"]}"]')
    page.wait_for_selector("#timeline")
    assert page.locator("#state").inner_text() == "compensated"
    labels = page.locator("svg.timeline text.label").all_text_contents()
    assert labels.index("undo #1 refund_payment") < labels.index("undo #0 release_inventory")
    assert page.locator("svg .mark.probe").count() == 1
    assert "rolled back" in page.locator("#history").inner_text()
    shot(page, "saga")


def _watch_live(page: Any, base: str, sid: str, shot: Any) -> None:
    page.goto(f"{base}/sagas/{sid}")
    assert page.locator("#state").inner_text() == "running"
    before = int(page.locator("#events-count").inner_text())
    shot(page, "live-running")
    Path(gate_path("live")).touch()  # the waiting step may finish now
    # no reload: the page's own script swaps in what the event stream sends
    page.locator("#state", has_text="committed").wait_for()
    assert int(page.locator("#events-count").inner_text()) > before
    assert page.locator("svg .bar.running").count() == 0
    assert "opened" in page.locator("#history").inner_text()  # the history follows too
    shot(page, "live-committed")


def _decide(page: Any, base: str, made: dict[str, str], shot: Any) -> None:
    page.goto(f"{base}/approvals")
    prod = page.locator(f'#approval-{made["prod"]}-1')
    assert "PRODUCTION" in prod.inner_text()
    assert "4111222233334444" not in page.content()
    shot(page, "approvals")
    prod.locator("button.approve").click()
    page.wait_for_selector("p.flash.ok")
    assert "approved by olivia" in page.locator("p.flash.ok").inner_text()
    mail = page.locator(f'#approval-{made["mail"]}-1')
    mail.locator("input[name=reason]").fill("not to the CEO")
    mail.locator("button.deny").click()
    page.wait_for_selector("text=denied by olivia")
    shot(page, "approvals-decided")


def _attention_and_verify(page: Any, base: str, hook: str, shot: Any) -> None:
    page.goto(f"{base}/attention")
    assert "step 0 (emit_webhook)" in page.locator(f"#attention-{hook}").inner_text()
    shot(page, "attention")
    page.goto(f"{base}/verify")
    page.click("#run-verify")
    page.wait_for_selector("p.verdict.ok")  # the page reloads itself while it runs
    shot(page, "verify")


def _resolve_stuck(page: Any, base: str, sid: str, shot: Any) -> None:
    """An operator settles a stuck step from the saga's page, through the
    confirmation that says what it does; the page then follows the unwind."""
    page.goto(f"{base}/sagas/{sid}")
    assert page.locator("#state").inner_text() == "stuck undoing step 1 (reserve_forgetful)"
    assert any("saga resolve" in t for t in page.locator("dd.reason").all_inner_texts())
    shot(page, "saga-stuck", full=False)  # its top: state, hint, actions
    page.click("#do-resolve")
    page.wait_for_selector("#confirm")
    assert "resolve step 1 (reserve_forgetful) as undone by hand" in \
        page.locator("#effect").inner_text()
    page.fill("textarea[name=why]", "released B by hand")
    shot(page, "confirm-resolve")
    page.click("#confirm-button")
    page.wait_for_selector("p.flash.ok")
    assert "step 1 resolved by hand by olivia" in page.locator("p.flash.ok").inner_text()
    page.locator("#state", has_text="needs attention").wait_for()  # the live feed follows
    shot(page, "saga-resolved", full=False)


def _operator_pages(page: Any, base: str, made: dict[str, str], shot: Any) -> None:
    page.goto(f"{base}/overview")
    assert page.locator("#by-state").is_visible()
    shot(page, "overview")
    page.goto(f"{base}/workers")
    page.locator("#workers td.pid").first.wait_for()
    assert page.locator("#workers td.pid").count() == 2
    shot(page, "workers")
    page.goto(f"{base}/search")
    page.select_option("select[name=by]", "tool")
    page.fill("input[name=q]", "charge_payment")
    page.click("#search button")
    page.wait_for_selector("#hits")
    assert "by=tool&q=charge_payment" in page.url  # a search is a link
    found = page.locator("#hits a.mono").all_inner_texts()
    assert made["story"] in found
    assert made["prod"] in found
    shot(page, "search")
