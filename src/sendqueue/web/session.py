"""Sessions and CSRF tokens: the signed ``sq_session`` cookie and the ``sq_csrf`` double-submit
cookie, shared by the middlewares (:mod:`sendqueue.web.middleware`), the login routes and the
pages.

Session cookies are ``v1.<expires>.<nonce>.<signature>``, the signature an HMAC-SHA256 with a
key derived from the API token, so changing the token ends every session and several server
processes with one token accept each other's cookies. Tokens and cookie values are compared
with :func:`hmac.compare_digest` and never logged.

The CSRF token of a request is the ``sq_csrf`` cookie's value; the CSRF middleware puts it (or a
fresh one, whose cookie it sets) into ``request.state.csrf_token`` for pages to put into forms
and ``<meta name="csrf-token">``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.responses import Response

__all__ = [
    "CSRF_COOKIE",
    "CSRF_FIELD",
    "CSRF_HEADER",
    "SESSION_COOKIE",
    "SESSION_TTL_SECONDS",
    "SessionSigner",
    "auth_config",
    "csrf_shaped",
    "new_csrf_token",
    "page_csrf_token",
    "safe_next",
    "set_csrf_cookie",
    "token_matches",
]

SESSION_COOKIE = "sq_session"
#: The double-submit CSRF cookie (docs/api.md, "Access"). Not HttpOnly: the scripts echo it.
CSRF_COOKIE = "sq_csrf"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf_token"
SESSION_TTL_SECONDS = 12 * 3600

_CSRF_SHAPE = re.compile(r"[A-Za-z0-9_-]{32,128}\Z")


def token_matches(given: str | None, expected: str) -> bool:
    """Constant-time comparison of a presented token with the configured one."""
    if not given:
        return False
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


class SessionSigner:
    """Issues and checks session cookie values (see the module docstring)."""

    def __init__(
        self,
        token: str,
        *,
        ttl: float = SESSION_TTL_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._key = hmac.new(token.encode("utf-8"), b"sendqueue session v1", "sha256").digest()
        self.ttl = ttl
        self._clock = clock

    def _sign(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode("ascii"), hashlib.sha256).digest())

    def issue(self) -> str:
        """A fresh session value, valid for ``ttl`` seconds."""
        expires = int(self._clock() + self.ttl)
        payload = f"v1.{expires}.{secrets.token_urlsafe(16)}"
        return f"{payload}.{self._sign(payload)}"

    def verify(self, value: str | None) -> bool:
        """True for an unexpired value this signer (or one with the same token) issued."""
        # Only ASCII is ever issued: anything else (str.isdigit() also takes "²") is refused
        # here rather than failing the ASCII signing below.
        if not value or len(value) > 256 or not value.isascii():
            return False
        parts = value.split(".")
        if len(parts) != 4 or parts[0] != "v1" or not parts[1].isdigit():
            return False
        payload = ".".join(parts[:3])
        if not hmac.compare_digest(self._sign(payload).encode(), parts[3].encode()):
            return False
        return int(parts[1]) > self._clock()


def auth_config(request: Request) -> tuple[str | None, SessionSigner | None]:
    """The app's API token and session signer (None, None when no token is configured)."""
    config: tuple[str | None, SessionSigner | None] = request.app.state.auth
    return config


def safe_next(value: object) -> str:
    """A local path to go to after login; anything else (another host, a scheme) is ``/``."""
    if not isinstance(value, str) or not value.startswith("/") or value.startswith("//"):
        return "/"
    if "\\" in value or any(ord(c) < 32 for c in value):
        return "/"
    parts = urlsplit(value)
    if parts.scheme or parts.netloc:
        return "/"
    return value


def csrf_shaped(value: str | None) -> bool:
    """Whether a cookie value looks like a CSRF token this app makes (else a new one is made)."""
    return value is not None and _CSRF_SHAPE.match(value) is not None


def new_csrf_token() -> str:
    return secrets.token_urlsafe(32)


def page_csrf_token(request: Request) -> tuple[str, bool]:
    """The request's CSRF token and whether it is new (then the response must set the cookie).

    The middleware sets the cookie on responses that lack it; a token it made for this request
    (``request.state.csrf_token``) wins, so the page and the cookie always agree. Without the
    middleware the cookie's value serves, or a new token.
    """
    token = getattr(request.state, "csrf_token", None)
    if isinstance(token, str) and token:
        return token, False
    cookie = request.cookies.get(CSRF_COOKIE)
    if cookie:
        return cookie, False
    return new_csrf_token(), True


def set_csrf_cookie(response: Response, token: str, *, secure: bool) -> None:
    """The ``sq_csrf`` cookie: SameSite=Strict, readable by the page's scripts."""
    response.set_cookie(
        CSRF_COOKIE, token, path="/", samesite="strict", secure=secure, httponly=False
    )
