"""What a downstream server declares of a tool in ``_meta["dev.chronomcp/compensate"]``.

Two forms are read. The mcp-compensate extension's, as its authors wrote it::

    {"reversibility": "readonly" | "compensable" | "irreversible",
     "compensation": {"toolName": "delete_record",
                      "parameterMapping": {"id": "$.output.structuredContent.id"},
                      "timeoutMs": 5000, "maxRetries": 2},
     "sideEffectScope": ["records"], "notes": "..."}

and the gateway's earlier shorthand, ``{"tool": ..., "args": {...}}`` (always
compensable). ``maxRetries`` counts retries after the first attempt, so the
unwind tries a compensation ``maxRetries + 1`` times; ``timeoutMs`` bounds each
attempt (one that overruns is in doubt, and retried under the same key).
A declaration that does not read raises :class:`InvalidInput` saying what is
wrong; the caller logs it and treats the tool as unclassified.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from saga_store.errors import InvalidInput, MappingError
from saga_store.protocol.mapping import parts_of

META_COMPENSATE = "dev.chronomcp/compensate"
SPEC_KEYS = frozenset({"reversibility", "compensation", "sideEffectScope", "notes"})
COMPENSATION_KEYS = frozenset({"toolName", "parameterMapping", "timeoutMs", "maxRetries"})
DEFAULT_ATTEMPTS = 3


@dataclass(frozen=True)
class Compensation:
    """The tool that undoes a call and its static argument mapping; how often it is
    tried, and how long each attempt may take (None: as long as the call takes)."""

    tool: str
    args: Mapping[str, str]
    max_attempts: int = DEFAULT_ATTEMPTS
    timeout_s: float | None = None


@dataclass(frozen=True)
class Declared:
    """A server's declaration of one tool, read."""

    reversibility: str
    compensation: Compensation | None = None
    scope: tuple[str, ...] = ()
    notes: str | None = None


def check_paths(args: Mapping[str, Any], where: str) -> dict[str, str]:
    """``args`` as a mapping of parameter to path; raises :class:`InvalidInput` for
    one that is not ``$.input.<field>`` or ``$.output.<field>``."""
    for param, path in args.items():
        try:
            parts_of(path)
        except MappingError:
            raise InvalidInput(f"{where}: compensation argument {param!r} must map from "
                               f"'$.input.<field>' or '$.output.<field>', got {path!r}") from None
    return dict(args)


def read_declared(raw: Any, tool: str) -> Declared:
    """The declaration ``raw`` of ``tool``, in either form."""
    where = f"tool {tool}: _meta {META_COMPENSATE}"
    if not isinstance(raw, Mapping):
        raise InvalidInput(f"{where} must be an object")
    if "reversibility" not in raw:
        return _shorthand(raw, where)
    extra = set(raw) - SPEC_KEYS
    if extra:
        raise InvalidInput(f"{where}: unknown field(s) {sorted(extra)}; the fields are "
                           f"{sorted(SPEC_KEYS)}")
    rev = raw["reversibility"]
    if rev not in ("readonly", "compensable", "irreversible"):
        raise InvalidInput(f"{where}: reversibility must be readonly, compensable or "
                           f"irreversible, got {rev!r}")
    scope = raw.get("sideEffectScope") or []
    if not isinstance(scope, list) or not all(isinstance(s, str) for s in scope):
        raise InvalidInput(f"{where}: sideEffectScope is a list of strings")
    notes = raw.get("notes")
    if notes is not None and not isinstance(notes, str):
        raise InvalidInput(f"{where}: notes is a string")
    comp = raw.get("compensation")
    if rev != "compensable":
        if comp is not None:
            raise InvalidInput(f"{where}: only a compensable tool names a compensation")
        return Declared(rev, None, tuple(scope), notes)
    return Declared(rev, _compensation(comp, where), tuple(scope), notes)


def _compensation(comp: Any, where: str) -> Compensation:
    if not isinstance(comp, Mapping) or not isinstance(comp.get("toolName"), str) \
            or not comp["toolName"]:
        raise InvalidInput(f"{where}: a compensable tool needs compensation = {{\"toolName\": "
                           "..., \"parameterMapping\": {...}}")
    extra = set(comp) - COMPENSATION_KEYS
    if extra:
        raise InvalidInput(f"{where}: unknown compensation field(s) {sorted(extra)}; the "
                           f"fields are {sorted(COMPENSATION_KEYS)}")
    mapping = comp.get("parameterMapping") or {}
    if not isinstance(mapping, Mapping):
        raise InvalidInput(f"{where}: parameterMapping is an object of parameter: path")
    timeout = comp.get("timeoutMs")
    if timeout is not None and (not _positive_int(timeout)):
        raise InvalidInput(f"{where}: timeoutMs is a whole number of milliseconds above 0, "
                           f"got {timeout!r}")
    retries = comp.get("maxRetries", DEFAULT_ATTEMPTS - 1)
    if not _positive_int(retries) and retries != 0:
        raise InvalidInput(f"{where}: maxRetries is a whole number, 0 or more, got "
                           f"{retries!r}")
    return Compensation(comp["toolName"], check_paths(mapping, where), int(retries) + 1,
                        timeout / 1000 if timeout is not None else None)


def _shorthand(raw: Mapping[str, Any], where: str) -> Declared:
    if not isinstance(raw.get("tool"), str) or not isinstance(raw.get("args") or {}, Mapping):
        raise InvalidInput(f"{where}: declare {{\"reversibility\": ..., \"compensation\": "
                           "{\"toolName\": ..., \"parameterMapping\": {...}}}")
    return Declared("compensable", Compensation(raw["tool"], check_paths(raw.get("args") or {},
                                                                         where)))


def _positive_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0
