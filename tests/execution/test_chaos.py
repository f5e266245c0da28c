"""The short chaos soak (``make chaos`` runs it at full size): random SIGKILLs of
worker and compensator pools about every two seconds and one Redis kill -9 and
restart, slow retrying tools whose steps outlast the lease and tools raising
BaseExceptions, then every guarantee checked against the soak's own ledger."""

from __future__ import annotations

import io
import os

import pytest

from ..chaos import Config, run

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(240)]


def test_chaos_soak_short(worker_kind: str) -> None:
    """300 sagas through RQ worker pools (200 through asyncio ones, whose unstoppable
    hung CRM calls hold a slot 3 s each) SIGKILLed about every 1.5 s, and one Redis
    restart: every guarantee holds against the soak's own ledger, no two tries of a
    slow step ran at once and no tool that raised a BaseException ran twice."""
    out = io.StringIO()
    sagas = 200 if worker_kind == "async" else 300
    rep = run(Config(sagas=sagas, kill_every_s=1.5, seed=7, worker_kind=worker_kind), out=out)
    print(rep.table())
    assert rep.ok, "\n".join(rep.failures)
    assert rep.doubled == 0
    assert rep.by_shape["slow"]
    assert rep.by_shape["raises"]
    assert rep.pool_kills >= 5, "too few kills to mean anything; the soak ran too fast"
    assert rep.redis_restarts == 1
    assert rep.recoveries_s, "no kill caught a saga mid-step"
    assert rep.unrecovered == 0
    assert set(rep.by_state) >= {"committed", "compensated", "needs_attention",
                                 "refused (nothing written)"}


@pytest.mark.cluster
def test_chaos_soak_on_a_cluster() -> None:
    """The log on a six-node Redis Cluster, the queues on their own Redis: pools
    SIGKILLed about every 1.5 s, one master SIGKILLed (its replica takes over),
    then back as a replica and 500 slots resharded under load: every guarantee
    holds against the soak's own ledger."""
    if os.environ.get("SAGA_TEST_BACKEND") != "cluster":
        pytest.skip("the cluster run only (SAGA_TEST_BACKEND=cluster): it starts its own")
    out = io.StringIO()
    # every process waits for a replica: the master killed takes no acknowledged append
    rep = run(Config(sagas=200, kill_every_s=1.5, seed=3, cluster=True, wait_replicas=1),
              out=out)
    print(rep.table())
    assert rep.ok, "\n".join(rep.failures)
    assert (rep.failovers, rep.reshards) == (1, 1)
    assert rep.pool_kills >= 3, "too few kills to mean anything; the soak ran too fast"
    assert set(rep.by_state) >= {"committed", "compensated", "needs_attention"}


@pytest.mark.cluster
@pytest.mark.timeout(330)
def test_chaos_soak_through_replica_lag_failovers() -> None:
    """Four times under load, a master's replica is stopped and cut off, the master
    SIGKILLed while it lags and the replica promoted, the killed node back as a
    replica (``python -m tests.chaos --cluster --master-kills 20`` is the long run),
    pools SIGKILLed meanwhile: with SAGA_WAIT_REPLICAS=1 no saga whose submit was
    acknowledged is lost, none is left short of final, every guarantee holds against
    the soak's own ledger; and the lag was real, as measured: each promoted replica
    lacked part of its master's stream, and appends were told "not confirmed"."""
    if os.environ.get("SAGA_TEST_BACKEND") != "cluster":
        pytest.skip("the cluster run only (SAGA_TEST_BACKEND=cluster): it starts its own")
    out = io.StringIO()
    # all 150 in flight from the start, so every kill is under load; pools killed
    # every ~3 s, not 1.5: a pool takes seconds to start on a loaded machine
    rep = run(Config(sagas=150, kill_every_s=3.0, seed=11, cluster=True, wait_replicas=1,
                     master_kills=4, timeout_s=240), out=out)
    print(rep.table())
    assert rep.ok, "\n".join(rep.failures)
    assert (rep.lost, rep.stranded) == (0, 0)
    assert rep.failovers == 4
    assert len(rep.lag_bytes) == 4
    assert min(rep.lag_bytes) > 0, f"a promoted replica lacked nothing: {rep.lag_bytes}"
    assert rep.unconfirmed_submits + rep.unconfirmed_logged > 0
    assert rep.waits_cut >= 1, "no master was killed with an append's WAIT under way"
    assert rep.pool_kills >= 3, "too few kills to mean anything; the soak ran too fast"
