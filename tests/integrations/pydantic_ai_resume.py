"""A Pydantic AI agent run in a process of its own, for the crash tests: the
order story against a FunctionModel, its message history saved as JSON after
every step of the run (the application's own persistence) and a SagaSession;
started fresh (``first``) or resumed from the saved history (``resume``, which
runs the saved response's pending tool calls); it writes what the model was
shown to a JSON file. ``gated`` reserves, then asks for the gated invoice: the
run ends with ``DeferredToolRequests``; ``approve`` loads the saved history,
hours later, and alice grants it (``SagaToolset.decide``).

    python -m tests.integrations.pydantic_ai_resume DIR first|resume|gated|approve OUT TEXT
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from saga_store import Registry, SagaStore, Settings
from saga_store.integrations.pydantic_ai import (
    SagaSession,
    SagaToolset,
    saga_history_processor,
)

from ..integration_support import CHARGE, INVOICE, RESERVE, TOOLS


def seen(messages: list[ModelMessage]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        for p in m.parts if isinstance(m, ModelRequest) else []:
            if isinstance(p, ToolReturnPart):
                out.append({"type": "ToolMessage", "tool_call_id": p.tool_call_id,
                            "content": str(p.content)})
            elif isinstance(p, SystemPromptPart | UserPromptPart):
                out.append({"type": "SystemMessage", "tool_call_id": None,
                            "content": str(p.content)})
    return out


async def main(workdir: str, mode: str, out: str, final_text: str) -> None:
    saved = Path(workdir) / "messages.json"
    second = ToolCallPart(*INVOICE, tool_call_id="call_inv") if mode == "gated" else \
        ToolCallPart(*CHARGE, tool_call_id="call_2")
    turns = [ModelResponse(parts=[ToolCallPart(*RESERVE, tool_call_id="call_1")]),
             ModelResponse(parts=[second])] if mode in ("first", "gated") else []
    replies = [*turns, ModelResponse(parts=[TextPart(final_text)])]
    received: list[list[dict[str, Any]]] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        received.append(seen(messages))
        return replies.pop(0)

    store = SagaStore.from_url(os.environ["SAGA_REDIS_URL"], Registry.from_modules(TOOLS),
                               Settings.from_env())
    fresh = mode in ("first", "gated")
    history = None if fresh else ModelMessagesTypeAdapter.validate_json(saved.read_bytes())
    with SagaSession(store, "shop", conversation_id="order-1") as session:
        toolset = SagaToolset(session)
        agent = Agent(FunctionModel(model), toolsets=[toolset],
                      output_type=[str, DeferredToolRequests],
                      capabilities=[ProcessHistory(saga_history_processor(session))])
        answers = None
        if mode == "approve":  # the waiting calls are the saved last response's
            assert history is not None
            assert isinstance(history[-1], ModelResponse)
            waiting = DeferredToolRequests(approvals=history[-1].tool_calls)
            answers = await toolset.decide(waiting, {"call_inv": True}, by="alice")
        async with agent.iter("Order a laptop" if fresh else None, message_history=history,
                              deferred_tool_results=answers) as run:
            async for _ in run:
                saved.write_bytes(ModelMessagesTypeAdapter.dump_json(run.all_messages()))
        assert run.result is not None
        sagas, output = session.sagas, run.result.output
    Path(out).write_text(json.dumps({
        "received": received, "sagas": sagas,
        "last": output if isinstance(output, str) else None,
        "deferred": [p.tool_call_id for p in output.approvals]
        if isinstance(output, DeferredToolRequests) else []}))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
