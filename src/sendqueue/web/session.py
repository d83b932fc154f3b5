"""Sessions and CSRF tokens: the signed ``sq_session`` cookie and the ``sq_csrf`` cookie, shared
by the middlewares (:mod:`sendqueue.web.middleware`), the login routes and the pages.

Session cookies are ``v2.<expires>.<generation>.<nonce>.<signature>``, the signature an
HMAC-SHA256 with a key derived from the API token, so changing the token ends every session and
several server processes with one token accept each other's cookies. Tokens and cookie values
are compared with :func:`hmac.compare_digest` and never logged.

Logout ends every session issued before it: the store keeps a session generation (the counter
:data:`SESSION_GENERATION`), each cookie carries the generation it was issued under, logout
increments it, and a cookie of another generation is refused. :class:`SessionGenerations`
caches the store's value for :data:`GENERATION_CACHE_SECONDS`, so another process honours a
logout within that time (and a page view costs no store read).

CSRF: with a session, the token is bound to it (:meth:`SessionSigner.csrf_token`, an HMAC of
the session's nonce), so it changes at every login and an ``sq_csrf`` cookie planted before
login does not validate after it; ``sq_csrf`` then only carries that token to the scripts.
Without a session (the login form, or no API token configured) the token is the ``sq_csrf``
cookie's value (double submit). The CSRF middleware puts the request's token into
``request.state.csrf_token`` for pages to put into forms and ``<meta name="csrf-token">``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import threading
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import anyio.to_thread
from fastapi import Request
from fastapi.responses import Response

__all__ = [
    "CSRF_COOKIE",
    "CSRF_FIELD",
    "CSRF_HEADER",
    "GENERATION_CACHE_SECONDS",
    "NEXT_MAX_CHARS",
    "SESSION_COOKIE",
    "SESSION_GENERATION",
    "SESSION_TTL_SECONDS",
    "Session",
    "SessionGenerations",
    "SessionSigner",
    "auth_config",
    "csrf_shaped",
    "new_csrf_token",
    "page_csrf_token",
    "safe_next",
    "session_generations",
    "set_csrf_cookie",
    "token_matches",
]

SESSION_COOKIE = "sq_session"
#: The double-submit CSRF cookie (docs/api.md, "Access"). Not HttpOnly: the scripts echo it.
CSRF_COOKIE = "sq_csrf"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf_token"
SESSION_TTL_SECONDS = 12 * 3600
#: The store counter (TaskStore.counter) holding the session generation; logout increments it.
SESSION_GENERATION = "session-generation"
#: How long a web process trusts the generation it last read (docs/operations.md, "Sessions").
GENERATION_CACHE_SECONDS = 2.0

_CSRF_SHAPE = re.compile(r"[A-Za-z0-9_-]{32,128}\Z")


def token_matches(given: str | None, expected: str) -> bool:
    """Constant-time comparison of a presented token with the configured one."""
    if not given:
        return False
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


@dataclass(frozen=True)
class Session:
    """A session cookie's verified contents."""

    expires: int
    generation: int
    nonce: str


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
        self._csrf_key = hmac.new(token.encode("utf-8"), b"sendqueue csrf v1", "sha256").digest()
        self.ttl = ttl
        self._clock = clock

    def _sign(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode("ascii"), hashlib.sha256).digest())

    def issue(self, generation: int = 0) -> str:
        """A fresh session value of ``generation``, valid for ``ttl`` seconds."""
        expires = int(self._clock() + self.ttl)
        payload = f"v2.{expires}.{generation}.{secrets.token_urlsafe(16)}"
        return f"{payload}.{self._sign(payload)}"

    def session(self, value: str | None) -> Session | None:
        """The contents of an unexpired value this signer (or one with the same token) issued;
        None for anything else. The generation is checked by :class:`SessionGenerations`."""
        if not value or len(value) > 256 or not value.isascii():
            return None
        parts = value.split(".")
        if len(parts) != 5 or parts[0] != "v2":
            return None
        if not (parts[1].isdecimal() and parts[2].isdecimal()):
            return None
        payload = ".".join(parts[:4])
        if not hmac.compare_digest(self._sign(payload).encode(), parts[4].encode()):
            return None
        if int(parts[1]) <= self._clock():
            return None
        return Session(expires=int(parts[1]), generation=int(parts[2]), nonce=parts[3])

    def verify(self, value: str | None) -> bool:
        """True for an unexpired value this signer (or one with the same token) issued."""
        return self.session(value) is not None

    def csrf_token(self, session: Session) -> str:
        """The session's CSRF token: an HMAC of its nonce, so only the server can make it."""
        digest = hmac.new(self._csrf_key, session.nonce.encode("ascii"), hashlib.sha256)
        return _b64(digest.digest())


class Counters(Protocol):
    """What sessions need of the task store: its named counters (``TaskStore.counter``)."""

    def counter(self, name: str) -> int: ...

    def increment_counter(self, name: str) -> int: ...


class SessionGenerations:
    """The store's session generation, cached for ``max_age`` seconds (thread-safe).

    A cookie is accepted only under the current generation. One newer than the cached value
    (a login in another process after a logout there) makes it read the store at once.
    """

    def __init__(
        self,
        store: Counters,
        *,
        max_age: float = GENERATION_CACHE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self.max_age = max_age
        self._clock = clock
        self._lock = threading.Lock()
        self._cached: tuple[int, float] | None = None  # (generation, read at)

    def _remember(self, generation: int) -> int:
        with self._lock:
            self._cached = (generation, self._clock())
        return generation

    def refresh(self) -> int:
        """The generation, read from the store now (StoreUnavailable if it cannot be)."""
        return self._remember(self._store.counter(SESSION_GENERATION))

    def bump(self) -> int:
        """End every session issued so far: increment the generation; returns the new one."""
        return self._remember(self._store.increment_counter(SESSION_GENERATION))

    async def accepts(self, generation: int) -> bool:
        """Whether a cookie of ``generation`` is current (reads the store off the event loop
        when the cached value is too old, or older than the cookie)."""
        with self._lock:
            cached = self._cached
        fresh = cached is not None and self._clock() - cached[1] < self.max_age
        if cached is None or not fresh or generation > cached[0]:
            return generation == await anyio.to_thread.run_sync(self.refresh)
        return generation == cached[0]


def auth_config(request: Request) -> tuple[str | None, SessionSigner | None]:
    """The app's API token and session signer (None, None when no token is configured)."""
    config: tuple[str | None, SessionSigner | None] = request.app.state.auth
    return config


def session_generations(request: Request) -> SessionGenerations | None:
    """The app's session generations (None without an API token or a store)."""
    generations: SessionGenerations | None = request.app.state.session_generations
    return generations


# Control (Cc: C0, DEL, C1), format (Cf: zero-width, bidi), line and paragraph separators.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})
#: The longest ``next`` kept; a longer one goes to ``/`` (no page of the app needs more).
NEXT_MAX_CHARS = 2000
# Where going back after a login makes no sense: the form again, or out at once.
_NO_RETURN = frozenset({"/login", "/logout"})


def safe_next(value: object) -> str:
    r"""The path to go to after login, when ``value`` is a path of this site; anything else is
    ``/``, so the login cannot be made to redirect elsewhere (an open redirect).

    Refused: anything not starting with one ``/`` (``//host`` and ``/\host`` name another host
    to browsers, as do schemes), backslashes anywhere (browsers read them as ``/``), control
    and invisible format characters (browsers drop a tab or newline, so ``/<TAB>/host`` would
    become ``//host``; CR and LF would split the header), a path longer than
    :data:`NEXT_MAX_CHARS`, and the login and logout routes themselves.
    """
    if not isinstance(value, str) or not value.startswith("/") or value.startswith("//"):
        return "/"
    if len(value) > NEXT_MAX_CHARS or "\\" in value:
        return "/"
    if any(unicodedata.category(c) in _UNSAFE_CATEGORIES for c in value):
        return "/"
    parts = urlsplit(value)
    if parts.scheme or parts.netloc or parts.path in _NO_RETURN:
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
