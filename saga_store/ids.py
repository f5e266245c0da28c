"""Identifier rules and generation.

Ids end up inside Redis key names and stream fields, so they are checked
before any key is built: a ``:`` or ``{`` would break the key schema or the
Cluster hash tag, and ``*`` / ``?`` / ``[`` would turn into glob patterns.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable

from saga_store.errors import InvalidInput

MAX_ID_LEN = 128
_FORBIDDEN = frozenset(":*?{}[]\\\"'")
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def check_id(value: object, what: str = "id") -> str:
    """Return ``value`` if it is a usable id, else raise :class:`InvalidInput`."""
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be a string, got {type(value).__name__}", field=what)
    if not value or len(value) > MAX_ID_LEN:
        raise InvalidInput(
            f"{what} must be 1 to {MAX_ID_LEN} characters long, got {len(value)}", field=what
        )
    for ch in value:
        if ch in _FORBIDDEN or not ch.isprintable() or ch.isspace():
            raise InvalidInput(
                f"{what} {value[:40]!r} contains {ch!r}; use letters, digits and . _ - / @ + =",
                field=what,
            )
    return value


SAGA_ID = re.compile(rf"[A-Za-z0-9_-]{{1,{MAX_ID_LEN}}}")
RESERVED_SAGA_ID = "ledger"  # keys.LEDGER_ID: the ledger is a chain too


def check_saga_id(value: object) -> str:
    """A saga id: letters, digits, ``_`` and ``-`` only, 1-128 of them. Stricter than
    other ids because a saga id is part of its RQ job ids, and RQ refuses (with a
    ``ValueError`` in the worker) any other character."""
    if not isinstance(value, str) or not value or len(value) > MAX_ID_LEN:
        return check_id(value, "saga_id")  # says what is wrong with its type or length
    if value == RESERVED_SAGA_ID:
        raise InvalidInput(f"saga_id {value!r} is reserved (it names the ledger's chain); "
                           "choose another id or omit it", field="saga_id")
    if not SAGA_ID.fullmatch(value):
        bad = next(c for c in value if not (c.isascii() and (c.isalnum() or c in "_-")))
        raise InvalidInput(f"saga_id {value[:40]!r} contains {bad!r}; a saga id takes only "
                           "letters, digits, _ and - (it is part of its queue jobs' ids)",
                           field="saga_id")
    return value


# An agent whose id is made of these owns a namespace: its sagas' ids are
# "<agent>_<ULID>", and since "_" never occurs in such an agent id, no agent's
# namespace ("<agent>_*") covers another's (agent "a" does not cover "a-b_...").
SCOPED_AGENT = re.compile(r"[A-Za-z0-9-]{1,64}")


def scoped_saga_id(agent_id: str) -> str:
    """A new saga id in ``agent_id``'s namespace (a plain ULID for an agent id that
    cannot own one: with ``_`` or other characters, or longer than 64)."""
    return f"{agent_id}_{new_id()}" if SCOPED_AGENT.fullmatch(agent_id) else new_id()


def agent_of(saga_id: str) -> str | None:
    """The agent whose namespace ``saga_id`` is in, if any ("<agent>_...")."""
    head, sep, _ = saga_id.partition("_")
    return head if sep and SCOPED_AGENT.fullmatch(head) else None


def valid_id(value: object, check: Callable[[object], str] = check_id) -> bool:
    """Whether ``check`` (default: any id's) takes ``value``."""
    try:
        check(value)
    except InvalidInput:
        return False
    return True


_last = [0]  # the last id made in this process, as a number (monotonic within a ms)
_id_lock = threading.Lock()


def new_id() -> str:
    """A 26-character, time-ordered, random id (ULID layout, Crockford base32). Ids
    made in one process in the same millisecond increase, as ULID's monotonic
    mode has them, so they sort in the order they were made (listings merged
    from many ledger buckets rely on it)."""
    n = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(os.urandom(10), "big")
    with _id_lock:
        if n >> 80 == _last[0] >> 80 and n <= _last[0]:
            n = _last[0] + 1 + (int.from_bytes(os.urandom(2), "big") & 0xFFF)
        _last[0] = n
    out = []
    for _ in range(26):
        out.append(_CROCKFORD[n & 31])
        n >>= 5
    return "".join(reversed(out))


def plan_call_id(saga_id: str, step: int) -> str:
    """The ``tool_call_id`` of a plan step that names none: unique across sagas (a
    model's history mixes the calls of many), at most 40 characters (OpenAI's limit)
    and only letters, digits and ``_`` (Anthropic's pattern)."""
    import hashlib
    return f"call_{hashlib.sha256(saga_id.encode()).hexdigest()[:24]}_{step}"
