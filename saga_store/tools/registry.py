"""The registry: the only tools a worker will run, by name.

Callables are never resolved from data: a job names a tool, the registry
looks the name up, and an unknown name is refused (dramatiq's ActorNotFound,
unlike RQ's import_attribute).
"""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Iterable, Iterator
from typing import Any

from saga_store.errors import InvalidInput, UnknownTool
from saga_store.protocol.vocab import Reversibility
from saga_store.tools.spec import ToolSpec, check_mapping_targets, spec_of


def _import(name: str) -> Any:
    """Import a tools module; whatever goes wrong in it becomes one line that says
    where (the traceback stays on the exception's cause)."""
    try:
        return importlib.import_module(name)
    except SyntaxError as exc:
        raise InvalidInput(f"tools module {name!r} does not compile: {exc.msg} "
                           f"({exc.filename}, line {exc.lineno})") from exc
    except ImportError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
            raise InvalidInput(f"no tools module {name!r} (looked in the current folder and "
                               "PYTHONPATH); check --tools / SAGA_TOOLS") from exc
        raise InvalidInput(f"tools module {name!r} could not be imported: {exc}; is it "
                           "installed in this environment?") from exc
    except Exception as exc:  # anything its top level raises: reported, never a traceback
        frames = traceback.extract_tb(exc.__traceback__)
        at = f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""
        raise InvalidInput(f"tools module {name!r} failed while loading: "
                           f"{type(exc).__name__}: {exc}{at}") from exc


class Registry:
    """Tools by name. Build one from modules with :meth:`from_modules`."""

    # tools that live in this process only (``saga_registry``): no worker can run them
    inline_only = False

    def __init__(self, tools: Iterable[Any] = ()) -> None:
        self._tools: dict[str, ToolSpec] = {}
        for t in tools:
            self.add(t)
        self.check()

    def add(self, fn_or_spec: Any) -> ToolSpec:
        spec = fn_or_spec if isinstance(fn_or_spec, ToolSpec) else spec_of(fn_or_spec)
        if spec is None:
            raise InvalidInput(f"{fn_or_spec!r} is not a tool; decorate it with @tool")
        other = self._tools.get(spec.name)
        if other is not None and other.fn is not spec.fn:
            raise InvalidInput(f"two tools are named {spec.name!r}; "
                               "rename one with @tool(name=...)")
        self._tools[spec.name] = spec
        return spec

    @classmethod
    def from_modules(cls, *names: str) -> Registry:
        """Every ``@tool`` function defined in the named modules, checked together."""
        reg = cls()
        for name in names:
            module = _import(name)
            for value in vars(module).values():
                spec = spec_of(value)
                if spec is not None:
                    reg.add(spec)
        reg.check()
        return reg

    def check(self) -> None:
        """Every compensation and probe exists, and every mapping fits its compensation."""
        for spec in self._tools.values():
            if spec.compensation is not None:
                comp = self._tools.get(spec.compensation)
                if comp is None:
                    raise InvalidInput(f"tool {spec.name}: compensation {spec.compensation!r} "
                                       "is not a registered tool")
                check_mapping_targets(spec.name, spec.mapping, comp)
            if spec.probe is not None and spec.probe not in self._tools:
                raise InvalidInput(f"tool {spec.name}: probe {spec.probe!r} is not registered")

    def get(self, name: str) -> ToolSpec:
        spec = self._tools.get(name) if isinstance(name, str) else None
        if spec is None:
            known = ", ".join(sorted(self._tools)) or "none"
            raise UnknownTool(f"unknown tool {name!r}; registered tools: {known}", field="tool")
        return spec

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[ToolSpec]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    # -- schemas for LLM providers ---------------------------------------

    def schemas(self, fmt: str = "openai") -> list[dict[str, Any]]:
        """Tool schemas for ``openai`` (function calling), ``anthropic`` (tool use) or ``mcp``."""
        out = []
        for spec in self._tools.values():
            params = spec.args_model.model_json_schema()
            params.pop("title", None)
            desc = _describe(spec)
            if fmt == "openai":
                out.append({"type": "function", "function": {
                    "name": spec.name, "description": desc, "parameters": params}})
            elif fmt == "anthropic":
                out.append({"name": spec.name, "description": desc, "input_schema": params})
            elif fmt == "mcp":
                out.append({"name": spec.name, "description": desc, "inputSchema": params,
                            "annotations": {
                                "readOnlyHint": spec.reversibility is Reversibility.READONLY,
                                "destructiveHint":
                                    spec.reversibility is Reversibility.IRREVERSIBLE}})
            else:
                raise InvalidInput(f"unknown schema format {fmt!r}: use openai, anthropic or mcp")
        return out


def _describe(spec: ToolSpec) -> str:
    note = {Reversibility.READONLY: "Read-only.",
            Reversibility.COMPENSABLE: f"Can be undone (by {spec.compensation}).",
            Reversibility.IRREVERSIBLE: "Cannot be undone."}[spec.reversibility]
    return f"{spec.description} {note}".strip()
