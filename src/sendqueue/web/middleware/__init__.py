"""Access control and request limits for the web app, as pure-ASGI middlewares.

:func:`install_security` adds, outermost first:

1. :class:`~sendqueue.web.middleware.headers.SecurityHeadersMiddleware`: security headers on
   every response (a 500 included);
2. :class:`~sendqueue.web.middleware.hosts.TrustedHostMiddleware`: 400 for a ``Host`` not
   loopback nor in ``SENDQUEUE_ALLOWED_HOSTS`` (DNS rebinding);
3. :class:`~sendqueue.web.middleware.auth.AuthMiddleware`: the API token (bearer or session
   cookie), with the back-off of :mod:`sendqueue.web.middleware.throttle` (429);
4. :class:`~sendqueue.web.middleware.requests.BodyLimitMiddleware`: 413 above the body limit
   (a small one for the public routes);
5. :class:`~sendqueue.web.middleware.csrf.CsrfMiddleware`: the double-submit CSRF check;
6. :class:`~sendqueue.web.middleware.hosts.OriginMiddleware`: 403 for a state change from
   another origin (inside the CSRF check, whose cookie its 403 then sets too);
7. :class:`~sendqueue.web.middleware.requests.NulByteMiddleware`: no NUL byte in path or query.

The app factory adds :class:`~sendqueue.web.middleware.limits.BodyTimeoutMiddleware` outside
them all; :mod:`sendqueue.web.middleware.limits` also has the uvicorn protocol with the header
deadline.
"""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import APIRouter, FastAPI

from sendqueue.web.middleware.auth import AuthMiddleware
from sendqueue.web.middleware.csrf import CsrfMiddleware, form_routes
from sendqueue.web.middleware.headers import SecurityHeadersMiddleware
from sendqueue.web.middleware.hosts import OriginMiddleware, TrustedHostMiddleware
from sendqueue.web.middleware.requests import BodyLimitMiddleware, NulByteMiddleware
from sendqueue.web.middleware.throttle import AuthThrottle
from sendqueue.web.session import Counters, SessionGenerations, SessionSigner

__all__ = ["install_security"]


def install_security(
    app: FastAPI,
    *,
    token: str | None,
    max_body_bytes: int,
    routers: Iterable[APIRouter],
    public_max_body_bytes: int | None = None,
    throttle: AuthThrottle | None = None,
    store: Counters | None = None,
    allowed_hosts: Iterable[str] = (),
) -> None:
    """Add the middlewares, in the order above. The CSRF check learns from ``routers`` (the
    app's) which routes take a form's field. ``public_max_body_bytes`` bounds the body of a
    request to a public route (``/login``); ``throttle`` counts wrong tokens (it is also
    ``app.state.throttle``, for the login route). With a token and ``store``, sessions carry
    the store's session generation, so logout ends them everywhere. ``allowed_hosts`` are
    answered besides loopback."""
    signer = SessionSigner(token) if token is not None else None
    generations = SessionGenerations(store) if token is not None and store is not None else None
    app.state.auth = (token, signer)
    app.state.throttle = throttle
    app.state.session_generations = generations
    # add_middleware puts each new one outside the previous ones: innermost first.
    app.add_middleware(NulByteMiddleware)
    app.add_middleware(OriginMiddleware, token_configured=token is not None)
    app.add_middleware(CsrfMiddleware, form_routes=form_routes(routers))
    app.add_middleware(
        BodyLimitMiddleware, max_bytes=max_body_bytes, public_max_bytes=public_max_body_bytes
    )
    app.add_middleware(
        AuthMiddleware, token=token, signer=signer, throttle=throttle, generations=generations
    )
    app.add_middleware(TrustedHostMiddleware, allowed=tuple(allowed_hosts))
    viewers = {app.docs_url, app.redoc_url}
    if app.docs_url is not None:
        viewers.add(app.swagger_ui_oauth2_redirect_url)
    docs_paths = frozenset(path for path in viewers if path is not None)
    app.add_middleware(SecurityHeadersMiddleware, docs_paths=docs_paths)
