"""Lease holder tokens: a holder is taken for gone only when it provably is."""

from __future__ import annotations

import subprocess

from saga_store.mcp.holders import holder_gone, holder_token
from saga_store.testing import assert_eventually


def _token_of(pid: int) -> str:
    kind, host, ns, _, rand = holder_token("test").split("/")
    return "/".join((kind, host, ns, str(pid), rand))


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
    kind, host, ns, pid, rand = _token_of(proc.pid).split("/")
    assert not holder_gone("/".join((kind, host + "-elsewhere", ns, pid, rand)))
    assert not holder_gone("/".join((kind, host, ns + "1", pid, rand)))
    assert not holder_gone("a-worker-token")
    assert not holder_gone("/".join((kind, host, ns, "x", rand)))
