"""The overview counts sagas committed and compensated per minute over the last
hour, from the ledger's closing entries, read backwards within a bound (and
says so when the bound cut the hour short)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from saga_store import SagaStore, Status
from saga_store.console import throughput
from saga_store.testing.workers import workers

from ..console_helpers import console

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
TOOLS = "tests.ledger_tools"
COMMITS = [{"tool": "reserve_inventory", "args": {"sku": "A", "qty": 1}}]
UNWINDS = [{"tool": "reserve_inventory", "args": {"sku": "A", "qty": 1}},
           {"tool": "fail_always", "args": {}}]


def test_sagas_closed_per_minute_over_the_last_hour(
        saga_store: SagaStore, worker_env: dict[str, str], ledger: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    with workers(worker_env, TOOLS):
        ids = [saga_store.submit(COMMITS, agent_id="agent-c") for _ in range(3)]
        ids += [saga_store.submit(UNWINDS, agent_id="agent-u") for _ in range(2)]
        ends = [saga_store.wait(sid, timeout=60).status for sid in ids]
    assert ends == [Status.COMMITTED] * 3 + [Status.COMPENSATED] * 2
    tc = console(saga_store)
    page = tc.get("/overview").text
    assert '<b id="committed-hour">3</b>' in page
    assert '<b id="compensated-hour">2</b>' in page
    bars = re.findall(r'<rect class="bar (committed|compensated)"', page)
    assert sorted(set(bars)) == ["committed", "compensated"]
    assert "Counted in part" not in page
    hour = throughput.last_hour(saga_store.events)
    assert (hour.total("committed"), hour.total("compensated")) == (3, 2)
    assert sum(hour.per_minute["committed"][-2:]) == 3  # this minute, or the one before
    later = throughput.last_hour(saga_store.events, time.time_ns() // 1_000_000 + 7_200_000)
    assert (later.total("committed"), later.total("compensated")) == (0, 0)  # 2 h on
    monkeypatch.setattr(throughput, "MAX_READ", 2)
    monkeypatch.setattr(throughput, "CHUNK", 2)
    saga_store.events.ledger.flush()  # every entry chained: the pending list is empty
    cut = throughput.last_hour(saga_store.events)
    assert cut.partial
    assert cut.read <= 2 * len(saga_store.events.ledger.present())
    assert "Counted in part" in tc.get("/overview").text
