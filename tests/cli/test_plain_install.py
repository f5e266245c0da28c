"""A plain ``pip install saga-store`` (no extras), in a bare virtual environment,
runs the everyday commands against a real Redis; a command that needs an extra
says which, with exit 2; and the installed CLI works from this repository's own
root, whose ``saga_store/`` folder holds neither ``cli`` nor ``workers``.

The wheel is built from this checkout and installed as a user would; pip's cache
(or its index) provides the core dependencies. Without either, the test is
skipped with pip's reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from saga_store.testing import RedisServer, assert_eventually

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]
# what the wheel is built from (a copy: the build writes build/ and *.egg-info)
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "saga_store", "cli", "workers")
# pip's words when no index or cache can provide a dependency
OFFLINE = ("No matching distribution found", "Could not find a version",
           "Failed to establish a new connection", "Temporary failure in name resolution")

TOOLS = '''
from saga_store import Reversibility, tool


@tool(reversibility=Reversibility.READONLY)
def look_up(sku: str) -> dict:
    return {"sku": sku, "in_stock": 3}


@tool(reversibility=Reversibility.IRREVERSIBLE, approval="require_approval")
def ship(sku: str) -> dict:
    return {"shipped": sku}
'''


def _pip(*args: str, cwd: Path) -> None:
    """Run pip; skip the test when no index or cache can provide a dependency."""
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode == 0:
        return
    if any(word in done.stderr for word in OFFLINE):
        pytest.skip(f"pip could not get the core dependencies (no network, no cache): "
                    f"{done.stderr.strip().splitlines()[-1]}")
    raise AssertionError(f"{' '.join(args[:3])} failed:\n{done.stdout}\n{done.stderr}")


@pytest.fixture(scope="module")
def bare() -> Iterator[Path]:
    """A virtual environment holding only ``pip install saga_store-*.whl``: its bin/."""
    work = Path(tempfile.mkdtemp(prefix="saga-plain-"))
    try:
        src = work / "src"
        src.mkdir()
        for name in SOURCES:
            (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(
                ROOT / name, src / name)
        _pip(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(work / "dist"),
             str(src), cwd=work)
        wheel = next((work / "dist").glob("saga_store-*.whl"))
        # no pip of its own (ensurepip takes longer than the install): this pip fills it
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(work / "venv")],
                       check=True)
        _pip(sys.executable, "-m", "pip", "--python", str(work / "venv" / "bin" / "python"),
             "install", "-q", str(wheel), cwd=work)
        yield work / "venv" / "bin"
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


def _env(url: str) -> dict[str, str]:
    """The environment a user's shell gives: nothing of this checkout's own."""
    keep = {k: v for k, v in os.environ.items()
            if not k.startswith(("SAGA_", "PYTHON", "VIRTUAL_ENV", "PROMETHEUS"))}
    return {**keep, "SAGA_REDIS_URL": url}


class Saga:
    """The installed ``saga``, run as a user would run it, from ``cwd``."""

    def __init__(self, bin_dir: Path, url: str, cwd: Path) -> None:
        self.exe, self.env, self.cwd = str(bin_dir / "saga"), _env(url), cwd

    def __call__(self, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([self.exe, *args], cwd=self.cwd, env=self.env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=120, check=False)
        assert done.returncode == code, (f"saga {' '.join(args)}: exit {done.returncode}\n"
                                         f"{done.stdout}\n{done.stderr}")
        return done

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([self.exe, *args], cwd=self.cwd, env=self.env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _plan(folder: Path, name: str, *steps: dict[str, Any]) -> str:
    (folder / name).write_bytes(orjson.dumps({"agent_id": "shop", "steps": list(steps)}))
    return name


def test_a_plain_install_runs_the_everyday_commands(bare: Path, server: RedisServer,
                                                    tmp_path: Path) -> None:
    """help, run, worker --burst, approve, run --wait --json, verify, ls and show work
    with no extra installed; console and mcp-guard name their extras and exit 2."""
    (tmp_path / "shop_tools.py").write_text(TOOLS)
    saga = Saga(bare, server.url, tmp_path)
    assert "worker" in saga("--help").stdout

    gated = _plan(tmp_path, "gated.json", {"tool": "look_up", "args": {"sku": "A"}},
                  {"tool": "ship", "args": {"sku": "A"}})
    sid = saga("run", gated, "--tools", "shop_tools").stdout.strip()
    saga("worker", "--tools", "shop_tools", "--burst")
    assert f"{sid} step 1: ship" in saga("approvals").stdout
    saga("approve", sid, "1", "--by", "ops")
    saga("worker", "--tools", "shop_tools", "--burst")
    assert "committed" in saga("show", sid).stdout

    # --wait: the burst worker starts once the saga is in, and drives it to the end
    plain = _plan(tmp_path, "plain.json", {"tool": "look_up", "args": {"sku": "B"}})
    waiting = saga.popen("run", plain, "--tools", "shop_tools", "--wait", "--json")
    assert_eventually(lambda: len(orjson.loads(saga("ls", "--json").stdout)) == 2,
                      timeout=30, what="the second saga to be listed")
    saga("worker", "--tools", "shop_tools", "--burst")
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, err
    assert orjson.loads(out)["state"] == "committed"

    assert "intact" in saga("verify").stdout
    listed = saga("ls").stdout
    assert sid in listed
    assert listed.count("committed") == 2

    for command, extra in ((["console"], "console"), (["mcp-guard", "--", "true"], "mcp")):
        needs = saga(*command, code=2)
        assert f"pip install 'saga-store[{extra}]'" in needs.stderr
        assert "Traceback" not in needs.stderr


def test_the_demo_runs_from_the_repository_root_on_a_real_redis(
        bare: Path, server: RedisServer) -> None:
    """Its worker processes import the installed package, not the checkout's own
    saga_store/ folder (which has no cli/ or workers/)."""
    saga = Saga(bare, server.url, ROOT)
    began = time.monotonic()
    done = saga("demo", "--workers", "1")
    assert "saga verify: intact" in done.stdout, done.stderr
    assert time.monotonic() - began < 60


def test_the_demo_runs_on_a_plain_install_without_a_redis(bare: Path, tmp_path: Path) -> None:
    """The embedded store is part of the core install."""
    saga = Saga(bare, "", tmp_path)
    del saga.env["SAGA_REDIS_URL"]
    assert "saga verify: intact" in saga("demo").stdout
