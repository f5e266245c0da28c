"""Shared plumbing for CLI commands: settings, the store, output and exit codes.

Exit codes (every command; the README's CLI section has the full table, 4-7 for
``saga run --wait``): 0 success, 1 integrity failure, 2 usage error or
bad input, 3 could not do it (Redis unreachable, could not verify).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

import click
import orjson
import redis

from saga_store.errors import CannotVerify, InvalidInput, SagaError, StoreUnavailable
from saga_store.log.store import EventStore
from saga_store.ops.connection import DEFAULT_URL, connect, connect_or_embedded, connect_queue
from saga_store.settings import Settings

if TYPE_CHECKING:
    from saga_store.client.api import SagaStore
    from saga_store.tools.registry import Registry

EXIT_OK, EXIT_INTEGRITY, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3


def saga_argv(*args: str) -> list[str]:
    """The argv that runs ``saga ARGS`` in a new process of this same install.

    ``-P`` keeps the working directory off ``sys.path``: run from a checkout of
    this repository, its own ``saga_store/`` folder (which holds neither ``cli``
    nor ``workers``; the wheel maps them in) would otherwise shadow the installed
    package. Tools modules are still found there: the CLI adds the working
    directory itself, after the package is imported.
    """
    return [sys.executable, "-P", "-m", "saga_store.cli.main", *args]


@dataclass
class Context:
    redis_url: str | None
    settings: Settings
    _store: EventStore | None = field(default=None, repr=False)
    queue_url: str | None = None
    _queues: redis.Redis | None = field(default=None, repr=False)
    # when the command began (time.monotonic()): the process's start when run as
    # 'saga', so --timeout counts what the person waited
    started: float = field(default_factory=time.monotonic)

    @property
    def log_url(self) -> str:
        return self.redis_url or DEFAULT_URL

    def store(self) -> EventStore:
        """A store on ``--redis-url`` (default address when unset); never embedded."""
        if self._store is None:
            self._store = EventStore(connect(self.log_url), self.settings)
        return self._store

    def queues(self) -> redis.Redis:
        """RQ's queues: ``--queue-url`` (``SAGA_QUEUE_URL``), else the log's Redis
        (the same client); required when the log is on a Redis Cluster."""
        if self._queues is None:
            self._queues = connect_queue(self.store().redis, self.log_url,
                                         self.queue_url or "")
        return self._queues

    def saga_store(self, registry: Registry, **kwargs: Any) -> SagaStore:
        """A :class:`SagaStore` on the log and the queues."""
        from saga_store.client.api import SagaStore
        return SagaStore(self.store().redis, registry, self.settings, queues=self.queues(),
                         **kwargs)

    def store_or_embedded(self) -> tuple[EventStore, bool]:
        client, is_embedded = connect_or_embedded(self.redis_url)
        self._store = EventStore(client, self.settings)
        return self._store, is_embedded


pass_ctx = click.make_pass_decorator(Context)


def emit_json(value: Any) -> None:
    click.echo(orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))


def fail(message: str, code: int) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


@contextmanager
def errors_to_exit() -> Iterator[None]:
    """Map Saga Store errors to the documented exit codes with a one-line message."""
    try:
        yield
    except InvalidInput as exc:
        fail(str(exc), EXIT_USAGE)
    except (StoreUnavailable, CannotVerify) as exc:
        fail(str(exc), EXIT_UNAVAILABLE)
    except redis.exceptions.NoPermissionError as exc:
        fail(no_permission(exc), EXIT_UNAVAILABLE)
    except redis.RedisError as exc:
        fail(f"Redis error: {exc}; check the server and SAGA_REDIS_URL", EXIT_UNAVAILABLE)
    except SagaError as exc:
        fail(str(exc), EXIT_INTEGRITY)


_WHOLE_STORE = ("run it as the worker's Redis user ('saga acl worker') or an "
                "administrator's; an agent's user ('saga acl agent') reads and drives only "
                "its own agent's sagas")
# what a user refused by the ACL can do instead, by command
_INSTEAD = {
    "ls": "an agent's user ('saga acl agent') lists only its own agent's sagas: "
          "saga ls --agent AGENT_ID; the whole list needs the worker's user ('saga acl "
          "worker') or an administrator's",
    "verify": "an agent's user reads its own sagas ('saga show SAGA_ID') but not the "
              "ledger that 'saga verify' checks every saga against; verify as the worker's "
              "user ('saga acl worker') or an administrator's",
    "show": "an agent's user reads only its own agent's sagas, whose ids start with "
            "AGENT_ID_ ('saga ls --agent AGENT_ID' lists them); " + _WHOLE_STORE.split("; ")[0],
    "context": "an agent's user reads only its own agent's sagas: saga context --agent "
               "AGENT_ID, or --saga with one of its ids; for others, " +
               _WHOLE_STORE.split("; ")[0],
}


def no_permission(exc: redis.RedisError) -> str:
    """A NOPERM refusal in the user's terms: what the ACL refused, and the command or
    user that does it (never Saga Store's internal key names)."""
    ctx = click.get_current_context(silent=True)
    name = ctx.info_name if ctx is not None else None
    what = "this command" if "command" in str(exc) else "a key this command needs"
    instead = _INSTEAD.get(name or "") or (
        f"'saga {name}' reads the whole store: {_WHOLE_STORE}" if name else _WHOLE_STORE)
    return f"the Redis user of SAGA_REDIS_URL may not use {what} (Redis ACL): {instead}"


def operator(by: str | None) -> str:
    """Who is acting (``--by``, else the login name), fit to record: one line, at
    most 128 characters."""
    if by is None:
        import getpass
        try:
            by = getpass.getuser()
        except (KeyError, OSError):
            by = "operator"
    by = by.strip()
    if not by or len(by) > 128 or "\n" in by or "\r" in by:
        raise InvalidInput("--by must name who acts (1-128 characters, one line)", field="by")
    return by


def progress_reporter(enabled: bool, total: int | None, label: str,
                      ) -> tuple[Callable[[int], None] | None, Callable[[], None]]:
    """A stderr progress bar when enabled and stderr is a terminal; else nothing."""
    if not enabled or not sys.stderr.isatty():
        return None, lambda: None
    bar = click.progressbar(length=total or 0, label=label, file=sys.stderr)
    bar.__enter__()
    return bar.update, lambda: bar.__exit__(None, None, None)
