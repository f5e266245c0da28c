"""Every action on a saga's page, taken in a real browser: headless Chromium
(Debian's, one for the module) against a console served by uvicorn, real
Redis and real workers. Each goes through the saga page's button and the
confirmation page; the test then reads the saga's log and state from Redis:
approve, deny and abort of sagas waiting for approval; resume (with who and
why) and acknowledge of a saga whose unwind is stuck. A saga whose log was
edited in Redis shows the first bad event on its page.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from saga_store import Registry, SagaStore, Settings, Status, keys
from saga_store.approval import requests as approvals
from saga_store.approval.attention import needing_attention
from saga_store.console import ConsoleConfig, create_app
from saga_store.log.events import EventKind as K
from saga_store.testing import assert_eventually
from saga_store.testing.workers import workers

from ..helpers import committed_saga, edit_body, tamper
from .test_console_actions import GATED, STUCK, kinds
from .test_console_browser import CHROMIUM, _browser_or_skip, _shots, serving

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(180)]
TOOLS = "tests.ledger_tools"
# what the action's page says once it is done, or why it was not
OUTCOME = "p.flash.ok[role=status], p.flash.bad[role=alert]"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One Chromium for every test here: a launch costs more than a test's clicks."""
    sync_playwright = _browser_or_skip()
    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    tab = context.new_page()
    tab.set_default_timeout(30_000)
    yield tab
    context.close()


def _store(client: redis.Redis) -> SagaStore:
    return SagaStore(client, Registry.from_modules(TOOLS), Settings(lease_ms=1000))


def act(page: Any, base: str, sid: str, action: str, why: str = "", by: str = "") -> str:
    """Press ``action``'s button on the saga's page, fill in the confirmation and
    confirm it, as a person would; the message the saga's page then shows."""
    page.goto(f"{base}/sagas/{sid}")
    page.click(f"#do-{action}")
    page.wait_for_selector("#confirm")
    if by:
        page.fill("input[name=by]", by)
    if why:
        page.fill("textarea[name=why]", why)
    page.click("#confirm-button")
    said = page.wait_for_selector(OUTCOME)
    assert said is not None
    text: str = said.inner_text()
    assert "flash ok" in (said.get_attribute("class") or ""), text
    return text


def _data(store: SagaStore, sid: str, kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in store.events.log.bodies(sid) if e["kind"] == kind]


def test_approve_deny_and_abort_in_the_browser(
        client: redis.Redis, worker_env: dict[str, str], ledger: Path, tmp_path: Path,
        page: Any) -> None:
    store = _store(client)
    policy = tmp_path / "policy.toml"
    policy.write_text("")
    with workers({**worker_env, "SAGA_POLICY_FILE": str(policy)}, TOOLS):
        yes, no, stop = (store.submit(GATED, agent_id=f"agent-{n}") for n in "abc")
        for sid in (yes, no, stop):
            assert_eventually(lambda s=sid: any(p.saga_id == s for p in approvals.pending(store)),
                              timeout=30, what=f"saga {sid} to wait for approval")
        with serving(create_app(store, ConsoleConfig(operator="olivia"))) as base:
            assert "step 1 approved by olivia" in act(page, base, yes, "approve",
                                                      why="checked with sales")
            assert "step 1 denied by olivia" in act(page, base, no, "deny",
                                                    why="not to the CEO")
            assert "aborted by pat" in act(page, base, stop, "abort", why="customer cancelled",
                                           by="pat")
            assert store.wait(yes, timeout=60).status is Status.COMMITTED
            assert store.wait(no, timeout=60).status is Status.COMPENSATED
            assert store.wait(stop, timeout=60).status is Status.COMPENSATED
    assert [(d["by"], d["reason"]) for d in _data(store, yes, K.APPROVAL_GRANTED)] == [
        ("olivia", "checked with sales")]
    assert [(d["by"], d["reason"]) for d in _data(store, no, K.APPROVAL_DENIED)] == [
        ("olivia", "not to the CEO")]
    assert K.STEP_STARTED not in [e["kind"] for e in store.events.log.bodies(no)
                                  if e.get("step") == 1]  # the denied step never ran
    assert _data(store, stop, K.SAGA_FAILED)[0]["reason"] == "aborted by pat: customer cancelled"
    assert K.APPROVAL_GRANTED not in kinds(store, stop)


def test_resume_and_acknowledge_in_the_browser(
        client: redis.Redis, worker_env: dict[str, str], ledger: Path, tmp_path: Path,
        page: Any) -> None:
    store = _store(client)
    shot = _shots(tmp_path)
    forged = committed_saga(store.events, steps=2, agent="agent-f").saga_id
    tamper(client, forged, lambda es: [*es[:3], edit_body(es[3], lambda b: b.update(
        data={"result": {"ok": 1000}})), *es[4:]])
    with workers(worker_env, TOOLS):
        sid = store.submit(STUCK, agent_id="warehouse-bot")
        assert store.wait(sid, timeout=60).status is Status.STUCK
        with serving(create_app(store, ConsoleConfig(operator="olivia"))) as base:
            page.goto(f"{base}/sagas/{forged}")
            assert page.locator("#chain-seq").inner_text() == "3"
            assert page.locator("#chain-reason").inner_text() == "hash_mismatch"
            shot(page, "saga-tampered", full=False)
            assert "unwind resumed by olivia" in act(page, base, sid, "resume",
                                                     why="restarted the warehouse API")
            assert_eventually(lambda: kinds(store, sid).count(K.SAGA_STUCK) == 2
                              and store.state(sid).status is Status.STUCK, timeout=60,
                              what="the resumed unwind to be stuck again")
            page.goto(f"{base}/sagas/{sid}")
            assert "resumed by olivia: restarted the warehouse API" in page.locator(
                "#events tr.k-saga_resumed").inner_text()
            assert "hash chain intact" in page.locator("#chain").inner_text()
            shot(page, "saga-resumed")
            store.resolve(sid, 1, by="olivia", note="released B by hand")
            assert store.wait(sid, timeout=60).status is Status.NEEDS_ATTENTION
            assert "acknowledged by dana" in act(page, base, sid, "acknowledge",
                                                 why="B checked", by="dana")
    resumed = _data(store, sid, K.SAGA_RESUMED)  # the browser's, then the resolve's
    assert (resumed[0]["by"], resumed[0]["note"]) == ("olivia", "restarted the warehouse API")
    ack = client.xrange(keys.ATTENTION_ACKS)[-1][1]
    assert (ack[b"saga_id"].decode(), ack[b"by"], ack[b"note"]) == (sid, b"dana", b"B checked")
    assert sid not in [a.saga_id for a in needing_attention(store.events.log)]
