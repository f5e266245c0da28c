"""The operator console (``saga console``): a web app over the same Redis.

Sagas newest first, one saga's timeline drawn and kept live as events land,
the approvals inbox, the attention list and verification status. Needs the
``console`` extra: ``pip install 'saga-store[console]'``.

>>> from saga_store.console import ConsoleConfig, create_app   # doctest: +SKIP
>>> app = create_app(saga_store, ConsoleConfig())               # doctest: +SKIP
"""

from .app import create_app
from .config import ConsoleConfig

__all__ = ["ConsoleConfig", "create_app"]
