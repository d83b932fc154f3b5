"""The webhook transport's HTTP/1.1 exchange (``adapters/webhooks/wire.py``) against scripted
answers on a socket pair: one write per request, every framing of an answer's body, interim
answers, the limits, and when a connection may carry the next delivery."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from sendqueue.adapters.webhooks.wire import (
    MAX_BODY,
    MAX_HEADERS,
    Answer,
    Disconnected,
    ProtocolError,
    Wire,
    request_head,
    request_line,
)

_LINE = request_line("/hook?x=1", "receiver.example:8080")


class _Peer:
    """The server's end: reads one request (head and content-length body), then writes the
    scripted answer and, if told, closes."""

    def __init__(self, sock: socket.socket, answer: bytes, close: bool) -> None:
        self.sock, self.answer, self.close = sock, answer, close
        self.reads: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.sock.recv(65536)
            self.reads.append(chunk)
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        fields = dict(line.lower().split(b": ", 1) for line in head.split(b"\r\n")[1:])
        length = int(fields[b"content-length"])
        while len(body) < length:
            chunk = self.sock.recv(65536)
            self.reads.append(chunk)
            body += chunk
        self.sock.sendall(self.answer)
        if self.close:
            self.sock.close()


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def _exchange(
    pair: tuple[socket.socket, socket.socket], answer: bytes, *, close: bool = False
) -> tuple[Answer, _Peer]:
    ours, theirs = pair
    peer = _Peer(theirs, answer, close)
    body = b'{"id":"evt_1"}'
    request = request_head(_LINE, {"webhook-id": "evt_1"}, len(body)) + body
    got = Wire(ours).exchange(request, time.monotonic() + 5)
    peer.thread.join(5)
    return got, peer


def test_the_request_goes_out_in_one_write_with_its_headers(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    answer, peer = _exchange(pair, b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
    assert answer.status == 204 and answer.reusable
    assert len(peer.reads) == 1
    head = peer.reads[0].split(b"\r\n\r\n")[0].decode().split("\r\n")
    assert head[0] == "POST /hook?x=1 HTTP/1.1"
    assert "Host: receiver.example:8080" in head and "Content-Length: 14" in head
    assert "webhook-id: evt_1" in head


@pytest.mark.parametrize(
    ("answer", "reusable"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", True),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n0\r\n"
            b"trailer: t\r\n\r\n",
            True,
        ),
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", False),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", False),
        (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok", True),
        (
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n",
            True,
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\nHTTP/1.1 200 OK", False),  # bytes after it
        (b"HTTP/1.1 200 OK\nContent-Length: 0\n\n", True),  # bare line feeds
    ],
)
def test_answers_are_read_to_their_end_and_the_connection_kept_only_when_clean(
    pair: tuple[socket.socket, socket.socket], answer: bytes, reusable: bool
) -> None:
    got, _ = _exchange(pair, answer)
    assert got.status in (200, 202)
    assert got.reusable is reusable


def test_a_body_without_length_lasts_until_the_connection_ends(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    got, _ = _exchange(pair, b"HTTP/1.1 500 Oops\r\n\r\n" + b"x" * 1000, close=True)
    assert got.status == 500 and not got.reusable


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY + 1) + b"x" * (MAX_BODY + 1),
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n" % (MAX_BODY + 1)
        + b"x" * (MAX_BODY + 1)
        + b"\r\n0\r\n\r\n",
    ],
)
def test_a_body_past_the_limit_is_left_unread_and_the_connection_dropped(
    pair: tuple[socket.socket, socket.socket], answer: bytes
) -> None:
    got, _ = _exchange(pair, answer)
    assert got.status == 200 and not got.reusable


@pytest.mark.parametrize(
    ("answer", "match"),
    [
        (b"SMTP 220 hello\r\n\r\n", "status line"),
        (b"HTTP/1.1 2000 OK\r\n\r\n", "status code"),
        (b"HTTP/1.1 200 OK\r\n" + b"x-a: b\r\n" * (MAX_HEADERS + 1) + b"\r\n", "header lines"),
        (b"HTTP/1.1 200 OK\r\nx-long: " + b"a" * 70_000 + b"\r\n\r\n", "too long"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "chunk size"),
    ],
)
def test_answers_that_are_not_http_are_protocol_errors(
    pair: tuple[socket.socket, socket.socket], answer: bytes, match: str
) -> None:
    with pytest.raises(ProtocolError, match=match):
        _exchange(pair, answer, close=True)


def test_a_connection_closed_before_any_answer_is_disconnected(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    with pytest.raises(Disconnected):
        _exchange(pair, b"", close=True)


def test_a_silent_server_times_out_at_the_deadline(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, _theirs = pair
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        Wire(ours).exchange(request_head(_LINE, {}, 0), time.monotonic() + 0.3)
    assert time.monotonic() - started < 2


@pytest.mark.parametrize(
    "headers",
    [
        {"webhook-id": "evt_1\r\nx-injected: 1"},
        {"bad name": "v"},
        {"x-nul": "a\x00b"},
        {"x-euro": "\u20ac"},
    ],
)
def test_headers_that_would_change_the_request_are_refused(headers: dict[str, str]) -> None:
    with pytest.raises(ProtocolError):
        request_head(_LINE, headers, 0)


def test_the_transport_owns_host_and_framing_headers() -> None:
    head = request_head(_LINE, {"Host": "evil", "content-length": "99", "x-a": "b"}, 3)
    text = head.decode()
    assert "evil" not in text and "99" not in text
    assert text.endswith("x-a: b\r\n\r\n") and "Content-Length: 3\r\n" in text
