"""Security headers on every response: ``X-Content-Type-Options``, ``Referrer-Policy``,
``X-Frame-Options`` and a Content-Security-Policy.

The middleware is also where an exception no handler took becomes the 500: Starlette's own
500 comes from outside every middleware (so without these headers) and uvicorn logs a full
traceback for each request. Here it is a JSON 500 with the headers, logged in one line; the
traceback is logged once per place of origin, so a request repeated in a loop cannot flood the
log.
"""

from __future__ import annotations

import logging
import traceback

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sendqueue.web.errors import error_response

__all__ = ["CSP", "DOCS_CSP", "SecurityHeadersMiddleware"]

log = logging.getLogger(__name__)
#: Places of origin (exception type, file, line) whose traceback was logged; bounded.
_MAX_TRACEBACKS = 256

CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'"
)
# FastAPI's /docs and /redoc pages load their viewer from a CDN with an inline bootstrap
# script; they show no user data, so only they get a policy that allows it, and only where
# the app serves them (not in production: see create_app).
DOCS_CSP = (
    "default-src 'self'; img-src 'self' data: https:; style-src 'self' 'unsafe-inline' https:; "
    "script-src 'self' 'unsafe-inline' https:; connect-src 'self'; worker-src 'self' blob:; "
    "frame-ancestors 'none'"
)


class SecurityHeadersMiddleware:
    """Adds the security headers to every response that does not set them itself."""

    def __init__(self, app: ASGIApp, docs_paths: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.docs_paths = docs_paths
        self._seen: set[tuple[str, str, int | None]] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        csp = DOCS_CSP if scope["path"] in self.docs_paths else CSP
        extra = [
            (b"x-content-type-options", b"nosniff"),
            (b"referrer-policy", b"same-origin"),
            (b"x-frame-options", b"DENY"),
            (b"content-security-policy", csp.encode("latin-1")),
        ]

        started = False

        async def send_with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = list(message.get("headers", []))
                present = {k.lower() for k, _ in headers}
                headers += [(k, v) for k, v in extra if k not in present]
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        except Exception as exc:
            self._log(scope, exc)
            if started:
                raise  # half a response is out: only closing the connection is left
            response = error_response(500, "internal error; the server's log has the details")
            await response(scope, receive, send_with_headers)

    def _log(self, scope: Scope, exc: Exception) -> None:
        frame = traceback.extract_tb(exc.__traceback__)[-1:] or None
        origin = (type(exc).__name__, frame[0].filename, frame[0].lineno) if frame else None
        # repr: one line whatever the message holds (it may quote the request)
        text = repr(str(exc)[:300])
        line = f"{scope.get('method')} {scope.get('path')!r}: 500: {type(exc).__name__}: {text}"
        if origin is not None and origin not in self._seen and len(self._seen) < _MAX_TRACEBACKS:
            self._seen.add(origin)
            log.error("%s", line, exc_info=exc)
        else:
            log.error("%s (traceback not repeated)", line)
