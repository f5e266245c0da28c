"""The simulated hosts of ``saga_store.testing.hosts``: each its own hostname, PID
namespace and address, reaching the bridge and nothing else; killed whole,
partitioned and healed; and gone without a trace, even after a test process
that made them was killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from saga_store.testing import assert_eventually
from saga_store.testing.hosts import Network, missing, sweep_stale

pytestmark = pytest.mark.timeout(60)
PING = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 2)"
LISTEN = ("import socket, time; s = socket.socket(); s.bind(('0.0.0.0', 7000)); s.listen(); "
          "time.sleep(60)")


@pytest.fixture(autouse=True)
def _needs_namespaces() -> None:
    reason = missing()
    if reason:
        pytest.skip(f"needs root and ip netns: {reason}")


def reaches(net: Network, i: int, ip: str, port: int) -> bool:
    return net.hosts[i].run([sys.executable, "-c", PING, ip, str(port)]).returncode == 0


def leftovers(tag: str) -> list[str]:
    names = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    names += subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [w for w in names.split() if tag in w]


def test_hosts_have_their_own_names_pids_and_network_and_reach_only_the_bridge() -> None:
    """Two hosts: their own hostnames, each its own PID 1, and a Redis on the bridge
    that both reach; the machine's own address they do not reach, and a host
    partitioned reaches nothing until healed. Each host's loopback is its own."""
    with Network(2) as net, net.redis() as srv:
        a, b = net.hosts
        assert [h.run(["hostname"]).stdout.strip() for h in (a, b)] == ["host-a", "host-b"]
        inits = [h.run(["cat", "/proc/1/cmdline"]).stdout for h in (a, b)]
        assert all("sethostname" in c for c in inits)
        assert a.run(["readlink", "/proc/self/ns/pid"]).stdout != \
            b.run(["readlink", "/proc/self/ns/pid"]).stdout
        assert reaches(net, 0, net.gateway_ip, srv.port)
        a.spawn([sys.executable, "-c", LISTEN])
        assert_eventually(lambda: reaches(net, 1, a.ip, 7000), timeout=10,
                          what="host B to reach host A's listener")
        assert not reaches(net, 1, "127.0.0.1", 7000)  # B's loopback is B's own
        assert not reaches(net, 0, "127.0.0.1", srv.port)  # Redis is on the machine's
        outside = subprocess.run(["hostname", "-I"], capture_output=True, text=True)
        for ip in outside.stdout.split():
            if ":" not in ip and ip != net.gateway_ip:
                assert not reaches(net, 0, ip, srv.port), f"host A reached {ip}"
        a.partition()
        assert not reaches(net, 0, net.gateway_ip, srv.port)
        a.heal()  # the link is up at once; the first packets may wait on ARP again
        assert_eventually(lambda: reaches(net, 0, net.gateway_ip, srv.port), timeout=15,
                          what="host A to reach the Redis again once healed")


def test_a_host_killed_whole_leaves_no_process() -> None:
    """Kill a host: every process it ran is gone, a grandchild in a session of its
    own included; the other host runs on."""
    with Network(2) as net:
        a, b = net.hosts
        a.spawn(["sh", "-c", "setsid sleep 300 & sleep 300"])
        b.spawn(["sleep", "300"])  # spawn returns before the process is on its host
        assert_eventually(lambda: len(a.pids()) >= 3, timeout=15, what="host A's processes")
        assert_eventually(lambda: len(b.pids()) >= 2, timeout=15, what="host B's process")
        a.kill()
        assert a.pids() == set()
        assert len(b.pids()) >= 2


def test_what_a_killed_test_process_left_is_removed_by_the_next_network() -> None:
    """A test process SIGKILLed with its hosts up: its hosts' processes die with it,
    and the next Network removes its bridge, namespaces and links."""
    code = ("import os, signal; from saga_store.testing.hosts import Network; "
            "net = Network(2).__enter__(); print(net.tag, flush=True); "
            "os.kill(os.getpid(), signal.SIGKILL)")
    made = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert made.returncode == -signal.SIGKILL
    tag = made.stdout.strip()
    assert leftovers(tag), "the killed process made no hosts"
    assert not [p for p in os.listdir("/proc") if p.isdigit() and tag in _cmdline(p)]
    assert f"sgb{tag}" in sweep_stale()
    assert leftovers(tag) == []


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""
