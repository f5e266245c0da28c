"""An adapter whose framework is not installed says which extra installs it."""

from __future__ import annotations

import importlib
import sys

import pytest


@pytest.mark.parametrize(("adapter", "framework", "extra"), [
    ("openai_agents", "agents", "openai-agents"),
    ("pydantic_ai", "pydantic_ai", "pydantic-ai"),
    ("langgraph", "langchain_core", "langgraph"),
])
def test_a_missing_framework_names_its_extra(
        monkeypatch: pytest.MonkeyPatch, adapter: str, framework: str, extra: str) -> None:
    module = f"saga_store.integrations.{adapter}"
    monkeypatch.delitem(sys.modules, module, raising=False)
    for name in [m for m in sys.modules if m == framework or m.startswith(framework + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, framework, None)  # import raises ImportError
    with pytest.raises(ImportError, match=rf"pip install 'saga-store\[{extra}\]'"):
        importlib.import_module(module)
