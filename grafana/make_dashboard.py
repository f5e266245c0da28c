"""Writes grafana/dashboards/saga-store.json from the panel list below, so the
queries live in one readable place (tests read them back from the JSON).

    python grafana/make_dashboard.py
"""

from __future__ import annotations

import json
from pathlib import Path

PANELS = [
    ("Steps per second by outcome", "timeseries", "ops",
     ['sum by (outcome) (rate(saga_steps_total[1m]))']),
    ("Step error ratio", "timeseries", "percentunit",
     ['sum(rate(saga_steps_total{outcome!="succeeded"}[5m])) / '
      'clamp_min(sum(rate(saga_steps_total[5m])), 1e-9)']),
    ("Step latency (worker) p50 / p95 / p99", "timeseries", "s",
     [f'histogram_quantile({q}, sum by (le) (rate(saga_step_duration_seconds_bucket[5m])))'
      for q in ("0.5", "0.95", "0.99")]),
    ("Step latency p99 by tool", "timeseries", "s",
     ['histogram_quantile(0.99, sum by (le, tool) (rate(saga_step_duration_seconds_bucket[5m])))']),
    ("Compensations per second by outcome", "timeseries", "ops",
     ['sum by (outcome) (rate(saga_compensations_total[5m]))']),
    ("Compensation lag p50 / p99 (failure to fully compensated)", "timeseries", "s",
     [f'histogram_quantile({q}, sum by (le) (rate(saga_compensation_lag_seconds_bucket[5m])))'
      for q in ("0.5", "0.99")]),
    ("Sagas finished per second by state", "timeseries", "ops",
     ['sum by (state) (rate(saga_sagas_finished_total[5m]))']),
    ("Sagas in flight, stuck, needing attention", "stat", "short",
     ['max by (state) (saga_sagas)']),
    ("Calls waiting for a person's approval", "stat", "short",
     ['max(saga_approvals_pending)']),
    ("Queue depth", "timeseries", "short", ['max by (queue) (saga_queue_depth)']),
    ("Oldest waiting job", "timeseries", "s",
     ['max by (queue) (saga_queue_oldest_job_age_seconds)']),
    ("Chain appends and CAS conflicts per second", "timeseries", "ops",
     ['sum(rate(saga_chain_appends_total[1m]))',
      'sum(rate(saga_chain_cas_conflicts_total[1m]))']),
    ("Redis reachable (0 = outage; workers back off until it returns)", "stat", "short",
     ['min(saga_redis_up)']),
    ("Chain health: verification failures (1h)", "stat", "short",
     ['sum(increase(saga_verification_failures_total[1h]))']),
    ("Deduplicated calls per second by kind", "timeseries", "ops",
     ['sum by (kind) (rate(saga_dedupe_hits_total[5m]))']),
    ("Refused jobs and redeliveries (1h)", "stat", "short",
     ['sum(increase(saga_refused_jobs_total[1h]))', 'sum(increase(saga_redeliveries_total[1h]))']),
    ("Redis durable (0 = a crash of Redis would lose acknowledged appends)", "stat", "short",
     ['min(saga_redis_durable)']),
]


def dashboard() -> dict[str, object]:
    panels = []
    for i, (title, kind, unit, exprs) in enumerate(PANELS):
        panels.append({
            "id": i + 1, "title": title, "type": kind,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": 12, "x": (i % 2) * 12, "y": (i // 2) * 8},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{"refId": chr(65 + j), "expr": e, "legendFormat": "__auto"}
                        for j, e in enumerate(exprs)],
        })
    return {
        "uid": "saga-store", "title": "Saga Store", "schemaVersion": 39, "version": 1,
        "tags": ["saga-store"], "time": {"from": "now-1h", "to": "now"}, "refresh": "10s",
        "templating": {"list": [{"name": "datasource", "type": "datasource",
                                 "query": "prometheus", "current": {}}]},
        "panels": panels,
    }


if __name__ == "__main__":
    out = Path(__file__).parent / "dashboards" / "saga-store.json"
    out.write_text(json.dumps(dashboard(), indent=2) + "\n")
