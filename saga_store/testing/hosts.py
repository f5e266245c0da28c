"""Several hosts on one Linux machine, for tests of workers spread over machines.

A host is a network namespace, on a bridge of a private /24 of its own, plus a
UTS namespace (its own hostname) and a PID namespace (its own process ids,
starting at 1) held open by a small init process. Everything a test starts on
a host runs in those namespaces, reaches the others and a Redis served on the
bridge (:meth:`Network.redis`) only over the bridge, and dies with the host:
:meth:`Host.kill` SIGKILLs the init, and the kernel kills the rest of its PID
namespace. :meth:`Host.partition` takes the host's link down (its packets are
dropped, as when a cable is cut: no connection is refused, they time out) and
:meth:`Host.heal` brings it back.

Needs root, ``ip`` (iproute2) and ``unshare``/``nsenter`` (util-linux);
:func:`missing` says what is missing. Names and the subnet are picked afresh
for every :class:`Network`, so runs side by side do not meet, and everything
is removed on the way out, a failed test included. Processes started here
get SIGKILL should the test process die first; the bridge names its owner
(PID namespace and pid), and what an owner that died left behind is removed
by the next :class:`Network` made in that PID namespace.

>>> with Network(2) as net, net.redis() as srv:       # doctest: +SKIP
...     a, b = net.hosts
...     a.spawn(["saga", "worker", "--tools", "myapp.tools"],
...             env={**os.environ, "SAGA_REDIS_URL": srv.url})
...     a.partition(); a.heal(); a.kill()
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import random
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from saga_store.testing import RedisServer, assert_eventually

TOOLS = ("ip", "unshare", "nsenter")
OWNER = "saga-test-owner="  # the bridge's alias: OWNER + "<pid namespace>:<pid>"
_OWNED = re.compile(r"^\d+: sgb(?P<tag>[0-9a-f]{6}): .*alias " + re.escape(OWNER) +
                    r"(?P<ns>\S+):(?P<pid>\d+)$")
PR_SET_PDEATHSIG = 1
# pid 1 of a host: names the host, says so, then reaps orphans until killed
_INIT = ("import os, socket, sys, time\n"
         "socket.sethostname(sys.argv[1])\n"
         "print('ready', flush=True)\n"
         "while True:\n"
         "    try:\n"
         "        os.wait()\n"
         "    except ChildProcessError:\n"
         "        time.sleep(0.2)\n")


def missing() -> str | None:
    """Why hosts cannot be made here (not root, a tool missing), or None."""
    if os.geteuid() != 0:
        return "not running as root"
    absent = [t for t in TOOLS if shutil.which(t) is None]
    if absent:
        return f"{', '.join(absent)} not installed (iproute2, util-linux)"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)  # noqa: S607
    if probe.returncode != 0:
        return f"ip netns does not work here: {probe.stderr.strip()}"
    return None


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the test process goes, so a test
    killed mid-run leaves no host's processes running."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(["ip", *args], capture_output=True, text=True)  # noqa: S603, S607
    if check and res.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {res.stderr.strip()}")
    return res


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.200.0.0-10.254.255.0 that no address or route here touches."""
    taken = _ip("-o", "-4", "addr").stdout + _ip("-4", "route").stdout
    rng = random.SystemRandom()
    for _ in range(100):
        net = ipaddress.IPv4Network(f"10.{rng.randint(200, 254)}.{rng.randint(0, 255)}.0/24")
        if f"{'.'.join(str(net.network_address).split('.')[:3])}." not in taken:
            return net
    raise RuntimeError("no free private /24 for the test hosts")


def _pid_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def sweep_stale() -> list[str]:
    """Remove the bridges, namespaces and links that a test process of this PID
    namespace left when it died without cleaning up; returns the bridges removed.
    (Another namespace's owner cannot be seen from here, so its are left alone.)"""
    here = _pid_ns(os.getpid())
    removed = []
    for line in _ip("-o", "link", "show", "type", "bridge").stdout.splitlines():
        m = _OWNED.match(line.strip())
        if m is None or m["ns"] != here or os.path.exists(f"/proc/{m['pid']}"):
            continue
        # the links first: a namespace deleted takes its links along, but later
        for link in _ip("-o", "link").stdout.split():
            if link.startswith(f"sgv{m['tag']}"):
                _ip("link", "del", link.split("@")[0].rstrip(":"), check=False)
        for ns in _ip("netns", "list").stdout.split():
            if ns.startswith(f"saga-{m['tag']}-"):
                _ip("netns", "del", ns, check=False)
        _ip("link", "del", f"sgb{m['tag']}", check=False)
        removed.append(f"sgb{m['tag']}")
    return removed


class Host:
    """One simulated machine: its own network, hostname and process ids."""

    def __init__(self, hostname: str, netns: str, veth: str, ip: str) -> None:
        self.hostname, self.netns, self.veth, self.ip = hostname, netns, veth, ip
        self.init_pid: int | None = None  # pid 1 of the host, as the root namespace sees it
        self._unshare: subprocess.Popen[str] | None = None
        self._pid_ns: str | None = None

    def boot(self) -> Host:
        """Start the host's init in fresh UTS and PID namespaces inside its netns."""
        # S603/S607: our own argv, no shell
        self._unshare = subprocess.Popen(  # noqa: S603
            ["ip", "netns", "exec", self.netns, "unshare", "--uts", "--pid", "--fork",  # noqa: S607
             "--mount-proc", "--kill-child", "--", sys.executable, "-c", _INIT, self.hostname],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=_die_with_parent, start_new_session=True)  # prctl only
        assert self._unshare.stdout is not None
        if self._unshare.stdout.readline().strip() != "ready":
            err = self._unshare.stderr.read() if self._unshare.stderr else ""
            raise RuntimeError(f"host {self.hostname} did not boot: {err.strip()}")
        self.init_pid = self._child_of(self._unshare.pid)
        self._pid_ns = _pid_ns(self.init_pid)
        return self

    @staticmethod
    def _child_of(pid: int) -> int:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if len(children) != 1:
            raise RuntimeError(f"unshare {pid} has children {children}, expected one")
        return int(children[0])

    @property
    def up(self) -> bool:
        """Whether the host runs (its init is alive)."""
        return self._unshare is not None and self._unshare.poll() is None

    def command(self) -> list[str]:
        """The argv prefix that runs a program on this host (in its namespaces)."""
        if not self.up or self.init_pid is None:
            raise RuntimeError(f"host {self.hostname} is not running; boot it first")
        return ["nsenter", f"--target={self.init_pid}", "--net", "--uts", "--pid", "--mount",
                f"--wd={os.getcwd()}", "--"]

    def spawn(self, argv: Sequence[str], env: Mapping[str, str] | None = None,
              out: IO[Any] | int | None = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
        """Start ``argv`` on this host in a session of its own (stdout and stderr to
        ``out``); it dies with the host, or with the test process."""
        # S603: our own argv, no shell
        return subprocess.Popen(  # noqa: S603
            [*self.command(), *argv], env=dict(env) if env is not None else None,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=_die_with_parent)  # prctl only

    def run(self, argv: Sequence[str], env: Mapping[str, str] | None = None,
            timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on this host to the end; its output captured."""
        # S603: our own argv, no shell
        return subprocess.run([*self.command(), *argv], env=dict(env) if env is not None  # noqa: S603
                              else None, capture_output=True, text=True, timeout=timeout)

    def pids(self) -> set[int]:
        """Live processes on this host (in its PID namespace), as root's pids."""
        if self._pid_ns is None:
            return set()
        out = set()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and _pid_ns(int(entry.name)) == self._pid_ns:
                with contextlib.suppress(OSError):
                    if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                        out.add(int(entry.name))
        return out

    def kill(self) -> None:
        """Crash the host: SIGKILL its init, and with it every process it runs."""
        if self._unshare is None:
            return
        if self.init_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.init_pid, signal.SIGKILL)
        self._unshare.kill()
        self._unshare.wait()
        self._unshare = None
        assert_eventually(lambda: not self.pids(), timeout=10,
                          what=f"every process on host {self.hostname} to be gone")

    def partition(self) -> None:
        """Cut the host off: its link goes down, and its packets are lost until
        :meth:`heal`."""
        _ip("link", "set", self.veth, "down")

    def heal(self) -> None:
        _ip("link", "set", self.veth, "up")


class Network:
    """A bridge and ``count`` hosts on it, named ``host-a``, ``host-b``, ...; a
    context manager that removes all of it."""

    def __init__(self, count: int = 2) -> None:
        if not 1 <= count <= 26:
            raise ValueError(f"count={count}: between 1 and 26 hosts")
        self.count = count
        self.tag = os.urandom(3).hex()
        self.bridge = f"sgb{self.tag}"
        self.subnet = _free_subnet()
        self.gateway_ip = str(self.subnet.network_address + 1)
        self.hosts: list[Host] = []
        self._bridge_made = False

    def __enter__(self) -> Network:
        reason = missing()
        if reason:
            raise RuntimeError(f"cannot make test hosts: {reason}")
        sweep_stale()
        try:
            self._make_bridge()
            for i in range(self.count):
                self._make_host(i)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _make_bridge(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        self._bridge_made = True
        _ip("link", "set", self.bridge, "alias", f"{OWNER}{_pid_ns(os.getpid())}:{os.getpid()}")
        _ip("addr", "add", f"{self.gateway_ip}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def _make_host(self, i: int) -> None:
        netns, veth, peer = f"saga-{self.tag}-{i}", f"sgv{self.tag}{i:02d}", f"sgp{self.tag}{i:02d}"
        ip = str(self.subnet.network_address + 11 + i)
        host = Host(f"host-{chr(ord('a') + i)}", netns, veth, ip)
        self.hosts.append(host)  # first, so that close() removes whatever is made
        _ip("netns", "add", netns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", netns)
        _ip("-n", netns, "link", "set", peer, "name", "eth0")
        _ip("-n", netns, "addr", "add", f"{ip}/{self.subnet.prefixlen}", "dev", "eth0")
        _ip("-n", netns, "link", "set", "eth0", "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        _ip("link", "set", veth, "master", self.bridge, "up")
        host.boot()

    @contextmanager
    def redis(self, *extra_args: str, appendfsync: str = "always") -> Iterator[RedisServer]:
        """A private redis-server on the bridge: its ``url`` is what every host uses."""
        with RedisServer(*extra_args, appendfsync=appendfsync, host=self.gateway_ip) as srv:
            yield srv

    def close(self) -> None:
        """Kill every host and remove namespaces, links and the bridge; goes on past
        failures and raises the first at the end."""
        errors: list[BaseException] = []
        for host in self.hosts:
            for undo in (host.kill, lambda h=host: _ip("link", "del", h.veth, check=False),
                         lambda h=host: _ip("netns", "del", h.netns, check=False)):
                try:
                    undo()
                except Exception as exc:  # the rest must still go
                    errors.append(exc)
        self.hosts = []
        if self._bridge_made:
            _ip("link", "del", self.bridge, check=False)
            self._bridge_made = False
        if errors:
            raise errors[0]
