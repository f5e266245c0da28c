"""The chaos soak's replica-lag failovers (``python -m tests.chaos --cluster
--master-kills 20``): one after another under load, a master's replica is made
to lag, the master is SIGKILLed while it lags, the replica is promoted, and the
killed node is started again (it rejoins as a replica of its successor).

How the lag is made, and why so: the replica is SIGSTOPped (a stalled replica: a
long fork, a VM pause, a disk that blocks) and the master then drops its link
(``CLIENT KILL TYPE replica``, what a master does itself to a replica whose
output buffer outgrows ``client-output-buffer-limit replica``, or what a
partition does). The stop alone makes every ``WAIT`` on that master time out,
but loses nothing: what the master sent sits in the replica's socket buffer and
is applied when it runs again. With the link dropped, every write from then on
is on the master only, and the SIGKILL takes it: the promoted replica is really
behind. ``DEBUG SLEEP`` is the same stop from inside (and needs the command
enabled); ``CLIENT PAUSE WRITE`` on a replica does not hold back the stream
from its master, so it makes no lag at all.

Each failover is measured, not assumed: the bytes of the master's replication
stream the promoted replica never had (the master's offset just before the kill
against the offset at which the replica took over, its ``second_repl_offset``),
whether an append's ``WAIT`` was blocked on the master when it was killed, and
whether the replica was promoted by the cluster or had to be told to take over
(``CLUSTER FAILOVER TAKEOVER``, as an operator would).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

import redis

from saga_store.testing import RedisServer, assert_eventually
from saga_store.testing.cluster import NODE_TIMEOUT_MS, RedisClusterServers

PROMOTION_S = 10 * NODE_TIMEOUT_MS / 1000  # then a takeover, as an operator would


@dataclass
class Failover:
    """What one lagged master kill did."""

    master: int  # the killed master's port
    replica: int  # the promoted replica's port
    lag_bytes: int  # of the master's stream the promoted replica never had
    wait_cut: bool  # an append's WAIT was blocked on the master when it died
    takeover: bool  # the cluster did not promote it in PROMOTION_S: told to take over
    seconds: float  # from the stop of the replica to the cluster being whole again


class LaggedFailovers:
    """``count`` replica-lag failovers on a thread of their own, back to back while
    the soak runs (see the module). ``stall_ms``: how long the replica is stopped
    at least before its master is killed (past ``SAGA_WAIT_TIMEOUT_MS``, so the
    appends on that master in the meantime are reported not confirmed)."""

    def __init__(self, servers: RedisClusterServers, count: int, stall_ms: int,
                 seed: int) -> None:
        self.servers, self.count, self.stall_ms = servers, count, stall_ms
        self.rng = random.Random(seed)
        self.done: list[Failover] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._busy = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        if not self._thread.is_alive() and not self.done:
            self._thread.start()

    @property
    def busy(self) -> bool:
        """A failover is under way (a master's indexes may be unreadable now)."""
        return self._busy.is_set()

    def join(self, timeout: float = 180) -> None:
        """No kill after this one; wait for the one under way to be whole again."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            for _ in range(self.count):
                # a moment of load on the whole cluster between two failovers
                if self._stop.wait(self.rng.uniform(0.5, 1.5)):
                    return
                self._busy.set()
                try:
                    self.done.append(self.once())
                finally:
                    self._busy.clear()
        except BaseException as exc:  # reported by the soak
            self.errors.append(exc)

    def once(self) -> Failover:
        """One lagged failover; returns when the cluster is whole again."""
        servers = self.servers
        servers.wait_ok(timeout=60)
        started = time.monotonic()
        master = self.rng.choice(servers.masters())
        replica = replica_of(servers, master)
        assert replica.proc is not None
        os.kill(replica.proc.pid, signal.SIGSTOP)
        try:
            with _client(master) as m:
                m.execute_command("CLIENT", "KILL", "TYPE", "replica")
                cut = _offset(m)
                # lag, polled: writes past the cut (on the master only); then the
                # stall held long enough for the WAITs in it to time out; then a WAIT
                # blocked at the kill, if one comes within a few seconds
                assert_eventually(lambda: _offset(m) > cut, timeout=30,
                                  what="an append on the master past its replica's cut")
                time.sleep(max(0.0, started + self.stall_ms / 1000 - time.monotonic()))
                wait_cut = _poll(lambda: _waiting(m), 3.0)
                offset = _offset(m)
            master.kill()
        finally:
            os.kill(replica.proc.pid, signal.SIGCONT)
        takeover = not _poll(lambda: _is_master(replica), PROMOTION_S)
        if takeover:
            with _client(replica) as r:
                r.execute_command("CLUSTER", "FAILOVER", "TAKEOVER")
            assert_eventually(lambda: _is_master(replica), timeout=30,
                              what=f"{replica.port} to take over", swallow=(redis.RedisError,))
        with _client(replica) as r:
            took_over_at = int(r.info("replication")["second_repl_offset"]) - 1
        servers.wait_ok(timeout=60)  # the promoted replica serves the slots
        master.start()  # its nodes.conf: back as a replica of its successor
        servers.wait_ok(timeout=90)
        return Failover(master.port, replica.port, offset - took_over_at, wait_cut, takeover,
                        time.monotonic() - started)


def replica_of(servers: RedisClusterServers, master: RedisServer) -> RedisServer:
    for node in servers.live():
        with _client(node) as c:
            role = c.execute_command("ROLE")
        if role[0] == b"slave" and int(role[2]) == master.port:
            return node
    raise AssertionError(f"no replica of {master.port}")


def _client(node: RedisServer) -> Any:
    return redis.Redis(port=node.port, socket_connect_timeout=1, socket_timeout=5)


def _offset(c: Any) -> int:
    return int(c.info("replication")["master_repl_offset"])


def _waiting(c: Any) -> bool:
    return any(cl.get("cmd") == "wait" for cl in c.client_list())


def _is_master(node: RedisServer) -> bool:
    with _client(node) as c:
        return bool(c.execute_command("ROLE")[0] == b"master")


def _poll(check: Any, seconds: float) -> bool:
    """Whether ``check`` came true within ``seconds`` (polled)."""
    try:
        assert_eventually(check, timeout=seconds, interval=0.02, swallow=(redis.RedisError,))
    except AssertionError:
        return False
    return True
