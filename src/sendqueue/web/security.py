"""Access control for the web app: the API token, the session cookie, CSRF, body limits and
security headers.

Five pure-ASGI middlewares, outermost first (see :func:`install_security`):

1. :class:`SecurityHeadersMiddleware` adds ``X-Content-Type-Options``, ``Referrer-Policy``,
   ``X-Frame-Options`` and a Content-Security-Policy to every response.
2. :class:`AuthMiddleware`: with ``SENDQUEUE_API_TOKEN`` set, every route but ``/login``,
   ``/static/*`` and ``/healthz`` needs ``Authorization: Bearer <token>`` or a valid
   ``sq_session`` cookie. Without them an API route answers 401 (``WWW-Authenticate:
   Bearer``) and a page redirects to ``/login?next=...``. It records how the request was
   authenticated in ``scope["state"]["auth"]``: ``bearer``, ``cookie``, ``open`` (no token
   configured) or ``public``.
3. :class:`BodyLimitMiddleware` refuses a body larger than the limit with 413: at once when
   ``Content-Length`` says so, otherwise by counting bytes as they arrive, so no more than the
   limit is ever read.
4. :class:`CsrfMiddleware`: every unsafe request (POST, PUT, PATCH, DELETE) not authenticated
   by a bearer header must carry the ``sq_csrf`` cookie's value as the ``X-CSRF-Token`` header
   or a ``csrf_token`` form field (double-submit cookie), else 403. Without a token configured,
   requests that carry neither ``Origin`` nor ``Sec-Fetch-Site`` are exempt: browsers send one
   of them with every POST, scripts like curl send none. A form without the header is spooled
   to a temporary file (memory up to 1 MiB), searched for the field and replayed to the app.
   The cookie is set on every response to a request that lacked it, and its value is in
   ``request.state.csrf_token`` for pages to put into forms and ``<meta name="csrf-token">``.
5. :class:`NulByteMiddleware`: a NUL byte in the path (404) or the query (422) is answered
   before any route runs. No id or address holds one, and PostgreSQL refuses it in any text
   parameter, which would otherwise surface as an unreachable store (503, an ERROR log line).

Session cookies are ``v1.<expires>.<nonce>.<signature>``, the signature an HMAC-SHA256 with a
key derived from the API token, so changing the token ends every session and several server
processes with one token accept each other's cookies. Tokens and cookie values are compared
with :func:`hmac.compare_digest` and never logged.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import re
import secrets
import tempfile
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, unquote_to_bytes, urlencode, urlsplit

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from python_multipart.multipart import MultipartParser, QuerystringParser, parse_options_header
from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sendqueue.web.errors import error_response

__all__ = [
    "CSRF_COOKIE",
    "CSRF_FIELD",
    "CSRF_HEADER",
    "SESSION_COOKIE",
    "SESSION_TTL_SECONDS",
    "AuthMiddleware",
    "BodyLimitMiddleware",
    "CsrfMiddleware",
    "NulByteMiddleware",
    "SecurityHeadersMiddleware",
    "SessionSigner",
    "install_security",
    "router",
    "safe_next",
    "token_matches",
]

log = logging.getLogger(__name__)

SESSION_COOKIE = "sq_session"
CSRF_COOKIE = "sq_csrf"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf_token"
SESSION_TTL_SECONDS = 12 * 3600

_UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_CSRF_SHAPE = re.compile(r"[A-Za-z0-9_-]{32,128}\Z")
_SPOOL_IN_MEMORY = 1 << 20
_CHUNK = 1 << 16
_FIELD_BYTES = CSRF_FIELD.encode()

CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'"
)
# FastAPI's /docs and /redoc pages load their viewer from a CDN with an inline bootstrap
# script; they show no user data, so only they get a policy that allows it.
DOCS_CSP = (
    "default-src 'self'; img-src 'self' data: https:; style-src 'self' 'unsafe-inline' https:; "
    "script-src 'self' 'unsafe-inline' https:; connect-src 'self'; worker-src 'self' blob:; "
    "frame-ancestors 'none'"
)
_DOCS_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc"})
_API_PATHS = frozenset({"/healthz", "/metrics", "/openapi.json"})


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
        if not value or len(value) > 256:
            return False
        parts = value.split(".")
        if len(parts) != 4 or parts[0] != "v1" or not parts[1].isdigit():
            return False
        payload = ".".join(parts[:3])
        if not hmac.compare_digest(self._sign(payload).encode(), parts[3].encode()):
            return False
        return int(parts[1]) > self._clock()


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


def _headers(scope: Scope) -> dict[str, str]:
    # Last one wins for repeated headers; none of those read here may repeat meaningfully.
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


def _cookies(headers: dict[str, str]) -> dict[str, str]:
    raw = headers.get("cookie")
    return cookie_parser(raw) if raw else {}


def _state(scope: Scope) -> dict[str, Any]:
    state: dict[str, Any] = scope.setdefault("state", {})
    return state


def is_api_path(path: str) -> bool:
    """Routes that answer machines (401 JSON) rather than people (redirect to login)."""
    return path.startswith("/api/") or path == "/api" or path in _API_PATHS


def _is_public(path: str) -> bool:
    # /healthz is for load balancers and process managers, which hold no token; it tells
    # only whether the store answers.
    return path in {"/login", "/healthz"} or path.startswith("/static/")


async def _send_response(scope: Scope, receive: Receive, send: Send, response: Response) -> None:
    await response(scope, receive, send)


class SecurityHeadersMiddleware:
    """Adds the security headers to every response that does not set them itself."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        csp = DOCS_CSP if scope["path"] in _DOCS_PATHS else CSP
        extra = [
            (b"x-content-type-options", b"nosniff"),
            (b"referrer-policy", b"same-origin"),
            (b"x-frame-options", b"DENY"),
            (b"content-security-policy", csp.encode("latin-1")),
        ]

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {k.lower() for k, _ in headers}
                headers += [(k, v) for k, v in extra if k not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


class AuthMiddleware:
    """Requires the token (bearer or session cookie) when one is configured."""

    def __init__(self, app: ASGIApp, *, token: str | None, signer: SessionSigner | None) -> None:
        self.app = app
        self.token = token
        self.signer = signer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = _state(scope)
        path: str = scope["path"]
        if self.token is None:
            state["auth"] = "open"
        elif _is_public(path):
            state["auth"] = "public"
        else:
            headers = _headers(scope)
            method = self._authenticate(headers)
            if method is None:
                await _send_response(scope, receive, send, self._deny(scope, headers))
                return
            state["auth"] = method
        await self.app(scope, receive, send)

    def _authenticate(self, headers: dict[str, str]) -> str | None:
        assert self.token is not None
        assert self.signer is not None
        authorization = headers.get("authorization")
        if authorization is not None:
            scheme, _, value = authorization.partition(" ")
            # A wrong bearer token is refused even alongside a valid cookie: it is explicit.
            if scheme.lower() == "bearer" and token_matches(value.strip(), self.token):
                return "bearer"
            return None
        if self.signer.verify(_cookies(headers).get(SESSION_COOKIE)):
            return "cookie"
        return None

    @staticmethod
    def _deny(scope: Scope, headers: dict[str, str]) -> Response:
        path: str = scope["path"]
        if not is_api_path(path) and "text/html" in headers.get("accept", ""):
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


class _BodyTooLarge(Exception):
    pass


class BodyLimitMiddleware:
    """Refuses request bodies larger than ``max_bytes`` with 413, without reading past it."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self) -> Response:
        return error_response(
            413,
            f"request body larger than {self.max_bytes} bytes; split the file or raise "
            "SENDQUEUE_MAX_UPLOAD_BYTES",
            headers={"Connection": "close"},
            field="file",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _headers(scope).get("content-length")
        if length is not None and length.strip().isdigit() and int(length) > self.max_bytes:
            await _send_response(scope, receive, send, self._too_large())
            return
        received = 0
        exceeded = False
        started = False

        async def limited_receive() -> Message:
            nonlocal received, exceeded
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    exceeded = True
                    raise _BodyTooLarge
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if exceeded:
                return  # whatever the app made of the aborted read, the answer is 413
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except BaseException:
            if not exceeded:
                raise
        if exceeded and not started:
            await _send_response(scope, receive, send, self._too_large())


class NulByteMiddleware:
    """Refuses a NUL byte in the path or the query string; see the module docstring."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if "\x00" in scope["path"]:
                response = error_response(404, "not found: a path holds no NUL character")
                await _send_response(scope, receive, send, response)
                return
            if b"\x00" in unquote_to_bytes(scope.get("query_string", b"")):
                response = error_response(
                    422,
                    "query: a parameter holds a NUL character",
                    field="query",
                    reason="a parameter holds a NUL character",
                )
                await _send_response(scope, receive, send, response)
                return
        await self.app(scope, receive, send)


class CsrfMiddleware:
    """Double-submit-cookie CSRF check; see the module docstring."""

    def __init__(self, app: ASGIApp, *, secure: Callable[[Scope], bool] | None = None) -> None:
        self.app = app
        self.secure = secure or (lambda scope: scope.get("scheme") == "https")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        cookie = _cookies(headers).get(CSRF_COOKIE)
        if cookie is not None and not _CSRF_SHAPE.match(cookie):
            cookie = None
        state = _state(scope)
        state["csrf_token"] = token = cookie or secrets.token_urlsafe(32)

        async def send_with_cookie(message: Message) -> None:
            if message["type"] == "http.response.start" and cookie is None:
                value = f"{CSRF_COOKIE}={token}; Path=/; SameSite=Strict"
                if self.secure(scope):
                    value += "; Secure"
                headers_out = [*message.get("headers", []), (b"set-cookie", value.encode())]
                message = {**message, "headers": headers_out}
            await send(message)

        if scope["method"] in _UNSAFE and self._needs_check(state.get("auth"), headers):
            presented = headers.get(CSRF_HEADER)
            spool = None
            if presented is None:
                presented, spool = await self._form_field(headers, receive)
            try:
                if cookie is None or not token_matches(presented, cookie):
                    response = error_response(
                        403,
                        "CSRF token missing or wrong: send the sq_csrf cookie's value as the "
                        "X-CSRF-Token header or the csrf_token form field",
                    )
                    await _send_response(scope, receive, send_with_cookie, response)
                    return
                if spool is not None:
                    receive = _replay(spool, receive)
                await self.app(scope, receive, send_with_cookie)
            finally:
                if spool is not None:
                    spool.close()
            return
        await self.app(scope, receive, send_with_cookie)

    @staticmethod
    def _needs_check(auth: object, headers: dict[str, str]) -> bool:
        if auth == "bearer":
            return False
        if auth == "open":
            # No token, so no session to ride on; still, a page in the user's browser must
            # not be made to post here by another site. Browsers say where a POST comes from.
            return "origin" in headers or "sec-fetch-site" in headers
        return True

    async def _form_field(
        self, headers: dict[str, str], receive: Receive
    ) -> tuple[str | None, tempfile.SpooledTemporaryFile[bytes] | None]:
        """The ``csrf_token`` field of a form body, and the spooled body to replay."""
        content_type, params = parse_options_header(headers.get("content-type", ""))
        if content_type not in {b"application/x-www-form-urlencoded", b"multipart/form-data"}:
            return None, None
        # closed by the caller once the app has read it
        spool: tempfile.SpooledTemporaryFile[bytes] = tempfile.SpooledTemporaryFile(  # noqa: SIM115
            max_size=_SPOOL_IN_MEMORY
        )
        try:
            finder = _FieldFinder(content_type, params)
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    break
                body: bytes = message.get("body", b"")
                spool.write(body)
                finder.feed(body)
                if not message.get("more_body", False):
                    break
            finder.finish()
            return finder.value(), spool
        except BaseException:
            spool.close()
            raise


class _FieldFinder:
    """Streams a form body through python-multipart and keeps only ``csrf_token``."""

    _MAX = 256

    def __init__(self, content_type: bytes, params: dict[bytes, bytes]) -> None:
        self.found: bytes | None = None
        self._name = bytearray()
        self._data = bytearray()
        self._header_field = bytearray()
        self._header_value = bytearray()
        self._broken = False
        self._urlencoded = content_type != b"multipart/form-data"
        self.parser: MultipartParser | QuerystringParser
        if self._urlencoded:
            self.parser = QuerystringParser(
                {
                    "on_field_start": self._begin,
                    "on_field_name": self._on_name,
                    "on_field_data": self._on_data,
                    "on_field_end": self._end,
                }
            )
        else:
            self.parser = MultipartParser(
                params.get(b"boundary", b""),
                {
                    "on_part_begin": self._begin,
                    "on_header_field": self._on_header_field,
                    "on_header_value": self._on_header_value,
                    "on_header_end": self._header_end,
                    "on_part_data": self._on_data,
                    "on_part_end": self._end,
                },
            )

    def feed(self, data: bytes) -> None:
        if self._broken or not data or self.found is not None:
            return
        try:
            self.parser.write(data)
        except Exception:
            # A malformed body has no field to find; the app reports the body itself.
            self._broken = True

    def finish(self) -> None:
        """The body ended: the last field ends with it."""
        if self._broken or self.found is not None:
            return
        try:
            self.parser.finalize()
        except Exception:
            self._broken = True

    def value(self) -> str | None:
        if self.found is None:
            return None
        raw = unquote_to_bytes(self.found.replace(b"+", b" ")) if self._urlencoded else self.found
        return raw.decode("utf-8", "replace")

    def _begin(self) -> None:
        self._name.clear()
        self._data.clear()
        self._header_field.clear()
        self._header_value.clear()

    def _on_name(self, data: bytes, start: int, end: int) -> None:
        self._name += data[start:end]

    def _on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_field += data[start:end]

    def _on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _header_end(self) -> None:
        if bytes(self._header_field).lower() == b"content-disposition":
            _, params = parse_options_header(bytes(self._header_value))
            self._name[:] = params.get(b"name", b"")
        self._header_field.clear()
        self._header_value.clear()

    def _on_data(self, data: bytes, start: int, end: int) -> None:
        if bytes(self._name) == _FIELD_BYTES and len(self._data) < self._MAX:
            self._data += data[start:end]

    def _end(self) -> None:
        if bytes(self._name) == _FIELD_BYTES and self.found is None:
            self.found = bytes(self._data[: self._MAX])


def _replay(spool: tempfile.SpooledTemporaryFile[bytes], receive: Receive) -> Receive:
    """A receive that hands out the spooled body first, then defers to the real one."""
    spool.seek(0, 2)
    size = spool.tell()
    spool.seek(0)
    done = False

    async def replay() -> Message:
        nonlocal done
        if done:
            return await receive()
        chunk = spool.read(_CHUNK)
        done = spool.tell() >= size
        return {"type": "http.request", "body": chunk, "more_body": not done}

    return replay


# -- login and logout --------------------------------------------------------------------------

router = APIRouter(include_in_schema=False)


def _security(request: Request) -> tuple[str | None, SessionSigner | None]:
    config: tuple[str | None, SessionSigner | None] = request.app.state.auth
    return config


@router.post("/login")
async def login(request: Request) -> Response:
    """The login form posts ``token``, ``csrf_token`` (checked by the middleware) and an
    optional ``next``. Success: the session cookie and 303 to ``next``; a wrong token: the
    form again, with 401."""
    token, signer = _security(request)
    form = await request.form(max_files=0, max_fields=10, max_part_size=4096)
    target = safe_next(form.get("next") or request.query_params.get("next"))
    if token is None or signer is None:
        return RedirectResponse(target, status_code=303)
    presented = form.get("token")
    if not isinstance(presented, str) or not token_matches(presented.strip(), token):
        client = request.client.host if request.client else "?"
        log.warning("failed login from %s", client)
        # pages imports this module (safe_next), so the import waits until it is needed.
        from sendqueue.web.pages import render_login

        # The form again, keeping where the user wanted to go.
        scope = {**request.scope, "query_string": urlencode({"next": target}).encode()}
        return render_login(Request(scope), error="wrong token", status_code=401)
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        signer.issue(),
        max_age=int(signer.ttl),
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    """Ends the session (the cookie is cleared) and goes to the login page."""
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(
        SESSION_COOKIE,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


def install_security(app: FastAPI, *, token: str | None, max_body_bytes: int) -> None:
    """Add the five middlewares (in the order of the module docstring) and the login routes."""
    signer = SessionSigner(token) if token is not None else None
    app.state.auth = (token, signer)
    app.include_router(router)
    # add_middleware puts each new one outside the previous ones: innermost first.
    app.add_middleware(NulByteMiddleware)
    app.add_middleware(CsrfMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes)
    app.add_middleware(AuthMiddleware, token=token, signer=signer)
    app.add_middleware(SecurityHeadersMiddleware)
