"""Small helpers the pure-ASGI middlewares share: headers, cookies and state of a scope."""

from __future__ import annotations

from typing import Any

from starlette.requests import cookie_parser
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

__all__ = ["cookies", "headers", "send_response", "state"]


def headers(scope: Scope) -> dict[str, str]:
    """The request headers, names lower-cased."""
    # Last one wins for repeated headers; none of those read here may repeat meaningfully.
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


def cookies(request_headers: dict[str, str]) -> dict[str, str]:
    raw = request_headers.get("cookie")
    return cookie_parser(raw) if raw else {}


def state(scope: Scope) -> dict[str, Any]:
    """``scope["state"]``, which becomes ``request.state`` in the routes."""
    value: dict[str, Any] = scope.setdefault("state", {})
    return value


async def send_response(scope: Scope, receive: Receive, send: Send, response: Response) -> None:
    await response(scope, receive, send)
