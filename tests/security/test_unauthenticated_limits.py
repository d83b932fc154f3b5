"""Issue #17, medium 1: one client without credentials must not make the server answer 503 to
everyone. Against the real uvicorn server of ``sendqueue serve`` (:func:`build_server`):

- the attack itself (scaled to the test machine): 200 connections each posting ``/login`` with
  ``Content-Length: 100000``, a 43-character ``sq_csrf`` cookie and one byte every 2 s, from
  one address, against a server that serves 100 connections at once; ``GET /healthz`` from the
  same loopback answers 200 on every probe during the attack (it answered 503 before);
- a 50 MB body to ``/login`` without a token is refused with 413 before it is read;
- a body trickled to ``/login`` within the size limit is cut by the short public deadline,
  not by the long one of authenticated uploads;
- a client address holding ``SENDQUEUE_HTTP_MAX_CONNECTIONS_PER_CLIENT`` connections gets a
  503 for the next one (logged once per interval), trusted proxies excepted.
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
import time
from collections import Counter
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from sendqueue.settings import Settings
from tests.security.test_request_timeouts import MARGIN, live, parse, read_until_closed

TOKEN = "unauth-limits-" + "Kq7vN2xPz9LmR4tW"
CSRF = secrets.token_urlsafe(32)  # 43 characters, as in the issue
FORM = "application/x-www-form-urlencoded"


def login_head(length: int, *, cookie: bool = True, origin: bool = False) -> bytes:
    lines = [
        "POST /login HTTP/1.1",
        "Host: 127.0.0.1",
        f"Content-Type: {FORM}",
        f"Content-Length: {length}",
    ]
    if cookie:
        lines.append(f"Cookie: sq_csrf={CSRF}")
    if origin:
        lines.append("Origin: http://127.0.0.1")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def probe(port: int) -> int | str:
    """``GET /healthz`` on a new connection: the status, or what went wrong."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            return parse(read_until_closed(conn)).status
    except OSError as exc:
        return type(exc).__name__


class SlowLoginAttack:
    """``connections`` slots, each a connection posting ``/login`` (``Content-Length: length``)
    and sending one byte of its body every ``interval`` s; a slot whose connection the server
    answered or closed connects again at its next turn. One thread, non-blocking sockets; the
    slots take their turns one after another, spread evenly over the interval."""

    def __init__(
        self, port: int, connections: int, *, interval: float = 2.0, length: int = 100_000
    ) -> None:
        self.port = port
        self.slots: list[socket.socket | None] = [None] * connections
        self.interval = interval
        self.head = login_head(length)
        self.opened = 0
        self.answers: Counter[int | str] = Counter()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="attack", daemon=True)

    def _answered(self, conn: socket.socket) -> bool:
        try:
            data = conn.recv(65536)
        except BlockingIOError:
            return False
        except OSError:
            self.answers["reset"] += 1
            return True
        if data.startswith(b"HTTP/1.1 "):
            self.answers[int(data.split()[1])] += 1
        else:
            self.answers["closed"] += 1
        return True

    def _turn(self, conn: socket.socket | None) -> socket.socket | None:
        if conn is not None and self._answered(conn):
            conn.close()
            conn = None
        try:
            if conn is None:
                conn = socket.create_connection(("127.0.0.1", self.port), timeout=5)
                conn.sendall(self.head)
                conn.setblocking(False)
                self.opened += 1
            else:
                conn.send(b"a")
        except OSError:
            if conn is not None:
                conn.close()
            return None
        return conn

    def _run(self) -> None:
        # The slots' turns are spread over the interval, as independent clients' would be.
        pause = self.interval / len(self.slots)
        while not self.stop.is_set():
            for index, conn in enumerate(self.slots):
                if self.stop.wait(pause):
                    break
                self.slots[index] = self._turn(conn)

    def __enter__(self) -> SlowLoginAttack:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(30)
        for conn in self.slots:
            if conn is not None:
                conn.close()


def run_attack(
    port: int, connections: int, *, seconds: float, every: float = 0.25
) -> tuple[Counter[int | str], SlowLoginAttack]:
    """The probes' statuses during ``seconds`` of the attack (after its first round)."""
    statuses: Counter[int | str] = Counter()
    with SlowLoginAttack(port, connections) as attack:
        deadline = time.monotonic() + 30
        while attack.opened < connections:  # every slot has connected once
            assert time.monotonic() < deadline, attack.opened
            time.sleep(0.05)
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            statuses[probe(port)] += 1
            time.sleep(every)
    return statuses, attack


def test_the_slow_login_attack_does_not_starve_healthz(tmp_path: Path) -> None:
    # The attack, scaled: 1,000 against 1,000 there, 200 against 100 here.
    with live(tmp_path, api_token=TOKEN, http_max_connections=100, http_body_timeout=120) as server:
        statuses, attack = run_attack(server.port, 200, seconds=6)

    assert sum(statuses.values()) >= 10
    assert statuses == Counter({200: sum(statuses.values())}), (statuses, attack.answers)
    # each connection was refused at once for its declared length, not held
    assert attack.answers[413] >= 200, attack.answers


@pytest.mark.parametrize("token", [TOKEN, None], ids=["token", "no-token"])
def test_a_50_mb_body_to_login_is_refused_before_it_is_read(
    tmp_path: Path, token: str | None
) -> None:
    # Without credentials (or without a token configured, from a browser: the form's CSRF
    # field would be read from the body).
    with live(tmp_path, api_token=token, http_body_timeout=60) as server, server.connect() as conn:
        conn.sendall(login_head(50 * 1000 * 1000, origin=token is None) + b"token=" + b"a" * 65536)
        started = time.monotonic()
        answer = parse(read_until_closed(conn))
        elapsed = time.monotonic() - started

        assert answer.status == 413
        assert answer.headers["connection"] == "close"
        error = answer.json()["error"]
        assert error["field"] == "body"
        assert "SENDQUEUE_HTTP_PUBLIC_MAX_BODY_BYTES" in error["message"]
        assert elapsed < 5


def test_a_chunked_body_to_login_is_cut_at_the_public_limit(tmp_path: Path) -> None:
    head = (
        f"POST /login HTTP/1.1\r\nHost: test\r\nContent-Type: {FORM}\r\n"
        f"Cookie: sq_csrf={CSRF}\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    chunk = b"token=" + b"a" * 8000
    with live(tmp_path, api_token=TOKEN, http_body_timeout=60) as server, server.connect() as conn:
        conn.sendall(head + f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        assert parse(read_until_closed(conn)).status == 413


def test_a_trickled_login_body_is_cut_by_the_public_deadline(tmp_path: Path) -> None:
    with (
        live(tmp_path, api_token=TOKEN, http_body_timeout=60, http_public_body_timeout=1) as server,
        server.connect() as conn,
    ):
        conn.settimeout(0.2)
        conn.sendall(login_head(1000))
        started = time.monotonic()
        received = b""
        while not received and time.monotonic() - started < 10:
            with suppress(TimeoutError):
                conn.sendall(b"a")
                received = conn.recv(65536)
        elapsed = time.monotonic() - started

        assert received, "the server was still reading the login body after 10 s"
        # the head and the body may arrive in separate segments: read the rest
        conn.settimeout(5)
        answer = parse(received + read_until_closed(conn))
        assert answer.status == 408
        assert "SENDQUEUE_HTTP_PUBLIC_BODY_TIMEOUT" in answer.body.decode()
        assert elapsed < 1 + MARGIN
        server.wait_until_idle()


def _hold(server_port: int, stack: ExitStack) -> socket.socket:
    conn = stack.enter_context(socket.create_connection(("127.0.0.1", server_port), timeout=10))
    conn.sendall(b"GET /hea")  # unfinished headers hold the connection
    return conn


def test_connections_beyond_the_per_client_cap_get_a_503(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sendqueue.web.middleware.peers")
    request = b"GET /healthz HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    # loopback is not a trusted proxy here, so it is capped like any client
    with live(
        tmp_path,
        http_max_connections_per_client=3,
        forwarded_allow_ips="10.0.0.0/8",
        http_header_timeout=30,
    ) as server:
        with ExitStack() as held:
            for _ in range(3):
                _hold(server.port, held)
            time.sleep(0.2)
            refused = []
            for _ in range(4):
                # answered as soon as it is made: a request sent after it would meet a reset
                with server.connect() as conn:
                    refused.append(parse(read_until_closed(conn)))
            assert [a.status for a in refused] == [503] * 4
            assert refused[0].json()["error"]["status"] == 503
            assert refused[0].headers["connection"] == "close"
        server.wait_until_idle()
        with server.connect() as conn:  # the held ones closed: served again
            conn.sendall(request)
            assert parse(read_until_closed(conn)).status == 200

    lines = [r for r in caplog.records if r.name == "sendqueue.web.middleware.peers"]
    assert len(lines) == 1, [r.getMessage() for r in lines]  # once per client per interval
    assert "127.0.0.1" in lines[0].getMessage()
    assert "SENDQUEUE_HTTP_MAX_CONNECTIONS_PER_CLIENT" in lines[0].getMessage()


def test_a_trusted_proxy_is_not_capped(tmp_path: Path) -> None:
    with (
        live(tmp_path, http_max_connections_per_client=2, http_header_timeout=30) as server,
        ExitStack() as held,
    ):
        for _ in range(3):
            _hold(server.port, held)
        time.sleep(0.2)
        with server.connect() as conn:
            conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
            assert parse(read_until_closed(conn)).status == 200


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("http_public_max_body_bytes", 10),
        ("http_public_body_timeout", 0),
        ("http_max_connections_per_client", 0),
    ],
)
def test_a_bad_limit_is_refused_naming_the_setting(field: str, value: Any) -> None:
    with pytest.raises(ValidationError, match=field):
        Settings(_env_file=None, **{field: value})
