"""A raw Anthropic tool_use loop whose calls are a saga: ``make example-anthropic``.

Offline the client talks to a scripted Messages API (an httpx MockTransport)
that makes the order story's calls (reserve, charge, a CRM call that hangs).
With ``ANTHROPIC_API_KEY`` set it talks to the real API (``SAGA_EXAMPLE_MODEL``,
default claude-sonnet-4-5).
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import anthropic
import orjson

from saga_store.integrations.anthropic import (
    SagaSession,
    anthropic_tools,
    rebuild,
    run_tool_uses,
)

from .agent_runtime import (
    ORDER,
    PROMPT,
    conversation,
    heading,
    real_model,
    saga_store,
    show,
    wrapped,
)

try:  # the SDK's HTTP layer: httpx2 in its newer releases, httpx before
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx  # type: ignore[no-redef]  # whichever httpx the SDK uses


def scripted_client() -> anthropic.Anthropic:
    ids = itertools.count(1)
    turns = iter(ORDER)

    def api(request: Any) -> Any:
        body = orjson.loads(request.content)
        step = next(turns, None)
        if step is not None:
            tool, args, call_id = step
            content = [{"type": "tool_use", "id": call_id, "name": tool, "input": args}]
        else:
            heading("what the model is shown after the CRM call")
            for m in body["messages"]:
                for b in m["content"] if isinstance(m["content"], list) else []:
                    if b.get("type") == "tool_result":
                        print(wrapped(b['content']))
            content = [{"type": "text", "text": "I could not place the order: the earlier "
                                                "steps were rolled back."}]
        return httpx.Response(200, json={
            "id": f"msg_{next(ids)}", "type": "message", "role": "assistant",
            "model": body["model"], "content": content, "stop_sequence": None,
            "stop_reason": "tool_use" if step is not None else "end_turn",
            "usage": {"input_tokens": 0, "output_tokens": 0}})

    return anthropic.Anthropic(api_key="offline", http_client=httpx.Client(
        transport=httpx.MockTransport(api)))


def main() -> None:
    live = real_model("ANTHROPIC_API_KEY")
    client = anthropic.Anthropic() if live else scripted_client()
    model = os.environ.get("SAGA_EXAMPLE_MODEL", "claude-sonnet-4-5")
    print(f"Anthropic SDK, {'model ' + model if live else 'scripted API'}, ", end="")
    with saga_store() as store:
        messages: list[Any] = [{"role": "user", "content": PROMPT}]
        # the session opens the saga at the model's first call, named after it
        with SagaSession(store, "shop-agent", conversation_id=conversation()) as session:
            tools: Any = anthropic_tools(session)  # ToolParam dicts
            while True:
                reply = client.messages.create(model=model, max_tokens=1024, tools=tools,
                                               messages=messages)
                messages.append({"role": "assistant", "content": [
                    b.model_dump(exclude_none=True) for b in reply.content]})
                if reply.stop_reason != "tool_use":
                    break
                messages.append({"role": "user",
                                 "content": run_tool_uses(session, reply, messages=messages)})
        sid = session.sagas[0]
        heading("the agent's answer")
        print(wrapped(" ".join(b.text for b in reply.content if b.type == "text")))
        state = show(store, sid)
        print(f"\nthe next turn starts from {len(rebuild(messages, [state]))} rebuilt messages")


if __name__ == "__main__":
    main()
