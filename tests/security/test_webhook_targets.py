"""Where a webhook may connect: private, loopback, link-local and reserved addresses are
refused, as literal IPs and as DNS answers (an injected resolver: no traffic leaves the
machine), unless SENDQUEUE_WEBHOOK_ALLOW_HOSTS names them; the connection goes to the address
that was checked (a second DNS answer is never asked for)."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator

import pytest

from sendqueue.adapters.webhooks import HttpWebhookTransport
from sendqueue.adapters.webhooks import http as webhook_http
from sendqueue.domain.errors import InvalidField, WebhookDeliveryFailed
from sendqueue.domain.webhook_safety import AllowList, refusal


class _resolver:
    """A resolver with fixed answers that records the names asked for."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append(host)
        return self.answers[host]


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1/hook",
        "http://169.254.169.254/latest/meta-data/",
        "http://127.0.0.1:8080/",
        "http://[::1]/",
        "http://0.0.0.0/",
        "http://224.0.0.1/",
        "http://[::ffff:10.0.0.1]/",
        "http://100.64.0.1/",
        "http://240.0.0.1/",
    ],
)
def test_literal_private_addresses_are_refused(url: str) -> None:
    transport = HttpWebhookTransport(resolve=_resolver({}))
    with pytest.raises(WebhookDeliveryFailed, match="refused"):
        transport.post(url, b"{}", {})


def test_a_name_resolving_to_a_private_address_is_refused() -> None:
    resolve = _resolver({"hooks.example.com": ["93.184.216.34", "10.1.2.3"]})
    transport = HttpWebhookTransport(resolve=resolve)
    with pytest.raises(WebhookDeliveryFailed, match=r"hooks\.example\.com resolves to a private"):
        transport.post("https://hooks.example.com/in", b"{}", {})
    assert resolve.asked == ["hooks.example.com"]


def test_in_production_an_http_url_stored_before_is_refused_unresolved() -> None:
    resolve = _resolver({})
    transport = HttpWebhookTransport(AllowList.parse("127.0.0.1"), resolve=resolve, https_only=True)
    for url in ("http://hooks.example.com/in", "http://127.0.0.1:9/in"):
        with pytest.raises(WebhookDeliveryFailed, match="only https in production"):
            transport.post(url, b"{}", {})
    assert resolve.asked == []  # refused before any lookup or connection


def test_the_allow_list_admits_hosts_ips_and_networks() -> None:
    allow = AllowList.parse("receiver.internal, 127.0.0.1, 10.0.0.0/8")
    assert refusal("127.0.0.1", "127.0.0.1", allow) is None
    assert refusal("x", "10.9.9.9", allow) is None
    assert refusal("receiver.internal", "192.168.1.1", allow) is None
    assert refusal("other.internal", "192.168.1.1", allow) is not None
    assert refusal("127.0.0.2", "127.0.0.2", allow) is not None
    assert refusal("x", "169.254.169.254", allow) is not None
    assert refusal("example.com", "93.184.216.34", AllowList()) is None
    with pytest.raises(InvalidField):
        AllowList.parse("bad host/name")


@pytest.fixture
def server() -> Iterator[tuple[int, list[str]]]:
    """A loopback HTTP server that answers 204 and records the Host headers."""
    hosts: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            hosts.append(self.headers["host"])
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1], hosts
    httpd.shutdown()
    httpd.server_close()


def test_the_connection_goes_to_the_checked_address_with_the_name_as_host(
    server: tuple[int, list[str]],
) -> None:
    port, hosts = server
    resolve = _resolver({"receiver.internal": ["127.0.0.1"]})
    transport = HttpWebhookTransport(AllowList.parse("receiver.internal"), resolve=resolve)
    answer = transport.post(f"http://receiver.internal:{port}/in", b"{}", {})
    assert answer.status == 204
    assert hosts == [f"receiver.internal:{port}"]
    assert resolve.asked == ["receiver.internal"]


def test_an_address_that_refuses_is_followed_by_the_next_checked_one(
    server: tuple[int, list[str]],
) -> None:
    """A name with several addresses (round-robin DNS, IPv6 and IPv4) is reached on the first
    that accepts the connection, each of them checked; one dead server fails nothing."""
    port, hosts = server
    resolve = _resolver({"receiver.internal": ["127.0.0.2", "127.0.0.1"]})
    transport = HttpWebhookTransport(AllowList.parse("receiver.internal"), resolve=resolve)
    assert transport.post(f"http://receiver.internal:{port}/in", b"{}", {}).status == 204
    assert hosts == [f"receiver.internal:{port}"]
    refused = _resolver({"mixed.example": ["127.0.0.2", "10.0.0.1"]})
    with pytest.raises(WebhookDeliveryFailed, match="private"):
        HttpWebhookTransport(AllowList.parse("127.0.0.0/8"), resolve=refused).post(
            f"http://mixed.example:{port}/in", b"{}", {}
        )


def test_a_non_ascii_host_is_looked_up_and_named_in_its_idna_2008_form(
    server: tuple[int, list[str]],
) -> None:
    """A URL stored with a U-label host goes to that domain's IDNA 2008 name, never to the one
    Python's IDNA 2003 codec makes of it (faß.example -> fass.example, another domain)."""
    port, hosts = server
    resolve = _resolver({"xn--fa-hia.example": ["127.0.0.1"], "fass.example": ["127.0.0.1"]})
    transport = HttpWebhookTransport(AllowList.parse("127.0.0.1"), resolve=resolve)
    assert transport.post(f"http://faß.example:{port}/in", b"{}", {}).status == 204
    assert resolve.asked == ["xn--fa-hia.example"]
    assert hosts == [f"xn--fa-hia.example:{port}"]


def test_loopback_is_refused_unless_allowed(server: tuple[int, list[str]]) -> None:
    port, hosts = server
    with pytest.raises(WebhookDeliveryFailed, match="loopback"):
        HttpWebhookTransport().post(f"http://127.0.0.1:{port}/in", b"{}", {})
    assert hosts == []


def test_a_redirect_is_a_failure_and_bodies_are_never_quoted() -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            self.send_response(302)
            self.send_header("location", "http://10.0.0.1/")
            self.end_headers()
            self.wfile.write(b"secret-body " * 10000)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        transport = HttpWebhookTransport(AllowList.parse("127.0.0.1"))
        with pytest.raises(WebhookDeliveryFailed) as caught:
            transport.post(f"http://127.0.0.1:{httpd.server_address[1]}/", b"{}", {})
        assert caught.value.status == 302
        assert "redirect" in str(caught.value) and "secret-body" not in str(caught.value)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_kept_alive_connection_carries_the_next_delivery_and_a_closed_one_is_replaced() -> None:
    peers: list[int] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            peers.append(self.client_address[1])
            self.send_response(204)
            self.send_header("content-length", "0")
            if self.headers.get("x-close"):
                self.send_header("connection", "close")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    transport = HttpWebhookTransport(AllowList.parse("127.0.0.1"))
    url = f"http://127.0.0.1:{httpd.server_address[1]}/"
    try:
        for headers in ({}, {"x-close": "1"}, {}, {}):
            assert transport.post(url, b"{}", headers).status == 204
        assert peers[0] == peers[1] != peers[2] == peers[3]
    finally:
        transport.close()
        httpd.shutdown()
        httpd.server_close()


def test_a_kept_alive_connection_is_pinned_until_it_expires_then_the_name_is_checked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """DNS rebinding through keep-alive: while the connection lives, the name's new answer is
    not asked for (the bytes go to the address checked); once the connection has expired, the
    name is resolved and checked again, and a private answer is refused."""
    peers: list[int] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            peers.append(self.client_address[1])
            self.send_response(204)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = httpd.server_address[1]
    resolve = _resolver({"receiver.internal": ["127.0.0.1"]})
    transport = HttpWebhookTransport(AllowList.parse("127.0.0.0/8"), resolve=resolve)
    url = f"http://receiver.internal:{port}/in"
    try:
        assert transport.post(url, b"{}", {}).status == 204
        resolve.answers["receiver.internal"] = ["10.0.0.1"]  # rebound to a private address
        assert transport.post(url, b"{}", {}).status == 204  # the same connection, pinned
        assert resolve.asked == ["receiver.internal"]
        monkeypatch.setattr(webhook_http, "KEEP_ALIVE_SECONDS", 0.0)
        time.sleep(0.01)
        with pytest.raises(WebhookDeliveryFailed, match="private"):
            transport.post(url, b"{}", {})
        assert resolve.asked == ["receiver.internal"] * 2
        assert len(peers) == 2 and peers[0] == peers[1]
    finally:
        transport.close()
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize(
    ("certified", "delivered"), [("receiver.internal", True), ("other", False)]
)
def test_https_goes_to_the_checked_address_and_verifies_the_certificate_for_the_name(
    certified: str, delivered: bool
) -> None:
    import ssl

    import trustme

    ca = trustme.CA()
    hosts: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            hosts.append(self.headers["host"])
            self.send_response(204)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(certified).configure_cert(server_tls)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.socket = server_tls.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    client_tls = ssl.create_default_context()
    ca.configure_trust(client_tls)
    resolve = _resolver({"receiver.internal": ["127.0.0.1"]})
    transport = HttpWebhookTransport(
        AllowList.parse("receiver.internal"), resolve=resolve, tls=client_tls
    )
    url = f"https://receiver.internal:{httpd.server_address[1]}/in"
    try:
        if delivered:
            for _ in range(2):  # the second on the kept-alive connection
                assert transport.post(url, b"{}", {}).status == 204
            assert hosts == [f"receiver.internal:{httpd.server_address[1]}"] * 2
            assert resolve.asked == ["receiver.internal"]
        else:
            with pytest.raises(WebhookDeliveryFailed, match="CERTIFICATE_VERIFY_FAILED"):
                transport.post(url, b"{}", {})
            assert hosts == []
    finally:
        transport.close()
        httpd.shutdown()
        httpd.server_close()
