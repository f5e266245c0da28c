"""Adapters that make an agent framework's tool calls steps of a saga.

One module per framework, each behind its own extra:

* :mod:`saga_store.integrations.openai_agents` (``saga-store[openai-agents]``)
* :mod:`saga_store.integrations.pydantic_ai` (``saga-store[pydantic-ai]``)
* :mod:`saga_store.integrations.langgraph` (``saga-store[langgraph]``)
* :mod:`saga_store.integrations.anthropic` (``saga-store[anthropic]``)

They share :mod:`saga_store.integrations._common`: which tools the model sees,
their schemas, running a call as a step, what a failure tells the model, and
the rollback-aware rewrite of the history. Importing this package imports no
framework.

:func:`saga_registry` (:mod:`saga_store.integrations.native`) takes the
framework's own tool objects, with their compensations, as a registry for sagas
run inline.
"""

from __future__ import annotations

from saga_store.integrations.native import saga_registry

__all__ = ["missing_extra", "saga_registry"]


def missing_extra(extra: str, exc: ImportError) -> ImportError:
    """The error an adapter raises when its framework is not installed: it names the
    extra that installs it."""
    return ImportError(f"{exc.name or 'a module'} is not installed, and the adapter "
                       f"needs it: pip install 'saga-store[{extra}]'", name=exc.name)
