"""Approval policy: per call, ``allow``, ``require_approval`` or ``deny``.

A policy file is TOML (or the same as YAML, in a .yaml or .yml file)::

    [defaults]                      # by reversibility; these are the safe defaults
    readonly = "allow"
    compensable = "allow"
    irreversible = "require_approval"
    unknown = "require_approval"    # a tool nobody classified locally is mutating
    production = "require_approval" # the least a PRODUCTION call gets
    production_pattern = "(?i)\\b(prod|production)\\b"
    approval_timeout_s = 3600       # a forgotten approval becomes a denial (0: never)

    [[rules]]                       # first match wins over the defaults
    tool = "drop_*"                 # glob on the tool name
    decision = "deny"

    [[rules]]
    tool = "charge_*"
    args = { amount_cents = "^[0-9]{5,}$" }   # regex on each named argument
    decision = "require_approval"

    [[rules]]
    reversibility = ["irreversible"]
    production = true               # only calls flagged PRODUCTION
    decision = "deny"

A call is PRODUCTION when any string in its arguments matches
``production_pattern``. Whatever decided, a PRODUCTION call gets at least the
``production`` decision. A tool's own default (``@tool(approval=...)``) applies
when no rule matches, if it is stricter than the reversibility default.
Reversibility comes from local declarations only (the tool's code, or the
gateway's tools-map); a remote server's claim that a tool is read-only makes
it ``unknown`` here unless ``trust_server_hints = true``.
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from saga_store.errors import InvalidInput

SAFE_APPROVAL_TIMEOUT_S = 3600


class Decision(StrEnum):
    ALLOW = "allow"
    REQUIRE_APPROVAL = "require_approval"
    DENY = "deny"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {Decision.ALLOW: 0, Decision.REQUIRE_APPROVAL: 1, Decision.DENY: 2}
REVERSIBILITIES = ("readonly", "compensable", "irreversible", "unknown")
DEFAULT_PRODUCTION = r"(?i)\b(prod|production)\b"


@dataclass(frozen=True)
class Rule:
    decision: Decision
    tool: str = "*"
    reversibility: frozenset[str] | None = None
    args: Mapping[str, re.Pattern[str]] = field(default_factory=dict)
    production: bool | None = None
    name: str = ""

    def matches(self, tool: str, reversibility: str, args: Mapping[str, Any],
                production: bool) -> bool:
        if not fnmatch.fnmatchcase(tool, self.tool):
            return False
        if self.reversibility is not None and reversibility not in self.reversibility:
            return False
        if self.production is not None and self.production != production:
            return False
        for name, pattern in self.args.items():
            if name not in args or not pattern.search(_text(args[name])):
                return False
        return True


@dataclass(frozen=True)
class Verdict:
    decision: Decision
    reason: str
    production: bool


@dataclass(frozen=True)
class Policy:
    defaults: Mapping[str, Decision]
    rules: tuple[Rule, ...] = ()
    production_pattern: re.Pattern[str] = re.compile(DEFAULT_PRODUCTION)
    production_decision: Decision = Decision.REQUIRE_APPROVAL
    approval_timeout_s: float = 0.0
    trust_server_hints: bool = False
    source: str = "built-in"

    @classmethod
    def safe(cls) -> Policy:
        """The defaults of a policy file that sets nothing."""
        return cls.from_dict({}, source="built-in safe defaults")

    @classmethod
    def permissive(cls) -> Policy:
        """Allow every call (tools' own approval defaults still apply): what workers
        use when no policy file is configured."""
        allow = dict.fromkeys(REVERSIBILITIES, Decision.ALLOW)
        return cls(defaults=allow, production_decision=Decision.ALLOW, source="none (allow)")

    @classmethod
    def load(cls, path: str | Path) -> Policy:
        return cls.from_dict(read_config(path, "policy file"), source=str(path))

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], source: str = "dict") -> Policy:
        unknown = set(doc) - {"defaults", "rules"}
        if unknown:
            raise InvalidInput(f"policy {source}: unknown section(s) {sorted(unknown)}; "
                               "use [defaults] and [[rules]]")
        d = dict(doc.get("defaults") or {})
        defaults = {"readonly": Decision.ALLOW, "compensable": Decision.ALLOW,
                    "irreversible": Decision.REQUIRE_APPROVAL,
                    "unknown": Decision.REQUIRE_APPROVAL}
        for rev in REVERSIBILITIES:
            if rev in d:
                defaults[rev] = _decision(d.pop(rev), f"{source}: defaults.{rev}")
        production = _decision(d.pop("production", "require_approval"),
                               f"{source}: defaults.production")
        pattern = _regex(d.pop("production_pattern", DEFAULT_PRODUCTION),
                         f"{source}: defaults.production_pattern")
        # a forgotten approval becomes a denial: nothing waits on a person forever
        timeout = d.pop("approval_timeout_s", SAFE_APPROVAL_TIMEOUT_S)
        if not isinstance(timeout, int | float) or timeout < 0:
            raise InvalidInput(f"policy {source}: defaults.approval_timeout_s must be a "
                               "number of seconds (0: never)")
        trust = d.pop("trust_server_hints", False)
        if d:
            raise InvalidInput(f"policy {source}: unknown default(s) {sorted(d)}")
        rules = tuple(_rule(r, f"{source}: rules[{i}]") for i, r in
                      enumerate(doc.get("rules") or []))
        return cls(defaults=defaults, rules=rules, production_pattern=pattern,
                   production_decision=production, approval_timeout_s=float(timeout),
                   trust_server_hints=bool(trust), source=source)

    def is_production(self, args: Any) -> bool:
        return any(self.production_pattern.search(s) for s in _strings(args))

    def decide(self, tool: str, reversibility: str | None, args: Mapping[str, Any],
               tool_default: Decision | None = None) -> Verdict:
        rev = reversibility if reversibility in REVERSIBILITIES else "unknown"
        # scanning every argument string is work on each step's path: do it only
        # where the flag can change the decision (or shows in a preview, below)
        matters = self.production_decision is not Decision.ALLOW or any(
            r.production is not None for r in self.rules)
        production = self.is_production(args) if matters else False
        for rule in self.rules:
            if rule.matches(tool, rev, args, production):
                decision, reason = rule.decision, f"policy rule {rule.name}"
                break
        else:
            decision, reason = self.defaults[rev], f"default for {rev} tools"
            if tool_default is not None and tool_default.rank > decision.rank:
                decision, reason = tool_default, f"the tool's own default ({tool_default})"
        if production and self.production_decision.rank > decision.rank:
            decision, reason = self.production_decision, "PRODUCTION arguments"
        if not matters and decision is not Decision.ALLOW:
            production = self.is_production(args)  # a person will see the flag
        return Verdict(decision, reason, production)


def read_config(path: str | Path, what: str) -> dict[str, Any]:
    """A TOML file, or a YAML one (``.yaml``/``.yml``) read the same way, as a dict;
    or :class:`InvalidInput` saying what is wrong with it."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"cannot read {what} {p}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{what} {p} is not UTF-8 text: {exc}") from None
    if p.suffix.lower() not in (".yaml", ".yml"):
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise InvalidInput(f"{what} {p} is not valid TOML: {exc} (a YAML file needs "
                               "a .yaml or .yml name)") from None
    try:
        import yaml
    except ImportError:
        raise InvalidInput(f"{what} {p} is YAML, which needs PyYAML: pip install "
                           "'saga-store[yaml]', or write it as TOML") from None
    try:
        doc = yaml.safe_load(text)  # plain data only: no tags that build objects
    except yaml.YAMLError as exc:
        raise InvalidInput(f"{what} {p} is not valid YAML: {exc}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict) or not all(isinstance(k, str) for k in doc):
        raise InvalidInput(f"{what} {p}: the top level must be a mapping of section "
                           f"names, not {type(doc).__name__}")
    return doc


def _decision(value: Any, where: str) -> Decision:
    try:
        return Decision(value)
    except ValueError:
        raise InvalidInput(f"{where}: {value!r} is not one of allow, require_approval, "
                           "deny") from None


def _regex(value: Any, where: str) -> re.Pattern[str]:
    if not isinstance(value, str):
        raise InvalidInput(f"{where}: expected a regular expression string")
    try:
        return re.compile(value)
    except re.error as exc:
        raise InvalidInput(f"{where}: bad regular expression: {exc}") from None


def _rule(raw: Any, where: str) -> Rule:
    if not isinstance(raw, dict):
        raise InvalidInput(f"{where}: a rule is a table with decision and matchers")
    r = dict(raw)
    if "decision" not in r:
        raise InvalidInput(f"{where}: a rule needs a decision")
    decision = _decision(r.pop("decision"), where)
    tool = r.pop("tool", "*")
    revs = r.pop("reversibility", None)
    if isinstance(revs, str):
        revs = [revs]
    if revs is not None and (not isinstance(revs, list)
                             or not set(revs) <= set(REVERSIBILITIES)):
        raise InvalidInput(f"{where}: reversibility must list some of {REVERSIBILITIES}")
    args = r.pop("args", {})
    if not isinstance(args, dict):
        raise InvalidInput(f"{where}: args is a table of argument name = regex")
    production = r.pop("production", None)
    number = int(where.rsplit("[", 1)[-1].rstrip("]")) + 1  # as a person counts them
    name = str(r.pop("name", "")) or f"#{number}"
    if r:
        raise InvalidInput(f"{where}: unknown key(s) {sorted(r)}")
    if not isinstance(tool, str):
        raise InvalidInput(f"{where}: tool is a glob string")
    return Rule(decision=decision, tool=tool,
                reversibility=frozenset(revs) if revs is not None else None,
                args={k: _regex(v, f"{where}.args.{k}") for k, v in args.items()},
                production=production if production is None else bool(production), name=name)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _strings(v)]
    return []
