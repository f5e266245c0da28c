"""Helpers for the console tests: an app on the test's Redis, and forms posted
the way a browser posts them (with the CSRF token the page carried)."""

from __future__ import annotations

import re
from typing import Any

import httpx
from starlette.testclient import TestClient

from saga_store import SagaStore
from saga_store.console import ConsoleConfig, create_app

CSRF_FIELD = re.compile(r'name="csrf" value="([^"]+)"')


def console(saga_store: SagaStore, **config: Any) -> TestClient:
    """A test client for a console on ``saga_store``'s Redis."""
    defaults: dict[str, Any] = {"operator": "olivia", "page_size": 3, "live_block_ms": 300}
    app = create_app(saga_store, ConsoleConfig(**{**defaults, **config}))
    # a name the console serves: any other Host is refused (DNS rebinding)
    return TestClient(app, base_url="http://127.0.0.1:8765", headers={"accept": "text/html"})


def csrf_of(html: str) -> str:
    found = CSRF_FIELD.search(html)
    assert found, "the page carries no CSRF token"
    return found.group(1)


def post_form(tc: TestClient, page: str, action: str, **fields: str) -> httpx.Response:
    """Open ``page``, then submit one of its forms to ``action`` as a browser would."""
    got = tc.get(page)
    assert got.status_code == 200, got.text
    # a page with no form left on it (an emptied inbox): the token the last one had
    token = csrf_of(got.text) if CSRF_FIELD.search(got.text) else tc.cookies["saga_csrf"]
    return tc.post(action, data={"csrf": token, **fields}, follow_redirects=False)
