"""The refresh-token grant against a real local token endpoint: the form it posts, what it
reads back, and each failure as an OAuthTokenError of the right kind with no secret in it."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from sendqueue.adapters.oauth import check_token_url, redeem
from sendqueue.domain.errors import InvalidField, OAuthTokenError
from sendqueue.domain.senders import OAuthGrant
from tests.support.oauth import CLIENT_ID, CLIENT_SECRET, TokenEndpoint

WHO = "sender news@example.com: oauth"


def _grant(endpoint: TokenEndpoint, **changes: Any) -> OAuthGrant:
    fields: dict[str, Any] = {
        "token_url": endpoint.url,
        "client_id": CLIENT_ID,
        "refresh_token": "rt-1",
        "client_secret": CLIENT_SECRET,
        "scope": endpoint.scope,
    }
    fields.update(changes)
    return OAuthGrant(**fields)


def test_the_grant_is_posted_as_a_form_and_the_token_read_back(
    token_endpoint: TokenEndpoint,
) -> None:
    token_endpoint.rotate = True

    granted = redeem(_grant(token_endpoint), WHO)

    assert (granted.access_token, granted.expires_in, granted.refresh_token) == (
        "at-1",
        3600.0,
        "rt-2",
    )
    assert token_endpoint.forms == [
        {
            "grant_type": "refresh_token",
            "refresh_token": "rt-1",
            "client_id": CLIENT_ID,
            "client_secret": CLIENT_SECRET,
            "scope": token_endpoint.scope,
        }
    ]
    assert "at-1" not in repr(granted) and "rt-2" not in repr(granted)


def test_a_public_client_posts_no_secret_and_no_scope(token_endpoint: TokenEndpoint) -> None:
    with pytest.raises(OAuthTokenError):  # this endpoint wants them: refused, as 400
        redeem(_grant(token_endpoint, client_secret=None, scope=None), WHO)

    assert set(token_endpoint.forms[0]) == {"grant_type", "refresh_token", "client_id"}


@pytest.mark.parametrize(
    ("status", "error", "permanent", "said"),
    [
        (400, "invalid_grant", True, "HTTP 400: invalid_grant: gone (the refresh token was"),
        (401, "invalid_client", True, "HTTP 401: invalid_client: gone (check oauth's"),
        (400, "invalid_scope", True, "HTTP 400: invalid_scope: gone"),
        (500, "server_error", False, "HTTP 500: server_error: gone (will try again)"),
        (503, None, False, "HTTP 503: no OAuth error given"),
        (429, "slow_down", False, "HTTP 429: slow_down"),
    ],
)
def test_refusals_are_permanent_or_not_and_quote_the_endpoint(
    token_endpoint: TokenEndpoint, status: int, error: str | None, permanent: bool, said: str
) -> None:
    token_endpoint.fail_next(status, error, "gone")

    with pytest.raises(OAuthTokenError) as raised:
        redeem(_grant(token_endpoint), WHO)

    assert raised.value.permanent is permanent
    assert str(raised.value).startswith(f"{WHO}: the token endpoint {token_endpoint.url} ")
    assert said in str(raised.value)


def test_no_secret_of_the_grant_is_quoted_even_when_the_endpoint_echoes_it(
    token_endpoint: TokenEndpoint,
) -> None:
    token_endpoint.fail_next(400, "invalid_grant rt-1", f"bad rt-1 for {CLIENT_SECRET}\r\nX: y")

    with pytest.raises(OAuthTokenError) as raised:
        redeem(_grant(token_endpoint), WHO)

    text = str(raised.value)
    assert "rt-1" not in text and CLIENT_SECRET not in text
    assert "\r" not in text and "\n" not in text
    assert "bad *** for ***" in text


def test_an_answer_that_is_no_token_is_transient(token_endpoint: TokenEndpoint) -> None:
    token_endpoint.fail_next(200, None)  # an HTML page with 200

    with pytest.raises(OAuthTokenError, match="answered 200 without a JSON object") as raised:
        redeem(_grant(token_endpoint), WHO)

    assert raised.value.permanent is False


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """A listening socket that never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(4)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/token"


def test_an_endpoint_that_does_not_answer_times_out_for_now(silent_endpoint: str) -> None:
    grant = OAuthGrant(silent_endpoint, CLIENT_ID, "rt-1")

    with pytest.raises(OAuthTokenError, match=r"did not answer within 0\.3s") as raised:
        redeem(grant, WHO, timeout=0.3)

    assert raised.value.permanent is False


def test_an_endpoint_that_cannot_be_reached_fails_for_now(closed_port: int) -> None:
    grant = OAuthGrant(f"http://127.0.0.1:{closed_port}/token", CLIENT_ID, "rt-1")

    with pytest.raises(OAuthTokenError, match="could not be reached") as raised:
        redeem(grant, WHO)

    assert raised.value.permanent is False


def test_a_redirect_is_not_followed() -> None:
    class Redirect(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.send_response(307)
            self.send_header("Location", "http://127.0.0.1:9/steal")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        grant = OAuthGrant(f"http://127.0.0.1:{server.server_address[1]}/t", CLIENT_ID, "rt-1")
        with pytest.raises(OAuthTokenError, match="HTTP 307") as raised:
            redeem(grant, WHO)
    finally:
        server.shutdown()
        server.server_close()
    assert raised.value.permanent is True  # the token_url needs fixing


@pytest.mark.parametrize(
    "url",
    ["http://login.example.com/token", "http://10.0.0.1/token", "ftp://localhost/token"],
)
def test_only_https_token_urls_except_on_loopback(url: str) -> None:
    with pytest.raises(InvalidField, match="https://") as raised:
        check_token_url(url)
    assert raised.value.field == "oauth.token_url"


def test_a_refresh_token_is_never_posted_in_clear_text_off_loopback() -> None:
    grant = OAuthGrant("http://login.example.com/token", CLIENT_ID, "rt-1")

    with pytest.raises(OAuthTokenError, match=r"oauth\.token_url") as refused:
        redeem(grant, WHO)

    assert refused.value.permanent is True


@pytest.mark.parametrize(
    "url",
    [
        "https://login.microsoftonline.com/common/oauth2/v2.0/token",
        "http://127.0.0.1:8080/token",
        "http://localhost/token",
        "http://[::1]/token",
    ],
)
def test_https_and_loopback_token_urls_are_taken(url: str) -> None:
    check_token_url(url)


@pytest.fixture
def dripping_endpoint() -> Iterator[str]:
    """An endpoint that answers one byte of its headers every 0.1 s, for ever: no read ever
    waits long enough for the per-read timeout."""
    stop = threading.Event()
    server = socket.create_server(("127.0.0.1", 0))

    def drip() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"a" * 100_000:
                if stop.wait(0.1):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return

    thread = threading.Thread(target=drip, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}/token"
    stop.set()
    thread.join()
    server.close()


def test_an_endpoint_dripping_its_answer_is_cut_off_at_the_deadline(dripping_endpoint: str) -> None:
    grant = OAuthGrant(dripping_endpoint, CLIENT_ID, "rt-1")
    result: list[BaseException] = []

    def ask() -> None:
        try:
            redeem(grant, WHO, timeout=0.5, deadline=1.0)
        except BaseException as exc:  # handed to the test's thread
            result.append(exc)

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    thread.join(5.0)

    assert not thread.is_alive(), "redeem still reading after 5 s"
    assert isinstance(result[0], OAuthTokenError), result
    assert "did not answer within 1s" in str(result[0]) and result[0].permanent is False
