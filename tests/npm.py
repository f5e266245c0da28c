"""npm packages the gateway tests run against (reference MCP servers, the
TypeScript SDK client): pinned, installed once into a cache under the checkout,
and skipped with the reason where npm or node is missing."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PINNED = {"server-memory": "2026.8.31", "server-everything": "2026.8.31",
          "server-filesystem": "2026.8.31", "sdk": "1.32.2"}
# the SDK client gets a cache of its own: installed beside the servers, npm would
# rearrange the copies of the SDK they depend on
CACHES = {"sdk": ROOT / ".cache" / "npm-sdk"}


def installed(name: str) -> Path:
    """The folder of ``@modelcontextprotocol/<name>`` at its pinned version."""
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("npm and node are needed for the reference-server tests (apt install npm)")
    cache = CACHES.get(name, ROOT / ".cache" / "npm")
    folder = cache / "node_modules" / "@modelcontextprotocol" / name
    if (folder / "package.json").exists():
        return folder
    cache.mkdir(parents=True, exist_ok=True)
    # test processes run side by side (pytest -n): one installs, the others wait for it
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "package.json").exists():
            subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix",
                            str(cache), f"@modelcontextprotocol/{name}@{PINNED[name]}"],
                           check=True, capture_output=True, timeout=300)
    return folder


def reference_server(name: str) -> list[str]:
    """``node`` and the entry of the npm reference server ``name``."""
    return ["node", str(installed(name) / "dist" / "index.js")]
