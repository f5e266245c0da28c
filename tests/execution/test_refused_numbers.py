"""Numbers JSON readers disagree on, and nesting past the limit, are refused on
every way into a saga (submit, submit_many, Saga.call, AsyncSaga.call) with
InvalidInput naming the field, and nothing is written; a tool's result that is
not plain JSON fails its step with the reason, never stored coerced."""

from __future__ import annotations

import asyncio
import math
import re
from typing import Any

import pytest
import redis
from saga_store.workers.invoke import Invoker

from saga_store import Registry, SagaStore, Settings
from saga_store.errors import InvalidInput, InvalidToolCall
from saga_store.protocol.vocab import OutcomeKind
from saga_store.tools.spec import StepContext

from ..number_tools import deep

pytestmark = pytest.mark.real_redis
REFUSED = [
    ("keep", {"value": math.nan}, "arguments.value: nan is not allowed"),
    ("keep", {"value": math.inf}, "arguments.value: inf is not allowed"),
    ("keep", {"value": -math.inf}, "arguments.value: -inf is not allowed"),
    ("keep", {"extra": {"score": math.nan}}, "arguments.extra.score: nan is not allowed"),
    ("keep", {"value": 2**64}, "arguments.value: integer 18446744073709551616 is beyond 2^53"),
    ("keep", {"value": -(2**53) - 1}, "is beyond 2^53"),
    ("measure", {"ratio": 2**64}, "arguments.ratio: integer 18446744073709551616"),
    ("measure", {"ratio": "inf"}, "arguments.ratio: inf is not allowed"),
    ("keep", {"value": deep(33)}, "nested deeper than 32 levels"),
    ("keep", {"value": deep(10_000)}, "nested deeper than 32 levels"),
]
IDS = ["nan", "inf", "-inf", "nan-in-dict", "2^64", "-2^53-1", "2^64-as-float", "inf-as-str",
       "depth-33", "depth-10000"]


@pytest.fixture
def store(client: redis.Redis) -> SagaStore:
    return SagaStore(client, Registry.from_modules("tests.number_tools"), Settings(),
                     invalid_call_limit=100)


@pytest.mark.parametrize(("tool", "args", "message"), REFUSED, ids=IDS)
def test_submit_refuses_and_writes_nothing(store: SagaStore, client: redis.Redis, tool: str,
                                           args: dict[str, Any], message: str) -> None:
    before = client.dbsize()
    with pytest.raises(InvalidInput, match=rf"steps\[0\]: .*{re.escape(message)}"):
        store.submit([{"tool": tool, "args": args}], agent_id="agent-n")
    assert client.dbsize() == before


def test_submit_many_refuses_every_plan_for_one_bad_number(store: SagaStore,
                                                           client: redis.Redis) -> None:
    before = client.dbsize()
    good = [{"tool": "keep", "args": {"value": 1.5}}]
    with pytest.raises(InvalidInput, match=r"plans\[1\]: steps\[0\]: .*arguments.value"):
        store.submit_many([good, [{"tool": "keep", "args": {"value": math.nan}}]],
                          agent_id="agent-n")
    assert client.dbsize() == before


@pytest.mark.parametrize(("tool", "args", "message"), REFUSED, ids=IDS)
def test_a_call_is_refused_for_the_agent_to_repair_and_writes_nothing(
        store: SagaStore, client: redis.Redis, tool: str, args: dict[str, Any],
        message: str) -> None:
    saga = store.saga(agent_id="agent-n")
    before = client.dbsize(), store.events.log.head(saga.saga_id)
    with pytest.raises(InvalidToolCall, match=re.escape(message)) as refused:
        saga.call(tool, args)
    assert refused.value.errors[0]["loc"][0].startswith("arguments.")
    assert (client.dbsize(), store.events.log.head(saga.saga_id)) == before


def test_an_async_call_is_refused_the_same_way(store: SagaStore, client: redis.Redis) -> None:
    async def go() -> tuple[Any, Any]:
        async with store.asaga(agent_id="agent-n") as saga:
            before = client.dbsize(), store.events.log.head(saga.saga_id)
            for args in ({"value": deep(10_000)}, {"extra": {"x": [math.inf]}}):
                with pytest.raises(InvalidToolCall, match=r"arguments\.(value|extra)"):
                    await saga.call("keep", args)
            return before, (client.dbsize(), store.events.log.head(saga.saga_id))
    before, after = asyncio.run(go())
    assert after == before


def test_plain_numbers_within_range_still_pass(store: SagaStore) -> None:
    """The limits are inclusive: 2^53, the largest float and 32 levels go through."""
    spec = store.registry.get("keep")
    args = {"value": [2**53, -(2**53), 1.7976931348623157e308], "extra": {"d": deep(31)}}
    assert spec.validate(args) == args


@pytest.mark.parametrize(("tool", "message"), [
    ("returns_nan", "result.score: nan is not allowed"),
    ("returns_huge", "result.id: integer 18446744073709551616 is beyond 2^53"),
    ("returns_deep_model", "result: Maximum serialization depth exceeded"),
], ids=["nan", "2^64", "deep-model"])
def test_a_result_that_is_not_plain_json_puts_the_step_in_doubt_with_the_reason(
        store: SagaStore, tool: str, message: str) -> None:
    """The tool ran, so its step has an outcome: in doubt (its effect is assumed to
    stand, so the unwind deals with it), never a crash that would run it again."""
    ctx = StepContext("k" * 64, "S1", 0, 1)
    outcome = Invoker().invoke(store.registry.get(tool), {}, ctx)
    assert outcome.kind is OutcomeKind.IN_DOUBT
    assert outcome.error is not None
    assert message in outcome.error
    assert outcome.result is None

