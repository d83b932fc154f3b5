"""POSTing a webhook delivery to an address checked first.

The URL's host is resolved here (a literal IP as itself; a non-ASCII name in its IDNA 2008
form, never Python's IDNA 2003 codec's), every address it resolves to is checked against
:func:`~sendqueue.domain.webhook_safety.refusal` (one refused answer refuses the delivery),
and the connection is made to the checked addresses, in the resolver's order, the first that
accepts it: a second resolution (DNS rebinding) never decides where the bytes go. TLS
verifies the certificate for the URL's host name (SNI and ``Host`` carry the name). A
connection the server keeps alive carries the next delivery to the same origin for up to a
minute, still to the address it was opened to (then the name is resolved and checked again).
The timeout bounds the whole delivery (connecting to each address tried, TLS, sending, the
answer's status, interim answers, headers and body), not each read, so a receiver that drips
its answer cannot hold a delivery longer. No proxy is used, redirects are not followed (a 3xx
is a failure), the response body is read to at most 64 KB and dropped, and every failure,
a URL no request can carry included, is a
:class:`~sendqueue.domain.errors.WebhookDeliveryFailed` with a short reason that never quotes
the receiver. The HTTP/1.1 exchange itself is :mod:`sendqueue.adapters.webhooks.wire`.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from sendqueue.adapters.webhooks.wire import (
    MAX_BODY,
    BadStatusLine,
    Disconnected,
    ProtocolError,
    Wire,
    request_head,
    request_line,
    time_left,
)
from sendqueue.domain.addresses import ascii_domain
from sendqueue.domain.errors import InvalidField, WebhookDeliveryFailed
from sendqueue.domain.webhook_safety import AllowList, refusal
from sendqueue.ports.webhooks import WebhookResponse

__all__ = [
    "KEEP_ALIVE_SECONDS",
    "MAX_BODY",
    "HttpWebhookTransport",
    "Resolver",
    "system_resolver",
]

#: How long a kept-alive connection is reused; then the name is resolved and checked again.
KEEP_ALIVE_SECONDS = 60.0

#: ``(host, port) -> addresses``: the DNS lookup, injectable for tests.
Resolver = Callable[[str, int], list[str]]

#: What a request line may not carry: printable ASCII only, no controls or spaces.
_UNSENDABLE = re.compile(r"[^\x21-\x7e]")


def system_resolver(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to, in the resolver's order."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True)
class _Route:
    """What a URL says about where and how to post, parsed and checked once per URL."""

    origin: str
    tls: bool
    host: str
    """The host as looked up and verified: an IP, or an ASCII (IDNA 2008) name."""
    port: int
    line: str
    """The request line and Host header (:func:`~sendqueue.adapters.webhooks.wire.request_line`)."""


class _Connection:
    """A connection to an address checked when it was opened, and when that was."""

    __slots__ = ("opened_at", "wire")

    def __init__(self, wire: Wire) -> None:
        self.wire = wire
        self.opened_at = time.monotonic()


class HttpWebhookTransport:
    """:class:`~sendqueue.ports.webhooks.WebhookTransport` over sockets (see the module
    docstring). ``resolve`` and ``tls`` are injectable for tests."""

    def __init__(
        self,
        allow: AllowList | None = None,
        *,
        timeout: float = 10.0,
        resolve: Resolver = system_resolver,
        tls: ssl.SSLContext | None = None,
        https_only: bool = False,
    ) -> None:
        """``https_only`` (production) refuses an http URL stored before it was set."""
        self._allow = allow or AllowList()
        self._https_only = https_only
        self._timeout = timeout
        self._resolve = resolve
        self._tls = tls or ssl.create_default_context()
        self._lock = threading.Lock()
        # One idle connection per origin (scheme://host:port).
        self._idle: dict[str, _Connection] = {}
        self._routes: dict[str, _Route] = {}

    def checked_addresses(self, url: str) -> tuple[str, int, list[str]]:
        """``(host, port, the addresses to connect to)``, or WebhookDeliveryFailed saying why
        not (one refused address refuses them all)."""
        route = self._route(url)
        host, port = route.host, route.port
        try:
            addresses = [str(ipaddress.ip_address(host))]
        except ValueError:
            try:
                addresses = self._resolve(host, port)
            except (OSError, UnicodeError) as exc:
                raise WebhookDeliveryFailed(f"cannot resolve {host}: {_short(exc)}") from None
        if not addresses:
            raise WebhookDeliveryFailed(f"{host} resolves to no address")
        for address in addresses:
            why = refusal(host, address, self._allow)
            if why is not None:
                raise WebhookDeliveryFailed(f"refused: {why}")
        return host, port, addresses

    def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> WebhookResponse:
        route = self._route(url)
        try:
            head = request_head(route.line, {**headers, "user-agent": "sendqueue"}, len(body))
        except ProtocolError as exc:
            raise WebhookDeliveryFailed(str(exc)) from None
        request = head + body
        deadline = time.monotonic() + self._timeout  # one for the whole delivery
        idle = self._take(route.origin)
        if idle is not None:
            try:
                return self._exchange(idle, route, request, deadline)
            except _Stale:
                pass  # the server closed it meanwhile: a fresh connection, checked again
        _, _, addresses = self.checked_addresses(url)
        return self._exchange(None, route, request, deadline, addresses=addresses)

    def _route(self, url: str) -> _Route:
        route = self._routes.get(url)
        if route is not None:
            return route
        parts = _split(url)
        host = parts.hostname or ""
        if parts.scheme not in ("http", "https") or not host:
            raise WebhookDeliveryFailed("not an http(s) URL with a host")
        if not host.isascii():  # stored before check_url made it ASCII
            try:
                host = ascii_domain("url", host, url)
            except InvalidField as exc:
                raise WebhookDeliveryFailed(f"invalid URL: {exc.reason}") from None
        tls = parts.scheme == "https"
        if self._https_only and not tls:
            raise WebhookDeliveryFailed("refused: only https in production (update the URL)")
        try:
            port = parts.port or (443 if tls else 80)
        except ValueError:
            raise WebhookDeliveryFailed("invalid URL: its port is not 0 to 65535") from None
        shown = f"[{host}]" if ":" in host else host  # an IPv6 literal keeps its brackets
        route = _Route(
            origin=f"{parts.scheme}://{parts.netloc}",
            tls=tls,
            host=host,
            port=port,
            line=request_line(
                _request_target(parts), shown if port == (443 if tls else 80) else f"{shown}:{port}"
            ),
        )
        with self._lock:
            if len(self._routes) >= 1000:
                self._routes.clear()
            self._routes[url] = route
        return route

    def _exchange(
        self,
        conn: _Connection | None,
        route: _Route,
        request: bytes,
        deadline: float,
        *,
        addresses: list[str] | None = None,
    ) -> WebhookResponse:
        """One request and its answer on ``conn`` (kept alive), or on a new connection to the
        first of the checked ``addresses`` that accepts it, all by ``deadline``. A kept-alive
        connection found closed is _Stale."""
        started = time.monotonic()
        reused = conn is not None
        try:
            if conn is None:
                conn = _Connection(self._connect(route, addresses or [], deadline))
            answer = conn.wire.exchange(request, deadline)
        except (Disconnected, BrokenPipeError, ConnectionResetError) as exc:
            if conn is not None:
                conn.wire.close()
            if reused and conn is not None and not conn.wire.answered:  # no answer came: resend
                raise _Stale from None
            reason = "the server closed the connection" if isinstance(exc, Disconnected) else None
            raise WebhookDeliveryFailed(reason or _short(exc)) from None
        except (OSError, ProtocolError, ValueError) as exc:  # ssl.SSLError is an OSError
            if conn is not None:
                conn.wire.close()
            raise WebhookDeliveryFailed(_short(exc)) from None
        latency = int((time.monotonic() - started) * 1000)
        status = answer.status
        if answer.reusable and 200 <= status < 300:
            self._keep(route.origin, conn)
        else:
            conn.wire.close()
        if not 200 <= status < 300:
            kind = "redirect not followed" if 300 <= status < 400 else "not 2xx"
            raise WebhookDeliveryFailed(f"HTTP {status} ({kind})", status=status)
        return WebhookResponse(status, latency)

    def _connect(self, route: _Route, addresses: list[str], deadline: float) -> Wire:
        """A socket to the first of ``addresses`` (all checked; never a new lookup) that
        accepts it within the deadline, TLS verified for the URL's host."""
        failure: OSError = ConnectionError("no address")
        for address in addresses:  # as socket.create_connection does with a name's
            try:
                sock = socket.create_connection((address, route.port), time_left(deadline))
                break
            except TimeoutError:
                raise  # the delivery's time is up: no address after it is tried
            except OSError as exc:
                failure = exc
        else:
            raise failure
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if route.tls:
                sock.settimeout(time_left(deadline))  # the handshake, in all
                sock = self._tls.wrap_socket(sock, server_hostname=route.host)
        except BaseException:
            sock.close()
            raise
        return Wire(sock)

    def _take(self, origin: str) -> _Connection | None:
        """An idle kept-alive connection to the origin, made to an address checked when it was
        opened, at most :data:`KEEP_ALIVE_SECONDS` ago."""
        with self._lock:
            conn = self._idle.pop(origin, None)
        if conn is None:
            return None
        # expired, or bytes came after its answer (they would answer the next request)
        if time.monotonic() - conn.opened_at > KEEP_ALIVE_SECONDS or not conn.wire.quiet():
            conn.wire.close()
            return None
        return conn

    def _keep(self, origin: str, conn: _Connection) -> None:
        with self._lock:
            old = self._idle.pop(origin, None)
            self._idle[origin] = conn
        if old is not None:
            old.wire.close()

    def close(self) -> None:
        """Close the idle connections."""
        with self._lock:
            idle, self._idle = list(self._idle.values()), {}
        for conn in idle:
            conn.wire.close()


def _split(url: str) -> SplitResult:
    try:
        return urlsplit(url)
    except ValueError:
        raise WebhookDeliveryFailed("invalid URL: it does not parse") from None


def _request_target(parts: SplitResult) -> str:
    """The path and query to request, or WebhookDeliveryFailed (which does not quote them:
    a URL's path often carries a secret)."""
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if _UNSENDABLE.search(target):
        raise WebhookDeliveryFailed("invalid URL: its path or query is not printable ASCII")
    return target


class _Stale(Exception):
    """A kept-alive connection the server had closed: nothing was answered on it."""


def _short(exc: BaseException) -> str:
    """A failure in one line of at most 120 printable characters, never quoting the receiver
    (its body, or the first line of an answer that is not HTTP)."""
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timed out"
    if isinstance(exc, BadStatusLine):
        return "BadStatusLine: the answer is not HTTP"
    if isinstance(exc, ProtocolError):
        return f"bad answer: {exc}"  # the wire's own words, never the receiver's bytes
    text = f"{type(exc).__name__}: {exc}"
    cleaned = "".join(ch if ch.isprintable() else " " for ch in text)
    return cleaned[:120]
