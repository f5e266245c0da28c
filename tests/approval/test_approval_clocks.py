"""Approval deadlines across hosts whose clocks disagree: a deadline is set and
checked by Redis's clock, never by the clock of whichever host asked or looks."""

from __future__ import annotations

import time

import pytest

from saga_store import SagaStore
from saga_store.approval import requests as approvals
from saga_store.testing import assert_eventually

pytestmark = pytest.mark.real_redis
PLAN = [{"tool": "send_email", "args": {"to": "ceo@example.com"}}]
BEHIND_NS = 600 * 10**9  # the asking host's clock, ten minutes behind


def _ask(store: SagaStore, agent_id: str, timeout_s: float,
         monkeypatch: pytest.MonkeyPatch) -> str:
    """Ask for approval of a saga's step 0 as a host whose clock runs behind."""
    sid = store.submit(PLAN, agent_id=agent_id)
    writer = store.events.writer(sid)
    real = time.time_ns
    with monkeypatch.context() as m:
        m.setattr(time, "time_ns", lambda: real() - BEHIND_NS)
        approvals.request(writer, 0, "send_email", {"tool": "send_email"}, timeout_s)
    return sid


def test_an_approval_asked_by_a_host_whose_clock_is_behind_is_not_denied_at_once(
        saga_store: SagaStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A five-minute approval asked on a host whose clock runs ten minutes behind:
    a sweeper on a host whose clock is right does not deny it as long overdue; a
    short one asked the same way is denied once its own time has passed."""
    waiting = _ask(saga_store, "agent-a", 300, monkeypatch)
    assert approvals.expire_due(saga_store) == 0
    assert [p.saga_id for p in approvals.pending(saga_store)] == [waiting]
    short = _ask(saga_store, "agent-b", 0.2, monkeypatch)
    assert_eventually(lambda: approvals.expire_due(saga_store) == 1, timeout=10,
                      what="the short approval to time out")
    assert [p.saga_id for p in approvals.pending(saga_store)] == [waiting]
    assert saga_store.state(short).steps[0].approval is not None
