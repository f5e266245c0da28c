"""Static parameter mappings: a compensation's arguments from the step's own
input and output, never from anything computed at unwind time.

A path is ``$.input.<field>...`` (the call's arguments) or ``$.output.<field>...``
(its result). A part may be a dict key, a list index, or ``[*]`` / ``*`` to take
every item of a list: ``$.input.entities[*].name`` gives the list of names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from saga_store.errors import MappingError

ROOTS = ("input", "output")


def parts_of(path: str) -> list[str]:
    """The parts of a path after ``$``; raises :class:`MappingError` if malformed."""
    if not isinstance(path, str) or not path.startswith("$."):
        raise MappingError(f"mapping path {path!r} must start with '$.input.' or '$.output.'")
    parts: list[str] = []
    for raw in path[2:].split("."):
        name, star, rest = raw.partition("[*]")
        if rest or not (name or star):
            raise MappingError(f"mapping path {path!r} has an empty or malformed part")
        if name:
            parts.append(name)
        if star:
            parts.append("*")
    if len(parts) < 2 or parts[0] not in ROOTS:
        raise MappingError(f"mapping path {path!r} must start with '$.input.<field>' or "
                           "'$.output.<field>'")
    return parts


def resolve(path: str, args: Mapping[str, Any], result: Any) -> Any:
    """The value ``path`` names; raises :class:`MappingError` if any part is missing."""
    parts = parts_of(path)
    return _walk(path, parts[1:], args if parts[0] == "input" else result)


def _walk(path: str, parts: list[str], node: Any) -> Any:
    for i, part in enumerate(parts):
        if part == "*":
            if not isinstance(node, list):
                raise MappingError(f"{path} did not resolve: [*] needs a list")
            return [_walk(path, parts[i + 1:], item) for item in node]
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise MappingError(f"{path} did not resolve: the field {part!r} is missing")
    return node


def resolve_all(mapping: Mapping[str, str], args: Mapping[str, Any], result: Any, *,
                in_doubt: bool = False) -> dict[str, Any]:
    """Every argument of a compensation from its mapping; raises :class:`MappingError`
    naming the first that does not resolve (for an in-doubt step whose output is
    unknown, it says so)."""
    out: dict[str, Any] = {}
    for target, source in mapping.items():
        try:
            out[target] = resolve(source, args, result)
        except MappingError as exc:
            if in_doubt and parts_of(source)[0] == "output":
                raise MappingError(f"mapping {target} <- {source} did not resolve: the "
                                   "step's outcome is unknown") from None
            raise MappingError(f"mapping {target} <- {exc}") from None
    return out
