"""Helpers for testing code built on Saga Store (and for Saga Store's own tests).

``RedisServer`` runs a private ``redis-server`` on a free loopback port with
AOF on, in a temporary directory, and removes it afterwards: tests never touch
the Redis a user already runs. ``saga_store.testing.hosts`` runs processes on
several simulated hosts (Linux network namespaces) that share one such server.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import redis

T = TypeVar("T")


def ctrl_c_reaches_it() -> None:
    """``preexec_fn`` for a child that a test stops with SIGINT, as Ctrl-C at a
    terminal would: a shell runs background jobs with SIGINT ignored, the child
    inherits that, and Python then installs no handler for it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A private redis-server process. ``with RedisServer() as srv: srv.url``

    ``host``: an address to listen on besides loopback (and the one ``url``
    names), for clients in other network namespaces; protected mode is then
    off, since those clients are not local to it."""

    def __init__(self, *extra_args: str, appendfsync: str = "always",
                 host: str = "127.0.0.1") -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed; apt-get install redis-server")
        self.binary = binary
        self.extra = list(extra_args)
        self.appendfsync = appendfsync
        self.host = host
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="saga-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def start(self) -> RedisServer:
        args = [self.binary, "--port", str(self.port), "--bind", *self._bind(),
                "--dir", str(self.dir), "--appendonly", "yes",
                "--appendfsync", self.appendfsync, "--save", "",
                "--logfile", str(self.dir / "redis.log"), *self.extra]
        # our own argv and no shell: nothing untrusted reaches it
        self.proc = subprocess.Popen(  # noqa: S603  # our own argv, no shell
            args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        client = redis.Redis(host=self.host, port=self.port, socket_connect_timeout=0.2)
        try:
            assert_eventually(lambda: client.ping(), timeout=10, what="redis-server to answer",
                              swallow=(redis.ConnectionError,))
        finally:
            client.close()
        return self

    def _bind(self) -> list[str]:
        if self.host == "127.0.0.1":
            return ["127.0.0.1"]
        return [self.host, "127.0.0.1", "--protected-mode", "no"]

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def assert_eventually(check: Callable[[], T], *, timeout: float = 10.0, interval: float = 0.01,
                      what: str = "condition", swallow: tuple[type[BaseException], ...] = (),
                      ) -> T:
    """Call ``check`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            result = check()
            if result:
                return result
            last = result
        except swallow as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")
        time.sleep(interval)
