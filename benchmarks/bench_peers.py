"""The peer workload (bench_workflows: N concurrent 5-step workflows of 10 ms waits,
20% or none failing at step 3 and compensating the two steps done) on Saga Store and
on other durable-execution engines, in interleaved rounds (A B C D E, E D C B A, ...),
the same plans for every engine in a round:

- Saga Store, its Redis with ``appendfsync everysec`` (the default we document) and
  ``appendfsync always`` (an fsync per write, the durability of the peers below);
  one Redis and one set of workers, switched with CONFIG SET between runs; the
  driver submits all N at once with ``submit_many`` (one pipelined round trip), as
  the drivers below fire all N requests at once;
- Restate: restate-server from npm (installed into .cache/npm-restate on first run),
  the workflow a service of the Python SDK (benchmarks/peers/restate_app.py) under
  hypercorn, invoked through the ingress over HTTP, all N in flight;
- DBOS on the local PostgreSQL (a database of its own, dropped after), the workflow
  a DBOS workflow of steps (benchmarks/peers/dbos_app.py), all N started at once;
- the in-memory asyncio engine of bench_workflows (no durability).

CPU per workflow counts every process involved: the engine's servers (redis-server,
restate-server, the PostgreSQL backends of the run's database and the server's own
background processes), workers or service processes, and this driver.

    make bench-peers                        # 3 rounds, n=50 and n=500
    python -m benchmarks.bench_peers --quick   # 1 round, n=50
    python -m benchmarks.bench_peers --rounds 5 --n 50 500 --engines restate dbos

An engine that cannot start (no npm, no PostgreSQL, the ``peers`` extra missing) is
skipped with its reason printed; the others still run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from saga_store.testing import free_port
from saga_store.testing.workers import group_pids

from .bench_workflows import (
    IO_MS,
    STEPS,
    WORKERS,
    cpu_s,
    durable,
    memory_run,
    plans,
    summarize,
    yardstick,
)
from .common import machine

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(__file__).parent / "out"
NPM_CACHE = Path(os.environ.get("RESTATE_NPM_DIR", ROOT / ".cache" / "npm-restate"))
RESTATE_VERSION = os.environ.get("RESTATE_SERVER_VERSION", "1.7.12")  # the version tested
PG_URL = os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432")
BASE = "saga-store everysec"  # what the ratios are to
PEERS_EXTRA = "pip install -e '.[peers]' (make bench-peers does)"


class Skip(Exception):
    """An engine that cannot run here; the message says why."""


def _missing(*modules: str) -> str | None:
    gone = [m for m in modules if importlib.util.find_spec(m) is None]
    return f"python package(s) {', '.join(gone)} missing: {PEERS_EXTRA}" if gone else None


def _wait_for(check: Callable[[], bool], timeout: float, what: str,
              proc: subprocess.Popen[bytes] | None = None, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-800:] if log and log.exists() else ""
            raise Skip(f"{what}: the process exited ({proc.returncode}): {tail}")
        with contextlib.suppress(OSError, ValueError):
            if check():
                return
        time.sleep(0.1)
    raise Skip(f"{what}: no answer in {timeout:.0f} s")


def _http(method: str, url: str, body: Any = None, timeout: float = 10) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,  # noqa: S310  # loopback
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _stop(proc: subprocess.Popen[bytes] | None, group: bool = False) -> None:
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        if group:
            os.killpg(proc.pid, 15)
        else:
            proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9) if group else proc.kill()
        proc.wait()


def _cpu_by(pids: dict[str, set[int]]) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for kind, ps in pids.items():
        out[kind] = {p: cpu_s({p}) for p in ps}
    return out


def _cpu_rows(before: dict[str, dict[int, float]], after_pids: dict[str, set[int]],
              n: int) -> dict[str, float]:
    """CPU ms per workflow by process kind; a process born during the run counts whole."""
    row = {}
    for kind, ps in after_pids.items():
        was = before.get(kind, {})
        row[f"cpu_ms_{kind}"] = sum(cpu_s({p}) - was.get(p, 0.0) for p in ps) * 1000 / n
    row["cpu_ms_total"] = sum(row.values())
    return row


# -- the engines --------------------------------------------------------------

class Engine:
    name = ""
    durability = ""

    def start(self) -> None: ...

    def measure(self, fails: list[bool]) -> dict[str, float]:
        raise NotImplementedError

    def close(self) -> None: ...


class SagaStoreEngine(Engine):
    """Both fsync settings share one Redis and one set of workers: ``appendfsync`` is
    set (CONFIG SET) before each run, so the two differ in nothing else."""

    shared: ClassVar[dict[str, Any]] = {}  # by worker kind: the Durable both settings use
    _stacks: ClassVar[dict[str, contextlib.ExitStack]] = {}

    def __init__(self, appendfsync: str, workers: int, kind: str = "rq") -> None:
        self.appendfsync, self.workers, self.kind = appendfsync, workers, kind
        self.name = f"saga-store {appendfsync}" + (" async" if kind == "async" else "")

    def start(self) -> None:
        if self.kind not in SagaStoreEngine.shared:
            if shutil.which("redis-server") is None:
                raise Skip("redis-server is not installed (apt-get install redis-server)")
            stack = contextlib.ExitStack()
            made: list[Path] = []  # the Redis's directory, removed once it has stopped
            stack.callback(lambda: [shutil.rmtree(d, ignore_errors=True) for d in made])
            SagaStoreEngine.shared[self.kind] = stack.enter_context(
                durable(self.workers, self.kind))
            made.append(SagaStoreEngine.shared[self.kind].srv.dir)
            SagaStoreEngine._stacks[self.kind] = stack
        r = SagaStoreEngine.shared[self.kind].store.redis
        r.config_set("appendfsync", self.appendfsync)
        got = r.config_get("appendfsync")
        aof = r.config_get("appendonly")
        when = {"everysec": "fsync once a second, after the reply: a crash of the machine "
                            "can lose the last second of acknowledged events",
                "always": "fsync before the reply (writes of one event-loop turn share an "
                          "fsync): acknowledged events survive a crash of the machine"}
        self.durability = (f"Redis AOF appendonly={aof.get('appendonly')}, appendfsync="
                           f"{got.get('appendfsync')}: {when.get(self.appendfsync, '')}")

    def measure(self, fails: list[bool]) -> dict[str, float]:
        d = SagaStoreEngine.shared[self.kind]
        d.store.redis.config_set("appendfsync", self.appendfsync)
        row = d.measure(fails, batch=True)  # all at once, as the peers' drivers do
        row["cpu_ms_total"] = sum(v for k, v in row.items() if k.startswith("cpu_ms_"))
        return row

    def close(self) -> None:
        stack = SagaStoreEngine._stacks.pop(self.kind, None)
        if stack is not None:
            stack.close()
            SagaStoreEngine.shared.pop(self.kind, None)


class MemoryEngine(Engine):
    name = "in-memory"
    durability = "none: asyncio in one process, nothing written"

    def measure(self, fails: list[bool]) -> dict[str, float]:
        me = {os.getpid()}
        was = cpu_s(me)
        row = summarize(*memory_run(fails))
        row["cpu_ms_driver"] = (cpu_s(me) - was) * 1000 / len(fails)
        row["cpu_ms_total"] = row["cpu_ms_driver"]
        return row


def restate_binary() -> Path:
    """restate-server as its npm package ships it: @restatedev/restate-server runs the
    binary of an optional dependency for the platform, which is the one we start (so
    its CPU is the server's, without a node wrapper in between)."""
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower(), platform.machine().lower())
    osname = {"linux": "linux", "darwin": "darwin"}.get(sys.platform, sys.platform)
    binary = (NPM_CACHE / "node_modules" / "@restatedev" / f"restate-server-{osname}-{arch}"
              / "bin" / "restate-server")
    if os.environ.get("RESTATE_SERVER_BIN"):
        return Path(os.environ["RESTATE_SERVER_BIN"])
    if binary.exists():
        return binary
    npm = shutil.which("npm")
    if npm is None:
        raise Skip("npm is not installed, so restate-server cannot be installed "
                   "(apt-get install npm, or set RESTATE_SERVER_BIN)")
    NPM_CACHE.mkdir(parents=True, exist_ok=True)
    print(f"installing @restatedev/restate-server@{RESTATE_VERSION} into {NPM_CACHE} ...",
          file=sys.stderr, flush=True)
    # no install scripts: the binary is a plain file of the platform's package
    done = subprocess.run([npm, "install", "--prefix", str(NPM_CACHE), "--no-audit",
                           "--no-fund", "--ignore-scripts",
                           f"@restatedev/restate-server@{RESTATE_VERSION}"],
                          capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0 or not binary.exists():
        raise Skip(f"npm install of restate-server failed ({done.returncode}): "
                   f"{(done.stderr or done.stdout)[-600:]}")
    return binary


class Http11:
    """A small keep-alive HTTP/1.1 client for the ingress: one connection per request
    in flight, reused after. A general client library (httpx) cost this driver more
    CPU per workflow than Saga Store's whole driver; this one costs what a request and
    a reply take, so the CPU counted for Restate is mostly Restate's."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def post_json(self, path: str, body: Any) -> Any:
        conn = self.idle.pop() if self.idle else await asyncio.open_connection(
            "127.0.0.1", self.port, limit=1 << 20)
        reader, writer = conn
        data = json.dumps(body).encode()
        writer.write(f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{self.port}\r\n"
                     "content-type: application/json\r\naccept: application/json\r\n"
                     f"content-length: {len(data)}\r\n\r\n".encode() + data)
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split()[1])
        headers = dict(h.lower().split(": ", 1) for h in head[1:] if ": " in h)
        if "content-length" in headers:
            payload = await reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            payload = b""
            while size := int((await reader.readuntil(b"\r\n")).strip().split(b";")[0], 16):
                payload += await reader.readexactly(size)
                await reader.readexactly(2)
            await reader.readuntil(b"\r\n")
        else:
            raise RuntimeError(f"restate ingress: a reply without a length: {head}")
        if headers.get("connection", "").lower() == "close":
            writer.close()
        else:
            self.idle.append(conn)
        if status >= 300:
            raise RuntimeError(f"restate ingress answered {status}: {payload[:300]!r}")
        return json.loads(payload)

    async def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


class RestateEngine(Engine):
    name = "restate"

    def __init__(self, service_workers: int = 1) -> None:
        self.service_workers = service_workers
        self.server: subprocess.Popen[bytes] | None = None
        self.service: subprocess.Popen[bytes] | None = None
        self.dir: Path | None = None
        self.runner: asyncio.Runner | None = None
        self.client: Any = None

    def start(self) -> None:
        if why := _missing("restate", "hypercorn"):
            raise Skip(why)
        binary = restate_binary()
        self.dir = Path(tempfile.mkdtemp(prefix="saga-bench-restate-"))
        node, admin, ingress, svc = (free_port() for _ in range(4))
        self.ingress_port = ingress
        self.admin, self.ingress = f"http://127.0.0.1:{admin}", f"http://127.0.0.1:{ingress}"
        conf = self.dir / "restate.toml"
        conf.write_text(f'bind-address = "127.0.0.1:{node}"\n'
                        "disable-telemetry = true\n"
                        'log-filter = "warn"\n'
                        f'[admin]\nbind-address = "127.0.0.1:{admin}"\n'
                        f'[ingress]\nbind-address = "127.0.0.1:{ingress}"\n')
        args = [str(binary), "--config-file", str(conf), "--base-dir", str(self.dir / "data"),
                "--listen-mode", "tcp", "--no-logo"]
        dumped = subprocess.run([*args, "--dump-config"], capture_output=True, text=True,
                                timeout=60, check=False)
        self.durability = self._durability(dumped.stdout)
        log = self.dir / "server.log"
        with log.open("wb") as out:
            self.server = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                           start_new_session=True)
        _wait_for(lambda: _http("GET", f"{self.admin}/health", timeout=1)[0] == 200, 60,
                  "restate-server to answer", self.server, log)
        slog = self.dir / "service.log"
        with slog.open("wb") as out:
            self.service = subprocess.Popen(
                [sys.executable, "-m", "hypercorn", "benchmarks.peers.restate_app:app",
                 "--bind", f"127.0.0.1:{svc}", "--workers", str(self.service_workers),
                 "--log-level", "warning"],
                cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True)

        def register() -> bool:
            code, body = _http("POST", f"{self.admin}/deployments",
                               {"uri": f"http://127.0.0.1:{svc}", "force": True})
            if code >= 400 and b"connect" not in body.lower():
                raise Skip(f"registering the service with restate failed ({code}): "
                           f"{body[:400]!r}")
            return code < 300
        _wait_for(register, 60, "the restate service to register", self.service, slog)
        self.runner = asyncio.Runner()
        self.client = Http11(self.ingress_port)
        self.measure([False] * 20 + [True] * 5)  # warm up

    @staticmethod
    def _durability(dump: str) -> str:
        try:
            c = tomllib.loads(dump)
        except tomllib.TOMLDecodeError:
            return "unknown (restate-server --dump-config did not parse)"
        provider = c.get("bifrost", {}).get("default-provider", "?")
        part = {"replicated": "log-server", "local": "bifrost.local"}.get(provider, "log-server")
        sect = c.get("log-server", {}) if part == "log-server" else \
            c.get("bifrost", {}).get("local", {})
        no_fsync = sect.get("rocksdb-disable-wal-fsync", "?")
        how = ("an fsync of the log's WAL before an append is acknowledged (concurrent "
               "appends share fsyncs)") if no_fsync is False else "no fsync per append"
        return (f"the log (bifrost provider '{provider}', single node, {part} "
                f"rocksdb-disable-wal-fsync={no_fsync}, the default): {how}; each ctx.run "
                "result is journaled before the handler goes on")

    async def _run(self, fails: list[bool]) -> tuple[float, list[float], int]:
        async def one(fail: bool) -> tuple[float, str]:
            began = time.perf_counter()
            reply = await self.client.post_json("/Saga/run", {"fail": fail})
            return time.perf_counter() - began, reply["status"]
        began = time.perf_counter()
        out = await asyncio.gather(*(one(f) for f in fails))
        elapsed = time.perf_counter() - began
        return elapsed, [x for x, _ in out], sum(s == "compensated" for _, s in out)

    def _pids(self) -> dict[str, set[int]]:
        assert self.server is not None
        assert self.service is not None
        return {"restate_server": group_pids(self.server.pid),
                "service": group_pids(self.service.pid), "driver": {os.getpid()}}

    def measure(self, fails: list[bool]) -> dict[str, float]:
        assert self.runner is not None
        before = _cpu_by(self._pids())
        elapsed, latency, compensated = self.runner.run(self._run(fails))
        if compensated != sum(fails):
            raise RuntimeError(f"restate: {compensated} compensated, {sum(fails)} planned")
        return {**summarize(elapsed, latency), **_cpu_rows(before, self._pids(), len(fails))}

    def close(self) -> None:
        if self.runner is not None:
            with contextlib.suppress(Exception):
                self.runner.run(self.client.close())
            self.runner.close()
        _stop(self.service, group=True)
        _stop(self.server, group=True)
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)


class DbosEngine(Engine):
    name = "dbos"

    def __init__(self) -> None:
        self.db = f"saga_bench_dbos_{uuid.uuid4().hex[:10]}"
        self.admin: Any = None
        self.proc: subprocess.Popen[str] | None = None
        self.created = False

    def _pg(self) -> Any:
        import psycopg
        return psycopg.connect(f"{PG_URL}/postgres", autocommit=True, connect_timeout=5)

    def start(self) -> None:
        if why := _missing("dbos", "psycopg"):
            raise Skip(why)
        try:
            self.admin = self._pg()
        except Exception as exc:
            raise Skip(f"no PostgreSQL at {PG_URL}: {exc}".strip()) from exc
        with self.admin.cursor() as cur:
            settings = {}
            for name in ("fsync", "synchronous_commit", "wal_sync_method", "full_page_writes",
                         "server_version"):
                cur.execute(f"SHOW {name}")
                settings[name] = cur.fetchone()[0]
            cur.execute(f'CREATE DATABASE "{self.db}"')
            self.created = True
            cur.execute("SELECT pg_backend_pid()")
            self.admin_pid = cur.fetchone()[0]
        per_commit = settings["fsync"] == "on" and settings["synchronous_commit"] in (
            "on", "remote_apply", "remote_write", "local")
        self.durability = (
            f"PostgreSQL {settings['server_version']} fsync={settings['fsync']}, "
            f"synchronous_commit={settings['synchronous_commit']}, wal_sync_method="
            f"{settings['wal_sync_method']}: "
            + ("every commit (each step's result, each workflow's status) waits for its WAL "
               "flush; concurrent commits share flushes" if per_commit else
               "commits do not wait for a WAL flush"))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.peers.dbos_app", f"{PG_URL}/{self.db}"],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            raise Skip(f"the DBOS app did not launch (exit {self.proc.poll()}): {line[:300]}")
        self.measure([False] * 20 + [True] * 5)  # warm up

    def _postgres_pids(self) -> set[int]:
        """The run database's backends, the server's background processes and the
        postmaster; not other databases' backends nor our own admin session."""
        with self.admin.cursor() as cur:
            cur.execute("SELECT pid FROM pg_stat_activity WHERE pid <> %s AND (datname = %s "
                        "OR backend_type <> 'client backend')", (self.admin_pid, self.db))
            pids = {int(r[0]) for r in cur.fetchall()}
        with contextlib.suppress(OSError, StopIteration):
            one = next(iter(pids))
            ppid = int(Path(f"/proc/{one}/stat").read_text().rsplit(")", 1)[1].split()[1])
            pids.add(ppid)
        return pids

    def _pids(self) -> dict[str, set[int]]:
        assert self.proc is not None
        return {"postgres": self._postgres_pids(), "dbos_app": group_pids(self.proc.pid),
                "driver": {os.getpid()}}

    def measure(self, fails: list[bool]) -> dict[str, float]:
        assert self.proc is not None
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        before = _cpu_by({**self._pids(), "postgres": self._all_postgres()})
        self.proc.stdin.write(json.dumps(fails) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the DBOS app exited ({self.proc.poll()})")
        got = json.loads(line)
        if got["compensated"] != sum(fails):
            raise RuntimeError(f"dbos: {got['compensated']} compensated, {sum(fails)} planned")
        return {**summarize(got["elapsed"], got["latency"]),
                **_cpu_rows(before, self._pids(), len(fails))}

    @staticmethod
    def _all_postgres() -> set[int]:
        out = set()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if (entry / "comm").read_text().strip().startswith("postgres"):
                        out.add(int(entry.name))
        return out

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            assert self.proc.stdin is not None
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        if self.admin is not None:
            if self.created:
                with contextlib.suppress(Exception), self.admin.cursor() as cur:
                    cur.execute(f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)')
            self.admin.close()


def _machine() -> dict[str, Any]:
    try:
        return machine()
    except (OSError, IndexError):  # no redis-server: Saga Store is skipped, the rest run
        return {"python": platform.python_version(), "cpus": os.cpu_count(), "redis": None,
                "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def engines(names: list[str], workers: int, service_workers: int) -> list[Engine]:
    every: dict[str, Callable[[], Engine]] = {
        "saga-everysec": lambda: SagaStoreEngine("everysec", workers),
        "saga-always": lambda: SagaStoreEngine("always", workers),
        "saga-async-everysec": lambda: SagaStoreEngine("everysec", workers, "async"),
        "saga-async-always": lambda: SagaStoreEngine("always", workers, "async"),
        "restate": lambda: RestateEngine(service_workers),
        "dbos": DbosEngine,
        "memory": MemoryEngine,
    }
    return [every[n]() for n in names]


ENGINE_NAMES = ["saga-everysec", "saga-always", "saga-async-everysec", "saga-async-always",
                "restate", "dbos", "memory"]


# -- the run ------------------------------------------------------------------

def run(rounds: int = 3, ns: tuple[int, ...] = (50, 500), fail_ratios: tuple[float, ...] = (
        0.0, 0.2), names: list[str] | None = None, workers: int = WORKERS,
        service_workers: int = 1) -> dict[str, Any]:
    rng = random.Random(7)
    chosen = engines(names or ENGINE_NAMES, workers, service_workers)
    out: dict[str, Any] = {"machine": _machine(), "io_ms": IO_MS, "steps": STEPS,
                           "rounds": rounds, "saga_store_workers": workers,
                           "restate_service_workers": service_workers,
                           "order": "interleaved: engines forward on even rounds, reversed "
                                    "on odd; the same plans for every engine in a round",
                           "engines": {}, "skipped": {}, "cases": {}}
    out["load_avg_before"] = os.getloadavg()
    if shutil.which("redis-server"):  # the machine's speed now, as bench_workflows reads it
        out["bare_rq_8_workers_10ms_jobs_per_s"] = yardstick(1000 if rounds > 1 else 400)
    live: list[Engine] = []
    started = time.time()
    try:
        for e in chosen:
            print(f"starting {e.name} ...", file=sys.stderr, flush=True)
            try:
                e.start()
            except Exception as exc:
                reason = str(exc) if isinstance(exc, Skip) else f"{type(exc).__name__}: {exc}"
                reason = " ".join(reason.split())
                print(f"SKIPPED {e.name}: {reason}", file=sys.stderr, flush=True)
                out["skipped"][e.name] = reason
                with contextlib.suppress(Exception):
                    e.close()
                continue
            live.append(e)
            out["engines"][e.name] = {"durability": e.durability}
        for n in ns:
            for ratio in fail_ratios:
                case = f"n={n} fail={round(ratio * 100)}%"
                per: dict[str, list[dict[str, float] | None]] = {e.name: [] for e in live}
                for k in range(rounds):
                    fails = plans(n, ratio, rng)
                    for e in (live if k % 2 == 0 else live[::-1]):
                        if e.name in out["skipped"]:
                            per[e.name].append(None)
                            continue
                        try:
                            per[e.name].append(e.measure(fails))
                        except Exception as exc:
                            reason = f"failed in {case} round {k + 1}: {type(exc).__name__}: {exc}"
                            print(f"SKIPPED {e.name}: {reason}", file=sys.stderr, flush=True)
                            out["skipped"][e.name] = reason
                            per[e.name].append(None)
                    print(f"{case} round {k + 1}/{rounds} done", file=sys.stderr, flush=True)
                out["cases"][case] = _case(per)
    finally:
        for e in reversed(live):
            with contextlib.suppress(Exception):
                e.close()
    out["seconds"] = round(time.time() - started, 1)
    out["load_avg_after"] = os.getloadavg()
    return out


def _case(per: dict[str, list[dict[str, float] | None]]) -> dict[str, Any]:
    """Medians over rounds, and each engine's ratios to Saga Store from the same rounds."""
    res: dict[str, Any] = {}
    for name, runs in per.items():
        ok = [r for r in runs if r is not None]
        if not ok:
            continue
        med = {k: statistics.median(r[k] for r in ok) for k in ok[0]}
        for base in (BASE, "saga-store always"):
            if base not in per or name == base:
                continue
            pairs = [(r, b) for r, b in zip(runs, per[base], strict=True)
                     if r is not None and b is not None]
            if pairs:
                tag = base.split()[-1]
                med[f"wfps_x_vs_{tag}"] = statistics.median(
                    r["workflows_per_s"] / b["workflows_per_s"] for r, b in pairs)
                med[f"cpu_x_vs_{tag}"] = statistics.median(
                    r["cpu_ms_total"] / b["cpu_ms_total"] for r, b in pairs)
        med["runs"] = len(ok)
        med["each_round"] = runs
        res[name] = med
    return res


def table(out: dict[str, Any]) -> str:
    lines = ["| case | engine | wf/s | p50 ms | p99 ms | CPU ms/wf (by process) | "
             "wf/s x vs everysec | CPU x vs everysec | wf/s x vs always |",
             "|---|---|---|---|---|---|---|---|---|"]
    for case, engines_ in out["cases"].items():
        for name, m in engines_.items():
            parts = ", ".join(f"{k[7:]} {v:.2f}" for k, v in m.items()
                              if k.startswith("cpu_ms_") and k != "cpu_ms_total")

            def x(key: str, m: dict[str, Any] = m) -> str:
                return f"{m[key]:.2f}" if key in m else "-"
            lines.append(f"| {case} | {name} | {m['workflows_per_s']:.0f} | {m['p50_ms']:.0f} "
                         f"| {m['p99_ms']:.0f} | {m['cpu_ms_total']:.2f} ({parts}) | "
                         f"{x('wfps_x_vs_everysec')} | {x('cpu_x_vs_everysec')} | "
                         f"{x('wfps_x_vs_always')} |")
    if "bare_rq_8_workers_10ms_jobs_per_s" in out:
        lines += ["", "Yardstick (bare RQ, 8 SimpleWorkers, 10 ms jobs, same run): "
                  f"{out['bare_rq_8_workers_10ms_jobs_per_s']:.0f} jobs/s; load average "
                  f"before/after {out['load_avg_before'][0]:.1f}/{out['load_avg_after'][0]:.1f}"]
    lines += ["", "Durability:"]
    lines += [f"- {name}: {e['durability']}" for name, e in out["engines"].items()]
    if out["skipped"]:
        lines += ["", "Skipped:"]
        lines += [f"- {name}: {why}" for name, why in out["skipped"].items()]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, nargs="+", default=[50, 500])
    ap.add_argument("--fail", type=float, nargs="+", default=[0.0, 0.2],
                    help="fractions of workflows failing at step 3")
    ap.add_argument("--engines", nargs="+", choices=ENGINE_NAMES, default=ENGINE_NAMES)
    ap.add_argument("--workers", type=int, default=WORKERS, help="Saga Store worker processes")
    ap.add_argument("--service-workers", type=int, default=1,
                    help="hypercorn processes serving the Restate service")
    ap.add_argument("--quick", action="store_true", help="one round, n=50: a smoke check")
    a = ap.parse_args()
    if a.quick:
        a.rounds, a.n = 1, [50]
    out = run(a.rounds, tuple(a.n), tuple(a.fail), a.engines, a.workers, a.service_workers)
    OUT.mkdir(exist_ok=True)
    (OUT / "peers.json").write_text(json.dumps(out, indent=1, default=str))
    md = table(out)
    (OUT / "peers.md").write_text(md + "\n")
    print(json.dumps(out, indent=1, default=str))
    print()
    print(md)


if __name__ == "__main__":
    main()
