"""How the MCP gateway knows a downstream tool: can it be undone, and how.

Classification of a downstream tool (first that says something wins):
1. the local tools-map file (``[tools.NAME]`` with ``reversibility`` and, for
   compensable tools, ``compensation = { tool = ..., args = { p = "$.input.x" } }``);
2. the tool's ``_meta["dev.chronomcp/compensate"]``, in the mcp-compensate
   extension's form (``reversibility``, ``compensation.toolName``,
   ``parameterMapping``, ``timeoutMs``, ``maxRetries``, ``sideEffectScope``,
   ``notes``) or the shorthand ``{"tool": ..., "args": {...}}``
   (:mod:`saga_store.mcp.declared`); a server's ``readonly`` counts as the
   annotations' ``readOnlyHint`` does;
3. the tool's MCP annotations: ``readOnlyHint`` makes it read-only for rollback
   purposes, but for the policy it stays ``unknown`` unless the policy trusts
   server hints; a server never talks its way past a stricter local policy;
4. otherwise unknown: treated as mutating and not undoable.

Compensation arguments come only from the static mapping: ``$.input.<path>``
(the call's arguments) or ``$.output.<path>`` (its logged result, e.g.
``$.output.structuredContent.id``). One that does not resolve is recorded as
``step_not_compensable`` with the reason, and the saga ends needing a person.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from saga_store.approval.policy import read_config
from saga_store.errors import InvalidInput, MappingError
from saga_store.mcp.declared import (
    DEFAULT_ATTEMPTS,
    META_COMPENSATE,
    Compensation,
    check_paths,
    read_declared,
)
from saga_store.protocol.mapping import parts_of
from saga_store.protocol.vocab import Reversibility, Unclassified

__all__ = ["META_COMPENSATE", "Classification", "Compensation", "classify", "load_tools_map"]
REVERSIBILITIES = frozenset(r.value for r in Reversibility)

log = logging.getLogger("saga_store.gateway")


@dataclass(frozen=True)
class Classification:
    # unknown is a value of its own all the way to the log and back (never None)
    reversibility: Reversibility | Unclassified
    compensation: Compensation | None = None
    source: str = "none"  # tools-map, _meta, annotations, none
    server_readonly: bool = False  # only the server says it is read-only
    secret: frozenset[str] = frozenset()  # arguments never written to the log
    probe: Compensation | None = None  # asks the server whether an in-doubt call happened
    scope: tuple[str, ...] = ()  # what the call touches, as the server declares it
    notes: str | None = None  # the server's word on the tool, shown to approvers
    problem: str | None = None  # why the declared compensation can never work

    def unusable(self, problem: str) -> Classification:
        """This classification with a compensation that cannot make a valid call: its
        calls are mutating and not undoable (the policy treats them as unknown)."""
        return dataclasses.replace(self, reversibility=Unclassified.UNKNOWN, compensation=None,
                                   server_readonly=False, problem=problem)

    def for_policy(self, trust_server_hints: bool) -> str:
        if self.server_readonly and not trust_server_hints:
            return Unclassified.UNKNOWN
        return self.reversibility

    @property
    def mutating(self) -> bool:
        return self.reversibility is not Reversibility.READONLY

    def label(self) -> str:
        if self.problem is not None:
            return ("NOT UNDOABLE: its declared compensation cannot make a valid call "
                    f"({self.problem})")
        if self.reversibility is Reversibility.READONLY:
            return "read-only" + (" (server's claim)" if self.server_readonly else "")
        if self.compensation is not None:
            return f"compensable: undone by {self.compensation.tool} if a later call fails"
        if self.reversibility is Reversibility.IRREVERSIBLE:
            return "IRREVERSIBLE: cannot be undone"
        return "unclassified: treated as mutating and not undoable"


def load_tools_map(path: str | Path) -> dict[str, Classification]:
    """The local tools-map (TOML, or YAML); it wins over anything a server says."""
    p = Path(path)
    doc = read_config(p, "tools map")
    out = {}
    for name, entry in (doc.get("tools") or {}).items():
        where = f"tools map {p}: tools.{name}"
        if not isinstance(entry, dict):
            raise InvalidInput(f"{where} must be a table")
        comp = entry.get("compensation")
        rev = entry.get("reversibility", "compensable" if comp else None)
        if rev not in REVERSIBILITIES:
            raise InvalidInput(f"{where}: reversibility must be readonly, compensable or "
                               "irreversible")
        secret = entry.get("secret") or []
        if not isinstance(secret, list) or not all(isinstance(s, str) for s in secret):
            raise InvalidInput(f"{where}: secret is a list of argument names")
        compensation = _compensation(comp, where, rev)
        if compensation is not None:
            leaked = [p for p, path in compensation.args.items()
                      if path.split(".")[1] == "input" and path.split(".")[2] in secret]
            if leaked:
                raise InvalidInput(f"{where}: compensation argument(s) {leaked} would copy a "
                                   "secret into the log; map an id from the output instead")
        probe = _probe(entry.get("probe"), where)
        out[name] = Classification(Reversibility(rev), compensation, "tools-map",
                                   secret=frozenset(secret), probe=probe)
    return out


def _probe(raw: Any, where: str) -> Compensation | None:
    """``probe = { tool = "...", args = { param = "$.input.x" } }``: a read-only tool
    that answers, for an in-doubt call, ``{"happened": false}`` or what it made."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("tool"), str) \
            or not isinstance(raw.get("args") or {}, dict):
        raise InvalidInput(f"{where}: probe = {{ tool = \"...\", args = {{ param = "
                           "\"$.input.x\" }} }}")
    args = dict(raw.get("args") or {})
    for param, path in args.items():
        try:
            root = parts_of(path)[0]
        except MappingError:
            root = ""
        if root != "input":  # an in-doubt call has no output to map from
            raise InvalidInput(f"{where}: probe argument {param!r} must map from "
                               f"'$.input.<field>', got {path!r}")
    return Compensation(raw["tool"], args)


def _compensation(raw: Any, where: str, rev: str) -> Compensation | None:
    if rev != "compensable":
        if raw:
            raise InvalidInput(f"{where}: only a compensable tool names a compensation")
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("tool"), str):
        raise InvalidInput(f"{where}: a compensable tool needs compensation = "
                           "{ tool = \"...\", args = { param = \"$.input.x\" } }")
    unknown = set(raw) - {"tool", "args", "timeout_s", "attempts"}
    if unknown:
        raise InvalidInput(f"{where}: compensation takes tool, args, timeout_s and attempts, "
                           f"not {sorted(unknown)}")
    args = raw.get("args") or {}
    if not isinstance(args, dict):
        raise InvalidInput(f"{where}: compensation args is a table of param = path")
    timeout = raw.get("timeout_s")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                                or not 0 < timeout < float("inf")):
        raise InvalidInput(f"{where}: compensation timeout_s is a number of seconds above 0 "
                           f"(each try of the undo), got {timeout!r}")
    attempts = raw.get("attempts", DEFAULT_ATTEMPTS)
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise InvalidInput(f"{where}: compensation attempts is a whole number from 1 (tries "
                           f"of the undo before the saga is stuck), got {attempts!r}")
    return Compensation(raw["tool"], check_paths(args, where), attempts,
                        float(timeout) if timeout is not None else None)


def classify(tool: Any, tools_map: Mapping[str, Classification]) -> Classification:
    """Classify a downstream ``Tool`` (an object with name, meta, annotations)."""
    if tool.name in tools_map:
        return tools_map[tool.name]
    meta = getattr(tool, "meta", None) or {}
    declared = meta.get(META_COMPENSATE) if isinstance(meta, dict) else None
    if declared is not None:
        try:
            d = read_declared(declared, tool.name)
        except InvalidInput as exc:
            log.warning("%s; treating %s as unclassified", exc, tool.name)
        else:
            return Classification(Reversibility(d.reversibility), d.compensation, "_meta",
                                  server_readonly=d.reversibility == Reversibility.READONLY,
                                  scope=d.scope, notes=d.notes)
    ann = getattr(tool, "annotations", None)
    if ann is not None and getattr(ann, "read_only_hint", None):
        return Classification(Reversibility.READONLY, None, "annotations",
                              server_readonly=True)
    if ann is not None and getattr(ann, "destructive_hint", None) is True:
        return Classification(Reversibility.IRREVERSIBLE, None, "annotations")
    return Classification(Unclassified.UNKNOWN)
