"""Worker processes for tests: real ``saga worker`` processes in their own
process group, killed (SIGKILL, the whole group) when the test is done.

``SAGA_TEST_WORKER_KIND`` in the test process's environment picks the kind of
worker every helper here starts: ``rq`` (the default) or ``async`` (``--async
--concurrency 4`` added to the arguments, unless they name their own). A test
that runs against both kinds takes the ``worker_kind`` fixture, which sets it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

KIND_VAR = "SAGA_TEST_WORKER_KIND"
KINDS = ("rq", "async")
ASYNC_CONCURRENCY = 4
ASYNC_ARGS = ("--async", "--concurrency", str(ASYNC_CONCURRENCY))


def worker_kind() -> str:
    """The kind of worker the helpers start: ``rq`` or ``async``."""
    kind = os.environ.get(KIND_VAR) or "rq"
    if kind not in KINDS:
        raise ValueError(f"{KIND_VAR}={kind!r}: expected one of {', '.join(KINDS)}")
    return kind


class WorkerProcess:
    """``saga worker`` in a process group of its own. ``prefix``: an argv that runs
    it elsewhere, such as :meth:`saga_store.testing.hosts.Host.command` (another
    host's namespaces)."""

    def __init__(self, env: Mapping[str, str], tools: str, *args: str,
                 log: Path | None = None, kind: str | None = None,
                 prefix: Sequence[str] = ()) -> None:
        self.kind = kind or worker_kind()
        if self.kind == "async" and "--async" not in args:
            args = (*args, *ASYNC_ARGS)
        # -P: a checkout's saga_store/ folder never shadows the installed package
        self.cmd = [*prefix, sys.executable, "-P", "-m", "saga_store.cli.main", "worker",
                    "--tools", tools, *args]
        self.env = dict(env)
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        # SIM115: the file outlives this call: the child writes to it
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115
        # S603: our own argv, no shell
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=out,  # noqa: S603
                                     stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def pids(self) -> set[int]:
        """Live processes of this worker's group (the pool and its workers)."""
        return group_pids(self.proc.pid) if self.proc is not None else set()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the worker's whole process group (pool, workers, anything forked)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM (a warm shutdown) and wait for the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


def group_pids(pgid: int) -> set[int]:
    """Live (not zombie) processes in a process group, read from /proc."""
    out = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.add(int(entry.name))
    return out


@contextmanager
def workers(env: Mapping[str, str], tools: str, *args: str, count: int = 1,
            log: Path | None = None, kind: str | None = None,
            ) -> Iterator[list[WorkerProcess]]:
    procs = [WorkerProcess(env, tools, *args, log=log, kind=kind).start()
             for _ in range(count)]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()


def kill_at(env: Mapping[str, str], tools: str, point: str, flag_dir: Path, at: int = 1,
            timeout: float = 30, kind: str | None = None) -> None:
    """Run a worker with a fault at ``point`` (its ``at``-th occurrence) until the
    worker kills itself there; fails if it died anywhere else or never."""
    from saga_store.testing import assert_eventually
    flag = Path(flag_dir) / f"fault-{point}-{at}"
    flag.touch()
    worker = WorkerProcess({**env, "SAGA_FAULT": point, "SAGA_FAULT_AT": str(at),
                            "SAGA_FAULT_ONCE": str(flag)}, tools, "--log-level",
                           "WARNING", kind=kind).start()
    try:
        assert_eventually(lambda: not worker.alive, timeout=timeout,
                          what=f"the worker to die at {point}")
    finally:
        worker.kill()
    if flag.exists():
        raise AssertionError(f"the worker died, but not at {point}")
