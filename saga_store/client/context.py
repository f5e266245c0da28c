"""Context sync: telling an agent what is true now.

Two views of the same facts:

* the agent's stream ``ss:ctx:{agent}``: ``observed`` (a step's result),
  ``retracted`` (a compensated step: what was undone and how) and
  ``saga_closed`` events, for a running agent to follow (:class:`Subscriber`).
  It is a projection of the log with a cursor (``ctx_seq`` in the saga's
  meta): whoever appends next, finishes or sweeps a saga projects everything
  after the cursor, then moves it. A crash can repeat an event, never lose
  one; each carries ``ref`` (saga:seq) and the subscriber drops repeats;
* :func:`rebuild_history`, which turns the log itself (the source of truth)
  into messages for OpenAI chat completions or Anthropic messages. A call that
  was rolled back keeps its call/result pair (providers require one), but its
  result says what undid it, not what it once returned; a closing note states
  the current truth. The same log always gives the same messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import orjson

from saga_store import keys
from saga_store.keys import SagaKeys
from saga_store.log.events import EventKind as K
from saga_store.protocol.state import SagaState, Status, StepState, paused_gc
from saga_store.protocol.vocab import CompStatus, StepStatus

UNDONE = frozenset({CompStatus.SUCCEEDED, CompStatus.RESOLVED})  # the agent sees them rolled back

FORMATS = ("openai", "anthropic", "plain")


def project(store: Any, saga_id: str) -> int:
    """Emit the context events of every log event after the saga's cursor; returns
    how many. Safe to call from anywhere, any number of times."""
    r = store.redis
    cur = r.hget(store.keys.meta(saga_id), "ctx_seq")
    start = int(cur) + 1 if cur is not None else 0
    # whose context it is comes from the log's first event, never from the cache
    events = store.log.bodies(saga_id)
    if not events or events[0]["kind"] != K.SAGA_STARTED:
        return 0
    agent = events[0].get("agent_id")
    conv = (events[0].get("data") or {}).get("conversation_id")
    events = events[start:]
    if not agent or not events:
        return 0
    pipe = r.pipeline(transaction=False)
    n = tell(pipe, store.keys, saga_id, agent, conv, events)
    pipe.execute()
    return n


def tell(pipe: Any, names: SagaKeys, saga_id: str, agent_id: str,
         conversation_id: str | None, events: list[dict[str, Any]]) -> int:
    """Queue on ``pipe`` the context events of ``events`` (every event past the
    cursor, in seq order, all already in the log) and move the cursor past them;
    returns how many context events that makes. Whoever knows what it appended
    (a worker, the compensator, the gateway) tells from memory in a round trip
    it makes anyway; :func:`project` tells from the log."""
    if not events:
        return 0
    ids = {"saga_id": saga_id, "conversation_id": conversation_id}
    n = 0
    for ev in events:
        out = projection(ev, ids)
        if out is not None:
            pipe.xadd(keys.agent_ctx(agent_id), {"e": orjson.dumps(out)})
            n += 1
    pipe.hset(names.meta(saga_id), "ctx_seq", events[-1]["seq"])
    return n


def projection(ev: dict[str, Any], ids: dict[str, Any]) -> dict[str, Any] | None:
    kind, data = ev["kind"], ev.get("data") or {}
    base = {**ids, "ref": f"{ids['saga_id']}:{ev['seq']}"}
    if kind == K.STEP_SUCCEEDED:
        return {"kind": "observed", **base, "step": ev.get("step"), "tool": ev.get("tool"),
                "tool_call_id": ev.get("tool_call_id"), "result": data.get("result")}
    if kind == K.COMPENSATION_SUCCEEDED:
        return {"kind": "retracted", **base, "step": ev.get("step"),
                "tool": data.get("undid"), "tool_call_id": ev.get("tool_call_id"),
                "undone_by": ev.get("tool"), "compensation_result": data.get("result")}
    if kind in (K.SAGA_COMMITTED, K.SAGA_COMPENSATED, K.SAGA_NEEDS_ATTENTION):
        return {"kind": "saga_closed", **base, "state": _CLOSED[kind],
                "needs_attention": data.get("needs_attention")}
    return None


_CLOSED = {K.SAGA_COMMITTED: "committed", K.SAGA_COMPENSATED: "compensated",
           K.SAGA_NEEDS_ATTENTION: "needs_attention"}


def step_views(state: SagaState) -> list[dict[str, Any]]:
    """One plain record per tool call, in order: what the agent should believe."""
    out = []
    for n in sorted(state.steps):
        st = state.steps[n]
        if st.tool is None:
            continue
        out.append({"step": n, "tool_call_id": st.tool_call_id or f"{state.saga_id}-{n}",
                    "tool": st.tool, "args": _mask(st.args), "status": _belief(st),
                    "result": _result_text(st)})
    return out


def closing_note(state: SagaState) -> str | None:
    """The current truth in one paragraph, once the saga has unwound or ended."""
    undone = [s for s in (state.steps[n] for n in sorted(state.steps))
              if s.compensation in UNDONE]
    stuck = [s for s in state.steps.values()
             if s.compensation in (CompStatus.NOT_COMPENSABLE, CompStatus.FAILED)]
    if state.status is Status.RUNNING or (state.status is Status.COMMITTED and not undone):
        return None
    parts = [f"Saga {state.saga_id} is {_PHRASE.get(state.status, state.status)}."]
    if undone:
        parts.append("Rolled back, latest first: " + "; ".join(
            _undone(s) for s in reversed(undone)) + ".")
        parts.append("Treat the results of those calls as void.")
    if stuck:
        parts.append("Still in effect and needing a person: "
                     + ", ".join(f"{s.tool} (step {s.step})" for s in stuck) + ".")
    return " ".join(parts)


_PHRASE = {Status.NEEDS_ATTENTION: "waiting for a person's attention"}


def _undone(s: StepState) -> str:
    if s.compensation is CompStatus.RESOLVED:
        by = s.resolved_by if isinstance(s.resolved_by, dict) else {}
        return (f"{s.tool} was undone by hand by {by.get('by', 'a person')}"
                f" ({_short(by.get('note'))})")
    return f"{s.tool} was undone by its compensation" + (
        f" ({_short(s.compensation_result)})" if s.compensation_result else "")


def rebuild_history(states: Iterable[SagaState], fmt: str = "openai") -> list[dict[str, Any]]:
    """Messages for one or more sagas (in the order given), in ``fmt``."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    with paused_gc():
        return _rebuild(states, fmt)


def _rebuild(states: Iterable[SagaState], fmt: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for state in states:
        views, note = step_views(state), closing_note(state)
        if fmt == "plain":
            messages.append({"saga_id": state.saga_id, "state": str(state.status),
                             "calls": views, "note": note})
        elif fmt == "openai":
            messages += _openai(views, note)
        else:
            messages += _anthropic(views, note)
    return messages


def _openai(views: list[dict[str, Any]], note: str | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for v in views:
        out.append({"role": "assistant", "content": None, "tool_calls": [{
            "id": v["tool_call_id"], "type": "function",
            "function": {"name": v["tool"], "arguments": orjson.dumps(v["args"]).decode()}}]})
        out.append({"role": "tool", "tool_call_id": v["tool_call_id"], "content": v["result"]})
    if note:
        out.append({"role": "system", "content": note})
    return out


def _anthropic(views: list[dict[str, Any]], note: str | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for v in views:
        out.append({"role": "assistant", "content": [{
            "type": "tool_use", "id": v["tool_call_id"], "name": v["tool"], "input": v["args"]}]})
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": v["tool_call_id"],
                                 "content": v["result"]}
        if v["status"] in (StepStatus.FAILED, StepStatus.IN_DOUBT):
            block["is_error"] = True
        out.append({"role": "user", "content": [block]})
    if note:
        if out and out[-1]["role"] == "user":  # tool results and the note: one user turn
            out[-1]["content"].append({"type": "text", "text": note})
        else:
            out.append({"role": "user", "content": [{"type": "text", "text": note}]})
    return out


def _belief(st: StepState) -> str:
    if st.compensation in UNDONE:
        return "retracted"
    return {StepStatus.SUCCEEDED: "observed", StepStatus.FAILED: "failed",
            StepStatus.IN_DOUBT: "in_doubt"}.get(st.status, "pending")


def _result_text(st: StepState) -> str:
    if st.compensation is CompStatus.RESOLVED:
        note = (st.resolved_by or {}).get("note") if isinstance(st.resolved_by, dict) else None
        return f"rolled back: this call was undone by hand ({_short(note)}). " \
               "Its earlier result no longer holds."
    if st.compensation is CompStatus.SUCCEEDED:
        undo = f": {_short(st.compensation_result)}" if st.compensation_result else ""
        return f"rolled back: this call was undone by its compensation{undo}. " \
               "Its earlier result no longer holds."
    if st.status is StepStatus.SUCCEEDED:
        return orjson.dumps(st.result or {}).decode()
    if st.status is StepStatus.FAILED:
        return f"error: {_short(st.error)}"
    if st.status is StepStatus.IN_DOUBT:
        return f"outcome unknown: {_short(st.error)}"
    return "in progress"


def _short(value: Any, limit: int = 300) -> str:
    if isinstance(value, dict) and set(value) == {"error"}:
        value = value["error"]
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _mask(args: Any) -> Any:
    if not isinstance(args, dict):
        return args or {}
    return {k: ("***" if isinstance(v, dict) and "$secret" in v else v) for k, v in args.items()}


def agent_states(store: Any, agent_id: str) -> list[SagaState]:
    """Every saga of ``agent_id``, oldest first, folded from the log."""
    return [store.state(sid) for sid in reversed(store.saga_ids(agent_id=agent_id))]


class Subscriber:
    """Follow an agent's context stream: ``for event in Subscriber(r, "agent-7"): ...``.

    Starts after ``last_id`` (``"0"`` replays the whole stream); XREAD BLOCK, no polling.
    """

    def __init__(self, client: Any, agent_id: str, last_id: str = "$",
                 block_ms: int = 1000) -> None:
        self.redis, self.key, self.last_id = client, keys.agent_ctx(agent_id), last_id
        self.block_ms = block_ms
        self.seen: set[str] = set()

    def poll(self) -> list[dict[str, Any]]:
        """New events since the last call, repeats dropped (waits up to ``block_ms``)."""
        reply = self.redis.xread({self.key: self.last_id}, block=self.block_ms)
        out = []
        for _, entries in reply or []:
            for eid, fields in entries:
                self.last_id = eid.decode() if isinstance(eid, bytes) else eid
                event = orjson.loads(fields[b"e"])
                if event.get("ref") in self.seen:
                    continue  # a projection repeated after a crash
                self.seen.add(event.get("ref"))
                out.append({"id": self.last_id, **event})
        return out

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            yield from self.poll()
