"""Approval gates: the policy's decisions, and gated steps end to end with real
worker processes: a step waits for a person without holding a worker, an
approval runs it once, a denial (by a person, the policy or a deadline) leaves
it unexecuted and the saga compensates; every decision is in the chain."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import redis

from saga_store import SagaStore
from saga_store.approval import requests as approvals
from saga_store.approval.policy import Decision, Policy
from saga_store.errors import InvalidInput
from saga_store.log.events import EventKind as K
from saga_store.protocol.state import Status
from saga_store.testing import assert_eventually
from saga_store.testing.workers import workers
from saga_store.verify.checker import Verifier

from ..ledger_tools import effects

TOOLS = "tests.ledger_tools"
ROOT = str(Path(__file__).resolve().parents[2])
PLAN = [{"tool": "reserve_inventory", "args": {"sku": "A", "qty": 1}},
        {"tool": "send_email", "args": {"to": "ceo@example.com"}}]


# -- the policy ----------------------------------------------------------------

def test_safe_defaults_gate_what_cannot_be_undone_and_what_nobody_classified() -> None:
    p = Policy.safe()
    assert p.decide("lookup", "readonly", {}).decision is Decision.ALLOW
    assert p.decide("reserve", "compensable", {}).decision is Decision.ALLOW
    assert p.decide("wire_money", "irreversible", {}).decision is Decision.REQUIRE_APPROVAL
    # a tool only a remote server vouches for is unknown here: treated as mutating
    assert p.decide("mystery", None, {}).decision is Decision.REQUIRE_APPROVAL
    v = p.decide("reserve", "compensable", {"env": "Production"})
    assert (v.decision, v.production) == (Decision.REQUIRE_APPROVAL, True)
    assert not p.decide("reserve", "compensable", {"note": "productive"}).production


def test_a_forgotten_approval_becomes_a_denial_after_an_hour_unless_told_otherwise() -> None:
    """The safe defaults, and a policy file that does not say, deny after 3600 s; 0
    waits forever."""
    assert Policy.safe().approval_timeout_s == 3600
    assert Policy.from_dict({"defaults": {"irreversible": "deny"}}).approval_timeout_s == 3600
    assert Policy.from_dict({"defaults": {"approval_timeout_s": 0}}).approval_timeout_s == 0


def test_rules_match_tool_reversibility_and_arguments_first_match_wins() -> None:
    p = Policy.from_dict({
        "defaults": {"irreversible": "allow"},
        "rules": [{"tool": "drop_*", "decision": "deny", "name": "no-drops"},
                  {"tool": "charge_*", "args": {"amount_cents": "^[0-9]{5,}$"},
                   "decision": "require_approval"},
                  {"reversibility": ["irreversible"], "production": True, "decision": "deny"}]})
    assert p.decide("drop_table", "readonly", {}).decision is Decision.DENY
    assert p.decide("drop_table", "readonly", {}).reason == "policy rule no-drops"
    assert p.decide("charge_card", "compensable",
                    {"amount_cents": 12000}).decision is Decision.REQUIRE_APPROVAL
    assert p.decide("charge_card", "compensable", {"amount_cents": 999}).decision \
        is Decision.ALLOW
    assert p.decide("send", "irreversible", {"to": "prod-db"}).decision is Decision.DENY
    assert p.decide("send", "irreversible", {"to": "dev"}).decision is Decision.ALLOW
    # a tool's own default is the least it gets when no rule matches
    assert p.decide("send", "irreversible", {}, Decision.REQUIRE_APPROVAL).decision \
        is Decision.REQUIRE_APPROVAL


def test_without_a_policy_file_only_a_tools_own_default_gates() -> None:
    p = Policy.permissive()
    assert p.decide("wire", "irreversible", {"env": "prod"}).decision is Decision.ALLOW
    v = p.decide("wire", "irreversible", {"env": "prod"}, Decision.REQUIRE_APPROVAL)
    assert (v.decision, v.production) == (Decision.REQUIRE_APPROVAL, True)  # for the preview


@pytest.mark.parametrize(("text", "message"), [
    ("[defaults]\nirreversible = 'maybe'\n", "not one of allow"),
    ("[[rules]]\ntool = 'x'\n", "needs a decision"),
    ("[[rules]]\ndecision = 'deny'\nargs = { a = '(' }\n", "bad regular expression"),
    ("[[rules]]\ndecision = 'deny'\nwhen = 1\n", "unknown key"),
    ("[defaults\n", "not valid TOML"),
    ("[other]\n", "unknown section"),
])
def test_bad_policy_files_are_refused_with_what_to_fix(tmp_path: Path, text: str,
                                                       message: str) -> None:
    f = tmp_path / "policy.toml"
    f.write_text(text)
    with pytest.raises(InvalidInput, match=message):
        Policy.load(f)


POLICY_TOML = """
[defaults]
irreversible = "deny"
approval_timeout_s = 30

[[rules]]
tool = "charge_*"
args = { amount_cents = "^[0-9]{5,}$" }
decision = "require_approval"
name = "big-charges"
"""
POLICY_YAML = """
defaults:
  irreversible: deny
  approval_timeout_s: 30
rules:
  - tool: "charge_*"
    args: {amount_cents: "^[0-9]{5,}$"}
    decision: require_approval
    name: big-charges
"""


def test_a_yaml_policy_reads_as_the_same_toml_one(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text(POLICY_TOML)
    (tmp_path / "p.yaml").write_text(POLICY_YAML)
    toml, yaml = Policy.load(tmp_path / "p.toml"), Policy.load(tmp_path / "p.yaml")
    for call in [("charge_card", "compensable", {"amount_cents": 12000}),
                 ("charge_card", "compensable", {"amount_cents": 12}),
                 ("wire", "irreversible", {}), ("reserve", "compensable", {"env": "prod"})]:
        assert yaml.decide(*call) == toml.decide(*call)
    assert yaml.decide("charge_card", "compensable", {"amount_cents": 12000}).decision \
        is Decision.REQUIRE_APPROVAL
    assert yaml.approval_timeout_s == toml.approval_timeout_s == 30


@pytest.mark.parametrize(("name", "text", "message"), [
    ("p.yaml", "defaults: [allow\n", "not valid YAML"),
    ("p.yml", "- allow\n- deny\n", "top level must be a mapping"),
    ("p.yaml", "defaults:\n  irreversible: maybe\n", "not one of allow"),
    ("p.yaml", "!!python/object/apply:os.system ['true']\n", "not valid YAML"),
    ("p.toml", "defaults:\n  irreversible: deny\n", "a YAML file needs a .yaml"),
])
def test_bad_yaml_policies_are_refused_with_what_to_fix(tmp_path: Path, name: str, text: str,
                                                        message: str) -> None:
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(InvalidInput, match=message):
        Policy.load(f)


# -- gated steps, end to end -----------------------------------------------------

def _policy(tmp_path: Path, body: str = "") -> Path:
    f = tmp_path / "policy.toml"
    f.write_text(body)
    return f


def _saga(*args: str, url: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "saga_store.cli.main", "--redis-url", url, *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120,
                          input=stdin, check=False, env={**os.environ, "PYTHONPATH": ROOT})


def _waiting(store: SagaStore, sid: str) -> approvals.Pending:
    return assert_eventually(
        lambda: next((p for p in approvals.pending(store) if p.saga_id == sid), None),
        timeout=30, what=f"saga {sid} to wait for approval")


@pytest.mark.real_redis
def test_approved_step_runs_once_and_waiting_holds_no_worker(
        saga_store: SagaStore, worker_env: dict[str, str], ledger: Path, tmp_path: Path,
        redis_url: str) -> None:
    policy = _policy(tmp_path)
    with workers({**worker_env, "SAGA_POLICY_FILE": str(policy)}, TOOLS):  # one process
        sid = saga_store.submit(PLAN, agent_id="agent-a")
        pending = _waiting(saga_store, sid)
        assert (pending.step, pending.preview["tool"]) == (1, "send_email")
        assert pending.preview["reversibility"] == "irreversible"
        assert pending.preview["compensation"] is None
        assert not effects("email")
        # the only worker is free: another saga runs to the end meanwhile
        other = saga_store.submit(PLAN[:1], agent_id="agent-b")
        assert saga_store.wait(other, timeout=30).status is Status.COMMITTED
        listed = _saga("approvals", "--json", url=redis_url)
        assert listed.returncode == 0, listed.stderr
        assert [(p["saga_id"], p["step"]) for p in orjson.loads(listed.stdout)] == [(sid, 1)]
        res = _saga("approve", sid, "1", "--by", "alice", url=redis_url)
        assert res.returncode == 0, res.stderr
        assert saga_store.wait(sid, timeout=30).status is Status.COMMITTED
    assert len(effects("email")) == 1
    granted = [e for e in saga_store.events.log.bodies(sid) if e["kind"] == K.APPROVAL_GRANTED]
    assert granted[0]["data"]["by"] == "alice"
    again = _saga("approve", sid, "1", "--by", "alice", url=redis_url)
    assert again.returncode == 2
    assert "no pending approval" in again.stderr
    both = _saga("approvals", "--interactive", "--json", url=redis_url)
    assert both.returncode == 2
    assert "leave out --json" in both.stderr
    assert Verifier(saga_store.events.log).verify().ok


@pytest.mark.real_redis
def test_denied_step_never_runs_and_the_saga_compensates(
        saga_store: SagaStore, worker_env: dict[str, str], ledger: Path, tmp_path: Path,
        redis_url: str) -> None:
    with workers({**worker_env, "SAGA_POLICY_FILE": str(_policy(tmp_path))}, TOOLS):
        sid = saga_store.submit(PLAN, agent_id="agent-a")
        _waiting(saga_store, sid)
        res = _saga("deny", sid, "1", "--reason", "not to the CEO", "--by", "bob",
                    url=redis_url)
        assert res.returncode == 0, res.stderr
        st = saga_store.wait(sid, timeout=30)
    assert st.status is Status.COMPENSATED
    assert st.steps[1].status == "failed"
    assert "denied by bob: not to the CEO" in st.steps[1].error
    assert not effects("email")
    assert len(effects("reserve")) == 1
    assert len(effects("release")) == 1
    assert Verifier(saga_store.events.log).verify().ok


@pytest.mark.real_redis
def test_policy_deny_and_deadline_deny_without_running_the_tool(
        saga_store: SagaStore, worker_env: dict[str, str], ledger: Path, tmp_path: Path) -> None:
    policy = _policy(tmp_path, """
[defaults]
approval_timeout_s = 1

[[rules]]
tool = "send_*"
args = { to = "@competitor[.]com$" }
decision = "deny"
""")
    with workers({**worker_env, "SAGA_POLICY_FILE": str(policy)}, TOOLS):
        denied = saga_store.submit(
            [PLAN[0], {"tool": "send_email", "args": {"to": "x@competitor.com"}}],
            agent_id="agent-a")
        forgotten = saga_store.submit(PLAN, agent_id="agent-b")
        a = saga_store.wait(denied, timeout=30)
        b = saga_store.wait(forgotten, timeout=60)
    assert a.status is Status.COMPENSATED
    assert "denied by policy" in a.steps[1].error
    assert a.steps[1].approval is None  # no person was asked
    assert b.status is Status.COMPENSATED
    assert "denied by timeout" in b.steps[1].error
    assert not effects("email")
    assert len(effects("release")) == 2
    assert Verifier(saga_store.events.log).verify().ok


@pytest.mark.real_redis
def test_production_arguments_are_flagged_and_gated(
        saga_store: SagaStore, worker_env: dict[str, str], ledger: Path, tmp_path: Path,
        redis_url: str) -> None:
    plan = [{"tool": "charge_payment",
             "args": {"amount_cents": 500, "card_number": "4111222233334444"}},
            {"tool": "update_crm_record", "args": {"customer": "production-eu", "note": "x"}}]
    with workers({**worker_env, "SAGA_POLICY_FILE": str(_policy(tmp_path))}, TOOLS):
        sid = saga_store.submit(plan, agent_id="agent-a")
        pending = _waiting(saga_store, sid)
        assert pending.step == 1
        assert pending.preview["production"] is True
        assert pending.preview["compensation"] == {"tool": "revert_crm",
                                                   "mapping": {"customer": "$.input.customer"}}
        listed = _saga("approvals", url=redis_url)
        assert "PRODUCTION" in listed.stdout
        assert "4111222233334444" not in listed.stdout
        approvals.decide(saga_store, sid, 1, grant=True, by="carol")
        assert saga_store.wait(sid, timeout=30).status is Status.COMMITTED
    assert len(effects("crm")) == 1


@pytest.mark.real_redis
def test_run_approve_interactively(worker_env: dict[str, str], ledger: Path, tmp_path: Path,
                                   redis_url: str, client: redis.Redis) -> None:
    plan = tmp_path / "plan.json"
    plan.write_bytes(orjson.dumps({"agent_id": "terminal-user", "steps": PLAN}))
    with workers({**worker_env, "SAGA_POLICY_FILE": str(_policy(tmp_path))}, TOOLS):
        res = subprocess.run(
            [sys.executable, "-m", "saga_store.cli.main", "--redis-url", redis_url, "run",
             "--tools",
             TOOLS, "--wait", "--approve-interactively", str(plan)],
            input="y\n", capture_output=True, text=True, cwd=ROOT, timeout=120, check=False,
            env=worker_env)
    assert res.returncode == 0, res.stderr
    assert "send_email" in res.stderr
    assert "Approve this step?" in res.stderr
    assert " committed" in res.stdout
    assert len(effects("email")) == 1
