"""Lease holder tokens: a holder is taken for gone only when it provably is."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from saga_store.mcp.holders import holder_gone, holder_token
from saga_store.testing import assert_eventually

BOOT_ID = "/proc/sys/kernel/random/boot_id"  # the kernel's, faked for a process below
MAKE_TOKEN = "from saga_store.mcp.holders import holder_token; print(holder_token('gateway'))"


def _token_of(pid: int) -> str:
    parts = holder_token("test").split("/")
    parts[-2] = str(pid)
    return "/".join(parts)


def test_a_running_process_and_this_one_are_not_gone() -> None:
    with subprocess.Popen(["sleep", "30"]) as proc:
        try:
            assert not holder_gone(_token_of(proc.pid))
        finally:
            proc.kill()
    assert not holder_gone(holder_token("test"))


def test_an_ended_process_is_gone_reaped_or_not() -> None:
    proc = subprocess.Popen(["true"])

    def zombie() -> bool:
        with open(f"/proc/{proc.pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    assert_eventually(zombie, timeout=10, what="the child to exit")
    assert holder_gone(_token_of(proc.pid))  # exited, not yet reaped
    proc.wait()
    assert holder_gone(_token_of(proc.pid))


def test_another_host_namespace_or_form_counts_as_alive() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    kind, host, boot, ns, pid, rand = _token_of(proc.pid).split("/")
    assert holder_gone("/".join((kind, host, boot, ns, pid, rand)))
    assert not holder_gone("/".join((kind, host + "-elsewhere", boot, ns, pid, rand)))
    assert not holder_gone("/".join((kind, host, "0" * 32, ns, pid, rand)))
    assert not holder_gone("/".join((kind, host, boot, ns + "1", pid, rand)))
    assert not holder_gone("/".join((kind, host, ns, pid, rand)))  # made before the boot id
    assert not holder_gone("a-worker-token")
    assert not holder_gone("/".join((kind, host, boot, ns, "x", rand)))


def test_a_holder_on_another_machine_of_the_same_name_is_not_gone(tmp_path: Path) -> None:
    """A holder on another machine with this one's hostname, in its first PID
    namespace (whose inode number every Linux machine shares), whose pid does not
    exist here: it is not taken for gone (the other machine is a process here that
    sees another boot id, then exits)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to show a process another boot id")
    other = tmp_path / "boot_id"
    other.write_text("0123456789abcdef0123456789abcdef\n")
    script = f'mount --bind "$1" {BOOT_ID} && exec "$2" -c "$3"'
    made = subprocess.run(["unshare", "--mount", "sh", "-c", script, "sh", str(other),
                           sys.executable, MAKE_TOKEN], capture_output=True, text=True,
                          check=True)
    token = made.stdout.strip()
    assert not os.path.exists(f"/proc/{token.split('/')[-2]}")
    assert token.split("/")[1] == os.uname().nodename
    assert not holder_gone(token)
