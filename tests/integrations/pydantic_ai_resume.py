"""A Pydantic AI agent run in a process of its own, for the crash tests: the
order story against a FunctionModel, its message history saved as JSON after
every step of the run (the application's own persistence) and a SagaSession;
started fresh (``first``) or resumed from the saved history (``resume``, which
runs the saved response's pending tool calls); it writes what the model was
shown to a JSON file.

    python -m tests.integrations.pydantic_ai_resume DIR first|resume OUT FINAL_TEXT
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
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

from ..integration_support import CHARGE, RESERVE, TOOLS


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
    turns = [ModelResponse(parts=[ToolCallPart(*RESERVE, tool_call_id="call_1")]),
             ModelResponse(parts=[ToolCallPart(*CHARGE, tool_call_id="call_2")])] \
        if mode == "first" else []
    replies = [*turns, ModelResponse(parts=[TextPart(final_text)])]
    received: list[list[dict[str, Any]]] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        received.append(seen(messages))
        return replies.pop(0)

    store = SagaStore.from_url(os.environ["SAGA_REDIS_URL"], Registry.from_modules(TOOLS),
                               Settings.from_env())
    history = None if mode == "first" else \
        ModelMessagesTypeAdapter.validate_json(saved.read_bytes())
    with SagaSession(store, "shop", conversation_id="order-1") as session:
        agent = Agent(FunctionModel(model), toolsets=[SagaToolset(session)],
                      capabilities=[ProcessHistory(saga_history_processor(session))])
        async with agent.iter("Order a laptop" if mode == "first" else None,
                              message_history=history) as run:
            async for _ in run:
                saved.write_bytes(ModelMessagesTypeAdapter.dump_json(run.all_messages()))
        assert run.result is not None
        sagas = session.sagas
    Path(out).write_text(json.dumps({"received": received, "sagas": sagas,
                                     "last": run.result.output}))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
