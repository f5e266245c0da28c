"""The systemd units of docs/operations.md pass 'systemd-analyze verify', and the
anchor's unit gives it the folder it writes to."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "operations.md"
SAGA = "/srv/myapp/.venv/bin/saga"


def units() -> dict[str, str]:
    """Each unit of the doc's ini blocks, by file name (a block may hold two)."""
    found: dict[str, str] = {}
    for block in re.findall(r"```ini\n(.*?)```", DOC.read_text(), re.S):
        for part in re.split(r"^# /etc/systemd/system/", block, flags=re.M)[1:]:
            name, _, body = part.partition("\n")
            found[name.strip()] = body
    return found


def test_the_doc_has_the_units_the_recipe_enables() -> None:
    assert set(units()) >= {"saga-worker.service", "saga-console.service",
                            "saga-anchor.service", "saga-anchor.timer"}


def test_the_anchor_unit_makes_the_folder_it_writes_to() -> None:
    anchor = units()["saga-anchor.service"]
    assert "StateDirectory=saga" in anchor
    assert "--out /var/lib/saga/" in anchor
    assert "useradd --system" in DOC.read_text()


def test_the_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    # the units name the app's own install; a stand-in takes its place here
    stand_in = tmp_path / "saga"
    stand_in.write_text("#!/bin/sh\nexit 0\n")
    stand_in.chmod(0o755)
    paths = []
    for name, body in units().items():
        path = tmp_path / name
        path.write_text(body.replace(SAGA, str(stand_in)))
        paths.append(str(path))
    done = subprocess.run([analyze, "verify", "--man=no", *paths], capture_output=True,
                          text=True, timeout=60, check=False)
    # a unit it names that this machine lacks (redis-server.service) is not the doc's fault
    problems = [ln for ln in (done.stdout + done.stderr).splitlines()
                if ln.strip() and "redis-server.service" not in ln]
    assert not problems, "\n".join(problems)
