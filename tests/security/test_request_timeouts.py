"""The web server's request limits (sendqueue.web.middleware.limits, SENDQUEUE_HTTP_*), against
the real uvicorn server of ``sendqueue serve`` (:func:`build_server`) and raw sockets.

- headers that never finish (stalled, or trickled a byte at a time: slowloris) get a 408 in
  the JSON error shape and the connection is closed, within the header timeout;
- a silent connection is closed without a word;
- a body that never finishes gets a 408 naming the body and the connection is closed, whether
  the route reads it or the CSRF check of a form does; nothing is written;
- a kept-alive connection whose next request trickles in is cut the same way;
- afterwards the server holds no connection and no task for them, and keeps answering;
- normal requests, bodies and event streams longer than the body timeout are not affected;
- unfinished request lines and headers beyond ``SENDQUEUE_HTTP_MAX_HEADER_BYTES`` get a 400 at
  once, and requests beyond ``SENDQUEUE_HTTP_MAX_CONNECTIONS`` a 503.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from sendqueue.bootstrap import Container, bootstrap
from sendqueue.settings import Settings
from sendqueue.web.app import Server, build_server, create_app

#: The deadlines under test are short; the margins for a loaded machine are generous.
HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 1.0
MARGIN = 15.0


@dataclass
class Live:
    port: int
    server: Server
    container: Container

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=MARGIN + 5)

    def wait_until_idle(self) -> None:
        """The server holds no connection and runs no request task (none leaked)."""
        state = self.server.server_state
        deadline = time.monotonic() + MARGIN
        while state.connections or state.tasks:
            assert time.monotonic() < deadline, (len(state.connections), len(state.tasks))
            time.sleep(0.05)


@contextmanager
def live(home: Path, **limits: Any) -> Iterator[Live]:
    settings = Settings(
        _env_file=None,
        database_url=f"sqlite:///{home / 'store.db'}",
        scheduler_url=f"sqlite:///{home / 'scheduler.db'}",
        mailer=f"maildir:{home / 'outbox'}",
        http_header_timeout=limits.pop("http_header_timeout", HEADER_TIMEOUT),
        http_body_timeout=limits.pop("http_body_timeout", BODY_TIMEOUT),
        **limits,
    )
    container = bootstrap(settings)
    try:
        server = build_server(create_app(container), host="127.0.0.1", port=0)
        thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
        thread.start()
        deadline = time.monotonic() + 15
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        try:
            yield Live(port, server, container)
        finally:
            server.should_exit = True
            thread.join(20)
            assert not thread.is_alive(), "the server did not stop within 20 s"
    finally:
        container.close()


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def parse(raw: bytes) -> Answer:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Answer(int(status_line.split()[1]), headers, body)


def read_until_closed(conn: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    chunks = []
    while chunk := conn.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def read_one(conn: socket.socket) -> Answer:
    """One response with a Content-Length, leaving the connection open."""
    raw = b""
    while b"\r\n\r\n" not in raw:
        chunk = conn.recv(65536)
        assert chunk, f"closed after {raw!r}"
        raw += chunk
    answer = parse(raw)
    length = int(answer.headers["content-length"])
    while len(answer.body) < length:
        chunk = conn.recv(65536)
        assert chunk
        answer.body += chunk
    return answer


def trickle(conn: socket.socket, data: bytes, interval: float = 0.2) -> tuple[bytes, float]:
    """Send ``data`` a byte at a time until the server answers or closes; what it sent, and
    how long after the first byte. A reset (the server closed while bytes were in flight)
    counts as closed."""
    conn.settimeout(interval)
    started = time.monotonic()
    received = b""
    for byte in data:
        try:
            conn.sendall(bytes([byte]))
            chunk = conn.recv(65536)
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            break
        if not chunk:
            break
        received += chunk
        conn.settimeout(MARGIN)
        with suppress(ConnectionResetError):
            received += read_until_closed(conn)
        break
    else:
        pytest.fail(f"the server was still reading after {time.monotonic() - started:.1f} s")
    return received, time.monotonic() - started


def post_json(path: str, body: bytes, *, declared: int | None = None) -> bytes:
    length = len(body) if declared is None else declared
    return (
        f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode() + body


CAMPAIGN = json.dumps(
    {
        "name": "timeouts",
        "recipients": [{"email": "a@example.com", "subject": "s", "body": "b"}],
        "policy": {"timezone": "UTC", "start": "2026-12-01T08:00:00Z"},
    }
).encode()


# -- headers -------------------------------------------------------------------------------------


def test_stalled_headers_get_a_408_and_the_connection_is_closed(tmp_path: Path) -> None:
    with live(tmp_path) as server:
        started = time.monotonic()  # before connecting: the deadline cannot start earlier
        with server.connect() as conn:
            conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: te")
            answer = parse(read_until_closed(conn))
        elapsed = time.monotonic() - started

        assert answer.status == 408
        assert answer.headers["connection"] == "close"
        assert answer.headers["content-type"] == "application/json"
        assert answer.json() == {
            "error": {"status": 408, "message": "the request headers did not arrive within 1 s"}
        }
        assert HEADER_TIMEOUT * 0.9 <= elapsed < HEADER_TIMEOUT + MARGIN
        server.wait_until_idle()


def test_headers_trickled_a_byte_at_a_time_are_cut_at_the_deadline(tmp_path: Path) -> None:
    # Each byte arrives well within uvicorn's keep-alive timeout, which every byte resets.
    request = b"GET /healthz HTTP/1.1\r\nHost: test\r\nX-Pad: " + b"a" * 500 + b"\r\n\r\n"
    with live(tmp_path, http_keep_alive=5) as server, server.connect() as conn:
        received, elapsed = trickle(conn, request)

        assert elapsed < HEADER_TIMEOUT + MARGIN
        if received:  # else the reset of a byte in flight beat the 408 to the client
            assert parse(received).status == 408
        server.wait_until_idle()
        with server.connect() as other:  # and the server still answers
            other.sendall(b"GET /healthz HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
            assert parse(read_until_closed(other)).status == 200


def test_a_silent_connection_is_closed_without_an_answer(tmp_path: Path) -> None:
    with live(tmp_path) as server, server.connect() as conn:
        started = time.monotonic()
        assert read_until_closed(conn) == b""
        assert time.monotonic() - started < HEADER_TIMEOUT + MARGIN
        server.wait_until_idle()


def test_a_kept_alive_connection_trickling_its_next_request_is_cut(tmp_path: Path) -> None:
    with live(tmp_path, http_keep_alive=30) as server, server.connect() as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
        assert read_one(conn).status == 200
        received, elapsed = trickle(conn, b"GET /healthz HTTP/1.1\r\nX-Pad: " + b"a" * 500)

        # cut by the header deadline, not by the 30 s keep-alive timeout
        assert elapsed < HEADER_TIMEOUT + MARGIN
        if received:
            assert parse(received).status == 408
        server.wait_until_idle()


def test_unfinished_headers_beyond_the_size_limit_get_a_400(tmp_path: Path) -> None:
    # The limit bounds what the server buffers while the headers are incomplete.
    with live(tmp_path, http_max_header_bytes=1024) as server, server.connect() as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: test\r\nX-Pad: " + b"a" * 4096)
        started = time.monotonic()
        assert parse(read_until_closed(conn)).status == 400
        assert time.monotonic() - started < HEADER_TIMEOUT  # at once, not at the deadline


def test_requests_beyond_the_connection_limit_get_a_503(tmp_path: Path) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    with live(tmp_path, http_max_connections=2, http_header_timeout=30) as server:
        with server.connect() as idle, server.connect() as conn:
            idle.sendall(b"GET /hea")  # holds a connection
            time.sleep(0.2)
            conn.sendall(request)
            assert parse(read_until_closed(conn)).status == 503
        server.wait_until_idle()
        with server.connect() as conn:
            conn.sendall(request)
            assert parse(read_until_closed(conn)).status == 200


# -- bodies --------------------------------------------------------------------------------------


def test_a_stalled_body_gets_a_408_naming_the_body(tmp_path: Path) -> None:
    with live(tmp_path) as server:
        started = time.monotonic()
        with server.connect() as conn:
            conn.sendall(post_json("/api/campaigns", CAMPAIGN[:40], declared=len(CAMPAIGN)))
            answer = parse(read_until_closed(conn))
        elapsed = time.monotonic() - started

        assert answer.status == 408
        assert answer.headers["connection"] == "close"
        error = answer.json()["error"]
        assert error["field"] == "body"
        assert error["message"].startswith("the request body did not arrive within 1 s")
        assert "SENDQUEUE_HTTP_BODY_TIMEOUT" in error["message"]
        assert BODY_TIMEOUT * 0.9 <= elapsed < BODY_TIMEOUT + MARGIN
        assert server.container.store.list_campaigns() == []
        server.wait_until_idle()


def test_a_body_trickled_a_byte_at_a_time_is_cut_at_the_deadline(tmp_path: Path) -> None:
    with live(tmp_path) as server, server.connect() as conn:
        conn.sendall(post_json("/api/campaigns", b"", declared=len(CAMPAIGN)))
        received, elapsed = trickle(conn, CAMPAIGN, interval=0.1)

        assert elapsed < BODY_TIMEOUT + MARGIN
        if received:
            assert parse(received).status == 408
        assert server.container.store.list_campaigns() == []
        server.wait_until_idle()


def test_a_stalled_form_body_read_by_the_csrf_check_gets_the_same_408(tmp_path: Path) -> None:
    # Without a token, a browser's form POST (it sends Origin) has its csrf_token field read
    # from the body by the CSRF middleware, before any route.
    form = b"csrf_token=abc&name=x"
    head = (
        "POST /api/campaigns HTTP/1.1\r\nHost: test\r\nOrigin: http://test\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\n"
        f"Content-Length: {len(form) + 100}\r\n\r\n"
    ).encode()
    with live(tmp_path) as server, server.connect() as conn:
        conn.sendall(head + form)
        answer = parse(read_until_closed(conn))

        assert answer.status == 408
        assert answer.json()["error"]["field"] == "body"
        assert server.container.store.list_campaigns() == []
        server.wait_until_idle()


# -- what is not affected ------------------------------------------------------------------------


def test_normal_requests_on_a_kept_alive_connection_still_work(tmp_path: Path) -> None:
    with live(tmp_path) as server, server.connect() as conn:
        # a body in two parts, the second within the deadline
        conn.sendall(post_json("/api/campaigns", CAMPAIGN[:40], declared=len(CAMPAIGN)))
        time.sleep(BODY_TIMEOUT / 3)
        conn.sendall(CAMPAIGN[40:])
        created = read_one(conn)
        assert created.status == 201, created.body
        time.sleep(HEADER_TIMEOUT / 2)
        conn.sendall(b"GET /api/campaigns HTTP/1.1\r\nHost: test\r\n\r\n")
        listed = read_one(conn)
        assert listed.status == 200
        assert [c["name"] for c in listed.json()["campaigns"]] == ["timeouts"]


def test_an_event_stream_outlives_the_body_timeout(tmp_path: Path) -> None:
    with live(tmp_path) as server:
        with server.connect() as conn:
            conn.sendall(post_json("/api/campaigns", CAMPAIGN))
            cid = read_one(conn).json()["id"]
        with server.connect() as conn:
            conn.sendall(f"GET /api/campaigns/{cid}/events HTTP/1.1\r\nHost: test\r\n\r\n".encode())
            conn.settimeout(0.5)
            received = b""
            until = time.monotonic() + 3 * BODY_TIMEOUT
            while time.monotonic() < until:
                try:
                    chunk = conn.recv(65536)
                except TimeoutError:
                    continue
                assert chunk, f"the stream was closed: {received!r}"
                received += chunk
            assert received.startswith(b"HTTP/1.1 200")
            assert b"text/event-stream" in received


# -- settings ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("http_header_timeout", 0),
        ("http_header_timeout", "soon"),
        ("http_body_timeout", -1),
        ("http_keep_alive", 0),
        ("http_max_connections", 0),
        ("http_max_header_bytes", 100),
    ],
)
def test_a_bad_limit_is_refused_naming_the_setting(field: str, value: Any) -> None:
    with pytest.raises(ValidationError, match=field):
        Settings(_env_file=None, **{field: value})
