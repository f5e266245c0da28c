"""Who is asking, and whether a form really came from the console.

:class:`Guard` is ASGI middleware in front of every route: it answers only
requests whose Host names this console (400 otherwise, before any cookie or
token is handed out: see ``ConsoleConfig.serves``), names the
operator (proxy header, bearer token, login cookie, or the configured name of
an open loopback console), turns strangers away, hands each browser a signed
CSRF token in a cookie, and adds headers that keep pages from being framed
or running foreign scripts. A read-only sign-in
(``SAGA_CONSOLE_READONLY_TOKEN``) sees every page, and every POST it sends
but signing in and out is refused here with 403, whatever route it names, so
no action can be added that forgets to check. :func:`checked_form` is how every POST handler
reads its form: the form's ``csrf`` field must equal the cookie (double
submit) and carry a valid signature, and a request whose Origin is not a
name this console serves is refused.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from typing import Any
from urllib.parse import quote, urlsplit

from starlette.datastructures import FormData, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from saga_store import InvalidInput

from .config import ConsoleConfig, check_name

CSRF_COOKIE = "saga_csrf"
SESSION_COOKIE = "saga_session"
SESSION_S = 12 * 3600
PUBLIC = ("/login", "/static/", "/healthz")
SIGN_IN_OUT = ("/login", "/logout")  # the only POSTs a read-only sign-in may send
# a load balancer's probe names the address it dials; the answer is "ok" and no cookie
ANY_HOST = "/healthz"
HEADERS = {
    # every script and style is a file of ours: no inline code, no other origin
    "content-security-policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; frame-ancestors 'none'; "
                               "form-action 'self'; base-uri 'none'",
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


def _sign(key: bytes, purpose: str, value: str) -> str:
    return hmac.new(key, f"{purpose}|{value}".encode(), hashlib.sha256).hexdigest()[:40]


def new_csrf(key: bytes) -> str:
    nonce = secrets.token_urlsafe(18)
    return f"{nonce}.{_sign(key, 'csrf', nonce)}"


def csrf_valid(key: bytes, token: str | None) -> bool:
    if not token or "." not in token:
        return False
    nonce, _, sig = token.partition(".")
    return hmac.compare_digest(sig, _sign(key, "csrf", nonce))


def session_cookie(key: bytes, name: str, now: float | None = None,
                   read_only: bool = False) -> str:
    """A login cookie naming ``name`` (and whether they may only look) until it
    expires, signed with ``key``."""
    expires = int((now or time.time()) + SESSION_S)
    who = base64.urlsafe_b64encode(name.encode()).decode()
    role = "ro" if read_only else "op"
    return f"{who}.{role}.{expires}.{_sign(key, 'session', f'{who}.{role}.{expires}')}"


def session_holder(key: bytes, cookie: str | None) -> tuple[str, bool] | None:
    """``(name, read_only)`` of a valid, unexpired login cookie."""
    try:
        who, role, expires, sig = (cookie or "").split(".")
        if not hmac.compare_digest(sig, _sign(key, "session", f"{who}.{role}.{expires}")):
            return None
        if int(expires) < time.time():
            return None
        return base64.urlsafe_b64decode(who.encode()).decode(), role == "ro"
    except ValueError:  # wrong shape, bad base64 or number, not UTF-8
        return None


def identify(config: ConsoleConfig, request: Request) -> tuple[str, bool] | None:
    """``(name, read_only)`` of who asks, or None when the request proves no identity."""
    if config.user_header is not None:
        value = request.headers.get(config.user_header)
        if value:
            try:
                return check_name(value), False
            except InvalidInput:
                return None
    if config.token_login:
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return config.token_holder(auth[7:].strip())
        return session_holder(config.signing_key, request.cookies.get(SESSION_COOKIE))
    return (config.operator, False) if config.open_access else None


class Guard:
    """ASGI middleware: authentication, the CSRF cookie, security headers."""

    def __init__(self, app: ASGIApp, config: ConsoleConfig) -> None:
        self.app, self.config = app, config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        path: str = scope["path"]
        if path == ANY_HOST:
            await self.app(scope, receive, send)
            return
        host = request.headers.get("host")
        if not self.config.serves(host):
            await self._stranger(host)(scope, receive, send)
            return
        found = identify(self.config, request)
        operator, read_only = found if found else (None, False)
        if operator is None and not path.startswith(PUBLIC):
            await self._refuse(request)(scope, receive, send)
            return
        if read_only and request.method not in ("GET", "HEAD") and path not in SIGN_IN_OUT:
            await self._read_only(operator)(scope, receive, send)
            return
        csrf = request.cookies.get(CSRF_COOKIE)
        fresh = not csrf_valid(self.config.signing_key, csrf)
        if fresh:
            csrf = new_csrf(self.config.signing_key)
        scope.setdefault("state", {}).update(operator=operator, csrf=csrf, read_only=read_only)
        secure = "; Secure" if scope.get("scheme") == "https" else ""

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in HEADERS.items():
                    headers.setdefault(name, value)
                if fresh:
                    headers.append("set-cookie", f"{CSRF_COOKIE}={csrf}; Path=/; HttpOnly; "
                                                 f"SameSite=Strict{secure}")
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def _stranger(self, host: str | None) -> Response:
        # a page of another site whose name resolves here (DNS rebinding) lands here
        shown = repr(host[:100]) if host else "(none)"
        return PlainTextResponse(
            f"this console does not serve the host {shown}; reach it by a name it serves "
            "(localhost, 127.0.0.1, [::1] or its bind address), or start it with "
            "--allowed-host NAME (SAGA_CONSOLE_ALLOWED_HOSTS) for the name a proxy or DNS "
            "gives it", status_code=400, headers=HEADERS)

    def _read_only(self, name: str | None) -> Response:
        return PlainTextResponse(f"{name} signed in read-only (SAGA_CONSOLE_READONLY_TOKEN): "
                                 "nothing was done; an operator token (SAGA_CONSOLE_TOKEN) "
                                 "is needed to act", status_code=403, headers=HEADERS)

    def _refuse(self, request: Request) -> Response:
        if self.config.user_header is not None and not self.config.token_login:
            return PlainTextResponse(f"authentication required: the {self.config.user_header} "
                                     "header names nobody", status_code=401)
        # a browser is sent to sign in; a program that presented a token is told no
        if request.method == "GET" and "authorization" not in request.headers and \
                "text/html" in request.headers.get("accept", ""):
            return RedirectResponse(f"/login?next={quote(request.url.path)}", status_code=303)
        return PlainTextResponse("authentication required (Authorization: Bearer TOKEN, or "
                                 "sign in at /login)", status_code=401,
                                 headers={"www-authenticate": "Bearer"})


async def checked_form(request: Request) -> FormData:
    """The POSTed form, once its CSRF token and origin are proven; else 403."""
    origin = request.headers.get("origin")
    config: ConsoleConfig = request.app.state.config
    # against the names served, never the request's own Host, which a rebinding
    # attacker's page sets to its own name along with the Origin
    if origin and origin != "null" and not config.serves(urlsplit(origin).netloc):
        raise HTTPException(403, "cross-origin form refused: the form was not sent from a "
                                 "page of this console")
    form = await request.form()
    sent = form.get("csrf")
    cookie = request.cookies.get(CSRF_COOKIE)
    key = config.signing_key
    if not (isinstance(sent, str) and cookie and hmac.compare_digest(sent, cookie)
            and csrf_valid(key, cookie)):
        raise HTTPException(403, "the form's CSRF token is missing or stale; reload the page "
                                 "and try again")
    return form


def operator_of(request: Request) -> str:
    name: Any = request.state.operator
    if not isinstance(name, str):
        raise HTTPException(401, "authentication required")
    return name


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a path of this site only."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target
