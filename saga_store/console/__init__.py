"""The operator console (``saga console``): a web app over the same Redis.

Sagas newest first, one saga's timeline drawn and kept live as events land,
the approvals inbox, the attention list and verification status. Needs the
``console`` extra: ``pip install 'saga-store[console]'``.

>>> from saga_store.console import ConsoleConfig, create_app   # doctest: +SKIP
>>> app = create_app(saga_store, ConsoleConfig())               # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import create_app
    from .config import ConsoleConfig

__all__ = ["ConsoleConfig", "create_app"]

# imported on first use: the listing helpers here serve 'saga ls' on a plain install,
# which has no Starlette
_LAZY = {"create_app": ".app", "ConsoleConfig": ".config"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
