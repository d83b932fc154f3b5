"""What a request may hold before any route runs: a body no larger than the limit (413; a few
KiB on the public routes, ``/login``, whose body is read before any authentication), and
no NUL byte in the path (404) or the query (422).

No id or address holds a NUL byte, and PostgreSQL refuses it in any text parameter, which
would otherwise surface as an unreachable store (503, an ERROR log line).
"""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sendqueue.web.errors import error_response
from sendqueue.web.middleware.auth import is_public_path
from sendqueue.web.middleware.scope import headers, send_response

__all__ = ["BodyLimitMiddleware", "NulByteMiddleware"]


class _BodyTooLarge(Exception):
    pass


class BodyLimitMiddleware:
    """Refuses request bodies larger than ``max_bytes`` with 413, without reading past it: at
    once when ``Content-Length`` says so, otherwise by counting bytes as they arrive."""

    def __init__(
        self, app: ASGIApp, *, max_bytes: int, public_max_bytes: int | None = None
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.public_max_bytes = public_max_bytes

    def _too_large(self, limit: int, public: bool) -> Response:
        if public:
            return error_response(
                413,
                f"request body larger than {limit} bytes before authentication; raise "
                "SENDQUEUE_HTTP_PUBLIC_MAX_BODY_BYTES",
                headers={"Connection": "close"},
                field="body",
            )
        return error_response(
            413,
            f"request body larger than {limit} bytes; split the file or raise "
            "SENDQUEUE_MAX_UPLOAD_BYTES",
            headers={"Connection": "close"},
            field="file",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        public = self.public_max_bytes is not None and is_public_path(scope["path"])
        limit = self.public_max_bytes if public and self.public_max_bytes else self.max_bytes
        length = (headers(scope).get("content-length") or "").strip()
        # isascii: str.isdigit() is also true for "²", which int() refuses.
        if length.isascii() and length.isdigit() and int(length) > limit:
            await send_response(scope, receive, send, self._too_large(limit, public))
            return
        received = 0
        exceeded = False
        started = False

        async def limited_receive() -> Message:
            nonlocal received, exceeded
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
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
            await send_response(scope, receive, send, self._too_large(limit, public))


class NulByteMiddleware:
    """Refuses a NUL byte in the path or the query string; see the module docstring."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if "\x00" in scope["path"]:
                response = error_response(404, "not found: a path holds no NUL character")
                await send_response(scope, receive, send, response)
                return
            if b"\x00" in unquote_to_bytes(scope.get("query_string", b"")):
                response = error_response(
                    422,
                    "query: a parameter holds a NUL character",
                    field="query",
                    reason="a parameter holds a NUL character",
                )
                await send_response(scope, receive, send, response)
                return
        await self.app(scope, receive, send)
