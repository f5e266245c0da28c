"""The one place where bytes that get hashed are produced.

Canonical form: orjson with sorted keys, UTF-8, no NaN or Infinity, integers
within +/-2^53 (what every JSON reader agrees on), nesting bounded. Values are
checked by :func:`check_json` at the boundary where they enter the system
(tool arguments, tool results); events built from checked values are encoded
by :func:`canonical` without walking them again. JSON text from outside (plan
files, MCP messages, a model's arguments) is read by :func:`loads`, which keeps
its numbers as written so that :func:`check_json` sees what was sent.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import orjson

from saga_store.errors import InvalidInput

MAX_DEPTH = 32
MAX_SAFE_INT = 2**53
_OPTS = orjson.OPT_SORT_KEYS | orjson.OPT_STRICT_INTEGER

JSONValue = Any  # recursive JSON types do not help mypy here; check_json is the guard


def canonical(value: JSONValue) -> bytes:
    """Encode ``value`` canonically. Raises :class:`InvalidInput` on what JSON can't carry."""
    try:
        return orjson.dumps(value, option=_OPTS)
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise InvalidInput(f"value is not canonical JSON: {exc}; pass plain JSON data") from exc


def check_json(value: JSONValue, what: str = "value", max_depth: int = MAX_DEPTH) -> JSONValue:
    """Walk ``value`` and raise :class:`InvalidInput` naming the first bad spot.

    Accepts dicts with string keys, lists, strings, bools, None, finite floats
    and integers within +/-2^53. Tuples are not accepted: they do not round-trip.
    """
    stack: list[tuple[Any, str, int]] = [(value, what, 0)]
    while stack:
        item, path, depth = stack.pop()
        if depth > max_depth:
            raise InvalidInput(f"{path}: nested deeper than {max_depth} levels; flatten it",
                               field=path)
        if item is None or isinstance(item, bool | str):
            if isinstance(item, str):
                _check_str(item, path)
            continue
        if isinstance(item, int):
            if not -MAX_SAFE_INT <= item <= MAX_SAFE_INT:
                raise InvalidInput(
                    f"{path}: integer {item} is beyond 2^53; send it as a string", field=path)
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise InvalidInput(f"{path}: {item} is not allowed in JSON; use null or a string",
                                   field=path)
        elif isinstance(item, dict):
            for k, v in item.items():
                if not isinstance(k, str):
                    raise InvalidInput(f"{path}: key {k!r} is not a string", field=path)
                _check_str(k, path)
                stack.append((v, f"{path}.{k}", depth + 1))
        elif isinstance(item, list):
            stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(item))
        else:
            raise InvalidInput(
                f"{path}: {type(item).__name__} is not JSON; convert it to str, number, "
                "list or dict", field=path)
    return value


def _check_str(s: str, path: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInput(f"{path}: string is not valid UTF-8 ({exc.reason})",
                           field=path) from exc


def loads(data: bytes | str, what: str = "value") -> JSONValue:
    """Parse JSON text as written, or raise :class:`InvalidInput` saying what is wrong.

    orjson reads an integer beyond 64 bits as a float, so a huge number would
    arrive as one nobody sent and pass :func:`check_json`. Text that may hold
    one (a run of 19 digits) is read again by the standard library, which keeps
    integers exact, for :func:`check_json` at the boundary to refuse with the
    field's name. What orjson refuses stays refused; the standard library only
    tells NaN, Infinity and nesting too deep to read apart from the rest.
    """
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"{what}: {_why_not(data) or exc}") from None
    wide = _WIDE.search(data) if isinstance(data, bytes) else _WIDE_STR.search(data)
    if wide:
        try:
            value = json.loads(data)
        except RecursionError:
            raise InvalidInput(f"{what}: {_TOO_DEEP}") from None
        except ValueError as exc:
            raise InvalidInput(f"{what}: {exc}") from None
    return value


_WIDE = re.compile(rb"\d{19}")
_WIDE_STR = re.compile(r"\d{19}", re.ASCII)
_TOO_DEEP = "nested too deeply to read; flatten it"


def _why_not(data: bytes | str) -> str | None:
    """Why orjson refused ``data`` when the reason is NaN, Infinity or depth, else None."""
    def constant(name: str) -> Any:
        raise InvalidInput(f"{name} is not allowed in JSON; use null or a string")
    try:
        json.loads(data, parse_constant=constant)
    except InvalidInput as exc:
        return str(exc)
    except RecursionError:
        return _TOO_DEEP
    except ValueError:  # the standard library refuses it too: orjson's words say why
        pass
    return None
