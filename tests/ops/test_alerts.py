"""grafana/alerts.yml: valid rules (promtool check rules), each alert firing on
the series that should raise it (promtool test rules), over metrics the code
exports, loaded by grafana/prometheus.yml."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from saga_store.ops.metrics import exported_names

GRAFANA = Path(__file__).resolve().parents[2] / "grafana"


def _promtool() -> str:
    binary = shutil.which("promtool")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is not installed; .ci/run installs Debian's prometheus")
        pytest.skip("promtool not installed (apt-get install prometheus)")
    return binary


def test_the_alerts_use_only_metrics_the_code_exports() -> None:
    used = set(re.findall(r"\bsaga_[a-z_]+", (GRAFANA / "alerts.yml").read_text()))
    assert used
    assert used <= exported_names(), sorted(used - exported_names())


def test_the_scrape_config_loads_the_alerts() -> None:
    assert "- alerts.yml" in (GRAFANA / "prometheus.yml").read_text()


@pytest.mark.parametrize("check", [["check", "rules", "alerts.yml"],
                                   ["test", "rules", "alerts_test.yml"],
                                   ["check", "config", "prometheus.yml"]])
def test_promtool_accepts_them(check: list[str]) -> None:
    done = subprocess.run([_promtool(), *check], cwd=GRAFANA, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
