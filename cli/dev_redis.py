"""``saga dev-redis``: a throwaway Redis for trying Saga Store out.

It starts ``redis-server`` on a free loopback port (AOF on, no eviction), in a
temporary folder, prints the ``export SAGA_REDIS_URL=...`` line for it on
standard output and runs until Ctrl-C or SIGTERM; then it stops the server and
removes the folder. It never touches a Redis the machine already runs (port
6379 included), so trying things out cannot write into one.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

import click
import redis

from .common import EXIT_UNAVAILABLE, fail

INSTALL_HINT = ("redis-server is not installed (Redis 7 or newer is needed): "
                "'sudo apt-get install redis-server' on Debian or Ubuntu, "
                "'sudo dnf install redis' on Fedora, 'brew install redis' on macOS")
READY_TIMEOUT_S = 10.0


class _Stop(Exception):
    """Raised in the main thread by SIGINT or SIGTERM: stop the server, clean up."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(signum: int, frame: FrameType | None) -> None:
    # one signal is enough: a second must not cut the clean-up short
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise _Stop


def _wait_ready(proc: subprocess.Popen[bytes], port: int, folder: Path) -> None:
    """Wait until the server answers PING; fail with its log if it exits first."""
    client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.2)
    deadline = time.monotonic() + READY_TIMEOUT_S
    try:
        while True:
            if proc.poll() is not None:
                log = folder / "redis.log"
                tail = log.read_text(errors="replace")[-800:] if log.exists() else ""
                raise RuntimeError(f"redis-server exited with status {proc.returncode}:\n{tail}")
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not answer on port {port} "
                                   f"within {READY_TIMEOUT_S:.0f} s")
            time.sleep(0.05)
    finally:
        client.close()


def _shutdown(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@click.command("dev-redis")
@click.option("--port", default=0, type=click.IntRange(0, 65535), envvar="SAGA_DEV_REDIS_PORT",
              help="Port to listen on (default: a free one).")
def dev_redis(port: int) -> None:
    """Run a throwaway redis-server for trying Saga Store, until Ctrl-C.

    It listens on 127.0.0.1 on a free port, with AOF on, in a temporary
    folder, and prints the line to give other shells:

        export SAGA_REDIS_URL=redis://127.0.0.1:PORT/0

    Ctrl-C or SIGTERM stops the server and removes the folder with its data.
    Not for production: see docs/operations.md.
    """
    binary = shutil.which("redis-server")
    if binary is None:
        fail(INSTALL_HINT, EXIT_UNAVAILABLE)
    port = port or _free_port()
    folder = Path(tempfile.mkdtemp(prefix="saga-dev-redis-"))
    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    proc: subprocess.Popen[bytes] | None = None
    try:
        # our own argv, no shell: nothing untrusted reaches it
        proc = subprocess.Popen(  # noqa: S603
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
             "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
             "--maxmemory-policy", "noeviction", "--logfile", str(folder / "redis.log")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)  # Ctrl-C reaches us, and we stop it
        try:
            _wait_ready(proc, port, folder)
        except RuntimeError as exc:
            fail(str(exc), EXIT_UNAVAILABLE)
        url = f"redis://127.0.0.1:{port}/0"
        click.echo(f"export SAGA_REDIS_URL={url}")
        sys.stdout.flush()
        click.echo(f"redis-server {url} is running in {folder} (AOF on).\n"
                   "Run the line above in each shell that should use it. Ctrl-C stops the "
                   "server and removes its folder.", err=True)
        while proc.poll() is None:
            time.sleep(0.2)
        fail(f"redis-server exited on its own with status {proc.returncode}",
             EXIT_UNAVAILABLE)
    except _Stop:
        click.echo("stopping redis-server and removing its folder", err=True)
    finally:
        for sig in previous:  # a Ctrl-C now must not leave the folder behind
            signal.signal(sig, signal.SIG_IGN)
        if proc is not None:
            _shutdown(proc)
        shutil.rmtree(folder, ignore_errors=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


COMMANDS = [dev_redis]
