"""Actions on a saga's page, end to end with real workers: each is confirmed on
a page that says what it will do, is done through the function its CLI command
calls, is recorded with the name typed and the reason given, and is refused
(nothing written) for a read-only sign-in and when the saga changed since the
confirmation was shown."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
import redis
from starlette.testclient import TestClient

from saga_store import SagaStore, Status, keys
from saga_store.approval import requests as approvals
from saga_store.log.events import EventKind as K
from saga_store.testing import assert_eventually
from saga_store.testing.workers import workers
from saga_store.verify.checker import Verifier

from ..console_helpers import console, csrf_of
from ..ledger_tools import effects

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
TOOLS = "tests.ledger_tools"
GATED = [{"tool": "reserve_inventory", "args": {"sku": "A", "qty": 1}},
         {"tool": "send_email", "args": {"to": "ceo@example.com"}}]
STUCK = [{"tool": "reserve_inventory", "args": {"sku": "A", "qty": 1}},
         {"tool": "reserve_forgetful", "args": {"sku": "B"}},
         {"tool": "fail_always", "args": {}}]
OPERATOR, VIEWER = "o" * 24, "v" * 24


def confirmation(tc: TestClient, sid: str, action: str, step: int | None = None) -> str:
    url = f"/sagas/{sid}/do/{action}" + (f"?step={step}" if step is not None else "")
    got = tc.get(url)
    assert got.status_code == 200, got.text
    assert 'id="confirm"' in got.text, got.text
    return got.text


def confirm(tc: TestClient, page: str, action: str, sid: str,
            **fields: str) -> httpx.Response:
    """Submit the confirmation ``page`` as a browser would; the page it lands on."""
    form = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', page))
    res = tc.post(f"/sagas/{sid}/do/{action}", data={**form, "csrf": csrf_of(page), **fields},
                  follow_redirects=False)
    assert res.status_code == 303, res.text
    assert res.headers["location"].startswith(f"/sagas/{sid}?")
    return tc.get(res.headers["location"])


def kinds(store: SagaStore, sid: str) -> list[str]:
    return [e["kind"] for e in store.events.log.bodies(sid)]


def _waiting(store: SagaStore, sid: str) -> None:
    assert_eventually(lambda: any(p.saga_id == sid for p in approvals.pending(store)),
                      timeout=30, what=f"saga {sid} to wait for approval")


def test_approve_deny_and_abort_from_the_saga_page(
        saga_store: SagaStore, worker_env: dict[str, str], ledger: Path,
        tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text("")
    tc = console(saga_store, operator="olivia")
    with workers({**worker_env, "SAGA_POLICY_FILE": str(policy)}, TOOLS):
        yes, no, stop = (saga_store.submit(GATED, agent_id=f"agent-{n}") for n in "abc")
        for sid in (yes, no, stop):
            _waiting(saga_store, sid)
        page = tc.get(f"/sagas/{yes}").text
        assert "waiting for approval: step 1 (send_email)" in page
        assert f'href="/sagas/{yes}/do/approve?step=1"' in page
        plan = page[page.index('id="unwind-plan"'):page.index("</ol>", page.index("unwind-plan"))]
        assert plan.index("#1 send_email: never ran") < plan.index(
            "#0 reserve_inventory: undone by its declared compensation")
        ask = confirmation(tc, yes, "approve", 1)
        assert "approve step 1 (send_email): it is queued to run now, once (undo: none, " \
               "it cannot be undone)" in ask
        other = console(saga_store, operator="bob")  # a second operator, same moment
        bobs = confirmation(other, yes, "approve", 1)
        done = confirm(tc, ask, "approve", yes, by="olivia", why="checked with sales")
        assert "step 1 approved by olivia" in done.text
        late = confirm(other, bobs, "approve", yes, by="bob", why="me too")
        assert "changed since this was confirmed" in late.text  # told, not recorded
        ask = confirmation(tc, no, "deny", 1)
        assert "#0 reserve_inventory: undone by its declared compensation" in ask
        no_why = confirm(tc, ask, "deny", no, by="olivia", why=" ")
        assert "say why" in no_why.text
        assert K.APPROVAL_DENIED not in kinds(saga_store, no)
        assert "denied by olivia" in confirm(tc, ask, "deny", no, by="olivia",
                                             why="not to the CEO").text
        ask = confirmation(tc, stop, "abort")
        assert "abort: the saga stops going forward" in ask
        assert "aborted by pat" in confirm(tc, ask, "abort", stop, by="pat",
                                           why="customer cancelled").text
        assert saga_store.wait(yes, timeout=60).status is Status.COMMITTED
        assert saga_store.wait(no, timeout=60).status is Status.COMPENSATED
        assert saga_store.wait(stop, timeout=60).status is Status.COMPENSATED
    granted = [e for e in saga_store.events.log.bodies(yes) if e["kind"] == K.APPROVAL_GRANTED]
    assert [(e["data"]["by"], e["data"]["reason"]) for e in granted] == [
        ("olivia", "checked with sales")]
    denied = next(e for e in saga_store.events.log.bodies(no) if e["kind"] == K.APPROVAL_DENIED)
    assert (denied["data"]["by"], denied["data"]["reason"]) == ("olivia", "not to the CEO")
    failed = next(e for e in saga_store.events.log.bodies(stop) if e["kind"] == K.SAGA_FAILED)
    assert failed["data"]["reason"] == "aborted by pat: customer cancelled"
    assert len(effects("email")) == 1  # only the approved one ran
    assert Verifier(saga_store.events.log).verify().ok


def test_a_stuck_saga_resumed_resolved_and_acknowledged_from_its_page(
        saga_store: SagaStore, client: redis.Redis, worker_env: dict[str, str],
        ledger: Path) -> None:
    tc = console(saga_store, operator="olivia")
    sid = saga_store.submit(STUCK, agent_id="agent-r")
    with workers(worker_env, TOOLS):
        assert saga_store.wait(sid, timeout=60).status is Status.STUCK
        page = tc.get(f"/sagas/{sid}").text
        assert "stuck undoing step 1 (reserve_forgetful)" in page
        hint = re.search(r'<dt>what to do</dt><dd class="reason">([^<]*)</dd>', page)
        assert hint is not None
        assert "saga resolve" in hint.group(1)  # the hint, as text, not JSON
        assert "&#34;" not in hint.group(1)
        ask = confirmation(tc, sid, "resume")
        assert "resume: the unwind will" in ask
        assert "step 1 (reserve_forgetful)" in ask
        assert "unwind resumed by olivia" in confirm(tc, ask, "resume", sid, by="olivia").text
        assert_eventually(lambda: kinds(saga_store, sid).count(K.SAGA_STUCK) == 2,
                          timeout=60, what="the resumed unwind to be stuck again")
        stale = confirm(tc, ask, "resume", sid, by="olivia")  # the page of before
        assert "changed since this was confirmed" in stale.text
        assert kinds(saga_store, sid).count(K.SAGA_RESUMED) == 1
        ask = confirmation(tc, sid, "resolve", 1)
        assert "resolve step 1 (reserve_forgetful) as undone by hand" in ask
        done = confirm(tc, ask, "resolve", sid, by="olivia", why="released B by hand")
        assert "step 1 resolved by hand by olivia" in done.text
        twice = confirm(tc, ask, "resolve", sid, by="bob", why="me too")  # a second operator
        assert "changed since this was confirmed" in twice.text
        assert saga_store.wait(sid, timeout=60).status is Status.NEEDS_ATTENTION
    bodies = saga_store.events.log.bodies(sid)
    resolved = [e for e in bodies if e["kind"] == K.COMPENSATION_RESOLVED]
    assert [(e["data"]["by"], e["data"]["note"]) for e in resolved] == [
        ("olivia", "released B by hand")]
    page = tc.get(f"/sagas/{sid}").text
    assert "needs attention" in page
    ask = confirmation(tc, sid, "acknowledge")
    assert "acknowledged by dana" in confirm(tc, ask, "acknowledge", sid, by="dana",
                                             why="B checked").text
    ack = client.xrange(keys.ATTENTION_ACKS)[-1][1]
    assert (ack[b"saga_id"].decode(), ack[b"by"], ack[b"note"]) == (sid, b"dana", b"B checked")
    again = tc.get(f"/sagas/{sid}/do/acknowledge", follow_redirects=False)
    assert again.status_code == 200  # still offered: the log says needs_attention
    refused = confirm(tc, again.text, "acknowledge", sid, by="dana")
    assert "not waiting for attention" in refused.text
    assert client.xlen(keys.ATTENTION_ACKS) == 1


def test_a_read_only_sign_in_sees_everything_and_can_do_nothing(
        saga_store: SagaStore, client: redis.Redis) -> None:
    """A viewer's POSTs are refused with 403 whatever the route, writing nothing;
    the operator's token acts."""
    w = saga_store.events.open("agent-v")
    w.append(K.STEP_INTENT, step=0, tool="wire", data={"args": {},
                                                         "reversibility": "compensable"})
    tc = console(saga_store, tokens={OPERATOR: "olivia"}, readonly_tokens={VIEWER: "victor"})
    viewer = {"authorization": f"Bearer {VIEWER}"}
    page = tc.get(f"/sagas/{w.saga_id}", headers=viewer)
    assert page.status_code == 200
    assert "signed in read-only" in page.text
    assert f"/sagas/{w.saga_id}/do/abort" not in page.text
    ask = tc.get(f"/sagas/{w.saga_id}/do/abort", headers=viewer)
    assert ask.status_code == 200
    assert "only an operator" in ask.text
    before = w.head.seq
    for route in (f"/sagas/{w.saga_id}/do/abort", f"/sagas/{w.saga_id}/do/resume",
                  f"/approvals/{w.saga_id}/0/approve", f"/attention/{w.saga_id}/ack",
                  "/verify/run"):
        res = tc.post(route, data={"csrf": tc.cookies.get("saga_csrf") or "", "by": "victor",
                                   "why": "x"}, headers=viewer)
        assert res.status_code == 403, route
        assert "read-only" in res.text
    assert saga_store.events.log.head(w.saga_id).seq == before
    signed_in = console(saga_store, tokens={OPERATOR: "olivia"},
                        readonly_tokens={VIEWER: "victor"})
    login = signed_in.get("/login")
    res = signed_in.post("/login", data={"csrf": csrf_of(login.text), "token": VIEWER,
                                         "next": "/sagas"}, follow_redirects=False)
    assert res.status_code == 303  # a viewer signs in with the form too ...
    ask = signed_in.get(f"/sagas/{w.saga_id}/do/abort").text
    assert '<b id="operator">victor</b>' in ask
    refused = signed_in.post(f"/sagas/{w.saga_id}/do/abort", follow_redirects=False,
                             data={"csrf": csrf_of(ask), "by": "victor", "why": "x"})
    assert refused.status_code == 403  # ... and stays read-only
    assert saga_store.events.log.head(w.saga_id).seq == before
    operator = {"authorization": f"Bearer {OPERATOR}"}
    ask_op = tc.get(f"/sagas/{w.saga_id}/do/abort", headers=operator).text
    form = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', ask_op))
    res = tc.post(f"/sagas/{w.saga_id}/do/abort", headers=operator, follow_redirects=False,
                  data={**form, "by": "pat", "why": "test"})
    assert res.status_code == 303
    st = saga_store.state(w.saga_id)
    assert st.status is Status.COMPENSATING
    # the name typed, and beside it the one the token names
    assert st.reason == {"reason": "aborted by pat (signed in as olivia): test"}
