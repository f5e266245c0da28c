"""The short chaos soak (``make chaos`` runs it at full size): random SIGKILLs of
worker and compensator pools about every two seconds and one Redis kill -9 and
restart, then every guarantee checked against the soak's own ledger."""

from __future__ import annotations

import io

import pytest

from ..chaos import Config, run

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(240)]


def test_chaos_soak_short(worker_kind: str) -> None:
    """1,200 sagas through RQ worker pools (600 through asyncio ones, whose unstoppable
    hung CRM calls hold a slot 3 s each) SIGKILLed about every 1.5 s, and one Redis
    restart: every guarantee holds against the soak's own ledger."""
    out = io.StringIO()
    sagas = 600 if worker_kind == "async" else 1200
    rep = run(Config(sagas=sagas, kill_every_s=1.5, seed=7, worker_kind=worker_kind), out=out)
    print(rep.table())
    assert rep.ok, "\n".join(rep.failures)
    assert rep.pool_kills >= 5, "too few kills to mean anything; the soak ran too fast"
    assert rep.redis_restarts == 1
    assert rep.recoveries_s, "no kill caught a saga mid-step"
    assert rep.unrecovered == 0
    assert set(rep.by_state) >= {"committed", "compensated", "needs_attention",
                                 "refused (nothing written)"}
