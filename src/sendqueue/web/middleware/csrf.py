"""CSRF. Every unsafe request (POST, PUT, PATCH, DELETE) not authenticated by a bearer header,
but those to the one-click unsubscribe routes (``/u/*``, which set no cookie either), must
carry the request's CSRF token, else 403. With a session cookie that token is bound to the
session (:meth:`~sendqueue.web.session.SessionSigner.csrf_token`, put into the scope by the
auth middleware) and the ``sq_csrf`` cookie only carries it to the scripts: a cookie planted by
someone else is overwritten and never accepted. Without a session it is the ``sq_csrf``
cookie's value (double submit).

- :class:`CsrfMiddleware` checks the ``X-CSRF-Token`` header (the scripts' fetches) before any
  route runs. Without a token configured, requests that carry neither ``Origin`` nor
  ``Sec-Fetch-Site`` are exempt: browsers send one of them with every POST, scripts like curl
  send none. It sets the cookie on every response to a request that lacked it, and puts the
  token into ``request.state.csrf_token`` for pages to embed.
- The HTML forms (login, logout, a new campaign) post the token as a ``csrf_token`` field
  instead. Only the routes that declare a :class:`FormCsrf` dependency take it: for them the
  middleware lets a form without the header through, and the dependency reads the form (with
  the route's own limits; the route gets the same parsed form) and checks the field before the
  route runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from fastapi import APIRouter, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sendqueue.domain.errors import InvalidField
from sendqueue.web.errors import HttpProblem, error_response
from sendqueue.web.middleware.auth import is_unsubscribe_path
from sendqueue.web.middleware.scope import cookies, headers, send_response, state
from sendqueue.web.session import (
    CSRF_COOKIE,
    CSRF_FIELD,
    CSRF_HEADER,
    csrf_shaped,
    new_csrf_token,
    token_matches,
)

__all__ = ["CsrfMiddleware", "FormCsrf", "form_routes"]

_UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
# scope["state"] keys: the cookie a form's field must match, set when the form route checks it.
_FORM_PENDING = "csrf_form_pending"
_EXPECTED = "csrf_expected"
_REFUSED = (
    "CSRF token missing or wrong: send the sq_csrf cookie's value as the X-CSRF-Token header "
    "or the csrf_token form field"
)


class FormCsrf:
    """A route dependency: checks the ``csrf_token`` field of a form posted without the header.

    ``limits`` (``max_files``, ``max_fields``, ``max_part_size``) are the route's own ones for
    ``request.form()``: the form is parsed once, here, and the route's call gets it back. A form
    that breaks them gets the route's own answer, not a CSRF refusal: with ``malformed_field``
    an InvalidField naming it (422), else Starlette's 400.
    """

    def __init__(self, limits: Mapping[str, int], *, malformed_field: str | None = None) -> None:
        self.limits = dict(limits)
        self.malformed_field = malformed_field

    async def __call__(self, request: Request) -> None:
        scope_state = state(request.scope)
        if not scope_state.get(_FORM_PENDING):
            return
        expected: str | None = scope_state.get(_EXPECTED)
        try:
            form = await request.form(**self.limits)
        except StarletteHTTPException as exc:
            if self.malformed_field is None:
                raise
            detail = f"malformed form: {exc.detail}"
            raise InvalidField(self.malformed_field, None, detail) from exc
        presented = form.get(CSRF_FIELD)
        if (
            expected is None
            or not isinstance(presented, str)
            or not token_matches(presented, expected)
        ):
            await form.close()
            raise HttpProblem(403, _REFUSED)
        scope_state[_FORM_PENDING] = False


def _has_form_csrf(dependant: Dependant) -> bool:
    return any(
        isinstance(dep.call, FormCsrf) or _has_form_csrf(dep) for dep in dependant.dependencies
    )


def form_routes(routers: Iterable[APIRouter]) -> frozenset[tuple[str, str]]:
    """``(method, path)`` of the routes that check a form's field (a :class:`FormCsrf`)."""
    found: set[tuple[str, str]] = set()
    for route in (route for router in routers for route in router.routes):
        if isinstance(route, APIRoute) and _has_form_csrf(route.dependant):
            found.update((method, route.path) for method in route.methods or ())
    return frozenset(found)


def _sets_csrf_cookie(message: Message) -> bool:
    """Whether the route's response sets (or clears) ``sq_csrf`` itself (login, logout)."""
    prefix = f"{CSRF_COOKIE}=".encode()
    return any(
        name.lower() == b"set-cookie" and value.startswith(prefix)
        for name, value in message.get("headers", [])
    )


def _is_form(content_type: str) -> bool:
    return content_type.split(";")[0].strip().lower() in _FORM_TYPES


class CsrfMiddleware:
    """The header half of the double-submit check; see the module docstring."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        form_routes: Iterable[tuple[str, str]] = (),
        secure: Callable[[Scope], bool] | None = None,
    ) -> None:
        self.app = app
        self.form_routes = frozenset(form_routes)
        self.secure = secure or (lambda scope: scope.get("scheme") == "https")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The unsubscribe routes take no CSRF token and set no cookie (auth.is_unsubscribe_path).
        if scope["type"] != "http" or is_unsubscribe_path(scope["path"]):
            await self.app(scope, receive, send)
            return
        request_headers = headers(scope)
        cookie: str | None = cookies(request_headers).get(CSRF_COOKIE)
        if not csrf_shaped(cookie):
            cookie = None
        scope_state = state(scope)
        bound: str | None = scope_state.get("session_csrf")
        # The token the request must present: the session's, else the cookie's.
        expected = bound if bound is not None else cookie
        scope_state["csrf_token"] = token = expected or new_csrf_token()
        set_cookie = cookie != token

        async def send_with_cookie(message: Message) -> None:
            if (
                message["type"] == "http.response.start"
                and set_cookie
                and not _sets_csrf_cookie(message)
            ):
                value = f"{CSRF_COOKIE}={token}; Path=/; SameSite=Strict"
                if self.secure(scope):
                    value += "; Secure"
                headers_out = [*message.get("headers", []), (b"set-cookie", value.encode())]
                message = {**message, "headers": headers_out}
            await send(message)

        if scope["method"] in _UNSAFE and self._needs_check(
            scope_state.get("auth"), request_headers
        ):
            presented = request_headers.get(CSRF_HEADER)
            if presented is None and self._takes_form(scope, request_headers):
                scope_state[_FORM_PENDING] = True
                scope_state[_EXPECTED] = expected
            elif expected is None or not token_matches(presented, expected):
                response = error_response(403, _REFUSED)
                await send_response(scope, receive, send_with_cookie, response)
                return
        await self.app(scope, receive, send_with_cookie)

    def _takes_form(self, scope: Scope, request_headers: dict[str, str]) -> bool:
        route = (scope["method"], scope["path"])
        return route in self.form_routes and _is_form(request_headers.get("content-type", ""))

    @staticmethod
    def _needs_check(auth: object, request_headers: dict[str, str]) -> bool:
        if auth == "bearer":
            return False
        if auth == "open":
            # No token, so no session to ride on; still, a page in the user's browser must
            # not be made to post here by another site. Browsers say where a POST comes from.
            return "origin" in request_headers or "sec-fetch-site" in request_headers
        return True
