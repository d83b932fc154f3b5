"""Hostile receivers against the webhooks' HTTP transport, as raw socket servers on 127.0.0.1:
one that drips its status line, headers or body a byte at a time, one that answers
``100 Continue`` without end, one that is not HTTP at all. A delivery takes at most its
timeout in all (not per read), and a failure's reason never quotes what the receiver sent."""

from __future__ import annotations

import contextlib
import http.server
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import trustme

from sendqueue.adapters.webhooks import HttpWebhookTransport
from sendqueue.domain.errors import WebhookDeliveryFailed
from sendqueue.domain.lifecycle import CampaignState
from sendqueue.domain.models import Campaign
from sendqueue.domain.webhook_safety import AllowList
from sendqueue.domain.webhooks import WebhookEndpoint, new_secret
from sendqueue.services.webhooks import WebhookDelivery
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.store import InMemoryTaskStore
from tests.support.app import T0, open_policy

Behaviour = Callable[[socket.socket], None]
TIMEOUT = 1.0


@pytest.fixture
def receiver() -> Iterator[Callable[[Behaviour], str]]:
    """``start(behaviour)``: a one-connection server that reads the request and then does
    ``behaviour`` with the connection; the URL to post to."""
    servers: list[socket.socket] = []
    stop = threading.Event()

    def start(behaviour: Behaviour) -> str:
        server = socket.create_server(("127.0.0.1", 0))
        servers.append(server)

        def run() -> None:
            conn, _ = server.accept()
            with conn:
                conn.recv(65536)
                with contextlib.suppress(OSError):  # the client hung up on it
                    behaviour(conn)
                stop.wait(5)

        threading.Thread(target=run, daemon=True).start()
        return f"http://127.0.0.1:{server.getsockname()[1]}/in"

    yield start
    stop.set()
    for server in servers:
        server.close()


def _drip(data: bytes, every: float = 0.2) -> Behaviour:
    def behaviour(conn: socket.socket) -> None:
        for byte in data:
            conn.sendall(bytes([byte]))
            time.sleep(every)

    return behaviour


def _post(url: str) -> tuple[WebhookDeliveryFailed | None, float]:
    transport = HttpWebhookTransport(AllowList.parse("127.0.0.1"), timeout=TIMEOUT)
    started = time.monotonic()
    try:
        transport.post(url, b"{}", {"content-type": "application/json"})
    except WebhookDeliveryFailed as exc:
        return exc, time.monotonic() - started
    finally:
        transport.close()
    return None, time.monotonic() - started


@pytest.mark.parametrize(
    "behaviour",
    [
        pytest.param(_drip(b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 60), id="status-and-headers"),
        pytest.param(_drip(b"HTTP/1.1 100 Continue\r\n\r\n" * 10, every=0.01), id="100-continue"),
    ],
)
def test_a_dripping_receiver_fails_within_the_timeout(
    receiver: Callable[[Behaviour], str], behaviour: Behaviour
) -> None:
    failed, took = _post(receiver(behaviour))
    assert failed is not None and failed.reason == "timed out"
    assert took < TIMEOUT + 0.5


@pytest.mark.parametrize(
    ("head", "body"),
    [
        pytest.param(b"Content-Length: 100000\r\n", b"x" * 100, id="content-length"),
        pytest.param(b"Transfer-Encoding: chunked\r\n", b"1\r\nx\r\n" * 100, id="chunked"),
    ],
)
def test_a_2xx_whose_body_drips_is_delivered_within_the_timeout(
    receiver: Callable[[Behaviour], str], head: bytes, body: bytes
) -> None:
    def behaviour(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\n" + head + b"\r\n")
        _drip(body)(conn)

    failed, took = _post(receiver(behaviour))
    assert failed is None  # the 200 came; the rest of its body is not waited for
    assert took < TIMEOUT + 0.5


def test_https_answers_are_read_the_same_way_and_the_name_is_verified() -> None:
    ca = trustme.CA()
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("hooks.test").configure_cert(served)
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            self.send_response(200)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.socket = served.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = httpd.server_address[1]
    names = {"hooks.test": ["127.0.0.1"], "other.test": ["127.0.0.1"]}
    transport = HttpWebhookTransport(
        AllowList.parse("127.0.0.1"),
        timeout=TIMEOUT,
        resolve=lambda host, _: names[host],
        tls=trusting,
    )
    try:
        for _ in range(2):  # the second one on the kept-alive connection
            assert transport.post(f"https://hooks.test:{port}/in", b"{}", {}).status == 200
        with pytest.raises(WebhookDeliveryFailed, match="certificate"):
            transport.post(f"https://other.test:{port}/in", b"{}", {})
    finally:
        transport.close()
        httpd.shutdown()
        httpd.server_close()


def test_an_https_receiver_that_drips_its_answer_fails_within_the_timeout() -> None:
    """The deadline holds over TLS too: the handshake done, every read of the answer gets
    only the time left."""
    ca = trustme.CA()
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("hooks.test").configure_cert(served)
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def run() -> None:
        raw, _ = server.accept()
        with served.wrap_socket(raw, server_side=True) as conn:
            conn.recv(65536)
            with contextlib.suppress(OSError):
                _drip(b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 60)(conn)
            stop.wait(5)

    threading.Thread(target=run, daemon=True).start()
    transport = HttpWebhookTransport(
        AllowList.parse("127.0.0.1"),
        timeout=TIMEOUT,
        resolve=lambda host, _: ["127.0.0.1"],
        tls=trusting,
    )
    started = time.monotonic()
    try:
        with pytest.raises(WebhookDeliveryFailed, match="timed out"):
            transport.post(f"https://hooks.test:{server.getsockname()[1]}/in", b"{}", {})
        assert time.monotonic() - started < TIMEOUT + 0.5
    finally:
        stop.set()
        transport.close()
        server.close()


def test_a_receiver_that_is_not_http_is_not_quoted(receiver: Callable[[Behaviour], str]) -> None:
    def behaviour(conn: socket.socket) -> None:
        conn.sendall(b"220 internal.example ESMTP token=s3cr3t-banner\r\n")

    failed, _ = _post(receiver(behaviour))
    assert failed is not None
    assert "s3cr3t" not in failed.reason and "internal.example" not in failed.reason
    assert failed.reason.startswith("BadStatusLine")


def test_a_stored_url_that_cannot_be_sent_fails_its_endpoint_alone() -> None:
    """An endpoint stored with a URL no request line can carry (a non-ASCII path, before such
    URLs were refused) fails its own attempts; the other endpoints still get theirs."""
    got: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            got.append(self.path)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    store = InMemoryTaskStore()
    transport = HttpWebhookTransport(AllowList.parse("127.0.0.1"), timeout=TIMEOUT)
    delivery = WebhookDelivery(store, store, transport, FakeClock(T0))
    try:
        for n, path in enumerate(("/caf\u00e9", "/a\x7fb", "/in")):
            store.add_endpoint(WebhookEndpoint(f"wh_{n}", base + path, T0, new_secret()))
        store.create_campaign(
            Campaign(
                id="c1",
                name="c",
                policy=open_policy(),
                from_addr="a@example.com",
                state=CampaignState.ACTIVE,
            ),
            [],
        )
        store.set_campaign_state("c1", [CampaignState.ACTIVE], CampaignState.PAUSED, at=T0)
        report = delivery.run_pass()
    finally:
        transport.close()
        httpd.shutdown()
        httpd.server_close()
    assert got == ["/in"]
    assert (report.delivered, report.failed) == (1, 2)
    for bad in ("wh_0", "wh_1"):
        (attempt,) = store.deliveries(bad)
        assert attempt.error is not None and "URL" in attempt.error
        assert "caf" not in attempt.error and "a\x7fb" not in attempt.error  # no path quoted


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 1\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999999\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0_0\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: ¹²³\r\n\r\n".encode("latin-1"),
        "HTTP/1.1 2²³ OK\r\nContent-Length: 0\r\n\r\n".encode("latin-1"),
    ],
    ids=[
        "te-and-cl",
        "two-lengths",
        "negative",
        "huge",
        "0x-chunk",
        "underscore-chunk",
        "superscript-length",
        "superscript-status",
    ],
)
def test_an_answer_of_unknown_framing_is_a_failed_attempt_that_quotes_nothing(
    receiver: Callable[[Behaviour], str], answer: bytes
) -> None:
    failed, _ = _post(receiver(lambda conn: conn.sendall(answer)))
    assert failed is not None, answer
    assert "¹" not in failed.reason and "²" not in failed.reason and "99999" not in failed.reason


class _KeptAlive:
    """A server keeping connections alive that answers the n-th request (from 1, over all its
    connections) with ``answers(n, conn)``; counts the requests it read."""

    def __init__(self, answers: Callable[[int, socket.socket], None]) -> None:
        self.answers = answers
        self.requests = 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}/in"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.server.accept()
                threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while conn.recv(65536):  # one request per read: each is small
                self.requests += 1
                self.answers(self.requests, conn)


def test_bytes_after_an_answer_never_answer_the_next_request() -> None:
    def answers(n: int, conn: socket.socket) -> None:
        if n == 1:  # answered twice, the second a moment later
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            time.sleep(0.05)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        else:
            conn.sendall(b"HTTP/1.1 500 Nope\r\nContent-Length: 0\r\n\r\n")

    server = _KeptAlive(answers)
    transport = HttpWebhookTransport(AllowList.parse("127.0.0.1"), timeout=TIMEOUT)
    try:
        transport.post(server.url, b"{}", {})
        time.sleep(0.3)
        with pytest.raises(WebhookDeliveryFailed, match="HTTP 500"):
            transport.post(server.url, b"{}", {})  # its own answer, on a fresh connection
    finally:
        transport.close()
        server.server.close()


def test_a_reset_within_an_answer_is_a_failure_not_a_second_send() -> None:
    def answers(n: int, conn: socket.socket) -> None:
        if n == 1:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        else:  # part of an answer, then a reset
            conn.sendall(b"HTTP/1.1 200 O")
            time.sleep(0.05)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

    server = _KeptAlive(answers)
    transport = HttpWebhookTransport(AllowList.parse("127.0.0.1"), timeout=TIMEOUT)
    try:
        transport.post(server.url, b"{}", {})
        with pytest.raises(WebhookDeliveryFailed):
            transport.post(server.url, b"{}", {})
        time.sleep(0.2)
        assert server.requests == 2  # the request the reset interrupted was not sent again
    finally:
        transport.close()
        server.server.close()
