"""Issue #17, low 3: token guessing is throttled per client with an exponential back-off and
logged without the token; guessable tokens are refused at startup. Low 4:
``SENDQUEUE_FORWARDED_ALLOW_IPS`` makes the session cookie Secure behind a TLS proxy on another
host, against a real server.
"""

from __future__ import annotations

import logging
import secrets
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from sendqueue.bootstrap import bootstrap
from sendqueue.settings import Settings
from sendqueue.web.app import create_app
from tests.security.test_request_timeouts import live

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*install `httpx2`")
    from fastapi.testclient import TestClient

TOKEN = secrets.token_urlsafe(32)
WRONG = "wrong-" + secrets.token_urlsafe(16)


def _settings(home: Path, **overrides: Any) -> Settings:
    return Settings(
        _env_file=None,
        database_url=f"sqlite:///{home / 'store.db'}",
        scheduler_url=f"sqlite:///{home / 'scheduler.db'}",
        mailer=f"maildir:{home / 'outbox'}",
        api_token=TOKEN,
        **overrides,
    )


@pytest.fixture
def app_client(tmp_path: Path) -> Iterator[TestClient]:
    container = bootstrap(_settings(tmp_path, auth_max_failures=3))
    try:
        with TestClient(create_app(container), follow_redirects=False) as client:
            yield client
    finally:
        container.close()


def _login(client: TestClient, token: str) -> httpx.Response:
    if "sq_csrf" not in client.cookies:
        client.get("/login")
    csrf = client.cookies["sq_csrf"]
    response: httpx.Response = client.post("/login", data={"token": token, "csrf_token": csrf})
    return response


# -- the back-off, over time ---------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_lockout_starts_after_n_failures_and_doubles() -> None:
    from sendqueue.web.middleware.throttle import AuthThrottle  # here: new in issue #17

    clock = Clock()
    throttle = AuthThrottle(max_failures=3, window=600, max_lockout=30, clock=clock)
    for _ in range(2):
        throttle.failed("10.0.0.1", "GET /api/campaigns")
        assert throttle.retry_after("10.0.0.1") == 0
    lockouts = []
    for _ in range(7):
        throttle.failed("10.0.0.1", "GET /api/campaigns")
        lockouts.append(throttle.retry_after("10.0.0.1"))
        clock.now += lockouts[-1]  # wait it out, then guess again
    assert lockouts == [1, 2, 4, 8, 16, 30, 30]  # doubling, up to the cap
    assert throttle.retry_after("10.0.0.2") == 0  # per client


def test_failures_are_forgotten_after_the_window_or_a_success() -> None:
    from sendqueue.web.middleware.throttle import AuthThrottle

    clock = Clock()
    throttle = AuthThrottle(max_failures=2, window=60, max_lockout=3600, clock=clock)
    throttle.failed("a", "POST /login")
    clock.now += 61
    throttle.failed("a", "POST /login")
    assert throttle.retry_after("a") == 0  # the first one was forgotten
    throttle.failed("a", "POST /login")
    assert throttle.retry_after("a") == 1
    throttle.succeeded("a")
    assert throttle.retry_after("a") == 0


# -- through the app -----------------------------------------------------------------------------


def test_wrong_bearer_tokens_earn_a_429_with_retry_after(
    app_client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sendqueue.web.middleware.throttle")
    wrong = {"Authorization": f"Bearer {WRONG}"}
    assert [app_client.get("/api/campaigns", headers=wrong).status_code for _ in range(3)] == [
        401
    ] * 3
    refused = app_client.get("/api/campaigns", headers={"Authorization": f"Bearer {TOKEN}"})
    # locked out: even the right token is not compared, so a guess in the lockout learns nothing
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["status"] == 429
    # a session needs no token to be compared, and /healthz none at all
    assert app_client.get("/healthz").status_code == 200

    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 3
    assert "testclient" in lines[0] and "GET /api/campaigns" in lines[0]
    assert "(1 in a row)" in lines[0] and "(3 in a row; locked out for 1 s)" in lines[2]
    assert not any(WRONG in line or TOKEN in line for line in lines)


def test_wrong_login_forms_earn_a_429_before_the_body_is_read(
    app_client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sendqueue.web.middleware.throttle")
    assert [_login(app_client, WRONG).status_code for _ in range(3)] == [401] * 3
    refused = _login(app_client, TOKEN)
    assert refused.status_code == 429
    assert int(refused.headers["retry-after"]) >= 1
    assert "sq_session" not in refused.headers.get("set-cookie", "")
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 3 and all("POST /login" in line for line in lines)
    assert not any(WRONG in line or TOKEN in line for line in lines)


def test_another_client_is_not_locked_out(app_client: TestClient) -> None:
    for _ in range(3):
        app_client.get("/api/campaigns", headers={"Authorization": f"Bearer {WRONG}"})
    other = TestClient(app_client.app, client=("192.0.2.7", 4000))
    ok = other.get("/api/campaigns", headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200


# -- guessable tokens ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "token",
    ["a" * 40, "ab" * 20, "1234567890123456", "password12345678", "0000000011111111"],
)
def test_a_guessable_token_is_refused_naming_the_variable(token: str) -> None:
    with pytest.raises(ValidationError, match="SENDQUEUE_API_TOKEN: too easy to guess"):
        Settings(_env_file=None, api_token=token)


@pytest.mark.parametrize(
    "token",
    [
        # fixed draws of secrets.token_urlsafe(32) and token_hex(16) (about 14 distinct
        # characters), so every xdist worker collects the same ids
        "d_LSgbAbEg1p_x6mMcIV1CH9qc-O913dCVkrzB9wqCk",
        "0fe4f8a38c76a25355cce657488c9243",
        "a-token-of-twenty-chars",
        "the-real-token-0123456789",
    ],
)
def test_a_random_token_is_accepted(token: str) -> None:
    assert Settings(_env_file=None, api_token=token).api_token is not None


# -- SENDQUEUE_FORWARDED_ALLOW_IPS ---------------------------------------------------------------


def _login_over_the_proxy(port: int) -> str:
    """The session cookie a login gets through a proxy that terminated TLS."""
    base = f"http://127.0.0.1:{port}"
    forwarded = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "198.51.100.4"}
    with httpx.Client(base_url=base, headers=forwarded, follow_redirects=False) as client:
        page = client.get("/login")
        csrf = next(
            c.split(";")[0].split("=", 1)[1]
            for c in page.headers.get_list("set-cookie")
            if c.startswith("sq_csrf=")
        )
        response = client.post(
            "/login",
            data={"token": TOKEN, "csrf_token": csrf},
            headers={"Cookie": f"sq_csrf={csrf}"},
        )
        assert response.status_code == 303, response.text
        return next(c for c in response.headers.get_list("set-cookie") if "sq_session=" in c)


def _attributes(cookie: str) -> set[str]:
    return {part.strip().split("=")[0].lower() for part in cookie.split(";")}


def test_a_login_through_an_allowed_proxy_gets_a_secure_cookie(tmp_path: Path) -> None:
    with live(tmp_path, api_token=TOKEN, forwarded_allow_ips="10.0.0.0/8, 127.0.0.1/32") as s:
        assert "secure" in _attributes(_login_over_the_proxy(s.port))


def test_a_login_through_another_peer_gets_no_secure_cookie(tmp_path: Path) -> None:
    # The proxy is on another host; the test's loopback peer is not it.
    with live(tmp_path, api_token=TOKEN, forwarded_allow_ips="10.1.2.3") as s:
        assert "secure" not in _attributes(_login_over_the_proxy(s.port))


@pytest.mark.parametrize(
    "value", ["", "10.0.0.0/33", "proxy.example", "*,10.0.0.1", "10.0.0.1,,10.0.0.2"]
)
def test_a_bad_forwarded_allow_ips_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(ValidationError, match="SENDQUEUE_FORWARDED_ALLOW_IPS"):
        Settings(_env_file=None, forwarded_allow_ips=value)


@pytest.mark.parametrize("value", ["*", "127.0.0.1", "10.0.0.1, 192.168.0.0/16", "::1,fd00::/8"])
def test_a_good_forwarded_allow_ips_is_accepted(value: str) -> None:
    assert Settings(_env_file=None, forwarded_allow_ips=value).forwarded_allow_ips == value
