"""A mistyped saga id is refused by every command and writes nothing; a saga stuck
on a compensation nobody can call is settled by a person and acknowledged."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from click.testing import CliRunner, Result
from prometheus_client import CollectorRegistry
from saga_store.cli.main import cli

from saga_store import keys
from saga_store.client.api import SagaStore
from saga_store.errors import InvalidInput
from saga_store.log.events import EventKind as K
from saga_store.ops.metrics import RedisCollector
from saga_store.protocol.state import Status
from saga_store.testing.workers import workers

from ..helpers import committed_saga
from ..ledger_tools import effects

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
TOOLS = "tests.ledger_tools"
MISSING = "01NOSUCHSAGA0000000000000X"
ENV = {"SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": "", "SAGA_OPERATOR": "ana"}


def run(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env={**ENV, "SAGA_REDIS_URL": url})


def snapshot(client: redis.Redis) -> dict[bytes, object]:
    """Every key with its type and size: what a refused command must leave as it was."""
    out: dict[bytes, object] = {}
    for k in client.keys("*"):
        kind = client.type(k)
        size = {b"stream": client.xlen, b"list": client.llen, b"zset": client.zcard,
                b"set": client.scard, b"hash": client.hlen}.get(kind, client.strlen)(k)
        out[k] = (kind, size)
    return out


@pytest.mark.parametrize("args", [
    ["abort", MISSING], ["resume", MISSING], ["resolve", MISSING, "0", "--note", "x"],
    ["approve", MISSING, "0"], ["deny", MISSING, "0", "--reason", "no"],
    ["attention", "--ack", MISSING], ["verify", "--saga", MISSING],
    ["export", "-", "--saga", MISSING], ["show", MISSING], ["context", "--saga", MISSING],
], ids=lambda a: a[0] if a[0] != "attention" else "attention-ack")
def test_a_mistyped_id_is_refused_and_writes_nothing(
        saga_store: SagaStore, client: redis.Redis, redis_url: str, args: list[str]) -> None:
    """exit 2, 'no such saga', not one key changed, and the log still verifies."""
    committed_saga(saga_store.events)
    saga_store.events.ledger.flush()
    before = snapshot(client)
    res = run(redis_url, *args)
    assert res.exit_code == 2, res.output
    assert f"no such saga {MISSING}" in res.output
    assert snapshot(client) == before
    assert run(redis_url, "verify").exit_code == 0


def test_verify_on_a_database_with_no_sagas_says_so(redis_url: str,
                                                    client: redis.Redis) -> None:
    res = run(redis_url, "verify")
    assert res.exit_code == 0
    assert "no sagas here yet" in res.output


def test_nothing_but_an_opening_creates_a_saga_log(saga_store: SagaStore,
                                                   client: redis.Redis) -> None:
    """Appending to a saga that does not exist is refused by the append script itself."""
    from saga_store.errors import NoSuchSaga
    from saga_store.log.stream import EMPTY
    with pytest.raises(NoSuchSaga):
        saga_store.events.log.append(MISSING, [{"v": 1, "saga_id": MISSING, "seq": 0,
                                              "kind": K.SAGA_FAILED, "ts": 1}], EMPTY)
    with pytest.raises(NoSuchSaga):
        saga_store.events.writer(MISSING)
    assert client.exists(saga_store.events.keys.log(MISSING)) == 0


def stuck_gauge(client: redis.Redis) -> float:
    reg = CollectorRegistry()
    reg.register(RedisCollector(client))
    return reg.get_sample_value("saga_sagas", {"state": "stuck"}) or 0.0


def test_a_saga_stuck_on_a_bad_mapping_is_resolved_by_a_person_and_acknowledged(
        saga_store: SagaStore, client: redis.Redis, worker_env: dict[str, str],
        redis_url: str, ledger: Path) -> None:
    """The compensation maps a field the tool never returned: stuck; resume is stuck
    again, abort and ack refuse; 'saga resolve' records the person's fix, the unwind
    finishes, the saga needs attention, the ack closes it, the gauge drops to 0."""
    sid = saga_store.submit([
        {"tool": "reserve_inventory", "args": {"sku": "A", "qty": 1}},
        {"tool": "reserve_forgetful", "args": {"sku": "B"}},
        {"tool": "fail_always", "args": {}}], agent_id="agent-r")
    with workers(worker_env, TOOLS):
        state = saga_store.wait(sid, timeout=60)
        assert state.status is Status.STUCK
        assert "saga resolve" in state.reason["hint"]
        assert stuck_gauge(client) == 1
        assert run(redis_url, "resume", sid).exit_code == 0
        assert saga_store.wait(sid, timeout=60).status is Status.STUCK  # the same again
        assert run(redis_url, "abort", sid).exit_code == 2
        assert run(redis_url, "attention", "--ack", sid).exit_code == 2
        assert run(redis_url, "resolve", sid, "2", "--note", "x").exit_code == 2  # not it
        res = run(redis_url, "resolve", sid, "1", "--note", "released B by hand")
        assert res.exit_code == 0, res.output
        state = saga_store.wait(sid, timeout=60)
    assert state.status is Status.NEEDS_ATTENTION
    assert state.steps[1].resolved_by == {"by": "ana", "note": "released B by hand",
                                          "at_ms": state.steps[1].resolved_by["at_ms"]}
    assert state.steps[0].compensation == "succeeded"  # the unwind went on past it
    from saga_store.client.context import rebuild_history
    note = rebuild_history([state], "plain")[0]["note"]
    assert "reserve_forgetful was undone by hand by ana (released B by hand)" in note
    assert "waiting for a person's attention" in note
    assert len(effects("release")) == 1
    assert stuck_gauge(client) == 0
    assert run(redis_url, "attention", "--ack", sid, "--note", "checked").exit_code == 0
    assert not client.sismember(saga_store.events.keys.needs_attention(sid), sid)
    assert run(redis_url, "verify").exit_code == 0


@pytest.mark.parametrize("sid", ["order.1", "a/b", "me@x", "a+b", "k=v", "ünï"])
def test_a_saga_id_rq_would_refuse_is_refused_before_anything_is_written(
        saga_store: SagaStore, client: redis.Redis, sid: str) -> None:
    """RQ refuses job ids with . / @ + = (a worker building one would die); a saga id
    is checked against that rule before a key is written."""
    from saga_store import InvalidInput
    before = snapshot(client)
    with pytest.raises(InvalidInput, match="a saga id takes only letters, digits"):
        saga_store.submit([{"tool": "noop", "args": {}}], agent_id="a", saga_id=sid)
    with pytest.raises(InvalidInput, match="a saga id takes only letters, digits"):
        saga_store.saga(agent_id="a", saga_id=sid)
    assert snapshot(client) == before


def test_an_empty_saga_id_is_a_usage_error_not_an_all_clear(
        saga_store: SagaStore, client: redis.Redis, redis_url: str) -> None:
    """'saga verify --saga \"$SID\"' with an empty variable must not verify nothing."""
    w = committed_saga(saga_store.events)
    log = saga_store.events.keys.log(w.saga_id)
    client.xdel(log, client.xrange(log)[3][0])
    assert run(redis_url, "verify").exit_code == 1
    res = run(redis_url, "verify", "--saga", "")
    assert res.exit_code == 2, res.output


def test_an_ack_needs_the_log_to_say_the_saga_needs_attention(
        saga_store: SagaStore, client: redis.Redis, redis_url: str) -> None:
    """The attention set is an index: listed without a needs_attention close (a
    compensator killed between the two), an ack is refused, not recorded and lost."""
    w = committed_saga(saga_store.events)
    client.sadd(saga_store.events.keys.needs_attention(w.saga_id), w.saga_id)
    res = run(redis_url, "attention", "--ack", w.saga_id)
    assert res.exit_code == 2
    assert "is committed, not waiting for attention" in res.output
    assert client.xlen(keys.ATTENTION_ACKS) == 0


def test_two_people_resolving_at_once_cannot_both_act(
        saga_store: SagaStore, worker_env: dict[str, str], ledger: Path) -> None:
    """Each decides on the state its append is checked against: the one who loses the
    race is refused, and the log keeps one resolution."""
    from saga_store.errors import ConflictError
    from saga_store.protocol import build
    sid = saga_store.submit([{"tool": "reserve_forgetful", "args": {"sku": "B"}},
                             {"tool": "fail_always", "args": {}}], agent_id="agent-r")
    with workers(worker_env, TOOLS):
        assert saga_store.wait(sid, timeout=60).status is Status.STUCK
    state, writer = saga_store.events.read_for_write(sid)  # bob reads ...
    saga_store.resolve(sid, 0, by="alice", note="released by hand")  # ... alice acts
    with pytest.raises(ConflictError):  # bob's append, decided on what he read
        writer.append_many([build.compensation_resolved(0, "bob", "me too", 1),
                            build.saga_resumed(state.reason)])
    with pytest.raises(InvalidInput):  # bob again, the way the command does it
        saga_store.resolve(sid, 0, by="bob", note="me too")
    kinds = [e["kind"] for e in saga_store.events.log.events(sid)]
    assert kinds.count(K.COMPENSATION_RESOLVED) == 1
