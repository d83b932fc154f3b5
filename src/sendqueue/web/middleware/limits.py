"""How long a client may take to send a request: deadlines for the headers and for the body.

uvicorn bounds the idle time between two requests on a keep-alive connection
(``timeout_keep_alive``), the size of a request's line and headers (h11's
``max_incomplete_event_size``: 400 above it) and the connections it serves at once
(``limit_concurrency``: 503 above it). Nothing in it bounds how long a client takes to *send*
a request: its keep-alive timer is cancelled by every byte that arrives, so a client trickling
its headers one byte at a time, or a body one byte a minute, holds the connection (and, for a
body, the request's task) for as long as it likes (slowloris). Two pieces add the deadlines:

- :class:`HeaderTimeoutProtocol`, uvicorn's h11 protocol with a deadline for the request line
  and headers, counted from the connection being made or from the end of the previous response
  on a kept-alive connection. When it passes, a client that sent part of a request gets a 408
  (the JSON error body of :mod:`sendqueue.web.errors`) and the connection is closed; a client
  that sent nothing is just disconnected. The same deadline covers the rest of a body the app
  never read, after its response went out.
- :class:`BodyTimeoutMiddleware`, an ASGI middleware giving the app's reading of the body a
  deadline, counted from the first ``receive()``. Past it, the read fails with a 408 (JSON,
  ``Connection: close``) and uvicorn closes the connection. Once the body is complete, later
  ``receive()`` calls (the disconnect watch of a streaming response) are not timed. A request
  to a public route (``/login``: its body is read before any authentication) gets the short
  ``public_timeout`` instead.
- The protocol also applies :class:`~sendqueue.web.middleware.peers.PeerCap`: a connection
  beyond the per-client cap gets a 503 and is closed as soon as it is made.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, ClassVar

import anyio
import h11
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from sendqueue.web.errors import HttpProblem, error_body, error_response
from sendqueue.web.middleware.auth import is_public_path
from sendqueue.web.middleware.peers import PeerCap

__all__ = ["BodyTimeoutMiddleware", "HeaderTimeoutProtocol", "header_timeout_protocol"]

log = logging.getLogger(__name__)


def _seconds(value: float) -> str:
    return f"{value:g} s"


def _peer(client: Any) -> str:
    if not client:
        return "a client"
    host, port = client
    return f"{host}:{port}"


class HeaderTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol, closing connections whose request headers do not arrive within
    :attr:`header_timeout` seconds. Made with :func:`header_timeout_protocol`."""

    header_timeout: ClassVar[float] = 10.0
    #: Shared by the connections of one server (the class is made per server).
    peer_cap: ClassVar[PeerCap | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._peer_key: str | None = None

    # -- the deadline -------------------------------------------------------------------------

    def _arm(self) -> None:
        self._disarm()
        self._header_deadline = self.loop.call_later(self.header_timeout, self._headers_late)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _request_in_flight(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _headers_late(self) -> None:
        self._header_deadline = None
        if self.transport.is_closing() or self._request_in_flight():
            return
        pending, _ = self.conn.trailing_data
        if self.conn.their_state is h11.IDLE and not pending:
            # Connected (or kept alive) and silent: nothing to answer.
            self.transport.close()
            return
        log.info(
            "%s did not finish sending its request within %s; closing the connection",
            _peer(self.client),
            _seconds(self.header_timeout),
        )
        if self.conn.our_state is h11.IDLE:
            self._send_408()
        self.transport.close()

    def _send_408(self) -> None:
        body = error_body(
            408,
            f"the request headers did not arrive within {_seconds(self.header_timeout)}",
        )
        data = json.dumps(body, separators=(",", ":")).encode()
        try:
            head = h11.Response(
                status_code=408,
                reason=b"Request Timeout",
                headers=[
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(data)).encode()),
                    (b"connection", b"close"),
                ],
            )
            out = self.conn.send(head)
            out += self.conn.send(h11.Data(data=data)) or b""
            out += self.conn.send(h11.EndOfMessage()) or b""
        except h11.LocalProtocolError:
            return
        if out:
            self.transport.write(out)

    # -- uvicorn's hooks ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.peer_cap is not None:
            self._peer_key = self.peer_cap.admit(self.client)
            if self._peer_key is None:
                self._refuse_over_cap()
                return
        self._arm()

    def _refuse_over_cap(self) -> None:
        body = error_body(
            503,
            "too many connections from this address at once; close some and try again",
        )
        data = json.dumps(body, separators=(",", ":")).encode()
        head = (
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            f"content-length: {len(data)}\r\nretry-after: 1\r\nconnection: close\r\n\r\n"
        )
        self.transport.write(head.encode() + data)
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self.peer_cap is not None and self._peer_key is not None:
            self.peer_cap.release(self._peer_key)
            self._peer_key = None
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self._request_in_flight() or self.transport.get_protocol() is not self:
            # The headers are in (reading the body is the app's to time), or the connection
            # was handed to another protocol (a WebSocket upgrade).
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and not self._request_in_flight():
            self._arm()  # the next request's headers (or the unread rest of this body)


def header_timeout_protocol(
    seconds: float, *, peer_cap: PeerCap | None = None
) -> type[HeaderTimeoutProtocol]:
    """:class:`HeaderTimeoutProtocol` with ``seconds`` as its deadline (and ``peer_cap``), for
    ``uvicorn.Config(http=...)`` (which builds the protocol itself, from its own config)."""
    if not seconds > 0:
        raise ValueError(f"the header timeout must be greater than 0, got {seconds!r}")
    return type(
        "HeaderTimeoutProtocol",
        (HeaderTimeoutProtocol,),
        {"header_timeout": seconds, "peer_cap": peer_cap},
    )


class _BodyTimeout(HttpProblem):
    """The body did not arrive in time; the app's error handlers answer it like any 408."""


class BodyTimeoutMiddleware:
    """Gives reading a request's body ``timeout`` seconds from the first ``receive()``
    (``public_timeout`` on a public route, whose body is read before any authentication)."""

    def __init__(
        self, app: ASGIApp, *, timeout: float, public_timeout: float | None = None
    ) -> None:
        for value in (timeout, public_timeout if public_timeout is not None else timeout):
            if not value > 0:
                raise ValueError(f"the body timeout must be greater than 0, got {value!r}")
        self.app = app
        self.timeout = timeout
        self.public_timeout = public_timeout

    def _problem(self, seconds: float, setting: str) -> _BodyTimeout:
        return _BodyTimeout(
            408,
            f"the request body did not arrive within {_seconds(seconds)}; "
            f"send it faster or raise {setting}",
            field="body",
            headers={"Connection": "close"},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline: float | None = None
        complete = False
        started = False
        seconds, setting = self.timeout, "SENDQUEUE_HTTP_BODY_TIMEOUT"
        if self.public_timeout is not None and is_public_path(scope["path"]):
            seconds, setting = self.public_timeout, "SENDQUEUE_HTTP_PUBLIC_BODY_TIMEOUT"

        async def timed_receive() -> Message:
            nonlocal deadline, complete
            if complete:
                return await receive()
            now = time.monotonic()
            if deadline is None:
                deadline = now + seconds
            try:
                with anyio.fail_after(max(deadline - now, 0.0)):
                    message = await receive()
            except TimeoutError:
                log.info(
                    "%s %s from %s: the body did not arrive within %s",
                    scope.get("method"),
                    scope.get("path"),
                    _peer(scope.get("client")),
                    _seconds(seconds),
                )
                raise self._problem(seconds, setting) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                complete = True
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, timed_receive, tracked_send)
        except _BodyTimeout as exc:
            # Raised where no error handler catches it (a middleware reading the body): answer
            # here, in the same shape.
            if started:
                raise
            response = error_response(exc.status, exc.message, headers=exc.headers, field="body")
            await response(scope, receive, send)
