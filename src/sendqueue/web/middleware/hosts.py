"""DNS rebinding and cross-origin writes: the ``Host`` a request names and the ``Origin`` of a
state change.

- :class:`TrustedHostMiddleware`: only ``127.0.0.1``, ``localhost``, ``[::1]`` (any port) and
  the names of ``SENDQUEUE_ALLOWED_HOSTS`` are answered; any other ``Host`` gets 400. A page of
  ``attacker.example`` whose name was made to resolve to 127.0.0.1 (DNS rebinding) sends
  ``Host: attacker.example``, so it reaches nothing. Starlette's own middleware answers a bare
  text "Invalid host header"; this one gives the JSON error naming the setting to change.
- :class:`OriginMiddleware`: a POST, PUT, PATCH or DELETE whose ``Origin`` (or, without one,
  ``Referer``) is present must come from the request's own ``scheme://host[:port]``, else 403.
  Without a token, a request from a browser (one that sends ``Sec-Fetch-Site``) must carry an
  ``Origin``. Bearer requests are exempt: a browser cannot add the token to a cross-site
  request, and scripts with the token may send any Origin. So are the one-click unsubscribe
  routes (``/u/*``): a mail provider or a webmail page posts there from its own origin, and
  the signed token in the path is all the authority they need.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from sendqueue.web.errors import error_response
from sendqueue.web.middleware.auth import is_unsubscribe_path
from sendqueue.web.middleware.scope import headers, send_response, state

__all__ = ["LOOPBACK_HOSTS", "OriginMiddleware", "TrustedHostMiddleware", "host_name"]

log = logging.getLogger(__name__)

#: Always answered: the names of this machine's loopback interface.
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
_UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


def host_name(authority: str) -> str | None:
    """The lower-cased host of ``host[:port]`` (IPv6 without its brackets); None when it is
    not one (a bad port, unbalanced brackets, userinfo, a path)."""
    if not authority or any(c in authority for c in "/?#@\\ ") or not authority.isascii():
        return None
    try:
        parts = urlsplit("//" + authority)
        parts.port  # noqa: B018 - raises for a port that is not a number in range
    except ValueError:
        return None
    return parts.hostname or None


def _origin_of(url: str) -> tuple[str, str, int] | None:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    return parts.scheme, parts.hostname, port or _DEFAULT_PORTS[parts.scheme]


class TrustedHostMiddleware:
    """400 for a ``Host`` that is neither loopback nor in ``allowed`` (see the module)."""

    def __init__(self, app: ASGIApp, *, allowed: Iterable[str] = ()) -> None:
        self.app = app
        self.allowed = LOOPBACK_HOSTS | {name.lower().strip("[]") for name in allowed}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = headers(scope).get("host")
        if given is None:
            # HTTP/1.0 may name no host (browsers always do): the address it arrived on counts.
            address = str((scope.get("server") or ("",))[0])
            given = f"[{address}]" if ":" in address else address
        if host_name(given) in self.allowed:
            await self.app(scope, receive, send)
            return
        log.info("refused Host %r from %s", given[:100], (scope.get("client") or ("?",))[0])
        response = error_response(
            400,
            "this server does not answer for this Host; add the name clients use to "
            "SENDQUEUE_ALLOWED_HOSTS (comma-separated)",
            field="Host",
            value=given[:100],
        )
        await send_response(scope, receive, send, response)


class OriginMiddleware:
    """403 for a state change from another origin (see the module docstring)."""

    def __init__(self, app: ASGIApp, *, token_configured: bool) -> None:
        self.app = app
        self.token_configured = token_configured

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _UNSAFE:
            await self.app(scope, receive, send)
            return
        if state(scope).get("auth") == "bearer" or is_unsubscribe_path(scope["path"]):
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope, headers(scope))
        if refusal is None:
            await self.app(scope, receive, send)
            return
        await send_response(scope, receive, send, error_response(403, refusal, field="Origin"))

    def _refusal(self, scope: Scope, request_headers: dict[str, str]) -> str | None:
        field = "origin" if "origin" in request_headers else "referer"
        given = request_headers.get(field)
        if given is None:
            if not self.token_configured and "sec-fetch-site" in request_headers:
                return "a browser's request to a server without SENDQUEUE_API_TOKEN needs Origin"
            return None
        scheme = scope.get("scheme", "http")
        host = request_headers.get("host", "")
        own = _origin_of(f"{scheme}://{host}")
        if own is None or _origin_of(given) != own:
            return f"cross-origin request refused: {field.title()} is not {scheme}://{host}"
        return None
