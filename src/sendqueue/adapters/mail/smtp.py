"""The SMTP mailer: one reused connection per thread, SMTP replies mapped to mail errors.

Error mapping (the text of every error names the server, the step, the reply code and the
server's own message):

- a reply that is not SMTP (no 2xx..5xx code: an HTTP server, another protocol's banner):
  :class:`TransientMailError` saying so, without the server's bytes;
- reply codes 4xx (including 421 "closing"), connection refused or reset, timeouts, TLS
  failures, a server that drops the connection: :class:`TransientMailError`;
- reply codes 5xx (sender or recipient refused, message refused after DATA, authentication
  failed 535), a server lacking STARTTLS, AUTH or SMTPUTF8 that the configuration or the message
  needs, and a message that cannot be built at all: :class:`PermanentMailError`.

With an access token (a sender's ``oauth``) it signs in with ``AUTH XOAUTH2`` instead of a
password. A refusal (535, or the error challenge 334 that Google and Microsoft send first)
gets a new token and one more try; a second refusal is permanent. A token endpoint's failure is
permanent or transient as :class:`~sendqueue.domain.errors.OAuthTokenError` says.

Connections are kept per thread (a send worker thread reuses its own), checked with NOOP when
they sat idle for longer than :attr:`SmtpMailer.IDLE_CHECK_AFTER` seconds, and re-opened once,
transparently, when a reused connection turns out to be dead before the message was handed
over. A connection that dies *after* the message data was sent is not retried here: the server
may have accepted the mail, so the caller gets a TransientMailError and its retry policy (with
the Message-ID derived from the task id, so a duplicate is recognisable) decides.
"""

from __future__ import annotations

import contextlib
import smtplib
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import get_args

from sendqueue.adapters.mail.mime import build_message, envelope_of, needs_smtputf8
from sendqueue.adapters.mail.url import (
    DEFAULT_PORTS,
    Security,
    SmtpUrl,
    parse_mailer_url,
    redact_mailer_url,
)
from sendqueue.domain.errors import (
    InvalidField,
    MailError,
    OAuthTokenError,
    PermanentMailError,
    TransientMailError,
)
from sendqueue.ports import AccessToken, OutgoingMessage

__all__ = ["DEFAULT_PORTS", "Security", "SmtpMailer"]


@dataclass(eq=False)
class _Connection:
    smtp: smtplib.SMTP
    thread: threading.Thread
    last_used: float
    # Held for a whole transaction, so close() from another thread waits for it to end.
    lock: threading.Lock = field(default_factory=threading.Lock)


class _DeadConnection(Exception):
    """Internal: the connection died; ``safe_to_retry`` when no message data had been sent."""

    def __init__(self, cause: OSError, *, safe_to_retry: bool) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.safe_to_retry = safe_to_retry


def _text(reply: bytes | str) -> str:
    return reply.decode("utf-8", "replace") if isinstance(reply, bytes) else reply


def xoauth2_response(user: str, token: str) -> str:
    """The XOAUTH2 initial response before base64 (smtplib encodes it): ``user=U^Aauth=Bearer
    T^A^A``, as Google and Microsoft document the mechanism."""
    return f"user={user}\x01auth=Bearer {token}\x01\x01"


def _token(oauth: AccessToken, rejected: str | None = None) -> str:
    """The access token, its endpoint's failure mapped to a MailError of the same kind."""
    try:
        return oauth.get(rejected)
    except OAuthTokenError as exc:
        kind = PermanentMailError if exc.permanent else TransientMailError
        raise kind(str(exc)) from exc


def _command(smtp: smtplib.SMTP, verb: str, path: str, options: list[str]) -> tuple[int, bytes]:
    """MAIL FROM or RCPT TO with an address the message's headers already parsed. smtplib's
    ``mail()``/``rcpt()`` parse it again (``quoteaddr``), about a tenth of a send's CPU."""
    if "SMTPUTF8" in options:
        smtp.command_encoding = "utf-8"  # what smtplib.mail() does for this option
    smtp.putcmd(verb, " ".join([path, *options]))
    return smtp.getreply()


def _is_smtp(code: int) -> bool:
    """Whether a reply code is SMTP's (2xx..5xx); smtplib gives -1 for a line without one."""
    return 200 <= code <= 599


def _by_code(code: int, text: str) -> MailError:
    if 500 <= code <= 599:
        return PermanentMailError(text)
    return TransientMailError(text)


class SmtpMailer:
    """Sends through an SMTP server (smtplib). Implements :class:`~sendqueue.ports.Mailer`.

    ``security``: ``starttls`` (plain connect, then STARTTLS, required), ``tls`` (implicit TLS
    from the first byte) or ``none``. ``ssl_context`` defaults to the system's trust store with
    hostname checking. ``username``/``password`` log in after TLS is up; with ``oauth`` (an
    access token) ``username`` signs in with XOAUTH2 instead, without a password. ``timeout``
    (seconds) bounds every socket operation. Thread-safe; ``close()`` sends QUIT on every open
    connection; a later ``send`` opens a new one.
    """

    #: Seconds a connection may sit idle before it is checked with NOOP prior to reuse.
    IDLE_CHECK_AFTER: float = 30.0

    def __init__(
        self,
        host: str,
        port: int,
        *,
        security: Security = "starttls",
        username: str | None = None,
        password: str | None = None,
        timeout: float = 30.0,
        local_hostname: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        oauth: AccessToken | None = None,
    ) -> None:
        if not host:
            raise InvalidField("host", host, "an SMTP host name or address is required")
        if not 0 < port < 65536:
            raise InvalidField("port", port, "a TCP port, 1..65535")
        if security not in get_args(Security):
            raise InvalidField("security", security, "one of starttls, tls, none")
        if not timeout > 0:
            raise InvalidField("timeout", timeout, "seconds, greater than 0")
        if password is not None and username is None:
            raise InvalidField("username", None, "a password needs a username")
        if oauth is not None and (not username or not username.isascii()):
            raise InvalidField("username", username, "XOAUTH2 needs an ASCII user to sign in as")
        self.host = host
        self.port = port
        self.security: Security = security
        self.username = username
        self._password = password
        self.timeout = float(timeout)
        self.local_hostname = local_hostname
        self._ssl_context = ssl_context
        self._oauth = oauth
        self._lock = threading.Lock()
        self._connections: dict[int, _Connection] = {}

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        oauth: AccessToken | None = None,
    ) -> SmtpMailer:
        """``smtp://user:pass@host:port?security=starttls|tls|none&timeout=30``.

        User and password are percent-decoded (write ``@`` as ``%40``, ``:`` as ``%3A``). The
        port defaults by security: 587 for starttls (the default), 465 for tls, 25 for none.
        With ``oauth`` it signs in with XOAUTH2 as the URL's user (none: ``oauth.user``, the
        sender's address), and any password in the URL is not used. Raises
        InvalidField("mailer", ...) for anything else; the message never shows the password.
        """
        parsed = parse_mailer_url(url)
        if not isinstance(parsed, SmtpUrl):
            raise InvalidField(
                "mailer", redact_mailer_url(url), "expected smtp://user:pass@host:port"
            )
        return cls(
            parsed.host,
            parsed.port,
            security=parsed.security,
            username=parsed.username or (oauth.user if oauth is not None else None),
            password=parsed.password if oauth is None else None,
            timeout=parsed.timeout,
            ssl_context=ssl_context,
            oauth=oauth,
        )

    def __repr__(self) -> str:
        user = f"{self.username}@" if self.username else ""
        return f"SmtpMailer(smtp://{user}{self.host}:{self.port}, security={self.security})"

    # -- Mailer -----------------------------------------------------------------------------

    def send(self, message: OutgoingMessage) -> str:
        """Hand ``message`` to the server; returns its Message-ID once the server accepted it."""
        try:
            mime = build_message(message)
            # MAIL FROM: the VERP bounce address when there is one (the Return-Path a DSN goes to)
            sender, recipient = envelope_of(mime, message.envelope_from)
        except InvalidField as exc:
            # A message that cannot be built never will be: retrying cannot help.
            raise PermanentMailError(f"message not sent, it is invalid: {exc}") from exc
        data = mime.as_bytes()
        # A VERP sender of a non-ASCII bounce address needs SMTPUTF8 even for an ASCII message.
        utf8 = needs_smtputf8(mime) or not sender.isascii()
        for attempt in (1, 2):
            conn, reused = self._acquire()
            with conn.lock:
                try:
                    self._transaction(conn, sender, recipient, data, utf8)
                except _DeadConnection as dead:
                    self._discard(conn)
                    if reused and dead.safe_to_retry and attempt == 1:
                        continue
                    raise self._connection_error(dead.cause, "sending") from dead.cause
                conn.last_used = time.monotonic()
            return message.message_id
        raise AssertionError("unreachable: the second attempt returns or raises")

    def probe(self, timeout: float) -> str:
        """Sign in on a connection of its own and QUIT (no mail sent): connect, EHLO, STARTTLS or
        TLS as configured, AUTH when a username is; see :class:`~sendqueue.ports.Probe`. Each
        step waits at most ``timeout`` seconds (or this mailer's own, shorter, timeout)."""
        smtp = self._open(min(timeout, self.timeout))
        # The first line of the EHLO reply starts with the server's name: which server answered.
        server = _text((smtp.ehlo_resp or b"").split(b"\n", 1)[0]).split(" ", 1)[0]
        steps = [f"EHLO {server}".rstrip()]
        if self.security != "none":
            steps.append("STARTTLS" if self.security == "starttls" else "TLS")
        if self._oauth is not None:
            steps.append(f"AUTH XOAUTH2 as {self.username}")
        else:
            steps.append(f"AUTH as {self.username}" if self.username is not None else "no AUTH")
        self._quit(smtp)
        return f"SMTP {self.host}:{self.port}: {', '.join(steps)}"

    def close(self) -> None:
        """QUIT and close every open connection (each after its current send, if any)."""
        with self._lock:
            conns = list(self._connections.values())
            self._connections.clear()
        for conn in conns:
            with conn.lock:
                self._quit(conn.smtp)

    def __enter__(self) -> SmtpMailer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- connections ------------------------------------------------------------------------

    def _acquire(self) -> tuple[_Connection, bool]:
        """This thread's connection and whether it was reused, opening one if needed."""
        me = threading.current_thread()
        ident = threading.get_ident()
        with self._lock:
            # Threads of a pool come and go: drop what dead threads left behind, including a
            # dead thread's connection filed under an ident the system gave to a new thread.
            stale = [
                key
                for key, c in self._connections.items()
                if not c.thread.is_alive() or (key == ident and c.thread is not me)
            ]
            leftovers = [self._connections.pop(key) for key in stale]
            conn = self._connections.get(ident)
        for c in leftovers:
            # close, not QUIT: a hung peer must not stall this thread's send for a timeout.
            self._close_quietly(c.smtp)
        if conn is not None:
            if time.monotonic() - conn.last_used <= self.IDLE_CHECK_AFTER or self._alive(conn):
                return conn, True
            self._discard(conn)
        conn = _Connection(self._open(), me, time.monotonic())
        with self._lock:
            self._connections[ident] = conn
        return conn, False

    def _alive(self, conn: _Connection) -> bool:
        try:
            code, _ = conn.smtp.noop()
        except (smtplib.SMTPException, OSError):
            return False
        return code == 250

    def _discard(self, conn: _Connection) -> None:
        with self._lock:
            for key, value in list(self._connections.items()):
                if value is conn:
                    del self._connections[key]
        self._close_quietly(conn.smtp)

    @staticmethod
    def _close_quietly(smtp: smtplib.SMTP) -> None:
        with contextlib.suppress(OSError):
            smtp.close()

    def _quit(self, smtp: smtplib.SMTP) -> None:
        try:
            smtp.quit()
        except (smtplib.SMTPException, OSError):
            self._close_quietly(smtp)

    def _open(self, timeout: float | None = None) -> smtplib.SMTP:
        """Connect, greet, secure and log in; every failure mapped to a MailError. ``timeout``
        (the probe's) replaces the mailer's own for this connection."""
        where = f"SMTP {self.host}:{self.port}"
        timeout = self.timeout if timeout is None else timeout
        try:
            if self.security == "tls":
                smtp: smtplib.SMTP = smtplib.SMTP_SSL(
                    self.host,
                    self.port,
                    local_hostname=self.local_hostname,
                    timeout=timeout,
                    context=self._context(),
                )
            else:
                smtp = smtplib.SMTP(
                    self.host, self.port, local_hostname=self.local_hostname, timeout=timeout
                )
        except smtplib.SMTPResponseException as exc:
            if not _is_smtp(exc.smtp_code):
                raise self._not_smtp() from None
            reply = f"{exc.smtp_code} {_text(exc.smtp_error)}"
            raise _by_code(exc.smtp_code, f"{where} refused the connection: {reply}") from exc
        except OSError as exc:
            raise self._connection_error(exc, "connecting", timeout) from exc
        try:
            self._greet(smtp, where, timeout)
        except BaseException:
            self._close_quietly(smtp)
            raise
        return smtp

    def _greet(self, smtp: smtplib.SMTP, where: str, timeout: float) -> None:
        step = "EHLO"
        try:
            smtp.ehlo_or_helo_if_needed()
            if self.security == "starttls":
                step = "STARTTLS"
                if not smtp.has_extn("starttls"):
                    raise PermanentMailError(
                        f"{where} does not offer STARTTLS, which security=starttls requires"
                    )
                smtp.starttls(context=self._context())
                smtp.ehlo()
            if self._oauth is not None and self.username is not None:
                step = "AUTH XOAUTH2"
                self._xoauth2(smtp, where, self._oauth, self.username)
            elif self.username is not None:
                step = "AUTH"
                if not smtp.has_extn("auth"):
                    raise PermanentMailError(
                        f"{where} does not offer AUTH, but a username is configured"
                    )
                smtp.login(self.username, self._password or "")
        except smtplib.SMTPResponseException as exc:
            if not _is_smtp(exc.smtp_code):
                raise self._not_smtp() from None
            reply = f"{exc.smtp_code} {_text(exc.smtp_error)}"
            raise _by_code(exc.smtp_code, f"{where} {step} failed: {reply}") from exc
        except smtplib.SMTPServerDisconnected as exc:
            raise self._connection_error(exc, step, timeout) from exc
        except smtplib.SMTPException as exc:
            # smtplib's own refusals ("No suitable authentication method found"): configuration
            # problems that a retry will not fix.
            raise PermanentMailError(f"{where} {step} failed: {exc}") from exc
        except OSError as exc:
            raise self._connection_error(exc, step, timeout) from exc

    @staticmethod
    def _xoauth2(smtp: smtplib.SMTP, where: str, oauth: AccessToken, user: str) -> None:
        """AUTH XOAUTH2 with the current token; once more with a new one when it is refused."""
        if "XOAUTH2" not in smtp.esmtp_features.get("auth", "").upper().split():
            raise PermanentMailError(
                f"{where} does not offer AUTH XOAUTH2, which the sender's oauth needs"
            )
        token = _token(oauth)
        for attempt in (1, 2):

            def respond(challenge: bytes | None = None, token: str = token) -> str:
                # The error challenge (334 and a JSON status) is answered with an empty line,
                # after which the server sends its final 535.
                return xoauth2_response(user, token) if challenge is None else ""

            try:
                smtp.auth("XOAUTH2", respond, initial_response_ok=True)
                return
            except smtplib.SMTPAuthenticationError as exc:
                if attempt == 2 or exc.smtp_code != 535:
                    raise
            token = _token(oauth, rejected=token)

    def _context(self) -> ssl.SSLContext:
        if self._ssl_context is None:
            self._ssl_context = ssl.create_default_context()
        return self._ssl_context

    def _not_smtp(self) -> TransientMailError:
        """A server whose replies are not SMTP (an HTTP server, another protocol's banner): its
        bytes are never quoted, in the task's error or in a log."""
        return TransientMailError(f"the server at {self.host}:{self.port} did not speak SMTP")

    def _connection_error(
        self, exc: OSError, step: str, timeout: float | None = None
    ) -> TransientMailError:
        where = f"SMTP {self.host}:{self.port}"
        # smtplib reports a timeout while reading a reply as SMTPServerDisconnected("Connection
        # unexpectedly closed: timed out"), raised while handling the TimeoutError.
        if isinstance(exc, TimeoutError) or isinstance(exc.__context__, TimeoutError):
            waited = self.timeout if timeout is None else timeout
            return TransientMailError(f"{where}: timed out after {waited:g}s while {step}")
        if isinstance(exc, smtplib.SMTPServerDisconnected):
            return TransientMailError(f"{where}: server closed the connection while {step}: {exc}")
        reason = exc.strerror or str(exc) or type(exc).__name__
        return TransientMailError(f"{where}: {type(exc).__name__} while {step}: {reason}")

    # -- one transaction --------------------------------------------------------------------

    def _transaction(
        self, conn: _Connection, sender: str, recipient: str, data: bytes, utf8: bool
    ) -> None:
        """MAIL, RCPT, DATA on ``conn``. Raises a MailError for replies, _DeadConnection else."""
        smtp = conn.smtp
        where = f"SMTP {self.host}:{self.port}"
        data_sent = False
        try:
            options: list[str] = []
            if utf8:
                if not smtp.has_extn("smtputf8"):
                    raise PermanentMailError(
                        f"{where} lacks SMTPUTF8, which the address {recipient!r} or "
                        f"{sender!r} needs"
                    )
                options.append("SMTPUTF8")
            if smtp.has_extn("size"):
                options.append(f"SIZE={len(data)}")
            code, reply = _command(smtp, "mail", f"FROM:<{sender}>", options)
            if code != 250:
                self._refused(conn, code, f"{where} refused MAIL FROM:<{sender}>", reply)
            code, reply = _command(smtp, "rcpt", f"TO:<{recipient}>", [])
            if code not in (250, 251):
                self._refused(conn, code, f"{where} refused RCPT TO:<{recipient}>", reply)
            # From here on the server may accept the mail even if we never see its reply.
            data_sent = True
            code, reply = smtp.data(data)
            if code != 250:
                self._refused(conn, code, f"{where} refused the message data", reply)
        except smtplib.SMTPResponseException as exc:
            # smtplib raises (instead of returning) when DATA itself is refused.
            self._refused(conn, exc.smtp_code, f"{where} refused DATA", exc.smtp_error)
        except MailError:
            raise
        except smtplib.SMTPServerDisconnected as exc:
            raise _DeadConnection(exc, safe_to_retry=not data_sent) from exc
        except smtplib.SMTPException as exc:
            raise PermanentMailError(f"{where}: {exc}") from exc
        except OSError as exc:
            # A broken pipe or reset before DATA means the server has not seen the message.
            raise _DeadConnection(exc, safe_to_retry=not data_sent) from exc

    def _refused(self, conn: _Connection, code: int, what: str, reply: bytes | str) -> None:
        """Raise the mapped error for a refusal, leaving the connection ready for the next mail."""
        if code == 421 or code < 0:
            self._discard(conn)  # 421: the server is closing this connection
        else:
            try:
                conn.smtp.rset()
            except (smtplib.SMTPException, OSError):
                self._discard(conn)
        if not _is_smtp(code):
            raise self._not_smtp() from None
        raise _by_code(code, f"{what}: {code} {_text(reply)}")
