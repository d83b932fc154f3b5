"""A real SMTP server for tests (aiosmtpd), recording what it accepts.

Fixtures (registered for every test through ``pytest_plugins`` in tests/conftest.py):

- ``smtp_sink``: a plain SMTP server on 127.0.0.1 (no TLS, no AUTH), fresh for each test;
- ``make_smtp_sink(security=..., auth=...)``: more servers, with STARTTLS or implicit TLS
  (certificate issued at test time by a throwaway CA, see :func:`client_ssl_context`) and
  required AUTH PLAIN/LOGIN;
- ``silent_smtp_server``: (host, port) of a listener that accepts TCP and never says a word;
- ``closed_port``: a port on 127.0.0.1 where nothing listens (connection refused).

A :class:`SmtpSink` records every accepted message as a :class:`ReceivedMail`, counts
connections, answers programmed replies (``reply_next("451 4.3.0 try later")``) and can drop
every open connection (``drop_connections()``) to test reconnects. It is usable outside pytest
too (``with SmtpSink() as sink:``), for scripts and subprocess tests.
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import functools
import logging
import re
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from email.message import EmailMessage
from typing import TYPE_CHECKING, Any, Literal, Self, cast

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

if TYPE_CHECKING:
    import trustme

__all__ = [
    "ReceivedMail",
    "SmtpSink",
    "client_ssl_context",
    "closed_port",
    "make_smtp_sink",
    "silent_smtp_server",
    "smtp_sink",
]

SinkSecurity = Literal["none", "starttls", "tls"]

_REPLY = re.compile(r"[2-5]\d\d(?:[ -].*)?")
_COMMANDS = ("MAIL", "RCPT", "DATA")


@dataclass(frozen=True)
class ReceivedMail:
    """One message the sink accepted."""

    mail_from: str
    rcpt_tos: tuple[str, ...]
    message: EmailMessage
    raw: bytes
    received_at: float
    """``time.time()`` when the DATA was accepted."""
    connection: int
    """The number of the connection it came over (1 for the first since start or clear)."""
    login: str | None
    """The AUTH user, when the client logged in."""
    tls: bool
    """Whether the connection was encrypted (STARTTLS or implicit TLS)."""

    def __getitem__(self, header: str) -> str | None:
        """The header's decoded value, e.g. ``mail["Subject"]``."""
        value = self.message[header]
        return None if value is None else str(value)


class _DropLoginDataNotice(logging.Filter):
    """aiosmtpd logs a deprecation notice about its own ``Session.login_data`` on every
    successful AUTH (its smtp_AUTH sets the attribute itself); the notice is not about our code."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Session.login_data is deprecated")


if not any(isinstance(f, _DropLoginDataNotice) for f in logging.getLogger("mail.log").filters):
    logging.getLogger("mail.log").addFilter(_DropLoginDataNotice())


# -- certificates ----------------------------------------------------------------------------


@functools.cache
def _test_ca() -> trustme.CA:
    import trustme

    return trustme.CA()


@functools.cache
def _server_context() -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    _test_ca().issue_cert("127.0.0.1", "localhost").configure_cert(ctx)
    return ctx


def client_ssl_context() -> ssl.SSLContext:
    """A client context that trusts the sinks' certificates (and verifies host names)."""
    ctx = ssl.create_default_context()
    _test_ca().configure_trust(ctx)
    return ctx


# -- the server --------------------------------------------------------------------------------


class _SinkSMTP(SMTP):
    """aiosmtpd's SMTP, carrying the number of its connection."""

    _sink_connection = 0


class _Controller(Controller):
    """aiosmtpd's Controller, on a port the kernel picks and with one SMTP per connection."""

    def __init__(self, sink: SmtpSink, **kwargs: Any) -> None:
        super().__init__(sink, hostname=sink.host, port=0, **kwargs)
        self._sink = sink

    def factory(self) -> SMTP:
        # Passing the loop keeps SMTP from looking one up itself (deprecated outside a loop).
        smtp = _SinkSMTP(self.handler, loop=self.loop, **self.SMTP_kwargs)
        self._sink._opened(smtp)
        return smtp

    def _trigger_server(self) -> None:
        # Bound to port 0, so learn the real port before start() connects to it.
        assert isinstance(self.server, asyncio.Server)
        self.port = self.server.sockets[0].getsockname()[1]
        super()._trigger_server()  # type: ignore[no-untyped-call]


class SmtpSink:
    """A running aiosmtpd server that records the messages it accepts. Thread-safe.

    ``security``: ``none`` (plain), ``starttls`` (STARTTLS offered and required before MAIL) or
    ``tls`` (implicit TLS). ``auth=(user, password)`` requires AUTH (PLAIN or LOGIN) before MAIL;
    over plain connections AUTH is offered unencrypted, as some relays on localhost do.
    """

    def __init__(
        self,
        *,
        security: SinkSecurity = "none",
        auth: tuple[str, str] | None = None,
        host: str = "127.0.0.1",
        timeout: float = 30.0,
    ) -> None:
        self.host = host
        self.security: SinkSecurity = security
        self.auth = auth
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._messages: list[ReceivedMail] = []
        self._replies: dict[str, deque[str]] = {c: deque() for c in _COMMANDS}
        self._servers: list[SMTP] = []
        self._connections = 0
        self._auth_failures = 0
        kwargs: dict[str, Any] = {
            "ready_timeout": 10.0,
            "timeout": timeout,
            "authenticator": self._authenticate,
            # Required AUTH is enforced in handle_MAIL instead of with auth_required=True, which
            # aiosmtpd refuses (with a warning) without TLS. Implicit TLS happens below
            # aiosmtpd's notice, so it must not insist on STARTTLS before AUTH there.
            "auth_require_tls": security == "starttls",
        }
        if security == "starttls":
            kwargs.update(tls_context=_server_context(), require_starttls=True)
        elif security == "tls":
            kwargs.update(ssl_context=_server_context())
        self._controller = _Controller(self, **kwargs)
        self._started = False

    # lifecycle

    def start(self) -> Self:
        self._controller.start()
        self._started = True
        self.clear()  # forget the Controller's own readiness probe connection
        return self

    def stop(self) -> None:
        if not self._started:
            return
        # Close client connections first: transports still open when the loop stops would be
        # reported as unclosed (a ResourceWarning, an error under filterwarnings=error).
        self.drop_connections()
        self._controller.stop()
        self._started = False

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return int(self._controller.port)

    def url(self, username: str | None = None, password: str | None = None) -> str:
        """An ``smtp://`` URL for this sink (credentials taken as given, not encoded)."""
        cred = f"{username}:{password}@" if username is not None else ""
        return f"smtp://{cred}{self.host}:{self.port}?security={self.security}"

    # what arrived

    @property
    def messages(self) -> list[ReceivedMail]:
        """A copy of the accepted messages, in arrival order."""
        with self._lock:
            return list(self._messages)

    @property
    def connections(self) -> int:
        """How many connections were opened since start (or the last ``clear()``)."""
        with self._lock:
            return self._connections

    @property
    def auth_failures(self) -> int:
        with self._lock:
            return self._auth_failures

    def wait_for(self, count: int, timeout: float = 5.0) -> list[ReceivedMail]:
        """Block until at least ``count`` messages arrived; TimeoutError after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while len(self._messages) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"SMTP sink: {len(self._messages)} of {count} messages within {timeout}s"
                    )
                self._arrived.wait(left)
            return list(self._messages)

    def clear(self) -> None:
        """Forget messages, the connection count and queued replies."""
        with self._lock:
            self._messages.clear()
            self._connections = 0
            self._auth_failures = 0
            for queue in self._replies.values():
                queue.clear()

    # programming it

    def reply_next(self, *replies: str, command: str = "DATA") -> None:
        """Answer the next ``command``s (DATA, RCPT or MAIL) with these replies, in order.

        ``sink.reply_next("451 4.3.0 try later", "550 5.1.1 no such user")`` refuses the next
        two messages, temporarily then permanently; later ones are accepted again.
        """
        command = command.upper()
        if command not in _COMMANDS:
            raise ValueError(f"command must be one of {_COMMANDS}, got {command!r}")
        for reply in replies:
            if not _REPLY.fullmatch(reply):
                raise ValueError(f"not an SMTP reply: {reply!r}")
        with self._lock:
            self._replies[command].extend(replies)

    def drop_connections(self) -> None:
        """Close every open client connection from the server side, as a restarting server does."""
        if not self._started:
            return

        async def close_all() -> None:
            for server in servers:
                transport = server.transport
                if transport is not None:
                    transport.close()
            await asyncio.sleep(0)  # let connection_lost run

        with self._lock:
            servers = list(self._servers)
            self._servers = [s for s in servers if s.transport is not None]
        loop = self._controller.loop
        if loop.is_running():
            asyncio.run_coroutine_threadsafe(close_all(), loop).result(timeout=5)

    # aiosmtpd's hooks (run in the server's thread)

    def _opened(self, server: _SinkSMTP) -> None:
        with self._lock:
            self._connections += 1
            server._sink_connection = self._connections
            self._servers = [s for s in self._servers if s.transport is not None]
            self._servers.append(server)

    def _programmed(self, command: str) -> str | None:
        with self._lock:
            queue = self._replies[command]
            return queue.popleft() if queue else None

    def _authenticate(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        ok = (
            self.auth is not None
            and isinstance(data, LoginPassword)
            and (data.login, data.password) == (self.auth[0].encode(), self.auth[1].encode())
        )
        if not ok:
            with self._lock:
                self._auth_failures += 1
        return AuthResult(success=ok, handled=False, auth_data=data if ok else None)

    async def handle_MAIL(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        if self.auth is not None and not session.authenticated:
            return "530 5.7.0 Authentication required"
        programmed = self._programmed("MAIL")
        if programmed is not None:
            return programmed
        envelope.mail_from = address
        envelope.mail_options.extend(options)
        return "250 OK"

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        programmed = self._programmed("RCPT")
        if programmed is not None:
            return programmed
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.extend(options)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        programmed = self._programmed("DATA")
        if programmed is not None:
            return programmed
        raw = cast(bytes, envelope.original_content)
        login = session.auth_data.login.decode() if session.auth_data is not None else None
        mail = ReceivedMail(
            mail_from=cast(str, envelope.mail_from),
            rcpt_tos=tuple(envelope.rcpt_tos),
            message=_parse(raw, utf8=envelope.smtp_utf8),
            raw=raw,
            received_at=time.time(),
            connection=getattr(server, "_sink_connection", 0),
            login=login,
            tls=session.ssl is not None or self.security == "tls",
        )
        with self._arrived:
            self._messages.append(mail)
            self._arrived.notify_all()
        return "250 2.0.0 OK queued"


def _parse(raw: bytes, *, utf8: bool) -> EmailMessage:
    """The message the way a mail reader sees it.

    Local line endings, so decoded parts read "a\\nb" rather than the wire's "a\\r\\nb"; and
    an SMTPUTF8 message's raw UTF-8 headers decoded as UTF-8 (the bytes parser would turn them
    into surrogate escapes).
    """
    unix = raw.replace(b"\r\n", b"\n")
    if utf8:
        parsed = email.message_from_string(unix.decode("utf-8"), policy=email.policy.default)
    else:
        parsed = email.message_from_bytes(unix, policy=email.policy.default)
    return parsed


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture
def smtp_sink() -> Iterator[SmtpSink]:
    """A plain SMTP server on 127.0.0.1 for this test, recording what it accepts."""
    with SmtpSink() as sink:
        yield sink


@pytest.fixture
def make_smtp_sink() -> Iterator[Callable[..., SmtpSink]]:
    """A factory of started sinks: ``make_smtp_sink(security="starttls", auth=("u", "p"))``."""
    sinks: list[SmtpSink] = []

    def make(**kwargs: Any) -> SmtpSink:
        sink = SmtpSink(**kwargs).start()
        sinks.append(sink)
        return sink

    yield make
    for sink in sinks:
        sink.stop()


@pytest.fixture
def silent_smtp_server() -> Iterator[tuple[str, int]]:
    """(host, port) of a server that accepts connections and never answers.

    The kernel completes the TCP handshake for a listening socket's backlog even though nobody
    calls accept(), so a client connects fine and then waits for a greeting that never comes.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield "127.0.0.1", listener.getsockname()[1]


@pytest.fixture
def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens: connecting is refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
