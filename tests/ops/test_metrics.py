"""Metrics: the names the code exports, a real scrape of a worker pool, and every
dashboard query run against a real Prometheus."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import redis
from rq.queue import Queue
from rq.serializers import JSONSerializer

from saga_store.client.api import SagaStore
from saga_store.execution import jobs
from saga_store.execution.enqueue import enqueue_step
from saga_store.ops.metrics import exported_names
from saga_store.settings import Settings
from saga_store.testing import assert_eventually, free_port
from saga_store.testing.workers import workers

DASHBOARD = Path(__file__).resolve().parents[2] / "grafana" / "dashboards" / "saga-store.json"
TOOLS = "tests.ledger_tools"
CARD = "4111111111111111"
LONG_LEASE_MS = 60_000


def dashboard_exprs() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in board["panels"] for t in p["targets"]]


def test_the_dashboard_only_uses_metrics_the_code_exports() -> None:
    names = exported_names()
    used = {m for e in dashboard_exprs() for m in re.findall(r"\bsaga_[a-z_]+", e)}
    assert used
    assert used <= names, f"dashboard uses unknown metrics: {sorted(used - names)}"


def _workload(store: SagaStore, client: redis.Redis) -> list[str]:
    ok = store.submit([{"tool": "reserve_inventory", "args": {"sku": "A", "qty": 1}},
                       {"tool": "charge_payment",
                        "args": {"amount_cents": 5, "card_number": CARD}}], agent_id="m")
    bad = store.submit([{"tool": "reserve_inventory", "args": {"sku": "B", "qty": 1}},
                        {"tool": "fail_always", "args": {}}], agent_id="m")
    for sid in (ok, bad):
        store.wait(sid, timeout=60)
    # the counts the tests expect need this course of events: say so if it went otherwise
    ran = [(s.status, s.compensation) for s in store.state(bad).steps.values()]
    assert ran == [("succeeded", "succeeded"), ("failed", None)], ran
    st = store.state(ok)
    enqueue_step(client, jobs.STEP_QUEUE, ok, 0, st.steps[0].intent_seq, st.steps[0].idem_key)
    Queue(jobs.STEP_QUEUE, connection=client, serializer=JSONSerializer).enqueue(
        "os.system", "true")
    return [ok, bad]


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return str(r.read().decode())


@pytest.mark.real_redis
@pytest.mark.timeout(120)
def test_a_worker_pool_exports_one_endpoint_without_ids(
        saga_store: SagaStore, client: redis.Redis, worker_env: dict[str, str],
        ledger: Path, worker_kind: str) -> None:
    port = free_port()
    # a counter moves just after the append it counts, so it may trail the log for a
    # moment (the chaos soak allows the same); the test waits for the exact counts,
    # and a count that overshoots or never arrives still fails it. The exact counts
    # need a lease longer than the test: with the suite's 1 s lease, a loaded machine
    # that starts the workers late has the sweeper redeliver the first steps, rightly,
    # and each redelivery is one more duplicate delivery
    store = SagaStore(client, saga_store.registry, Settings(lease_ms=LONG_LEASE_MS),
                      queues=saga_store.queues)
    env = {**worker_env, "SAGA_LEASE_MS": str(LONG_LEASE_MS)}
    expected = ['saga_steps_total{outcome="succeeded",tool="reserve_inventory"} 2.0',
                'saga_steps_total{outcome="failed",tool="fail_always"} 1.0',
                'saga_compensations_total{outcome="succeeded",tool="release_inventory"} 1.0',
                'saga_sagas_finished_total{state="compensated"} 1.0',
                "saga_compensation_lag_seconds_count 1.0",
                "saga_refused_jobs_total 1.0",
                'saga_dedupe_hits_total{kind="duplicate_delivery"} 1.0',
                "saga_redeliveries_total 0.0",
                'saga_queue_depth{queue="saga-steps"}',
                "saga_approvals_pending 0.0"]
    seen: list[str] = []
    with workers(env, TOOLS, "-n", "2", "--metrics-port", str(port)):
        ids = _workload(store, client)

        def ready() -> str | None:
            t = _scrape(port)
            seen[:] = [t]
            return t if all(e in t for e in expected) else None
        try:
            text = assert_eventually(ready, timeout=30, what="the workload's metrics",
                                     swallow=(OSError,))
        except AssertionError:
            text = seen[0] if seen else ""
    counts = [line for line in text.splitlines() if line.startswith(
        ("saga_steps_total", "saga_dedupe", "saga_sagas_finished", "saga_redeliveries",
         "saga_refused", "saga_compensations_total"))]
    assert [e for e in expected if e not in text] == [], "; ".join(counts)
    for sid in ids:
        assert sid not in text  # no ids as labels
    assert CARD not in text


@pytest.mark.real_redis
@pytest.mark.timeout(180)
def test_every_dashboard_query_returns_data_from_a_real_prometheus(
        saga_store: SagaStore, client: redis.Redis, worker_env: dict[str, str],
        ledger: Path, tmp_path: Path) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus is not installed; .ci/run installs Debian's package")
        pytest.skip("prometheus not installed (apt-get install prometheus)")
    metrics_port, prom_port = free_port(), free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                   "scrape_configs:\n  - job_name: saga\n    static_configs:\n"
                   f"      - targets: ['127.0.0.1:{metrics_port}']\n")
    prom = subprocess.Popen([binary, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path}/db",
                             f"--web.listen-address=127.0.0.1:{prom_port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with workers(worker_env, TOOLS, "-n", "2", "--metrics-port", str(metrics_port)):
            _workload(saga_store, client)
            api = f"http://127.0.0.1:{prom_port}/api/v1/query?query="

            def query(expr: str) -> dict[str, object]:
                # S310: an http(s) URL the operator configured
                with urllib.request.urlopen(api + urllib.parse.quote(expr),  # noqa: S310
                                            timeout=5) as r:
                    return dict(json.loads(r.read()))
            # index: JSON from the server
            assert_eventually(lambda: query("saga_refused_jobs_total")["data"]["result"],  # type: ignore[index]
                              timeout=60, what="prometheus to scrape the workers",
                              swallow=(OSError,))
            def empty_queries() -> list[str]:
                empty = []
                for expr in dashboard_exprs():
                    res = query(expr)
                    assert res["status"] == "success", (expr, res)  # it parses and runs
                    if not res["data"]["result"]:  # type: ignore[index]  # JSON from the server
                        empty.append(expr)
                return empty
            # rate() needs two samples of a series: wait for the scrapes, bounded
            empty: list[list[str]] = [[]]

            def all_answer() -> bool:
                empty[0] = empty_queries()
                return not empty[0]
            try:
                assert_eventually(all_answer, timeout=60,
                                  what="every dashboard query to return data")
            except AssertionError:
                # what Prometheus holds and what the endpoint serves, for the first one
                name = re.findall(r"saga_[a-z_]+", empty[0][0])[0]
                held = query(name)["data"]["result"]  # type: ignore[index]  # JSON from the server
                served = [ln for ln in _scrape(metrics_port).splitlines()
                          if ln.startswith(name)]
                raise AssertionError(f"queries with no data: {empty[0]}; Prometheus holds "
                                     f"{held}; the endpoint serves {served}") from None
    finally:
        prom.terminate()
        prom.wait(10)


@pytest.mark.real_redis
def test_the_approvals_gauge_counts_what_waits_for_a_person(client: redis.Redis) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from saga_store.approval import requests as approvals
    from saga_store.log.layout import names_of
    from saga_store.ops.metrics import RedisCollector
    reg = CollectorRegistry()
    reg.register(RedisCollector(client))
    assert "saga_approvals_pending 0.0" in generate_latest(reg).decode()
    names = names_of(client)
    for sid, step in (("01M8Q7MTHMG2KCVRH5MMK3YGPB", 2), ("01M8Q7MTHMG2KCVRH5MMK3YGPC", 0)):
        client.zadd(names.approvals(sid), {approvals.member(sid, step): 1e15})
    text = generate_latest(reg).decode()
    assert "saga_approvals_pending 2.0" in text
    assert 'saga_sagas{state="needs_attention"} 0.0' in text  # the others still line up


@pytest.mark.real_redis
@pytest.mark.timeout(120)
def test_a_fresh_worker_exports_every_labelled_series_at_zero(
        worker_env: dict[str, str], ledger: Path) -> None:
    """Before any saga: each tool's outcomes, each compensation's, each dedupe kind
    and final state are there at 0, so every panel has data from the first scrape."""
    port = free_port()
    expected = ['saga_steps_total{outcome="succeeded",tool="reserve_inventory"} 0.0',
                'saga_steps_total{outcome="in_doubt",tool="charge_payment"} 0.0',
                'saga_step_duration_seconds_count{tool="reserve_inventory"} 0.0',
                'saga_compensations_total{outcome="failed",tool="release_inventory"} 0.0',
                'saga_dedupe_hits_total{kind="repeated_call"} 0.0',
                *(f'saga_sagas_finished_total{{state="{s}"}} 0.0'
                  for s in ("committed", "compensated", "needs_attention"))]
    seen = [""]
    with workers(worker_env, TOOLS, "--metrics-port", str(port)):
        def ready() -> bool:
            seen[0] = _scrape(port)
            return all(e in seen[0] for e in expected)
        try:
            assert_eventually(ready, timeout=30, what="the series at 0", swallow=(OSError,))
        except AssertionError:
            missing = [e for e in expected if e not in seen[0]]
            raise AssertionError(f"missing from a fresh worker's /metrics: {missing}") from None


@pytest.mark.real_redis
@pytest.mark.timeout(120)
def test_a_compensation_that_goes_stuck_uncalled_counts_as_failed(
        saga_store: SagaStore, worker_env: dict[str, str]) -> None:
    """Its mapping finds nothing to undo with, so the saga is stuck without a call:
    saga_compensations_total{outcome="failed"} counts it all the same."""
    port = free_port()
    want = 'saga_compensations_total{outcome="failed",tool="release_inventory"} 1.0'
    with workers(worker_env, TOOLS, "--metrics-port", str(port)):
        sid = saga_store.submit([{"tool": "reserve_forgetful", "args": {"sku": "B"}},
                                 {"tool": "fail_always", "args": {}}], agent_id="m")
        state = saga_store.wait(sid, timeout=60)
        assert state.status == "stuck", state.status
        assert_eventually(lambda: want in _scrape(port), timeout=30,
                          what="the failed compensation's count", swallow=(OSError,))


@pytest.mark.real_redis
@pytest.mark.timeout(120)
def test_a_worker_killed_as_it_made_its_metrics_file_does_not_break_the_scrape(
        saga_store: SagaStore, worker_env: dict[str, str], ledger: Path,
        tmp_path: Path) -> None:
    """A worker SIGKILLed right after it created its multiprocess file leaves the
    file empty (the header not yet written). The pool's /metrics still answers, with
    the live workers' counters, instead of failing every scrape from then on."""
    port, files = free_port(), tmp_path / "prometheus"
    files.mkdir()
    (files / "counter_4194304.db").touch()  # what that kill leaves behind
    env = {**worker_env, "PROMETHEUS_MULTIPROC_DIR": str(files)}
    with workers(env, TOOLS, "-n", "2", "--metrics-port", str(port)):
        sid = saga_store.submit([{"tool": "reserve_inventory", "args": {"sku": "A", "qty": 1}}],
                                agent_id="agent-m")
        saga_store.wait(sid, timeout=30)

        def counted() -> str | None:
            text = _scrape(port)
            return text if 'tool="reserve_inventory"} 1.0' in text else None
        text = assert_eventually(counted, timeout=30, what="the step counted",
                                 swallow=(OSError,))
    assert 'saga_steps_total{outcome="succeeded",tool="reserve_inventory"} 1.0' in text
