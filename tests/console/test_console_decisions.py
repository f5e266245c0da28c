"""Decisions taken in the console, with real workers: approving runs the gated
step once, denying (with a reason) fails it unexecuted; both are recorded in
the chain with the operator's name. Acknowledging a saga that needs
attention records who and why and takes it off the list."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from saga_store import SagaStore, Status, keys
from saga_store.approval import requests as approvals
from saga_store.log.events import EventKind as K
from saga_store.testing import assert_eventually
from saga_store.testing.workers import workers
from saga_store.verify.checker import Verifier

from ..console_helpers import console, post_form
from ..ledger_tools import effects

TOOLS = "tests.ledger_tools"
PLAN = [{"tool": "charge_payment", "args": {"amount_cents": 500,
                                            "card_number": "4111222233334444"}},
        {"tool": "update_crm_record", "args": {"customer": "production-eu", "note": "x"}}]
GATED = [{"tool": "reserve_inventory", "args": {"sku": "A", "qty": 1}},
         {"tool": "send_email", "args": {"to": "ceo@example.com"}}]


def _waiting(store: SagaStore, sid: str) -> approvals.Pending:
    return assert_eventually(
        lambda: next((p for p in approvals.pending(store) if p.saga_id == sid), None),
        timeout=30, what=f"saga {sid} to wait for approval")


@pytest.mark.real_redis
@pytest.mark.cluster
def test_approve_and_deny_from_the_inbox(saga_store: SagaStore, worker_env: dict[str, str],
                                         ledger: Path, tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text("")
    tc = console(saga_store, operator="olivia")
    with workers({**worker_env, "SAGA_POLICY_FILE": str(policy)}, TOOLS):
        prod = saga_store.submit(PLAN, agent_id="agent-a")
        gated = saga_store.submit(GATED, agent_id="agent-b")
        _waiting(saga_store, prod)
        _waiting(saga_store, gated)
        inbox = tc.get("/approvals").text
        card = inbox[inbox.index(f'id="approval-{prod}-1"'):]
        card = card[:card.index("</section>")]
        assert "PRODUCTION" in card
        assert "update_crm_record" in card
        assert "revert_crm" in card
        assert "$.input.customer" in card
        assert "compensable" in card
        assert "4111222233334444" not in inbox
        email = inbox[inbox.index(f'id="approval-{gated}-1"'):]
        assert "none: this cannot be undone" in email[:email.index("</section>")]
        assert "irreversible" in email[:email.index("</section>")]

        no_reason = post_form(tc, "/approvals", f"/approvals/{gated}/1/deny", reason=" ")
        assert "a denial needs a reason" in tc.get(no_reason.headers["location"]).text
        assert saga_store.state(gated).steps[1].approval == "requested"

        ok = post_form(tc, "/approvals", f"/approvals/{prod}/1/approve")
        assert "approved by olivia" in tc.get(ok.headers["location"]).text
        no = post_form(tc, "/approvals", f"/approvals/{gated}/1/deny",
                       reason="not to the CEO <b>")
        assert "denied by olivia" in tc.get(no.headers["location"]).text
        assert saga_store.wait(prod, timeout=30).status is Status.COMMITTED
        denied = saga_store.wait(gated, timeout=30)
        again = post_form(tc, "/approvals", f"/approvals/{prod}/1/approve")
        assert "no pending approval" in tc.get(again.headers["location"]).text
    assert denied.status is Status.COMPENSATED
    assert "denied by olivia: not to the CEO <b>" in denied.steps[1].error
    assert len(effects("crm")) == 1
    assert not effects("email")
    granted = [e for e in saga_store.events.log.bodies(prod) if e["kind"] == K.APPROVAL_GRANTED]
    assert granted[0]["data"]["by"] == "olivia"
    refused = [e for e in saga_store.events.log.bodies(gated) if e["kind"] == K.APPROVAL_DENIED]
    assert refused[0]["data"] == {"by": "olivia", "reason": "not to the CEO <b>",
                                  "at_ms": refused[0]["data"]["at_ms"]}
    assert Verifier(saga_store.events.log).verify().ok


@pytest.mark.cluster
def test_acknowledging_a_saga_that_needs_attention(saga_store: SagaStore,
                                                   client: redis.Redis) -> None:
    w = saga_store.events.open("agent-w")
    w.append(K.STEP_INTENT, step=0, tool="wire", data={"args": {}})
    w.append(K.STEP_STARTED, step=0, attempt=1)
    w.append(K.STEP_SUCCEEDED, step=0, data={"result": {}})
    w.append(K.SAGA_FAILED, data={"reason": "later step failed"})
    w.append(K.STEP_NOT_COMPENSABLE, step=0, data={"reason": "tool is irreversible"})
    w.append(K.SAGA_NEEDS_ATTENTION, data={"needs_attention": ["step 0 (wire)"]})
    client.sadd(saga_store.events.keys.needs_attention(w.saga_id), w.saga_id)
    tc = console(saga_store, operator="dana")
    page = tc.get("/attention").text
    assert w.saga_id in page
    assert "step 0 (wire)" in page
    res = post_form(tc, "/attention", f"/attention/{w.saga_id}/ack", note="wired back by hand")
    assert "acknowledged by dana" in tc.get(res.headers["location"]).text
    assert "no saga needs attention" in tc.get("/attention").text
    acks = client.xrange(keys.ATTENTION_ACKS)
    assert acks[-1][1][b"by"] == b"dana"
    assert acks[-1][1][b"note"] == b"wired back by hand"
    twice = post_form(tc, "/attention", f"/attention/{w.saga_id}/ack")
    assert "not waiting for attention" in tc.get(twice.headers["location"]).text
    # the saga's page draws what could not be undone
    assert 'class="mark not-compensable"' in tc.get(f"/sagas/{w.saga_id}").text
