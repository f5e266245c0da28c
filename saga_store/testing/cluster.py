"""A private Redis Cluster for tests: six ``redis-server --cluster-enabled yes``
processes on loopback (three masters, each with a replica; AOF on, as
:class:`~saga_store.testing.RedisServer` runs them) and a standalone Redis for
RQ's queues, which cannot live on a cluster.

``with RedisClusterServers() as c: c.url, c.queue_url``
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
from typing import Any

import redis

from saga_store.testing import RedisServer, assert_eventually

NODES = 6
NODE_TIMEOUT_MS = 1000  # how soon a replica takes over a dead master


def free_cluster_port() -> int:
    """A free loopback port whose cluster bus port (10000 above it) is free too
    (and below 65536, which an ephemeral port often is not)."""
    for _ in range(200):
        port = random.randint(20000, 40000)  # a port, not a secret
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


class RedisClusterServers:
    """Six cluster nodes and a queue Redis (see the module)."""

    def __init__(self, *, appendfsync: str = "always") -> None:
        self.nodes = [RedisServer("--cluster-enabled", "yes",
                                  "--cluster-config-file", "nodes.conf",
                                  "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                                  # a replica takes over however long since it last
                                  # heard its master (an idle master pings every 10 s)
                                  "--cluster-replica-validity-factor", "0",
                                  "--repl-diskless-sync-delay", "0",  # replicas in sync now
                                  appendfsync=appendfsync) for _ in range(NODES)]
        self.queue = RedisServer(appendfsync=appendfsync)

    @property
    def url(self) -> str:
        """The log's URL (``SAGA_REDIS_URL``): every node, as a deployment would."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    @property
    def queue_url(self) -> str:
        """RQ's queues (``SAGA_QUEUE_URL``)."""
        return self.queue.url

    def start(self) -> RedisClusterServers:
        self.queue.start()  # first: a node's bus port (its port + 10000) cannot take its port
        for node in self.nodes:
            node.port = free_cluster_port()
            node.start()
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("redis-cli is not installed; apt-get install redis-tools")
        subprocess.run(  # noqa: S603  # our own argv, no shell
            [cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes),
             "--cluster-replicas", "1", "--cluster-yes"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60)
        self.wait_ok()
        return self

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every live node says the cluster is ok, agrees on three masters, and
        every live replica is in sync with its master."""
        def ok() -> bool:
            for node in self.live():
                c = _client(node)
                try:
                    if c.cluster("info")["cluster_state"] != "ok" or len(self.masters()) != 3:
                        return False
                    repl = c.info("replication")
                    if repl["role"] == "slave" and repl.get("master_link_status") != "up":
                        return False
                finally:
                    c.close()
            return True
        assert_eventually(ok, timeout=timeout, interval=0.1, what="the cluster to be ok",
                          swallow=(redis.RedisError,))

    def live(self) -> list[RedisServer]:
        return [n for n in self.nodes if n.proc is not None]

    def masters(self) -> list[RedisServer]:
        """The live nodes that serve slots now."""
        out = []
        for node in self.live():
            c = _client(node)
            try:
                info = c.execute_command("ROLE")
            finally:
                c.close()
            if info[0] in (b"master", "master") and self._has_slots(node):
                out.append(node)
        return out

    @staticmethod
    def _has_slots(node: RedisServer) -> bool:
        c = _client(node)
        try:
            myself = next(line for line in c.execute_command("CLUSTER", "NODES").decode()
                          .splitlines() if "myself" in line)
        finally:
            c.close()
        return len(myself.split()) > 8

    def flush(self) -> None:
        """Empty every master and the queue Redis (between tests)."""
        for node in self.masters():
            c = _client(node)
            try:
                c.flushall()
            finally:
                c.close()
        c = _client(self.queue)
        try:
            c.flushall()
        finally:
            c.close()

    def kill_master(self) -> RedisServer:
        """SIGKILL one master; its replica takes over (see :meth:`wait_ok`)."""
        victim = self.masters()[0]
        victim.kill()
        return victim

    def reshard(self, slots: int = 500) -> None:
        """Move ``slots`` slots from one master to another, keys and all, while
        clients keep writing."""
        cli = shutil.which("redis-cli")
        assert cli is not None
        source, target = self.masters()[:2]
        subprocess.run(  # noqa: S603  # our own argv, no shell
            [cli, "--cluster", "reshard", f"127.0.0.1:{source.port}",
             "--cluster-from", _node_id(source), "--cluster-to", _node_id(target),
             "--cluster-slots", str(slots), "--cluster-yes"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)

    def stop(self) -> None:
        for node in [*self.nodes, self.queue]:
            node.__exit__()

    def __enter__(self) -> RedisClusterServers:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _client(node: RedisServer) -> Any:
    return redis.Redis(port=node.port, socket_connect_timeout=1, socket_timeout=5,
                       decode_responses=False)


def _node_id(node: RedisServer) -> str:
    c = _client(node)
    try:
        return str(c.execute_command("CLUSTER", "MYID").decode())
    finally:
        c.close()
