"""The console's ASGI application: routes, templates, static files, the guard."""

from __future__ import annotations

import redis
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from saga_store import SagaError, SagaStore, StoreUnavailable

from . import actions, fleet_page, live, ops, overview, sagas, search
from .config import ConsoleConfig
from .counts import NavCounts, Tally
from .render import make_templates, page
from .security import Guard
from .verify_status import VerifyStatus


async def _home(request: Request) -> Response:
    return RedirectResponse("/sagas", 303)


async def _health(request: Request) -> Response:
    return PlainTextResponse("ok")


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if "text/html" not in request.headers.get("accept", "") or \
            getattr(request.state, "operator", None) is None:
        return PlainTextResponse(str(exc.detail), status_code=exc.status_code)
    return page(request, "error.html", {"status": exc.status_code, "message": exc.detail},
                status_code=exc.status_code)


async def _store_error(request: Request, exc: Exception) -> Response:
    unavailable = isinstance(exc, StoreUnavailable | redis.RedisError)
    status = 503 if unavailable else 500
    message = (f"Redis is unreachable or refused the request: {exc}" if unavailable
               else f"{type(exc).__name__}: {exc}")
    if getattr(request.state, "operator", None) is None:
        return PlainTextResponse(message, status_code=status)
    return page(request, "error.html", {"status": status, "message": message},
                status_code=status)


def create_app(saga_store: SagaStore, config: ConsoleConfig | None = None) -> Starlette:
    """The operator console for ``saga_store``'s Redis.

    >>> app = create_app(SagaStore.from_url(url, Registry()))  # doctest: +SKIP
    >>> uvicorn.run(app, host="127.0.0.1", port=8765)          # doctest: +SKIP
    """
    config = config or ConsoleConfig()
    config.check_bind()
    routes = [
        Route("/", _home),
        Route("/healthz", _health),
        Route("/overview", overview.overview_page),
        Route("/sagas", sagas.sagas_list),
        Route("/sagas/{saga_id}", sagas.saga_page),
        Route("/sagas/{saga_id}/export.jsonl", sagas.saga_export),
        Route("/sagas/{saga_id}/live", live.saga_live),
        Route("/sagas/{saga_id}/do/{action}", actions.confirm_page),
        Route("/sagas/{saga_id}/do/{action}", actions.act, methods=["POST"]),
        Route("/approvals", ops.approvals_page),
        Route("/approvals/{saga_id}/{step}/{verdict:str}", ops.decide, methods=["POST"]),
        Route("/attention", ops.attention_page),
        Route("/attention/{saga_id}/ack", ops.ack, methods=["POST"]),
        Route("/workers", fleet_page.workers_page),
        Route("/search", search.search_page),
        Route("/verify", ops.verify_page),
        Route("/verify/run", ops.verify_run, methods=["POST"]),
        Route("/login", ops.login_page),
        Route("/login", ops.login, methods=["POST"]),
        Route("/logout", ops.logout, methods=["POST"]),
        Mount("/static", StaticFiles(packages=[("saga_store.console", "static")]),
              name="static"),
    ]
    tally = Tally(saga_store)
    app = Starlette(routes=routes, middleware=[Middleware(Guard, config=config),
                                               Middleware(NavCounts, tally=tally)],
                    exception_handlers={HTTPException: _http_error,
                                        SagaError: _store_error,
                                        redis.RedisError: _store_error})
    app.state.saga_store = saga_store
    app.state.config = config
    app.state.tally = tally
    app.state.templates = make_templates()
    app.state.verify = VerifyStatus(saga_store.events, config.anchor_file)
    return app
