"""Anthropic SDK adapter, with the SDK's client on an httpx MockTransport that
plays a scripted model, a private Redis and real worker processes: the raw
tool_use loop and the beta tool runner, the order story unwinding exactly
once, the next request already saying so, and an approval-gated call."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

anthropic = pytest.importorskip("anthropic", reason="the anthropic extra is not installed: "
                                                    "pip install 'saga-store[anthropic]'")

import orjson  # noqa: E402  # after importorskip: skips cleanly without the extra

# E402: after importorskip: skips cleanly without the extra
from saga_store import SagaStore, Status  # noqa: E402

# E402: after importorskip: skips cleanly without the extra
from saga_store.client.context import rebuild_history  # noqa: E402

# E402: after importorskip: skips cleanly without the extra
from saga_store.integrations.anthropic import (  # noqa: E402
    SagaSession,
    anthropic_tools,
    rebuild,
    run_tool_uses,
)

# E402: after importorskip: skips cleanly without the extra
from saga_store.log.events import EventKind as K  # noqa: E402

# E402: after importorskip: skips cleanly without the extra
# E402: after importorskip: skips cleanly without the extra
from ..integration_support import (  # noqa: E402
    CHARGE,
    CRM_FAILS,
    INVOICE,
    RESERVE,
    assert_order_unwound,
    assert_verified,
    decisions,
    final,
)

# E402: after importorskip: skips cleanly without the extra
from ..ledger_tools import effects  # noqa: E402

try:  # the SDK's HTTP layer: httpx2 in its newer releases, httpx before
    import httpx2 as httpx
except ImportError:
    import httpx  # type: ignore[no-redef]  # whichever httpx the SDK uses
pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
_ids = itertools.count(1)


def tool_use(tool: tuple[str, dict[str, Any]], use_id: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": use_id, "name": tool[0], "input": tool[1]}


def reply(*blocks: dict[str, Any]) -> dict[str, Any]:
    uses = any(b["type"] == "tool_use" for b in blocks)
    return {"id": f"msg_{next(_ids)}", "type": "message", "role": "assistant",
            "model": "claude-scripted", "content": list(blocks),
            "stop_reason": "tool_use" if uses else "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 5}}


def say(text: str) -> dict[str, Any]:
    return reply({"type": "text", "text": text})


class Scripted:
    """The Messages API, scripted: one reply per request, and every request body."""

    def __init__(self, *replies: dict[str, Any]) -> None:
        self.replies, self.requests = list(replies), []  # type: list[Any], list[Any]

    def __call__(self, request: Any) -> Any:
        self.requests.append(orjson.loads(request.content))
        return httpx.Response(200, json=self.replies.pop(0))

    def client(self) -> Any:
        return anthropic.Anthropic(api_key="offline", max_retries=0, http_client=httpx.Client(
            transport=httpx.MockTransport(self)))


def results(body: dict[str, Any]) -> dict[str, Any]:
    """The tool_result blocks a request sent, by tool_use id."""
    return {b["tool_use_id"]: b for m in body["messages"] if m["role"] == "user"
            and isinstance(m["content"], list) for b in m["content"]
            if b.get("type") == "tool_result"}


def loop(api: Any, saga: Any, messages: list[Any], **kwargs: Any) -> Any:
    tools = anthropic_tools(saga)
    while True:
        msg = api.messages.create(model="claude-scripted", max_tokens=512, tools=tools,
                                  messages=messages)
        messages.append({"role": "assistant",
                         "content": [b.model_dump(exclude_none=True) for b in msg.content]})
        if msg.stop_reason != "tool_use":
            return msg
        messages.append({"role": "user",
                         "content": run_tool_uses(saga, msg, messages=messages, **kwargs)})


def test_the_raw_loop_unwinds_the_order_and_the_next_request_says_so(
        store: SagaStore, running: None) -> None:
    api = Scripted(reply(tool_use(RESERVE, "toolu_1")), reply(tool_use(CHARGE, "toolu_2")),
                   reply(tool_use(CRM_FAILS, "toolu_3")), say("The order was rolled back."))
    messages: list[Any] = [{"role": "user", "content": "Order a laptop for ana"}]
    with store.saga(agent_id="shop") as saga:
        last = loop(api.client(), saga, messages)
        sid = saga.saga_id
    assert last.content[0].text == "The order was rolled back."
    assert_order_unwound()
    state = final(store, sid)
    assert state.status is Status.COMPENSATED
    assert {t["name"] for t in api.requests[0]["tools"]} == {
        "reserve_inventory", "charge_payment", "get_stock", "update_crm", "send_invoice"}
    assert "payment confirmed" in results(api.requests[2])["toolu_2"]["content"]
    seen = results(api.requests[3])  # the request right after the failure
    assert seen["toolu_1"]["content"].startswith("rolled back:")
    assert seen["toolu_2"]["content"].startswith("rolled back:")
    assert seen["toolu_3"]["is_error"] is True
    assert "CRM unavailable" in seen["toolu_3"]["content"]
    assert "Rolled back, latest first: charge_payment" in seen["toolu_3"]["content"]
    # a later turn: rebuild gives rebuild_history's texts and note; the API takes it
    history = rebuild(messages, [state])
    ours = rebuild_history([state], "anthropic")
    assert {k: v["content"] for k, v in results({"messages": history}).items()} == \
        {b["tool_use_id"]: b["content"] for m in ours if m["role"] == "user"
         for b in m["content"] if b["type"] == "tool_result"}
    note = ours[-1]["content"][-1]
    assert note["type"] == "text"
    assert note in history[-2]["content"]
    assert rebuild(history, [state]) == history
    nxt = Scripted(say("Nothing was charged."))
    nxt.client().messages.create(model="claude-scripted", max_tokens=64, messages=[
        *history, {"role": "user", "content": "Was I charged?"}])
    assert results(nxt.requests[0])["toolu_2"]["content"].startswith("rolled back:")
    assert_verified(store)


def test_an_invalid_call_is_an_error_result_to_repair(store: SagaStore, running: None) -> None:
    api = Scripted(reply(tool_use(("reserve_inventory", {"sku": "L", "qty": "many"}), "toolu_b")),
                   reply(tool_use(RESERVE, "toolu_ok")), say("Reserved."))
    with store.saga(agent_id="shop") as saga:
        loop(api.client(), saga, [{"role": "user", "content": "Reserve"}])
        sid = saga.saga_id
    bad = results(api.requests[1])["toolu_b"]
    assert bad["is_error"] is True
    assert "invalid arguments" in bad["content"]
    assert final(store, sid).status is Status.COMMITTED
    assert [k for k, _, _ in effects()] == ["reserve"]


def test_a_gated_call_is_approved_and_recorded(store: SagaStore, running: None) -> None:
    api = Scripted(reply(tool_use(INVOICE, "toolu_inv")), say("Sent."))
    asked: list[dict[str, Any]] = []

    def approve(preview: dict[str, Any]) -> dict[str, Any]:
        asked.append(preview)
        return {"approved": True, "by": "alice"}

    with store.saga(agent_id="shop") as saga:
        loop(api.client(), saga, [{"role": "user", "content": "Invoice ana"}], approve=approve)
        sid = saga.saga_id
    assert [(a["tool"], a["tool_use_id"]) for a in asked] == [("send_invoice", "toolu_inv")]
    assert decisions(store, sid) == [(K.APPROVAL_GRANTED, 0, "alice")]
    assert len(effects("invoice")) == 1
    assert final(store, sid).status is Status.COMMITTED


# the runner warns that it holds no runnable tool for a call: by design, the saga runs it
@pytest.mark.filterwarnings("ignore:Tool '.*' not found in tool runner:UserWarning")
def test_the_beta_tool_runner_takes_the_results(store: SagaStore, running: None) -> None:
    api = Scripted(reply(tool_use(RESERVE, "toolu_1")), reply(tool_use(CRM_FAILS, "toolu_2")),
                   say("Rolled back."))
    with store.saga(agent_id="shop") as saga:
        runner = api.client().beta.messages.tool_runner(
            model="claude-scripted", max_tokens=512, tools=anthropic_tools(saga),
            messages=[{"role": "user", "content": "Reserve and note it"}])
        for msg in runner:
            blocks = run_tool_uses(saga, msg)
            if blocks:
                runner.append_messages({"role": "user", "content": blocks})
            if any(b.get("is_error") for b in blocks):
                states = [store.state(saga.saga_id)]
                runner.set_messages_params(lambda p, states=states: {
                    **p, "messages": rebuild(p["messages"], states)})
        sid = saga.saga_id
    assert len(api.requests) == 3
    seen = results(api.requests[2])
    assert seen["toolu_2"]["content"] == "error: RuntimeError: CRM unavailable (503)"
    assert seen["toolu_1"]["content"].startswith("rolled back:")
    last_turn = api.requests[2]["messages"][-1]["content"]
    assert "reserve_inventory was undone" in last_turn[-1]["text"]
    assert final(store, sid).status is Status.COMPENSATED
    assert [k for k, _, _ in effects()] == ["reserve", "release"]


def test_one_reply_with_several_calls_says_which_were_rolled_back(
        store: SagaStore, running: None) -> None:
    """Reserve, charge and a failing call in one assistant turn: every result of
    that turn says what is true now, not only the failed call's."""
    api = Scripted(reply(tool_use(RESERVE, "toolu_1"), tool_use(CHARGE, "toolu_2"),
                         tool_use(CRM_FAILS, "toolu_3"), tool_use(RESERVE, "toolu_4")),
                   say("Rolled back."))
    with store.saga(agent_id="shop") as saga:
        loop(api.client(), saga, [{"role": "user", "content": "Order"}])
        sid = saga.saga_id
    seen = results(api.requests[1])
    assert seen["toolu_1"]["content"].startswith("rolled back:")
    assert seen["toolu_2"]["content"].startswith("rolled back:")
    assert "refund" in seen["toolu_2"]["content"]
    assert "CRM unavailable" in seen["toolu_3"]["content"]
    assert seen["toolu_4"]["is_error"] is True  # after the failure: not run, and says so
    assert "was not run" in seen["toolu_4"]["content"]
    assert final(store, sid).status is Status.COMPENSATED
    assert_order_unwound()


def test_rebuild_answers_the_call_in_flight_and_the_sdk_takes_it(
        store: SagaStore, running: None) -> None:
    """A history saved before the in-flight call's result: rebuild gives every
    tool_use its tool_result from the log (a call no saga logged says it never ran),
    and the SDK's own types and client take the result."""
    from pydantic import TypeAdapter

    from saga_store import StepError
    with store.saga(agent_id="shop") as saga:
        saga.call(*RESERVE, tool_call_id="toolu_1")
        with pytest.raises(StepError):
            saga.call(*CRM_FAILS, tool_call_id="toolu_2")
        sid = saga.saga_id
    state = final(store, sid)
    saved = [{"role": "user", "content": "Order"},
             {"role": "assistant", "content": [tool_use(RESERVE, "toolu_1")]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                           "content": '{"reservation_id": "r-1"}'}]},
             {"role": "assistant", "content": [tool_use(CRM_FAILS, "toolu_2"),
                                               tool_use(RESERVE, "toolu_9")]}]
    fixed = rebuild(saved, [state])
    TypeAdapter(list[anthropic.types.MessageParam]).validate_python(fixed)
    seen = results({"messages": fixed})
    assert seen["toolu_1"]["content"].startswith("rolled back:")
    assert seen["toolu_2"]["is_error"] is True
    assert "CRM unavailable" in seen["toolu_2"]["content"]
    assert seen["toolu_9"]["content"].startswith("not run: no saga logged this call")
    assert fixed[-1]["role"] == "user"
    assert [b["type"] for b in fixed[-1]["content"]] == ["tool_result", "tool_result", "text"]
    assert rebuild(fixed, [state]) == fixed
    nxt = Scripted(say("Nothing is booked."))
    nxt.client().messages.create(model="claude-scripted", max_tokens=64, messages=fixed)
    assert results(nxt.requests[0]).keys() == {"toolu_1", "toolu_2", "toolu_9"}


def test_after_a_rollback_the_loop_goes_on_in_a_new_saga(
        store: SagaStore, running: None) -> None:
    """``on_rollback="new_saga"`` in the raw tool_use loop: the call after the
    rollback opens the next saga, and the history still says the first one's calls
    were rolled back."""
    api = Scripted(reply(tool_use(RESERVE, "toolu_1")), reply(tool_use(CRM_FAILS, "toolu_2")),
                   reply(tool_use(RESERVE, "toolu_3")), say("Reserved again."))
    messages: list[Any] = [{"role": "user", "content": "Reserve a laptop"}]
    with SagaSession(store, "shop", conversation_id="c-new", on_rollback="new_saga") as s:
        last = loop(api.client(), s, messages)
    assert last.content[0].text == "Reserved again."
    first, second = s.sagas[0], s.sagas[-1]
    assert first != second
    assert final(store, first).status is Status.COMPENSATED
    assert final(store, second).status is Status.COMMITTED  # committed on exit
    assert [k for k, _, _ in effects()] == ["reserve", "release", "reserve"]
    seen = results(api.requests[-1])
    assert seen["toolu_1"]["content"].startswith("rolled back:")
    assert f"Saga {first} is compensated" in seen["toolu_2"]["content"]
    assert "reservation_id" in seen["toolu_3"]["content"]
