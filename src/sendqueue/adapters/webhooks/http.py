"""POSTing a webhook delivery over http.client, to an address checked first.

The URL's host is resolved here (a literal IP as itself; a non-ASCII name in its IDNA 2008
form, never Python's IDNA 2003 codec's), every address it resolves to is checked against
:func:`~sendqueue.domain.webhook_safety.refusal` (one refused answer refuses the delivery),
and the connection is made to the checked addresses, in the resolver's order, the first that
accepts it: a second resolution (DNS rebinding) never decides where the bytes go. TLS
verifies the certificate for the URL's host name (SNI and ``Host`` carry the name). A
connection the server keeps alive carries the next delivery to the same origin for up to a
minute (then the name is checked again). The timeout bounds the whole exchange (connecting,
TLS, sending, the answer's status, headers and body), not each read, so a receiver that
drips its answer cannot hold a delivery longer. Redirects are not followed (a 3xx is a
failure), the response body is read to at most 64 KB and dropped, and every failure is a
:class:`~sendqueue.domain.errors.WebhookDeliveryFailed` with a short reason.
"""

from __future__ import annotations

import functools
import http.client
import io
import ipaddress
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, urlsplit

from sendqueue.domain.addresses import ascii_domain
from sendqueue.domain.errors import InvalidField, WebhookDeliveryFailed
from sendqueue.domain.webhook_safety import AllowList, refusal
from sendqueue.ports.webhooks import WebhookResponse

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = [
    "KEEP_ALIVE_SECONDS",
    "MAX_BODY",
    "HttpWebhookTransport",
    "Resolver",
    "system_resolver",
]

#: The most of a response body read (then dropped).
MAX_BODY = 64 * 1024

#: How long a kept-alive connection is reused; then the name is resolved and checked again.
KEEP_ALIVE_SECONDS = 60.0

#: ``(host, port) -> addresses``: the DNS lookup, injectable for tests.
Resolver = Callable[[str, int], list[str]]


def system_resolver(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to, in the resolver's order."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class _DeadlineReader(io.RawIOBase):
    """A socket's bytes, each read allowed only the time left to the exchange. Like
    ``sock.makefile``, it keeps the socket open until it is closed itself."""

    def __init__(self, sock: socket.socket, left: Callable[[], float]) -> None:
        super().__init__()
        self._sock = sock
        self._raw = sock.makefile("rb", buffering=0)
        self._left = left

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int | None:
        self._sock.settimeout(self._left())
        return self._raw.readinto(buffer)

    def close(self) -> None:
        self._raw.close()
        super().close()


class _DeadlineResponse(http.client.HTTPResponse):
    """An answer read through :class:`_DeadlineReader` (status line, headers and body)."""

    def __init__(
        self, sock: socket.socket, *args: Any, left: Callable[[], float], **kwargs: Any
    ) -> None:
        super().__init__(sock, *args, **kwargs)
        plain, self.fp = self.fp, io.BufferedReader(_DeadlineReader(sock, left))
        plain.close()


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """An HTTP connection to the first of ``addresses`` that accepts it, whatever its host name
    resolves to now; each exchange on it ends by its ``deadline`` (monotonic seconds)."""

    def __init__(self, host: str, port: int, addresses: list[str], timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._addresses = addresses
        self.opened_at = time.monotonic()
        self.deadline = self.opened_at + timeout
        # http.client builds each answer with response_class(sock, method=...)
        self.response_class = functools.partial(  # type: ignore[assignment]
            _DeadlineResponse, left=self.time_left
        )

    def time_left(self) -> float:
        """Seconds left before the deadline; TimeoutError when none."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        return left

    def connect(self) -> None:
        failure: OSError = ConnectionError("no address")
        for address in self._addresses:  # as socket.create_connection does with a name's
            try:
                self.sock = socket.create_connection((address, self.port), self.time_left())
                break
            except OSError as exc:
                failure = exc
        else:
            raise failure
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, data: Any) -> None:
        if self.sock is not None:
            self.sock.settimeout(self.time_left())
        super().send(data)


class _PinnedHTTPSConnection(_PinnedHTTPConnection):
    """The same over TLS, the certificate checked for the host name (SNI included)."""

    def __init__(
        self, host: str, port: int, addresses: list[str], timeout: float, context: ssl.SSLContext
    ) -> None:
        super().__init__(host, port, addresses, timeout)
        self._context = context

    def connect(self) -> None:
        super().connect()
        self.sock.settimeout(self.time_left())  # the handshake, in all
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self.host)


class HttpWebhookTransport:
    """:class:`~sendqueue.ports.webhooks.WebhookTransport` over http.client (see the module
    docstring). ``resolve`` and ``tls`` are injectable for tests."""

    def __init__(
        self,
        allow: AllowList | None = None,
        *,
        timeout: float = 10.0,
        resolve: Resolver = system_resolver,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self._allow = allow or AllowList()
        self._timeout = timeout
        self._resolve = resolve
        self._tls = tls or ssl.create_default_context()
        self._lock = threading.Lock()
        # One idle connection per origin (scheme://host:port), with when it was opened.
        self._idle: dict[str, _PinnedHTTPConnection] = {}

    def checked_addresses(self, url: str) -> tuple[str, int, list[str]]:
        """``(host, port, the addresses to connect to)``, or WebhookDeliveryFailed saying why
        not (one refused address refuses them all)."""
        parts = _split(url)
        host = parts.hostname or ""
        if parts.scheme not in ("http", "https") or not host:
            raise WebhookDeliveryFailed("not an http(s) URL with a host")
        if not host.isascii():  # stored before check_url made it ASCII
            try:
                host = ascii_domain("url", host, url)
            except InvalidField as exc:
                raise WebhookDeliveryFailed(f"invalid URL: {exc.reason}") from None
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise WebhookDeliveryFailed("invalid URL: its port is not 0 to 65535") from None
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
        parts = _split(url)
        target = _request_target(parts)
        sent = {**headers, "user-agent": "sendqueue"}
        key = f"{parts.scheme}://{parts.netloc}"
        idle = self._take(key)
        if idle is not None:
            try:
                return self._exchange(idle, key, target, body, sent, reused=True)
            except _Stale:
                pass  # the server closed it meanwhile: a fresh connection, checked again
        host, port, addresses = self.checked_addresses(url)
        conn: _PinnedHTTPConnection
        if parts.scheme == "https":
            conn = _PinnedHTTPSConnection(host, port, addresses, self._timeout, self._tls)
        else:
            conn = _PinnedHTTPConnection(host, port, addresses, self._timeout)
        return self._exchange(conn, key, target, body, sent, reused=False)

    def _exchange(
        self,
        conn: _PinnedHTTPConnection,
        key: str,
        target: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        reused: bool,
    ) -> WebhookResponse:
        started = time.monotonic()
        conn.deadline = started + self._timeout
        keep = False
        try:
            conn.request("POST", target, body=body, headers=dict(headers))
            with conn.getresponse() as response:
                drained = _drain(response)
                status = response.status
                keep = drained and not response.will_close
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
            conn.close()
            if reused:
                raise _Stale from None
            raise WebhookDeliveryFailed(_short(exc)) from None
        except (OSError, http.client.HTTPException, ssl.SSLError) as exc:
            conn.close()
            raise WebhookDeliveryFailed(_short(exc)) from None
        latency = int((time.monotonic() - started) * 1000)
        if keep and 200 <= status < 300:
            self._keep(key, conn)
        else:
            conn.close()
        if not 200 <= status < 300:
            kind = "redirect not followed" if 300 <= status < 400 else "not 2xx"
            raise WebhookDeliveryFailed(f"HTTP {status} ({kind})", status=status)
        return WebhookResponse(status, latency)

    def _take(self, key: str) -> _PinnedHTTPConnection | None:
        """An idle kept-alive connection to the URL's origin, made to an address checked when
        it was opened, at most :data:`KEEP_ALIVE_SECONDS` ago."""
        with self._lock:
            conn = self._idle.pop(key, None)
        if conn is not None and time.monotonic() - conn.opened_at > KEEP_ALIVE_SECONDS:
            conn.close()
            return None
        return conn

    def _keep(self, key: str, conn: _PinnedHTTPConnection) -> None:
        with self._lock:
            old = self._idle.pop(key, None)
            self._idle[key] = conn
        if old is not None:
            old.close()

    def close(self) -> None:
        """Close the idle connections."""
        with self._lock:
            idle, self._idle = list(self._idle.values()), {}
        for conn in idle:
            conn.close()


#: What a request line may not carry: http.client sends it as ASCII, without controls or spaces.
_UNSENDABLE = re.compile(r"[^\x21-\x7e]")


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


def _drain(response: http.client.HTTPResponse) -> bool:
    """Read at most MAX_BODY bytes, within the delivery's time, and drop them; whether the
    body ended (the connection can then carry the next delivery). The status has come: a
    body still arriving at the deadline is not waited for."""
    left = MAX_BODY
    try:
        while left > 0:
            chunk = response.read(min(left, 16384))
            if not chunk:
                return True
            left -= len(chunk)
    except TimeoutError:
        pass
    return False


def _short(exc: BaseException) -> str:
    """A failure in one line of at most 120 printable characters, never quoting the receiver
    (its body, or the first line of an answer that is not HTTP)."""
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timed out"
    if isinstance(exc, http.client.BadStatusLine | http.client.UnknownProtocol) and not isinstance(
        exc, http.client.RemoteDisconnected
    ):
        # their text is the receiver's first line: whatever it is, it is not shown
        return f"{type(exc).__name__}: the answer is not HTTP"
    text = f"{type(exc).__name__}: {exc}"
    cleaned = "".join(ch if ch.isprintable() else " " for ch in text)
    return cleaned[:120]
