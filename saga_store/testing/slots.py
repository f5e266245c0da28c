"""A check that no script and no transaction spans hash slots.

On a Redis Cluster a script (EVAL, EVALSHA) or a MULTI/EXEC block (with its
WATCH) must keep all its keys in one slot; on a standalone Redis nothing stops
one that does not, so a test on one Redis cannot see the bug. :func:`install`
wraps the command packer of every redis-py connection made afterwards in this
process: each script call and each transaction (from its WATCH or MULTI to its
EXEC) is recorded with its keys, and one whose keys hash to more than one slot
(``redis.crc.key_slot``) is written to the violations file. RQ's own
transactions (every key an RQ key) are the queue Redis's business and pass: a
cluster never holds them.

``SAGA_TEST_SLOT_LOG=<file>`` makes the test suite install it in the test
process and in every worker process it starts (see ``tests/slotcheck``).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from redis.connection import AbstractConnection
from redis.crc import key_slot

from saga_store.keys import RQ_PREFIX

LOG_VAR = "SAGA_TEST_SLOT_LOG"
RQ_KEYS = (f"{RQ_PREFIX}rq:".encode(), b"rq:")
_KEYLESS = frozenset({"MULTI", "EXEC", "DISCARD", "UNWATCH", "PING", "TIME", "WAIT", "INFO",
                      "SCRIPT", "CLIENT", "SELECT", "HELLO", "AUTH", "COMMAND", "READONLY",
                      "ASKING", "CLUSTER", "CONFIG", "ECHO"})
_ALL_KEYS = frozenset({"WATCH", "DEL", "UNLINK", "EXISTS", "MGET", "TOUCH", "SINTER", "SUNION",
                       "SDIFF"})
_TWO_KEYS = frozenset({"LMOVE", "BLMOVE", "RPOPLPUSH", "BRPOPLPUSH", "SMOVE", "RENAME",
                       "RENAMENX", "COPY"})
_BLOCKING = frozenset({"BLPOP", "BRPOP", "BZPOPMIN", "BZPOPMAX"})


def _b(x: Any) -> bytes:
    if isinstance(x, bytes):
        return x
    return str(x).encode()


def keys_of(args: tuple[Any, ...]) -> list[bytes]:
    """The keys of one command, as far as the commands this project and RQ send go."""
    name = str(args[0] if not isinstance(args[0], bytes) else args[0].decode()).upper()
    rest = [_b(a) for a in args[1:]]
    if name in _KEYLESS or not rest:
        return []
    if name in ("EVAL", "EVALSHA", "FCALL", "FCALL_RO"):
        return rest[2:2 + int(rest[1])]
    if name in _ALL_KEYS:
        return rest
    if name in _TWO_KEYS:
        return rest[:2]
    if name in _BLOCKING:
        return rest[:-1]
    if name == "MSET":
        return rest[::2]
    if name in ("XREAD", "XREADGROUP"):
        after = [a.upper() for a in rest].index(b"STREAMS") + 1
        streams = rest[after:]
        return streams[:len(streams) // 2]
    return rest[:1]


class SlotLog:
    """Where violations go: a file shared by the test and its worker processes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def check(self, what: str, keys: list[bytes]) -> None:
        if not keys or all(k.startswith(RQ_KEYS) for k in keys):
            return
        slots = {key_slot(k) for k in keys}
        if len(slots) > 1:
            names = [k.decode("utf-8", "replace") for k in keys]
            line = f"{what} spans {len(slots)} slots: {names}"
            with self._lock, self.path.open("a") as f:
                f.write(line + "\n")

    def violations(self) -> list[str]:
        return self.path.read_text().splitlines() if self.path.exists() else []


class _CheckingPacker:
    """A connection's command packer that watches what it packs (see the module)."""

    def __init__(self, inner: Any, log: SlotLog) -> None:
        self.inner, self.log = inner, log
        self.block: list[bytes] | None = None  # keys since WATCH or MULTI, until EXEC

    def pack(self, *args: Any) -> Any:
        self._see(args)
        return self.inner.pack(*args)

    def _see(self, args: tuple[Any, ...]) -> None:
        name = str(args[0] if not isinstance(args[0], bytes) else args[0].decode()).upper()
        if name in ("WATCH", "MULTI"):
            self.block = (self.block or []) + keys_of(args)
        elif name == "EXEC" and self.block is not None:
            self.log.check("MULTI/EXEC", self.block)
            self.block = None
        elif name in ("DISCARD", "UNWATCH"):
            self.block = None
        elif self.block is not None:
            self.block += keys_of(args)
        elif name in ("EVAL", "EVALSHA", "FCALL"):
            self.log.check(name, keys_of(args))


_PLAIN = AbstractConnection._construct_command_packer
_BEFORE: list[Any] = []  # the packer makers that installs replaced, innermost last


def install(path: str | Path) -> SlotLog:
    """Check every connection made from now on in this process (see the module)."""
    log = SlotLog(path)

    def checked(self: Any, packer: Any) -> Any:
        return _CheckingPacker(_PLAIN(self, packer), log)  # type: ignore[no-untyped-call]

    _BEFORE.append(AbstractConnection._construct_command_packer)
    AbstractConnection._construct_command_packer = checked  # type: ignore[method-assign]
    return log


def uninstall() -> None:
    """Connections made from now on are checked as before the last :func:`install`
    (those made since are still checked by it): a test of the check itself leaves
    the check of a slot-checked run in place."""
    AbstractConnection._construct_command_packer = (  # type: ignore[method-assign]
        _BEFORE.pop() if _BEFORE else _PLAIN)


def install_from_env() -> SlotLog | None:
    """:func:`install` when ``SAGA_TEST_SLOT_LOG`` names a file. Under pytest-xdist
    each test process takes a file of its own (``<file>.<worker id>``, passed on to
    the processes it starts), so a violation is charged to the test that made it."""
    path = os.environ.get(LOG_VAR)
    if not path:
        return None
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and not path.endswith(f".{worker}"):
        path = os.environ[LOG_VAR] = f"{path}.{worker}"
    return install(path)
