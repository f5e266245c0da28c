"""Templates: Jinja2 with autoescaping on for every template, and the filters
the pages use (UTC times, durations, masked JSON)."""

from __future__ import annotations

from typing import Any

import jinja2
import orjson
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.templating import Jinja2Templates

from .masking import mask
from .timeline import duration, utc

STATE_CLASS = {"running": "run", "compensating": "comp", "committed": "ok",
               "compensated": "undone", "needs_attention": "attn", "stuck": "stuck",
               "waiting_approval": "wait", "in_doubt": "doubt", "retrying": "retry"}


def _pretty(value: Any) -> str:
    return orjson.dumps(mask(value), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS
                        ).decode()


def make_templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("saga_store.console", "templates"),
        autoescape=True,  # every template, whatever its name: pages show agent-made text
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(utc=utc, duration=duration, pretty=_pretty,
                       state_class=lambda s: STATE_CLASS.get(str(s), "run"))
    return Jinja2Templates(env=env)


def page(request: Request, name: str, context: dict[str, Any],
         status_code: int = 200) -> HTMLResponse:
    """Render ``name`` with what every page needs: who is signed in, the CSRF token."""
    templates: Jinja2Templates = request.app.state.templates
    full = {"operator": request.state.operator, "csrf": request.state.csrf,
            "read_only": getattr(request.state, "read_only", False),
            "counts": getattr(request.state, "counts", None),
            "token_login": request.app.state.config.token_login, **context}
    response: HTMLResponse = templates.TemplateResponse(request, name, full,
                                                        status_code=status_code)
    return response


def flash(request: Request) -> dict[str, str]:
    """What the last action did (``done``) or why it was refused (``error``), from
    the query a see-other carried; shown escaped, never as HTML."""
    q = request.query_params
    return {k: q[k][:500] for k in ("done", "error") if q.get(k)}


def fragment(request: Request, name: str, context: dict[str, Any]) -> str:
    """A template rendered to a string (the live page's updates)."""
    templates: Jinja2Templates = request.app.state.templates
    return templates.get_template(name).render(context)
