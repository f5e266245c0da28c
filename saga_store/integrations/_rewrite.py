"""The rollback-aware rewrite of a framework's history, shared by every adapter:
the texts :func:`saga_store.context.rebuild_history` gives each call, planned
over ``(call id, text)`` pairs the framework module extracts (:func:`rewrite`),
and the result of a call a saved history has none for (:func:`unanswered`)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from saga_store import SagaState
from saga_store.client.context import closing_note, step_views
from saga_store.ids import valid_id


def step_call_id(framework_id: str | None) -> str | None:
    """The step's ``tool_call_id`` for a framework's tool call id: the id itself when
    Saga Store accepts it (``saga_store.ids.check_id``), else ``h-`` and the first 40
    hex digits of its SHA-256, so the same framework id always maps to the same step id."""
    if framework_id is None or valid_id(framework_id):
        return framework_id
    return "h-" + hashlib.sha256(framework_id.encode()).hexdigest()[:40]



@dataclass(frozen=True)
class SagaTruth:
    """What one saga's calls should say now, by step call id (``step_views``)."""

    saga_id: str
    results: dict[str, str]
    errors: frozenset[str]
    note: str | None


def truths(states: Iterable[SagaState]) -> list[SagaTruth]:
    out = []
    for state in states:
        views = step_views(state)
        out.append(SagaTruth(
            state.saga_id, {v["tool_call_id"]: v["result"] for v in views},
            frozenset(v["tool_call_id"] for v in views if v["status"] in ("failed", "in_doubt")),
            closing_note(state)))
    return out


@dataclass
class Rewrite:
    """How to change a history: new result texts by entry index, the notes to put
    after an entry, and which results are errors now."""

    texts: dict[int, str] = field(default_factory=dict)
    notes_after: dict[int, list[str]] = field(default_factory=dict)
    errors: set[int] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.texts or self.notes_after)


def rewrite(results: Sequence[tuple[str | None, str | None]], states: Iterable[SagaState],
            present_notes: Iterable[str] = ()) -> Rewrite:
    """Plan the rewrite of a history, given per entry ``(framework call id, text)``
    for tool results (``(None, None)`` for anything else) and the sagas' states.

    A result of a saga's call gets the text :func:`rebuild_history` gives it (a
    rolled-back call says so; its pair is kept), and each saga's closing note goes
    after the last of its results in the history, unless one of ``present_notes``
    (the history's system texts, which a framework may have framed) holds it already.
    """
    plan = Rewrite()
    present = list(present_notes)
    for truth in truths(states):
        last = None
        for i, (fid, text) in enumerate(results):
            cid = step_call_id(fid)
            if cid is None or cid not in truth.results:
                continue
            last = i
            if text != truth.results[cid]:
                plan.texts[i] = truth.results[cid]
            if cid in truth.errors:
                plan.errors.add(i)
        if truth.note and last is not None and not any(truth.note in p for p in present):
            plan.notes_after.setdefault(last, []).append(truth.note)
            present.append(truth.note)
    return plan


NOT_LOGGED = ("not run: no saga logged this call (the agent stopped before it was sent); "
              "call it again if it is still needed")


def unanswered(call_ids: Iterable[str], states: Iterable[SagaState],
               ) -> dict[str, tuple[str, bool]]:
    """For calls a history has no result for (the call in flight when the agent
    stopped), ``(text, is_error)`` by framework id: what the sagas' logs say of it,
    else that it never ran (:data:`NOT_LOGGED`)."""
    known = truths(states)
    out = {}
    for fid in call_ids:
        cid = step_call_id(fid)
        truth = next((t for t in known if cid in t.results), None)
        out[fid] = (NOT_LOGGED, True) if truth is None or cid is None else \
            (truth.results[cid], cid in truth.errors)
    return out
