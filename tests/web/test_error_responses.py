"""Client input that used to answer 500, and what every error response carries.

- ``Last-Event-ID: ²`` (``str.isdigit`` is true, ``int`` fails), a non-ASCII session cookie,
  CSRF cookie or CSRF header: a 4xx (or ignored), never a 500;
- a real 500 (a route that raises) carries the security headers and logs one line per
  request, the traceback only once.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable

import httpx
import pytest

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*install `httpx2`")
    from fastapi.testclient import TestClient

from sendqueue.web.middleware.headers import CSP
from sendqueue.web.session import SessionSigner
from tests.web.conftest import TOKEN, Web, live_server

SECURITY_HEADERS = {
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "x-frame-options": "DENY",
    "content-security-policy": CSP,
}


def _raw_client(web: Web) -> TestClient:
    """A client that returns a 500 instead of raising, as a browser would see it."""
    client = TestClient(
        web.app, base_url="http://testserver", raise_server_exceptions=False,
        follow_redirects=False,
    )  # fmt: skip
    return client


def _assert_security_headers(response: httpx.Response) -> None:
    for name, value in SECURITY_HEADERS.items():
        assert response.headers.get(name) == value, (name, dict(response.headers))


# Header bytes are read as Latin-1, where \xb2, \xb3 and \xb9 are "²", "³" and "¹": digits to
# str.isdigit(), not to int(). (UTF-8 "١٢" arrives as non-digits.)
@pytest.mark.parametrize("value", [b"\xb2", b"5\xb9", b"\xb3\xb3", "١٢".encode()])
def test_a_non_ascii_last_event_id_is_a_4xx_naming_the_header(web: Web, value: bytes) -> None:
    cid = web.create(1)["id"]
    # a real server: the test client re-encodes header bytes as UTF-8 on the way in
    with live_server(web.container) as (url, _), httpx.Client(timeout=10) as client:
        response = client.get(
            f"{url}/api/campaigns/{cid}/events", headers={b"Last-Event-ID": value}
        )
    assert 400 <= response.status_code < 500, response.text
    assert response.json()["error"]["field"] == "Last-Event-ID"
    _assert_security_headers(response)


@pytest.mark.parametrize(
    "cookie",
    [
        "v1.².nonce.sig",
        "v1.9999999999.nonc\u00e9.sig",
        "v1.9999999999.nonce.sig\u00e9",
        "\u00e9\u00e9\u00e9",
    ],
)
def test_a_non_ascii_session_cookie_is_refused_not_a_500(
    make_web: Callable[..., Web], cookie: str
) -> None:
    locked = make_web(api_token=TOKEN)
    sent = {"Cookie": f"sq_session={cookie}".encode()}  # as raw bytes: UTF-8 on the wire
    with _raw_client(locked) as client:
        response = client.get("/api/campaigns", headers=sent)
        page = client.get("/", headers={**sent, "Accept": "text/html"})
    assert response.status_code == 401, response.text
    assert page.status_code == 303
    _assert_security_headers(response)
    assert not SessionSigner(TOKEN).verify(cookie)


def test_a_non_ascii_csrf_cookie_or_header_is_a_403_not_a_500(web: Web) -> None:
    body = {"name": "c", "recipients": [{"email": "a@example.com"}],
            "templates": {"subject": "s", "body": "b"}}  # fmt: skip
    origin = {"Origin": "http://testserver"}
    wrong = ("\u00e9" * 43).encode()
    with _raw_client(web) as client:
        bad_cookie = client.post(
            "/api/campaigns", json=body,
            headers={**origin, "Cookie": b"sq_csrf=" + wrong, "X-CSRF-Token": wrong},
        )  # fmt: skip
        client.get("/healthz")
        bad_header = client.post(
            "/api/campaigns", json=body,
            headers={**origin, "X-CSRF-Token": wrong},
        )  # fmt: skip
    for response in (bad_cookie, bad_header):
        assert response.status_code == 403, response.text
        _assert_security_headers(response)
    assert web.container.store.list_campaigns() == []


def test_a_real_500_carries_the_security_headers_and_logs_one_line_per_request(
    web: Web, caplog: pytest.LogCaptureFixture
) -> None:
    async def boom() -> None:
        raise RuntimeError("a bug\nwith a second line")

    web.app.router.add_api_route("/api/boom", boom)
    caplog.set_level(logging.ERROR)
    with _raw_client(web) as client:
        responses = [client.get("/api/boom") for _ in range(3)]
    for response in responses:
        assert response.status_code == 500
        assert response.json()["error"]["status"] == 500
        assert "a bug" not in response.text  # the details are for the log, not the client
        _assert_security_headers(response)
    records = [r for r in caplog.records if "/api/boom" in r.getMessage()]
    assert len(records) == 3
    assert all("\n" not in r.getMessage() for r in records)
    assert [r.exc_info is not None for r in records] == [True, False, False]
