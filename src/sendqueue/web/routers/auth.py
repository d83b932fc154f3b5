"""Logging in and out: ``GET /login`` (the form), ``POST /login`` (checks the token, sets the
session cookie) and ``POST /logout``. Both forms post their CSRF token as a field, checked by
a :class:`~sendqueue.web.middleware.csrf.FormCsrf` dependency before the route runs.

Login issues the session under the store's current session generation and sets ``sq_csrf`` to
the new session's own CSRF token (the one planted before login no longer counts). Logout bumps
the generation, which ends every session issued before it, in every process
(:mod:`sendqueue.web.session`).
"""

from __future__ import annotations

import logging
from urllib.parse import urlencode

import anyio.to_thread
from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from sendqueue.web.middleware.auth import client_address
from sendqueue.web.middleware.csrf import FormCsrf
from sendqueue.web.middleware.throttle import AuthThrottle
from sendqueue.web.rendering import render
from sendqueue.web.session import (
    CSRF_COOKIE,
    SESSION_COOKIE,
    auth_config,
    safe_next,
    session_generations,
    set_csrf_cookie,
    token_matches,
)

__all__ = ["render_login", "router"]

log = logging.getLogger(__name__)

router = APIRouter(include_in_schema=False)

_FORM_LIMITS: dict[str, int] = {"max_files": 0, "max_fields": 10, "max_part_size": 4096}
_FORM_CSRF = Depends(FormCsrf(_FORM_LIMITS))


def render_login(
    request: Request, *, error: str | None = None, status_code: int = 200
) -> HTMLResponse:
    """The login form (``token``, ``csrf_token``, ``next``) posting to ``/login``.

    ``error`` is shown above the form; ``?error=1`` (where a failed ``POST /login`` redirects)
    shows the wrong-token message.
    """
    if error is None and request.query_params.get("error"):
        error = "That token is not valid. Check SENDQUEUE_API_TOKEN and try again."
    return render(
        request,
        "login.html",
        status_code=status_code,
        title="Log in",
        error=error,
        next_path=safe_next(request.query_params.get("next") or "/"),
    )


@router.get("/login", response_class=HTMLResponse, name="page_login")
def login_page(request: Request) -> Response:
    """The login form; ``POST /login`` checks the token and sets the session."""
    return render_login(request)


@router.post("/login", dependencies=[_FORM_CSRF])
async def login(request: Request) -> Response:
    """The login form posts ``token``, ``csrf_token`` and an optional ``next``. Success: the
    session cookie and 303 to ``next``; a wrong token: the form again, with 401."""
    token, signer = auth_config(request)
    form = await request.form(**_FORM_LIMITS)
    target = safe_next(form.get("next") or request.query_params.get("next"))
    if token is None or signer is None:
        return RedirectResponse(target, status_code=303)
    presented = form.get("token")
    throttle: AuthThrottle | None = getattr(request.app.state, "throttle", None)
    client = client_address(request.scope)
    if not isinstance(presented, str) or not token_matches(presented.strip(), token):
        if throttle is not None:
            throttle.failed(client, "POST /login")  # logs it
        else:
            log.warning("failed login from %s", client)
        # The form again, keeping where the user wanted to go.
        scope = {**request.scope, "query_string": urlencode({"next": target}).encode()}
        return render_login(Request(scope), error="wrong token", status_code=401)
    if throttle is not None:
        throttle.succeeded(client)
    generations = session_generations(request)
    # Read now, not from the cache: a cookie of a stale generation would be refused at once.
    generation = 0 if generations is None else await anyio.to_thread.run_sync(generations.refresh)
    value = signer.issue(generation)
    session = signer.session(value)
    assert session is not None  # just issued
    secure = request.url.scheme == "https"
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        value,
        max_age=int(signer.ttl),
        path="/",
        httponly=True,
        samesite="strict",
        secure=secure,
    )
    set_csrf_cookie(response, signer.csrf_token(session), secure=secure)
    return response


@router.post("/logout", dependencies=[_FORM_CSRF])
async def logout(request: Request) -> Response:
    """Ends every session issued so far (the store's session generation goes up; 503 when the
    store cannot record it), clears the cookies and goes to the login page."""
    generations = session_generations(request)
    if generations is not None:
        await anyio.to_thread.run_sync(generations.bump)
    secure = request.url.scheme == "https"
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(
        SESSION_COOKIE, path="/", httponly=True, samesite="strict", secure=secure
    )
    response.delete_cookie(CSRF_COOKIE, path="/", samesite="strict", secure=secure)
    return response
