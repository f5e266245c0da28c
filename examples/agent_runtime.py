"""What the framework examples share: a store to run on, and printing the story.

With ``SAGA_REDIS_URL`` set, the examples use that Redis and start real worker
processes (``saga worker``). Without it they use the embedded in-process store
and run the same step and compensation code on a thread of their own, as
``saga demo`` does, so they need no Redis at all.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from saga_store import Registry, SagaState, SagaStore
from saga_store.client.context import rebuild_history

TOOLS = "saga_store.cli.demo_tools"
CARD = "tok_visa_4242"
# the order story: stock, payment, then a CRM call that hangs (and is in doubt)
ORDER: list[tuple[str, dict[str, Any], str]] = [
    ("reserve_inventory", {"sku": "LAPTOP-15", "qty": 1}, "call_reserve"),
    ("charge_payment", {"amount_cents": 1_200_000, "card_token": CARD}, "call_charge"),
    ("update_crm", {"customer": "ana", "note": "slow order"}, "call_crm")]
STORY = ("The order: reserve a laptop, charge the card, then note it in the CRM. The CRM "
         "call hangs past its timeout, so nobody knows whether it happened: the saga asks "
         "the CRM (its probe), finds it did not, and rolls back the charge and the "
         "reservation, latest first.")
PROMPT = ("Order one LAPTOP-15 for customer ana: reserve it, charge 1200000 cents to card "
          f"{CARD}, then note the order on her CRM record with the note 'slow order'.")


@contextlib.contextmanager
def saga_store(tools: str = TOOLS) -> Iterator[SagaStore]:
    """A store with someone to run its steps (the tools module ``tools``): worker
    processes on the Redis at ``SAGA_REDIS_URL``, or a thread over the embedded store."""
    url = os.environ.get("SAGA_REDIS_URL")
    registry = Registry.from_modules(tools)
    if url:
        store = SagaStore.from_url(url, registry)
        env = {**os.environ, "SAGA_REDIS_URL": url}
        proc = subprocess.Popen(  # noqa: S603  our own argv, no shell
            [sys.executable, "-m", "saga_store.cli.main", "worker", "--tools", tools, "--log-level",
             "WARNING"], env=env, start_new_session=True)
        print(f"on the Redis at SAGA_REDIS_URL, with a worker process (pid {proc.pid})")
        print(wrapped(STORY, indent="", hang=""))
        try:
            yield store
        finally:
            proc.terminate()
            proc.wait(30)
        return
    from saga_store.ops.connection import embedded
    store = SagaStore(embedded(), registry)
    print("on the embedded in-process store (set SAGA_REDIS_URL to use a Redis and workers)")
    print(wrapped(STORY, indent="", hang=""))
    # the hanging CRM call is the story, told above: not a worker warning mid-output
    logging.getLogger("saga_store.worker").setLevel(logging.ERROR)
    stop = threading.Event()
    runner = threading.Thread(target=_run_jobs, args=(store, stop), daemon=True)
    runner.start()
    try:
        yield store
    finally:
        stop.set()
        runner.join()


def _run_jobs(store: SagaStore, stop: threading.Event) -> None:
    """The embedded store lives in this process: run its queued steps and unwinds
    here, in order, with the workers' own code."""
    from saga_store.workers.inline import InlineRunner
    runner = InlineRunner(store, "example")
    while not stop.is_set():
        if not runner.run_one():
            time.sleep(0.005)  # an embedded list cannot block across threads


def conversation() -> str:
    """A conversation id of its own for each run: the session names its saga after
    it and the first call's id, which a scripted model repeats every run."""
    return f"example-{uuid.uuid4().hex[:12]}"


def real_model(*names: str) -> str | None:
    """The first of these environment variables that is set (an API key), if any."""
    return next((n for n in names if os.environ.get(n)), None)


def show(store: SagaStore, saga_id: str) -> SagaState:
    """Print what happened in the saga and what the agent should now believe."""
    state = store.wait(saga_id, timeout=60)
    print(f"\nsaga {saga_id} is {state.status}")
    for view in rebuild_history([state], "plain")[0]["calls"]:
        print(f"  {view['tool']} ({view['status']})")
        print(wrapped(view["result"], indent="    ", hang=""))
    note = rebuild_history([state], "plain")[0]["note"]
    if note:
        print("  note:")
        print(wrapped(note, indent="    ", hang=""))
    return state


def heading(text: str) -> None:
    print(f"\n== {text}")


def wrapped(value: Any, indent: str = "  ", hang: str = "  ") -> str:
    """The whole text, wrapped to the terminal's usual width (never cut short); its
    later lines indented by ``hang`` more."""
    return textwrap.fill(str(value), width=88, initial_indent=indent,
                         subsequent_indent=indent + hang,
                         break_long_words=False, break_on_hyphens=False)
