"""An OpenAI Agents SDK agent whose tool calls are a saga: ``make example-openai-agents``.

Offline it runs on the SDK's ScriptedModel, which makes the order story's calls
(reserve, charge, a CRM call that hangs) and then answers from what it is shown.
With ``OPENAI_API_KEY`` set it runs on a real model (``SAGA_EXAMPLE_MODEL``,
default gpt-4.1-mini) with the same tools.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from agents import Agent, RunConfig, Runner, set_tracing_disabled
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call

from saga_store.integrations.openai_agents import (
    SagaSession,
    rebuild,
    saga_input_filter,
    saga_tools,
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


def scripted() -> ScriptedModel:
    def answer(call: ModelCall) -> Any:
        outputs = [i["output"] for i in call.input
                   if isinstance(i, dict) and i.get("type") == "function_call_output"]
        heading("what the model is shown after the CRM call")
        for out in outputs:
            print(wrapped(out))
        undone = sum(o.startswith("rolled back") for o in outputs)
        return [assistant_message(f"I could not place the order: {undone} earlier steps "
                                  "were rolled back, so nothing is reserved or charged.")]

    return ScriptedModel([*([function_call(t, a, call_id=c)] for t, a, c in ORDER),
                          ModelStep.respond(answer)])


async def main() -> None:
    live = real_model("OPENAI_API_KEY")
    if not live:
        set_tracing_disabled(True)
    model: Any = os.environ.get("SAGA_EXAMPLE_MODEL", "gpt-4.1-mini") if live else scripted()
    print(f"OpenAI Agents SDK, {'model ' + model if live else 'scripted model'}, ", end="")
    with saga_store() as store:
        # the session opens the saga at the model's first call, named after it
        with SagaSession(store, "shop-agent", conversation_id=conversation()) as session:
            agent = Agent(name="shop", instructions="You place orders with the tools.",
                          model=model, tools=[*saga_tools(session)])
            config = RunConfig(call_model_input_filter=saga_input_filter(session))
            result = await Runner.run(agent, PROMPT, context={}, run_config=config)
        sid = session.sagas[0]
        heading("the agent's answer")
        print(wrapped(result.final_output))
        state = show(store, sid)
        items = rebuild(result.to_input_list(), [state])
        print(f"\nthe next turn starts from {len(items)} rebuilt input items")


if __name__ == "__main__":
    asyncio.run(main())
