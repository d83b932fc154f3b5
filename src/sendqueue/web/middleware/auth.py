"""The API token: with ``SENDQUEUE_API_TOKEN`` set, every route but ``/login``, ``/static/*``,
``/healthz`` and the one-click unsubscribe routes ``/u/*`` needs ``Authorization: Bearer
<token>`` or a valid ``sq_session`` cookie.

Without them an API route answers 401 (``WWW-Authenticate: Bearer``) and a page redirects to
``/login?next=...``. :class:`AuthMiddleware` records how the request was authenticated in
``scope["state"]["auth"]``: ``bearer``, ``cookie``, ``open`` (no token configured) or
``public``; for a cookie, the session's CSRF token goes into ``scope["state"]["session_csrf"]``.

With a :class:`~sendqueue.web.middleware.throttle.AuthThrottle`, wrong bearer tokens are counted
per client, and a locked-out client's bearer requests and ``POST /login`` get 429 before any
token is compared or any body read.

A session cookie counts only under the store's current session generation (logout bumps it;
:class:`~sendqueue.web.session.SessionGenerations`). When the store cannot tell, the request
gets 503: a session that may have been ended is not let in.
"""

from __future__ import annotations

from urllib.parse import quote

from starlette.responses import RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from sendqueue.domain.errors import StoreUnavailable
from sendqueue.domain.unsubscribe import UNSUBSCRIBE_PATH
from sendqueue.web.errors import RETRY_AFTER_SECONDS, error_response
from sendqueue.web.middleware.scope import cookies, headers, send_response, state
from sendqueue.web.middleware.throttle import AuthThrottle
from sendqueue.web.session import (
    SESSION_COOKIE,
    SessionGenerations,
    SessionSigner,
    token_matches,
)

__all__ = [
    "AuthMiddleware",
    "client_address",
    "is_api_path",
    "is_public_path",
    "is_unsubscribe_path",
]

_API_PATHS = frozenset({"/healthz", "/metrics", "/openapi.json"})


def is_api_path(path: str) -> bool:
    """Routes that answer machines (401 JSON) rather than people (redirect to login)."""
    return path.startswith("/api/") or path == "/api" or path in _API_PATHS


def client_address(scope: Scope) -> str:
    """The client's address (the forwarded one behind a trusted proxy)."""
    client = scope.get("client")
    return str(client[0]) if client else "?"


def is_unsubscribe_path(path: str) -> bool:
    """The one-click unsubscribe routes (``/u/<token>``): mail providers POST to them blind,
    with no token, cookie or CSRF token (RFC 8058); the signed token in the path is the
    authorisation. They are exempt from the token, the CSRF and the Origin checks."""
    return path.startswith(UNSUBSCRIBE_PATH)


def is_public_path(path: str) -> bool:
    """Routes served before any authentication (their bodies get the small public limits)."""
    # /healthz is for load balancers and process managers, which hold no token; it tells
    # only whether the store answers.
    return (
        path in {"/login", "/healthz"} or path.startswith("/static/") or is_unsubscribe_path(path)
    )


class AuthMiddleware:
    """Requires the token (bearer or session cookie) when one is configured."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str | None,
        signer: SessionSigner | None,
        throttle: AuthThrottle | None = None,
        generations: SessionGenerations | None = None,
    ) -> None:
        self.app = app
        self.token = token
        self.signer = signer
        self.throttle = throttle
        self.generations = generations

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_state = state(scope)
        path: str = scope["path"]
        if self.token is None:
            request_state["auth"] = "open"
            await self.app(scope, receive, send)
            return
        request_headers = headers(scope)
        if self.throttle is not None and self._guesses(scope, request_headers):
            wait = self.throttle.retry_after(client_address(scope))
            if wait > 0:
                await send_response(scope, receive, send, self.throttle.refusal(wait))
                return
        if is_public_path(path):
            request_state["auth"] = "public"
        else:
            try:
                method = await self._authenticate(request_headers, request_state)
            except StoreUnavailable:
                response = error_response(
                    503,
                    "cannot check the session: the store is unavailable",
                    headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
                )
                await send_response(scope, receive, send, response)
                return
            if method is None:
                if self.throttle is not None and "authorization" in request_headers:
                    where = f"{scope['method']} {path}"
                    self.throttle.failed(client_address(scope), where)
                await send_response(scope, receive, send, self._deny(scope, request_headers))
                return
            if method == "bearer" and self.throttle is not None:
                self.throttle.succeeded(client_address(scope))
            request_state["auth"] = method
        await self.app(scope, receive, send)

    @staticmethod
    def _guesses(scope: Scope, request_headers: dict[str, str]) -> bool:
        """The request presents a token to compare: a bearer header, or the login form."""
        path: str = scope["path"]
        if scope["method"] == "POST" and path == "/login":
            return True
        return "authorization" in request_headers and not is_public_path(path)

    async def _authenticate(
        self, request_headers: dict[str, str], request_state: dict[str, object]
    ) -> str | None:
        assert self.token is not None
        assert self.signer is not None
        authorization = request_headers.get("authorization")
        if authorization is not None:
            scheme, _, value = authorization.partition(" ")
            # A wrong bearer token is refused even alongside a valid cookie: it is explicit.
            if scheme.lower() == "bearer" and token_matches(value.strip(), self.token):
                return "bearer"
            return None
        session = self.signer.session(cookies(request_headers).get(SESSION_COOKIE))
        if session is None:
            return None
        if self.generations is not None and not await self.generations.accepts(session.generation):
            return None  # ended by a logout
        request_state["session_csrf"] = self.signer.csrf_token(session)
        return "cookie"

    @staticmethod
    def _deny(scope: Scope, request_headers: dict[str, str]) -> Response:
        path: str = scope["path"]
        if not is_api_path(path) and "text/html" in request_headers.get("accept", ""):
            target = "/login"
            if scope["method"] in {"GET", "HEAD"}:
                query = scope.get("query_string", b"").decode("latin-1")
                here = path + (f"?{query}" if query else "")
                if here != "/":
                    target += "?next=" + quote(here, safe="")
            return RedirectResponse(target, status_code=303)
        return error_response(
            401,
            "authentication required: send Authorization: Bearer <SENDQUEUE_API_TOKEN> "
            "or log in at /login",
            headers={"WWW-Authenticate": 'Bearer realm="sendqueue"'},
        )
