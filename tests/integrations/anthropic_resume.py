"""An Anthropic tool_use loop run in a process of its own, for the crash tests: the
order story against a scripted Messages API, its history saved as JSON after every
turn (the application's own persistence) and a SagaSession; started fresh
(``first``) or resumed from the saved history (``resume``); it writes what the
model was shown to a JSON file. ``gated`` reserves, then asks for the gated
invoice, which waits for a person (``approve`` answers None) and the process
ends; ``approve`` loads the saved history, hours later, and alice grants it.

    python -m tests.integrations.anthropic_resume DIR first|resume|gated|approve OUT TEXT
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anthropic
import orjson

from saga_store import Registry, SagaStore, Settings
from saga_store.integrations.anthropic import SagaSession, anthropic_tools, run_tool_uses

from ..integration_support import CHARGE, INVOICE, RESERVE, TOOLS

try:  # the SDK's HTTP layer: httpx2 in its newer releases, httpx before
    import httpx2 as httpx
except ImportError:
    import httpx  # type: ignore[no-redef]  # whichever httpx the SDK uses


def reply(content: list[dict[str, Any]]) -> dict[str, Any]:
    uses = any(b["type"] == "tool_use" for b in content)
    return {"id": "msg_x", "type": "message", "role": "assistant", "model": "scripted",
            "content": content, "stop_reason": "tool_use" if uses else "end_turn",
            "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}


def use(tool: tuple[str, dict[str, Any]], use_id: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": use_id, "name": tool[0], "input": tool[1]}


def seen(messages: list[Any]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        content = m["content"] if isinstance(m["content"], list) else \
            [{"type": "text", "text": m["content"]}]
        for b in content:
            if b.get("type") == "tool_result":
                out.append({"type": "ToolMessage", "tool_call_id": b["tool_use_id"],
                            "content": b["content"]})
            elif b.get("type") == "text" and m["role"] == "user":
                out.append({"type": "SystemMessage" if b["text"].startswith("Saga ")
                            else "HumanMessage", "tool_call_id": None, "content": b["text"]})
    return out


def main(workdir: str, mode: str, out: str, final_text: str) -> None:
    saved = Path(workdir) / "messages.json"
    second = use(INVOICE, "toolu_inv") if mode == "gated" else use(CHARGE, "toolu_2")
    turns = [reply([use(RESERVE, "toolu_1")]), reply([second])] \
        if mode in ("first", "gated") else []
    decide = {"gated": lambda preview: None,  # a person decides later
              "approve": lambda preview: {"approved": True, "by": "alice"}}.get(mode)
    replies = [*turns, reply([{"type": "text", "text": final_text}])]
    received: list[list[dict[str, Any]]] = []

    def api(request: Any) -> Any:
        received.append(seen(orjson.loads(request.content)["messages"]))
        return httpx.Response(200, json=replies.pop(0))

    client = anthropic.Anthropic(api_key="offline", max_retries=0, http_client=httpx.Client(
        transport=httpx.MockTransport(api)))
    store = SagaStore.from_url(os.environ["SAGA_REDIS_URL"], Registry.from_modules(TOOLS),
                               Settings.from_env())
    messages: list[Any] = [{"role": "user", "content": "Order a laptop"}] \
        if mode in ("first", "gated") else json.loads(saved.read_text())
    with SagaSession(store, "shop", conversation_id="order-1") as session:
        tools = anthropic_tools(session)
        while True:
            last = messages[-1]
            if last["role"] == "user":
                msg = client.messages.create(model="scripted", max_tokens=64, tools=tools,
                                             messages=messages)
                last = {"role": "assistant",
                        "content": [b.model_dump(exclude_none=True) for b in msg.content]}
                messages.append(last)
                saved.write_text(json.dumps(messages))
            if not any(b.get("type") == "tool_use" for b in last["content"]):
                break
            results = run_tool_uses(session, last, messages=messages, approve=decide)
            if session.parked:  # the saved history ends with the reply that waits
                break
            messages.append({"role": "user", "content": results})
            saved.write_text(json.dumps(messages))
        sagas, parked = session.sagas, sorted(session.parked)
    with open(out, "w") as f:
        json.dump({"received": received, "sagas": sagas, "parked": parked,
                   "last": messages[-1]["content"][0].get("text")}, f)


if __name__ == "__main__":
    main(*sys.argv[1:5])
