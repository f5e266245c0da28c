"""A Pydantic AI agent whose tool calls are a saga: ``make example-pydantic-ai``.

Offline it runs on a FunctionModel that makes the order story's calls (reserve,
charge, a CRM call that hangs) and answers from what it is shown. With
``OPENAI_API_KEY`` or ``ANTHROPIC_API_KEY`` set it runs on a real model
(``SAGA_EXAMPLE_MODEL``, default openai:gpt-4.1-mini or
anthropic:claude-sonnet-4-5; the provider's SDK must be installed).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from saga_store.integrations.pydantic_ai import (
    SagaSession,
    SagaToolset,
    rebuild,
    saga_history_processor,
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

DEFAULTS = {"OPENAI_API_KEY": "openai:gpt-4.1-mini",
            "ANTHROPIC_API_KEY": "anthropic:claude-sonnet-4-5"}


def scripted() -> FunctionModel:
    turns = iter(ORDER)

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        step = next(turns, None)
        if step is not None:
            tool, args, call_id = step
            return ModelResponse(parts=[ToolCallPart(tool, dict(args), tool_call_id=call_id)])
        outputs = [p.content for m in messages if isinstance(m, ModelRequest)
                   for p in m.parts if isinstance(p, ToolReturnPart)]
        heading("what the model is shown after the CRM call")
        for out in outputs:
            print(wrapped(out))
        undone = sum(str(o).startswith("rolled back") for o in outputs)
        return ModelResponse(parts=[TextPart(
            f"I could not place the order: {undone} earlier steps were rolled back.")])

    return FunctionModel(respond)


async def main() -> None:
    key = real_model("OPENAI_API_KEY", "ANTHROPIC_API_KEY")
    model: Any = os.environ.get("SAGA_EXAMPLE_MODEL", DEFAULTS[key]) if key else scripted()
    print(f"Pydantic AI, {'model ' + model if key else 'scripted model'}, ", end="")
    with saga_store() as store:
        # the session opens the saga at the model's first call, named after it
        with SagaSession(store, "shop-agent", conversation_id=conversation()) as session:
            agent = Agent(model, instructions="You place orders with the tools.",
                          toolsets=[SagaToolset(session)],
                          capabilities=[ProcessHistory(saga_history_processor(session))])
            result = await agent.run(PROMPT)
        sid = session.sagas[0]
        heading("the agent's answer")
        print(wrapped(result.output))
        state = show(store, sid)
        history = rebuild(result.all_messages(), [state])
        print(f"\nthe next turn starts from {len(history)} rebuilt messages")


if __name__ == "__main__":
    asyncio.run(main())
