"""The saga CLI: verify's exit codes, export and offline verification, anchors."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest
import redis
from click.testing import CliRunner, Result
from saga_store.cli.main import cli

from saga_store import keys
from saga_store.log.store import EventStore

from ..golden.make_golden import HMAC_KEY
from ..helpers import committed_saga, edit_body, tamper

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def run(url: str | None, *args: str, env: dict[str, str] | None = None) -> Result:
    full_env = {"SAGA_REDIS_URL": url or "", "SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": ""}
    full_env.update(env or {})
    return CliRunner().invoke(cli, list(args), env=full_env)


def test_verify_exits_0_on_an_intact_log(store: EventStore, redis_url: str) -> None:
    committed_saga(store)
    res = run(redis_url, "verify", "--json")
    assert res.exit_code == 0, res.output
    out = orjson.loads(res.output)
    assert out["ok"] is True
    assert out["events"] == 11 + 2


def test_verify_exits_1_naming_seq_and_reason(store: EventStore, client: redis.Redis,
                                              redis_url: str) -> None:
    w = committed_saga(store)
    tamper(client, w.saga_id, lambda es: [*es[:3], edit_body(es[3], lambda b: b.update(ts=5)),
                                          *es[4:]])
    res = run(redis_url, "verify", "--json")
    assert res.exit_code == 1
    fail = orjson.loads(res.output)["failures"][0]
    assert (fail["chain"], fail["first_bad_seq"], fail["reason"]) == (
        w.saga_id, 3, "hash_mismatch")
    human = run(redis_url, "verify")
    assert f"FAIL {w.saga_id}: first bad seq 3: hash_mismatch" in human.output


def test_verify_exits_3_when_redis_is_unreachable() -> None:
    """An unreachable store is 'could not verify', never 'intact'."""
    res = run("redis://127.0.0.1:1/0", "verify")
    assert res.exit_code == 3
    assert "cannot reach Redis" in res.output


def test_verify_exits_2_on_usage_errors(redis_url: str) -> None:
    assert run(redis_url, "verify", "--saga", "bad:id").exit_code == 2
    assert run(redis_url, "verify", "--bogus").exit_code == 2
    assert run(redis_url, "verify", "--anchor", "/nonexistent/anchor.json").exit_code == 2


def test_export_verifies_offline_and_catches_an_edit(store: EventStore, redis_url: str,
                                                     tmp_path: Path) -> None:
    """An export verifies with no Redis at all; one edited character fails it."""
    committed_saga(store)
    committed_saga(store)
    out = tmp_path / "log.jsonl"
    assert run(redis_url, "export", str(out)).exit_code == 0
    res = run("redis://127.0.0.1:1/0", "verify", "--file", str(out), "--json")
    assert res.exit_code == 0, res.output
    assert orjson.loads(res.output)["events"] == 2 * 11 + 4
    text = out.read_bytes().replace(b'"ok":1', b'"ok":7', 1)
    out.write_bytes(text)
    res = run(None, "verify", "--file", str(out), "--json")
    assert res.exit_code == 1
    assert orjson.loads(res.output)["failures"][0]["reason"] == "hash_mismatch"


@pytest.mark.parametrize("name", ["sha256", "hmac"])
def test_golden_exports_verify(name: str, tmp_path: Path) -> None:
    """Checked-in logs written by an earlier build still verify: the format is stable."""
    env = {"SAGA_HMAC_KEY": HMAC_KEY.hex()} if name == "hmac" else {}
    res = run(None, "verify", "--file", str(GOLDEN / f"{name}.jsonl"), env=env)
    assert res.exit_code == 0, res.output


def test_golden_hmac_export_without_the_key_cannot_be_verified() -> None:
    res = run(None, "verify", "--file", str(GOLDEN / "hmac.jsonl"))
    assert res.exit_code == 3
    assert "SAGA_HMAC_KEY" in res.output


def test_golden_exports_verify_when_loaded_into_redis(client: redis.Redis, redis_url: str,
                                                      tmp_path: Path) -> None:
    """The Redis verifier and the file verifier agree on the golden log."""
    names = keys.SagaKeys(1, 1)  # the golden log is of layout 1: one ledger chain
    for line in (GOLDEN / "sha256.jsonl").read_bytes().splitlines()[1:]:
        ev = orjson.loads(line)
        prev, h = bytes.fromhex(ev.pop("prev")), bytes.fromhex(ev.pop("hash"))
        from saga_store.log.canonical import canonical
        assert prev  # implied by position in Redis
        client.xadd(names.chain_log(ev["saga_id"]), {"b": canonical(ev), "h": h},
                    id=keys.entry_id(ev["seq"]))
    res = run(redis_url, "verify")
    assert res.exit_code == 0, res.output


def test_not_an_export_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "x.jsonl"
    bad.write_text("hello\n")
    res = run(None, "verify", "--file", str(bad))
    assert res.exit_code == 2
    assert "not a Saga Store export" in res.output


def test_anchor_round_trip_and_rollback(store: EventStore, client: redis.Redis, redis_url: str,
                                        tmp_path: Path) -> None:
    """verify --anchor passes on the same log and fails with 'log behind anchor' after loss."""
    w = committed_saga(store)
    anchor = tmp_path / "anchor.json"
    assert run(redis_url, "anchor", "--out", str(anchor)).exit_code == 0
    assert run(redis_url, "verify", "--anchor", str(anchor)).exit_code == 0
    tamper(client, store.log.layout.ledger_of(w.saga_id), lambda es: es[:1])
    res = run(redis_url, "verify", "--anchor", str(anchor))
    assert res.exit_code == 1
    assert "log behind anchor" in res.output


def test_ls_and_show(store: EventStore, redis_url: str) -> None:
    w = committed_saga(store)
    res = run(redis_url, "ls", "--json")
    [row] = orjson.loads(res.output)
    assert {k: row[k] for k in ("saga_id", "state", "agent_id", "seq")} == {
        "saga_id": w.saga_id, "state": "committed", "agent_id": "agent-1", "seq": 10}
    assert run(redis_url, "ls", "--state", "compensated", "--json").output.strip() == "[]"
    res = run(redis_url, "show", w.saga_id)
    assert res.exit_code == 0
    assert "saga_committed" in res.output
    assert "tool_1" in res.output
    assert run(redis_url, "show", "nope").exit_code == 2


def test_demo_runs_on_the_embedded_store_without_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no Redis named, the demo runs on the embedded store with a notice."""
    monkeypatch.setattr("saga_store.ops.connection.DEFAULT_URL", "redis://127.0.0.1:1/0")
    res = CliRunner().invoke(cli, ["demo"], env={"SAGA_REDIS_URL": ""})
    assert res.exit_code == 0, res.output
    assert "embedded" in res.output


@pytest.mark.real_redis
def test_the_demo_never_writes_into_a_redis_nobody_named(
        redis_url: str, client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Redis answering on the default address (a deployment's) keeps its keys."""
    monkeypatch.setattr("saga_store.ops.connection.DEFAULT_URL", redis_url)
    client.set("theirs", "untouched")
    before = sorted(client.keys("*"))  # theirs (and the test's ss:layout, if any)
    res = CliRunner().invoke(cli, ["demo"], env={"SAGA_REDIS_URL": ""})
    assert res.exit_code == 0, res.output
    assert "embedded" in res.output
    assert sorted(client.keys("*")) == before


@pytest.mark.real_redis
def test_demo_tells_the_order_story_with_real_workers(redis_url: str) -> None:
    """saga demo against a real Redis: worker processes, rollback, commit, verify (its
    time, 10 s at most, is measured by benchmarks/bench_demo.py, not here)."""
    import subprocess
    import sys
    env = {**__import__("os").environ, "SAGA_REDIS_URL": redis_url,
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run([sys.executable, "-m", "saga_store.cli.main", "demo"], env=env,
                         capture_output=True, timeout=60, check=False)
    text = out.stdout.decode()
    assert out.returncode == 0, out.stderr
    assert "with 2 worker processes" in text
    assert text.index("undo #1 charge_payment by refund_payment") < \
        text.index("undo #0 reserve_inventory by release_inventory")
    assert "is compensated" in text
    assert "is committed" in text
    assert "saga verify: intact" in text


@pytest.mark.real_redis
def test_doctor_reports_missing_persistence(client: redis.Redis, redis_url: str) -> None:
    """The suite's Redis has AOF on: 0. Turned off: 1, naming what to change."""
    res = run(redis_url, "doctor", "--json")
    assert res.exit_code == 0, res.output
    client.config_set("appendonly", "no")
    try:
        res = run(redis_url, "doctor")
        assert res.exit_code == 1
        assert "FIX  appendonly = no" in res.output
    finally:
        client.config_set("appendonly", "yes")


@pytest.mark.real_redis
def test_a_strict_worker_refuses_redis_without_aof(client: redis.Redis, redis_url: str) -> None:
    client.config_set("appendonly", "no")
    try:
        res = run(redis_url, "worker", "--tools", "tests.ledger_tools", "--strict", "--burst")
        assert res.exit_code == 3
        assert "appendonly=no" in res.output
    finally:
        client.config_set("appendonly", "yes")


def test_attention_lists_and_acknowledges(store: EventStore, client: redis.Redis, redis_url: str,
                                          ) -> None:
    """A saga that ended needing a person is listed until someone acknowledges it;
    the acknowledgement is kept with who and why."""
    w = store.open("agent-1")
    w.append("step_intent", step=0, tool="wire", idem_key="k" * 64,
             data={"args": {}, "reversibility": "irreversible"})
    w.append("step_started", step=0, attempt=1)
    w.append("step_succeeded", step=0, data={"result": {}})
    w.append("saga_failed", data={"reason": "later step failed"})
    w.append("step_not_compensable", step=0, data={"reason": "irreversible"})
    w.append("saga_needs_attention", data={"needs_attention": ["step 0 (wire)"]})
    client.sadd(store.keys.needs_attention(w.saga_id), w.saga_id)
    listed = orjson.loads(run(redis_url, "attention", "--json").output)
    assert [(r["saga_id"], r["needs_attention"]) for r in listed] == [
        (w.saga_id, ["step 0 (wire)"])]
    res = run(redis_url, "attention", "--ack", w.saga_id, "--by", "dana", "--note",
              "refunded by hand")
    assert res.exit_code == 0, res.output
    assert orjson.loads(run(redis_url, "attention", "--json").output) == []
    [(_, ack)] = client.xrange(keys.ATTENTION_ACKS)
    assert (ack[b"saga_id"].decode(), ack[b"by"], ack[b"note"]) == (
        w.saga_id, b"dana", b"refunded by hand")
    again = run(redis_url, "attention", "--ack", w.saga_id, "--by", "dana")
    assert again.exit_code == 2
    assert "not waiting for attention" in again.output


def test_tools_modules_are_found_in_the_current_folder(
        redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """'saga run --tools shop_tools' from the app's own folder, as 'python -m' would
    find it, with no PYTHONPATH set."""
    import sys
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    (tmp_path / "shop_tools.py").write_text(
        "from saga_store import tool, Reversibility\n\n"
        "@tool(reversibility=Reversibility.READONLY)\n"
        "def look(sku: str) -> dict:\n    return {'sku': sku}\n")
    (tmp_path / "plan.json").write_text(
        '{"agent_id": "a", "steps": [{"tool": "look", "args": {"sku": "X"}}]}')
    monkeypatch.chdir(tmp_path)
    res = run(redis_url, "run", "--tools", "shop_tools", "plan.json")
    assert res.exit_code == 0, res.output
    assert re.fullmatch(r"a_[0-9A-Z]{26}", res.output.strip())  # the new saga's id


def test_every_option_names_its_environment_variable_and_saga_has_a_version() -> None:
    """--help of every command shows each option's variable, as the README promises."""
    import click as _click
    from saga_store.cli.main import cli as group
    runner = CliRunner()
    for name, command in group.commands.items():
        text = " ".join(runner.invoke(group, [name, "--help"]).output.split())
        for param in command.params:
            if isinstance(param, _click.Option) and not param.hidden and not param.is_eager:
                assert param.show_envvar, f"saga {name} {param.opts[0]}"
        assert "env var:" in text or not [p for p in command.params
                                          if isinstance(p, _click.Option)], name
    version = runner.invoke(group, ["--version"])
    assert version.exit_code == 0
    assert version.output.startswith("saga, version ")
