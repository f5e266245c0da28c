"""An OpenAI Agents run in a process of its own, for the crash tests: the order
story against the SDK's ScriptedModel, the conversation kept by the SDK's own
``SQLiteSession`` and a SagaSession; started fresh (``first``) or resumed by
running the agent again with the same session (``resume``); it writes what the
model was shown to a JSON file.

    python -m tests.integrations.openai_session_resume DIR first|resume OUT FINAL_TEXT
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from agents import Agent, RunConfig, Runner, SQLiteSession, set_tracing_disabled
from agents.run_config import CallModelData, ModelInputData
from agents.testing import ScriptedModel, assistant_message, function_call

from saga_store import Registry, SagaStore, Settings
from saga_store.integrations.openai_agents import SagaSession, saga_input_filter, saga_tools

from ..integration_support import CHARGE, RESERVE, TOOLS

set_tracing_disabled(True)  # offline: no trace export


def seen(items: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in items:
        if not isinstance(i, dict):
            continue
        if i.get("type") == "function_call_output":
            out.append({"type": "ToolMessage", "tool_call_id": i["call_id"],
                        "content": str(i["output"])})
        elif i.get("role") in ("system", "user") and isinstance(i.get("content"), str):
            out.append({"type": "SystemMessage" if i["role"] == "system" else "HumanMessage",
                        "tool_call_id": None, "content": i["content"]})
    return out


async def main(workdir: str, mode: str, out: str, final_text: str) -> None:
    turns = [[function_call(RESERVE[0], RESERVE[1], call_id="call_1")],
             [function_call(CHARGE[0], CHARGE[1], call_id="call_2")]] \
        if mode == "first" else []
    model = ScriptedModel([*turns, [assistant_message(final_text)]])
    received: list[list[dict[str, Any]]] = []
    store = SagaStore.from_url(os.environ["SAGA_REDIS_URL"], Registry.from_modules(TOOLS),
                               Settings.from_env())
    conversation = SQLiteSession("order-1", str(Path(workdir) / "conversation.db"))
    with SagaSession(store, "shop", conversation_id="order-1") as session:
        truthful = saga_input_filter(session)

        async def shown(data: CallModelData[Any]) -> ModelInputData:
            given = await truthful(data)
            received.append(seen(list(given.input)))
            return given

        agent = Agent(name="shop", model=model, tools=saga_tools(session))
        # a resume sends nothing new: the conversation so far is in the SQLiteSession
        result = await Runner.run(agent, "Order a laptop" if mode == "first" else [],
                                  session=conversation, context={},
                                  run_config=RunConfig(call_model_input_filter=shown))
        sagas = session.sagas
    Path(out).write_text(json.dumps({"received": received, "sagas": sagas,
                                     "last": result.final_output}))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
