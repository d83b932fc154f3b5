"""Rendering the pages: Jinja2 templates (autoescaped), versioned static URLs, error pages.

Everything a user typed reaches a page as text: Jinja2 escapes every value, and the scripts in
``static/`` only ever use ``textContent``. Every page gets the request's CSRF token (for its
forms and ``<meta name="csrf-token">``) and is never cached. Every page an authenticated user
sees also gets the "needs attention" banner (dead letters, campaigns paused by failures) from
the app's :class:`~sendqueue.services.operations.attention.AttentionCache`.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from starlette.exceptions import HTTPException as StarletteHTTPException

from sendqueue.domain.errors import InvalidField, NotFound
from sendqueue.domain.wording import plural
from sendqueue.services.operations.attention import Attention, AttentionCache
from sendqueue.services.reading.views import iso
from sendqueue.web.errors import RETRY_AFTER_SECONDS
from sendqueue.web.session import page_csrf_token, set_csrf_cookie
from sendqueue.web.times import human_time, zone_names_json

__all__ = [
    "STATIC_DIR",
    "TEMPLATES_DIR",
    "error_page",
    "http_error_page",
    "render",
    "render_public",
    "static_url",
]

log = logging.getLogger(__name__)

WEB_DIR = Path(__file__).resolve().parent
TEMPLATES_DIR = WEB_DIR / "templates"
STATIC_DIR = WEB_DIR / "static"

_env = Environment(
    loader=FileSystemLoader(TEMPLATES_DIR),
    autoescape=True,
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
# ``{{ count | plural("sender") }}``: "1 sender", "2 senders" (static/common.js: sq.plural).
_env.filters["plural"] = plural
# {{ value|human(zone) }}: "2026-12-04 09:30 CET"; {{ value|iso }}: the <time datetime=...>
_env.filters["human"] = human_time
_env.filters["iso"] = iso


@functools.cache
def _static_version(name: str) -> str:
    """A short content hash, so a browser never runs a stale script against a new page."""
    try:
        return hashlib.sha256((STATIC_DIR / name).read_bytes()).hexdigest()[:10]
    except OSError:
        return "0"


def static_url(name: str) -> str:
    """The URL of a file in STATIC_DIR, versioned by its content (safe to cache)."""
    return f"/static/{name}?v={_static_version(name)}"


def render(
    request: Request,
    template: str,
    *,
    status_code: int = 200,
    headers: Mapping[str, str] | None = None,
    zones: Iterable[str] = (),
    **context: Any,
) -> HTMLResponse:
    """``template`` rendered with ``context`` plus the CSRF token, the path and the login.

    ``zones`` are the zones the page shows times in (the default zone is always added): their
    abbreviations go into ``<body data-zone-names>`` for the scripts (:mod:`.times`)."""
    token, fresh = page_csrf_token(request)
    auth = getattr(request.state, "auth", None)
    default_zone = request.app.state.container.settings.default_timezone
    html = _env.get_template(template).render(
        csrf_token=token,
        static_url=static_url,
        path=request.url.path,
        logged_in=auth == "cookie",
        attention=_attention(request, auth),
        default_zone=default_zone,
        zone_names=zone_names_json([*zones, default_zone]),
        **context,
    )
    response = HTMLResponse(html, status_code=status_code, headers=dict(headers or {}))
    # pages carry live data and a CSRF token: never serve them from a cache
    response.headers["Cache-Control"] = "no-store"
    if fresh:
        set_csrf_cookie(response, token, secure=request.url.scheme == "https")
    return response


def render_public(
    template: str,
    *,
    status_code: int = 200,
    headers: Mapping[str, str] | None = None,
    **context: Any,
) -> HTMLResponse:
    """A page for people who are not operators (the unsubscribe page): ``template`` with
    ``context`` only: no CSRF token, no cookie, no banner, never cached."""
    html = _env.get_template(template).render(**context)
    response = HTMLResponse(html, status_code=status_code, headers=dict(headers or {}))
    response.headers["Cache-Control"] = "no-store"
    return response


#: How a request was let in (AuthMiddleware) when the banner may show: never to a visitor who
#: has not given the token (the login page is "public").
_BANNER_AUTH = frozenset({"cookie", "bearer", "open"})


def _attention(request: Request, auth: object) -> Attention | None:
    if auth not in _BANNER_AUTH:
        return None
    cache: AttentionCache = request.app.state.attention
    return cache.get()


def error_page(request: Request, exc: Exception) -> HTMLResponse:
    """An unknown id (404), a bad parameter (400) or an unreachable backend (503), as an HTML
    page instead of JSON."""
    if isinstance(exc, NotFound):
        return render(request, "error.html", status_code=404, title="Not found", message=str(exc))
    if isinstance(exc, InvalidField):
        return render(request, "error.html", status_code=400, title="Bad request", message=str(exc))
    log.warning("page %s: %s", request.url.path, exc)
    return render(
        request,
        "error.html",
        status_code=503,
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        title="Temporarily unavailable",
        message=f"{type(exc).__name__}: {exc}",
    )


def http_error_page(request: Request, exc: StarletteHTTPException) -> HTMLResponse:
    """A routing error (no such page, a method the page does not take) as an HTML page."""
    if exc.status_code == 404:
        # the path is not echoed back: a page reflects nothing of what the request asked for
        message = "There is no such page."
        title = "Not found"
    else:
        message = str(exc.detail)
        title = message
    return render(
        request,
        "error.html",
        status_code=exc.status_code,
        headers=exc.headers,
        title=title,
        message=message,
    )
