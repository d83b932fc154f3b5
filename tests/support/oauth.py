"""Real parts for the OAuth 2.0 tests, on loopback: a token endpoint and an SMTP server that
takes only ``AUTH XOAUTH2``.

- :class:`TokenEndpoint`: an HTTP server (``http.server`` in a thread) at
  ``http://127.0.0.1:PORT/token`` that checks the refresh-token grant's form fields, answers
  with a new access token and ``expires_in``, rotates the refresh token on demand, counts the
  calls and answers errors on demand (``fail_next``). ``GET /tokeninfo?access_token=T`` tells
  whether T is current, as Dovecot's ``oauth2`` passdb asks (``tokeninfo_url``).
- :class:`XOAuth2Smtp`: aiosmtpd with an ``auth_XOAUTH2`` mechanism that accepts only the
  endpoint's current access token for its user; a refused one gets the providers' error
  challenge (334 and a JSON status), then 535.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, Session

from tests.support.mailservers import free_port

__all__ = ["TokenEndpoint", "XOAuth2Smtp", "token_endpoint", "xoauth2_smtp"]

CLIENT_ID = "sendqueue-app"
CLIENT_SECRET = "client-Secret-42"


@dataclass
class _Failure:
    status: int
    body: bytes
    content_type: str = "application/json"


@dataclass
class TokenEndpoint:
    """See the module docstring. The grant it takes: :data:`CLIENT_ID`, :data:`CLIENT_SECRET`,
    ``refresh_token`` (``rt-1`` at first; each rotation makes the next one) and ``scope``."""

    user: str = "news@example.com"
    scope: str = "https://outlook.office.com/SMTP.Send"
    expires_in: int = 3600
    refresh_token: str = "rt-1"
    rotate: bool = False
    access_token: str | None = None
    calls: int = 0
    forms: list[dict[str, str]] = field(default_factory=list)
    _failures: list[_Failure] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None
    _issued: int = 0

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/token"

    @property
    def tokeninfo_url(self) -> str:
        return self.url.replace("/token", "/tokeninfo?access_token=")

    def fail_next(self, status: int, error: str | None = None, description: str = "") -> None:
        """Answer the next call with ``status`` and an OAuth error (or a non-JSON page)."""
        if error is None:
            failure = _Failure(status, b"<html>Bad gateway</html>", "text/html")
        else:
            doc = {"error": error, "error_description": description}
            failure = _Failure(status, json.dumps(doc).encode())
        with self._lock:
            self._failures.append(failure)

    def revoke(self) -> None:
        """Make the current access token invalid (the next one is issued at the next call)."""
        with self._lock:
            self.access_token = None

    def start(self) -> TokenEndpoint:
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            # Keep-alive, as Dovecot's HTTP client expects (it waits seconds on a closed one).
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
                self._answer(*endpoint._token(form, self.headers.get("Content-Type", "")))

            def do_GET(self) -> None:
                query = parse_qs(urlsplit(self.path).query)
                self._answer(*endpoint._tokeninfo(query.get("access_token", [""])[0]))

            def _answer(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _token(self, form: dict[str, str], content_type: str) -> tuple[int, bytes, str]:
        with self._lock:
            self.calls += 1
            self.forms.append(form)
            if self._failures:
                failure = self._failures.pop(0)
                return failure.status, failure.body, failure.content_type
            expected = {
                "grant_type": "refresh_token",
                "refresh_token": self.refresh_token,
                "client_id": CLIENT_ID,
                "client_secret": CLIENT_SECRET,
                "scope": self.scope,
            }
            if content_type != "application/x-www-form-urlencoded":
                return self._error(400, "invalid_request", "expected a form")
            if form.get("refresh_token") != self.refresh_token:
                return self._error(400, "invalid_grant", "AADSTS70000: the grant is not valid")
            if form != expected:
                return self._error(400, "invalid_request", f"unexpected fields {sorted(form)}")
            self._issued += 1
            self.access_token = f"at-{self._issued}"
            doc: dict[str, Any] = {
                "access_token": self.access_token,
                "token_type": "Bearer",
                "expires_in": self.expires_in,
                "scope": self.scope,
            }
            if self.rotate:
                self.refresh_token = f"rt-{self._issued + 1}"
                doc["refresh_token"] = self.refresh_token
            return 200, json.dumps(doc).encode(), "application/json"

    @staticmethod
    def _error(status: int, error: str, description: str) -> tuple[int, bytes, str]:
        doc = {"error": error, "error_description": description}
        return status, json.dumps(doc).encode(), "application/json"

    def _tokeninfo(self, token: str) -> tuple[int, bytes, str]:
        with self._lock:
            current = self.access_token
        if not token or token != current:
            return self._error(401, "invalid_token", "unknown or expired token")
        doc = {"email": self.user, "active": True, "scope": self.scope}
        return 200, json.dumps(doc).encode(), "application/json"

    def current(self) -> str | None:
        with self._lock:
            return self.access_token


class XOAuth2Smtp:
    """aiosmtpd on 127.0.0.1 (plain, AUTH offered without TLS, as on loopback) whose only
    mechanism is XOAUTH2, checked against ``endpoint``'s current token. Records what it got."""

    def __init__(self, endpoint: TokenEndpoint) -> None:
        self.endpoint = endpoint
        self.messages: list[Message] = []
        self.attempts: list[str] = []  # "ok" or "refused", one per AUTH XOAUTH2
        self._lock = threading.Lock()
        handler = _Handler(self)
        self._controller = Controller(
            handler,
            hostname="127.0.0.1",
            port=free_port(),
            auth_require_tls=False,
            auth_exclude_mechanism=["LOGIN", "PLAIN"],
            ready_timeout=10.0,
        )

    def start(self) -> XOAuth2Smtp:
        self._controller.start()
        return self

    def stop(self) -> None:
        self._controller.stop()

    @property
    def port(self) -> int:
        return int(self._controller.port)

    def url(self, user: str | None = None) -> str:
        who = f"{user}@" if user else ""
        return f"smtp://{who}127.0.0.1:{self.port}?security=none&timeout=5"


class _Handler:
    def __init__(self, server: XOAuth2Smtp) -> None:
        self._server = server

    async def auth_XOAUTH2(self, smtp: SMTP, args: list[str]) -> AuthResult:
        if len(args) < 2:
            return AuthResult(success=False, handled=False)
        parts = base64.b64decode(args[1]).decode().split("\x01")
        fields = dict(p.split("=", 1) for p in parts if p)
        expected = f"Bearer {self._server.endpoint.current()}"
        ok = fields.get("user") == self._server.endpoint.user and fields.get("auth") == expected
        with self._server._lock:
            self._server.attempts.append("ok" if ok else "refused")
        if ok:
            return AuthResult(success=True, auth_data=fields["user"])
        status = {"status": "401", "schemes": "bearer", "scope": "https://mail.google.com/"}
        # The providers' error challenge: the client answers with an empty line, then 535.
        await smtp.challenge_auth(json.dumps(status).encode())
        return AuthResult(success=False, handled=False)

    async def handle_MAIL(
        self, smtp: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        if not session.authenticated:
            return "530 5.7.0 Authentication required"
        envelope.mail_from = address
        return "250 OK"

    async def handle_DATA(self, smtp: SMTP, session: Session, envelope: Envelope) -> str:
        assert isinstance(envelope.content, bytes)
        with self._server._lock:
            self._server.messages.append(message_from_bytes(envelope.content))
        return "250 Message accepted"


@pytest.fixture
def token_endpoint() -> Iterator[TokenEndpoint]:
    endpoint = TokenEndpoint().start()
    try:
        yield endpoint
    finally:
        endpoint.stop()


@pytest.fixture
def xoauth2_smtp(token_endpoint: TokenEndpoint) -> Iterator[XOAuth2Smtp]:
    server = XOAuth2Smtp(token_endpoint).start()
    try:
        yield server
    finally:
        server.stop()
