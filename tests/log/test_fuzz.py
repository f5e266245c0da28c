"""Fuzzed input: whatever arrives, the answer is a clear, typed error or a
success, and a refusal writes nothing."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from saga_store.cli.main import cli

from saga_store import InvalidInput, Registry, SagaAborted, SagaStore, Settings
from saga_store.errors import CannotVerify
from saga_store.log.chain import Chain
from saga_store.ops.connection import embedded
from saga_store.verify.export import verify_file

pytestmark = pytest.mark.parity
FAST = settings(max_examples=120, deadline=None,
                suppress_health_check=[HealthCheck.too_slow,
                                       HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**60, 2**60) |
    st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)


def _store() -> SagaStore:
    return SagaStore(embedded(), Registry.from_modules("tests.ledger_tools"), Settings())


@FAST
@given(tool=st.sampled_from(["reserve_inventory", "charge_payment", "noop", "nope", ""]),
       args=json_values)
def test_fuzzed_tool_arguments_are_refused_cleanly(tool: str, args: Any) -> None:
    """Random arguments: accepted only if they fit; otherwise a typed error and no write."""
    store = _store()
    saga = store.saga(agent_id="fuzz")
    before = store.redis.dbsize()
    try:
        spec = store.registry.get(tool)
        spec.validate({} if args is None else args)  # call() reads None as "no arguments"
    except InvalidInput:
        refused = True
    else:
        refused = False
    if refused:
        with pytest.raises((InvalidInput, SagaAborted), match=r"\w"):  # says something
            saga.call(tool, args)
        assert store.redis.dbsize() == before  # the first invalid call writes nothing


@FAST
@given(plan=json_values)
def test_fuzzed_plans_are_refused_cleanly(plan: Any) -> None:
    store = _store()
    before = store.redis.dbsize()
    steps = plan.get("steps") if isinstance(plan, dict) else plan
    error: InvalidInput | None = None
    try:
        store.submit(steps if isinstance(steps, list) else [steps], agent_id="fuzz")
    except InvalidInput as exc:
        error = exc
    if error is not None:
        assert str(error)
        assert store.redis.dbsize() == before


@FAST
@given(doc=json_values)
def test_fuzzed_plan_files_exit_2_and_write_nothing(tmp_path: Path, doc: Any) -> None:
    path = tmp_path / "plan.json"
    path.write_bytes(orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
                     if not isinstance(doc, float) else b"1e999")
    res = CliRunner().invoke(cli, ["run", "--tools", "tests.ledger_tools", str(path)],
                             env={"SAGA_REDIS_URL": "redis://127.0.0.1:1/0"})
    # a plan that does not parse never reaches Redis (which is unreachable here: 3)
    assert res.exit_code in (2, 3), res.output
    if res.exit_code == 2:
        assert "error:" in res.output


@FAST
@given(lines=st.lists(st.binary(max_size=200) | json_values.map(orjson.dumps), max_size=6))
def test_fuzzed_exports_never_crash_the_verifier(tmp_path: Path, lines: list[bytes]) -> None:
    path = tmp_path / "x.jsonl"
    header = orjson.dumps({"export": "saga-store", "v": 1, "mode": "sha256"})
    path.write_bytes(b"\n".join([header, *(x.replace(b"\n", b" ") for x in lines)]) + b"\n")
    try:
        result = verify_file(path, Chain(None))
    except (InvalidInput, CannotVerify):
        return
    if any(x.strip() for x in lines):
        assert not result.ok or all(c.events == 0 for c in result.chains)


@pytest.mark.real_redis
def test_a_worker_survives_garbage_in_a_log(client: redis.Redis, worker_env: dict[str, str],
                                            ledger: Path) -> None:
    """A step job whose log entry is garbage is logged and dropped; the worker runs on."""
    from saga_store.execution import jobs
    from saga_store.execution.enqueue import enqueue_step
    from saga_store.testing import assert_eventually
    from saga_store.testing.workers import workers
    store = SagaStore(client, Registry.from_modules("tests.ledger_tools"), Settings())
    junk = store.events.keys.log("junk")
    client.xadd(junk, {"b": b"\xff not json", "h": b"x"}, id="0-1")
    client.xadd(junk, {"b": b"{}", "h": b"x"}, id="0-2")
    enqueue_step(client, jobs.STEP_QUEUE, "junk", 0, 1, "0" * 64)
    with workers(worker_env, "tests.ledger_tools"):
        assert_eventually(lambda: client.llen(jobs.queue_key(jobs.STEP_QUEUE)) == 0,
                          timeout=30, what="the junk job to be consumed")
        sid = store.submit([{"tool": "noop", "args": {"n": 1}}], agent_id="after-junk")
        assert str(store.wait(sid, timeout=30).status) == "committed"


entry_fields = st.dictionaries(
    st.sampled_from([b"b", b"h", b"x"]),
    st.binary(max_size=64) | json_values.map(orjson.dumps),
    min_size=1, max_size=3)


@FAST
@given(entries=st.lists(entry_fields, min_size=1, max_size=4), valid_first=st.booleans())
def test_fuzzed_log_entries_read_back_from_redis(entries: list[dict[bytes, bytes]],
                                                 valid_first: bool) -> None:
    """Garbage stream entries (as someone with write access could leave them): the
    verifier names a broken chain, reading state raises a typed error, nothing
    crashes and nothing is written."""
    from saga_store import SagaError
    from saga_store.verify.checker import Verifier
    store = _store()
    r = store.redis
    sid = "fuzzed"
    if valid_first:
        sid = store.submit([{"tool": "noop", "args": {"n": 1}}], agent_id="fuzz")
    start = store.events.log.head(sid).seq + 2
    log = store.events.keys.log(sid)
    for i, fields in enumerate(entries):
        r.xadd(log, fields, id=f"0-{start + i}")
    before = r.xlen(log)
    result = Verifier(store.events.log).verify(saga_id=sid)
    assert not result.ok
    bad = [c for c in result.chains if not c.ok]
    assert bad[0].reason, "a broken chain must name its reason"
    with contextlib.suppress(SagaError):  # a typed error is the right answer
        store.state(sid)
    assert r.xlen(log) == before
