"""An OpenAI Agents run in a process of its own, for the approval tests: the
order story with a gated invoice, a SagaSession and a dict context; ``first``
runs until the SDK's approval interruption and saves the ``RunState``;
``approve`` loads it (hours later, in another process), approves the call and
resumes the run. Writes what happened to a JSON file.

    python -m tests.integrations.openai_resume DIR first|approve OUT
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from agents import Agent, RunConfig, Runner, RunState, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call

from saga_store import Registry, SagaStore, Settings
from saga_store.integrations.openai_agents import (
    SagaSession,
    approve,
    saga_id_in,
    saga_input_filter,
    saga_tools,
)

from ..integration_support import INVOICE, RESERVE, TOOLS

set_tracing_disabled(True)  # offline: no trace export


async def main(workdir: str, mode: str, out: str) -> None:
    saved = Path(workdir) / "run_state.json"
    store = SagaStore.from_url(os.environ["SAGA_REDIS_URL"], Registry.from_modules(TOOLS),
                               Settings.from_env())
    turns = [[function_call(RESERVE[0], RESERVE[1], call_id="call_1")],
             [function_call(INVOICE[0], INVOICE[1], call_id="call_inv")]] \
        if mode == "first" else []
    model = ScriptedModel([*turns, [assistant_message("Invoiced.")]])
    report: dict[str, Any] = {}
    with SagaSession(store, "shop", conversation_id="order-2") as session:
        agent = Agent(name="shop", model=model, tools=saga_tools(session))
        config = RunConfig(call_model_input_filter=saga_input_filter(session))
        if mode == "first":
            result = await Runner.run(agent, "Reserve, then invoice ana", context={},
                                      run_config=config)
            report["interruptions"] = [i.call_id for i in result.interruptions]
            saved.write_text(json.dumps(result.to_state().to_json()))
        else:
            state = await RunState.from_json(agent, json.loads(saved.read_text()))
            report["context_saga"] = saga_id_in(state._context.context if state._context
                                                else None)
            for item in state.get_interruptions():
                approve(session, state, item, by="alice")
            result = await Runner.run(agent, state, run_config=config)
            report["final"] = result.final_output
        report["sagas"] = session.sagas
    Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
