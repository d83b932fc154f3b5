"""Access control: the token on every route, bearer and session cookie, CSRF, security headers,
and ``serve`` refusing a public address without a token."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.routing import APIRoute
from starlette.routing import Mount, Route
from typer.testing import CliRunner

from sendqueue.cli import app as cli_app
from sendqueue.web.middleware.auth import is_api_path, is_public_path
from sendqueue.web.middleware.headers import CSP
from sendqueue.web.session import SessionSigner, safe_next
from tests.support.app import csv_bytes
from tests.web.conftest import TOKEN, Web

BEARER = {"Authorization": f"Bearer {TOKEN}"}
# Open without the token: exactly these (the unsubscribe route is RFC 8058's one-click POST).
PUBLIC = {"/login", "/healthz", "/u/{token}"}


@pytest.fixture
def locked(make_web: Callable[..., Web]) -> Web:
    return make_web(api_token=TOKEN)


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x", path)


def _flatten(routes: list[Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for route in routes:
        # Newer FastAPI keeps an included router as one entry that wraps the original.
        inner = getattr(route, "original_router", None)
        if inner is not None:
            extra = getattr(getattr(route, "include_context", None), "prefix", "") or ""
            yield from _flatten(inner.routes, prefix + extra)
        else:
            yield prefix, route


def _routes(web: Web) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for prefix, route in _flatten(web.app.routes):
        if isinstance(route, Mount):
            assert route.path == "/static"
            continue
        assert isinstance(route, APIRoute | Route), route
        for method in sorted(route.methods or {"GET"}):
            found.append((method, prefix + route.path))
    return found


def test_every_route_but_login_static_healthz_and_unsubscribe_needs_the_token(
    locked: Web,
) -> None:
    checked = 0
    routes = _routes(locked)
    assert {path for _, path in routes if is_public_path(_concrete(path))} == PUBLIC
    for method, path in routes:
        if path in PUBLIC:
            continue
        url = _concrete(path)
        if is_api_path(path):
            response = locked.client.request(method, url, headers={"Accept": "text/html"})
            assert response.status_code == 401, (method, path, response.text)
            assert response.headers["www-authenticate"].startswith("Bearer")
            if method != "HEAD":
                assert response.json()["error"]["status"] == 401
        else:
            response = locked.client.request(method, url, headers={"Accept": "text/html"})
            assert response.status_code == 303, (method, path, response.text)
            assert response.headers["location"].startswith("/login")
            plain = locked.client.request(method, url, headers={"Accept": "application/json"})
            assert plain.status_code == 401, (method, path)
        checked += 1
    # the API alone has 20 routes; the docs and the pages add more
    assert checked >= 20
    assert locked.client.get("/healthz").json() == {"status": "ok"}
    assert locked.client.get("/login").status_code == 200
    assert locked.client.get("/static/nothing-here.css").status_code == 404


def test_a_page_redirect_keeps_the_path_to_come_back_to(locked: Web) -> None:
    response = locked.client.get(
        "/campaigns/c1?state=Failed", headers={"Accept": "text/html,application/xhtml+xml"}
    )
    assert response.status_code == 303
    assert response.headers["location"] == "/login?next=%2Fcampaigns%2Fc1%3Fstate%3DFailed"
    root = locked.client.get("/", headers={"Accept": "text/html"})
    assert root.headers["location"] == "/login"


def test_bearer_token_works_and_needs_no_csrf(locked: Web) -> None:
    assert locked.client.get("/api/campaigns", headers=BEARER).status_code == 200
    wrong = locked.client.get("/api/campaigns", headers={"Authorization": f"Bearer {TOKEN}x"})
    assert wrong.status_code == 401
    basic = locked.client.get("/api/campaigns", headers={"Authorization": f"Basic {TOKEN}"})
    assert basic.status_code == 401
    created = locked.client.post(
        "/api/campaigns",
        headers={**BEARER, "Origin": "http://elsewhere.example"},
        json={"name": "b", "recipients": [{"email": "a@example.com"}],
              "templates": {"subject": "s", "body": "b"}},
    )  # fmt: skip
    assert created.status_code == 201, created.text
    cid = created.json()["id"]
    assert locked.client.post(f"/api/campaigns/{cid}/cancel", headers=BEARER).status_code == 200


def _login(web: Web, token: str = TOKEN, next_path: str = "/") -> Any:
    page = web.client.get("/login")
    assert page.status_code == 200
    csrf = web.client.cookies.get("sq_csrf")
    assert csrf and csrf in page.text  # the page carries the token of the cookie it sets
    return web.client.post("/login", data={"token": token, "csrf_token": csrf, "next": next_path})


def test_login_sets_an_httponly_strict_session_cookie_that_works(locked: Web) -> None:
    response = _login(locked, next_path="/campaigns/new")
    assert response.status_code == 303
    assert response.headers["location"] == "/campaigns/new"
    cookie = next(
        v for k, v in response.headers.multi_items() if k == "set-cookie" and "sq_session" in v
    )
    attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
    assert {"httponly", "path", "max-age"} <= attributes
    assert "samesite=strict" in cookie.lower()
    assert "secure" not in attributes  # plain http here; behind https it is set
    assert locked.client.get("/api/campaigns").status_code == 200
    assert locked.client.get("/", headers={"Accept": "text/html"}).status_code == 200

    csrf = locked.client.cookies["sq_csrf"]
    logout = locked.client.post("/logout", data={"csrf_token": csrf})
    assert logout.status_code == 303
    assert logout.headers["location"] == "/login"
    assert locked.client.get("/api/campaigns").status_code == 401


def test_login_refuses_a_wrong_token_and_foreign_next_paths(
    locked: Web, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = _login(locked, token="not-the-token-at-all", next_path="/dead-letters")
    assert wrong.status_code == 401
    assert "text/html" in wrong.headers["content-type"]
    assert "wrong token" in wrong.text
    assert 'value="/dead-letters"' in wrong.text
    assert "sq_session" not in locked.client.cookies
    for target in ("//evil.example/x", "https://evil.example/", "/\\evil.example"):
        assert _login(locked, next_path=target).headers["location"] == "/"
    session = locked.client.cookies["sq_session"]
    locked.client.get("/api/campaigns", headers=BEARER)
    assert TOKEN not in caplog.text
    assert "not-the-token-at-all" not in caplog.text
    assert session not in caplog.text


def test_a_form_over_its_limits_gets_the_routes_answer_not_a_csrf_refusal(locked: Web) -> None:
    assert _login(locked).status_code == 303
    csrf = locked.client.cookies["sq_csrf"]
    too_big = locked.client.post(
        "/api/campaigns",
        data={"name": "x" * (600 * 1024), "csrf_token": csrf, "timezone": "UTC"},
        files={"file": ("r.csv", csv_bytes(3), "text/csv")},
    )
    assert too_big.status_code == 422, too_big.text
    assert too_big.json()["error"]["field"] == "body"
    assert "malformed form" in too_big.json()["error"]["message"]
    many = locked.client.post(
        "/logout", data={f"f{i}": "v" for i in range(50)} | {"csrf_token": csrf}
    )
    assert many.status_code == 400, many.text
    assert len(locked.container.store.list_campaigns()) == 0


def test_login_itself_needs_the_csrf_token(locked: Web) -> None:
    locked.client.get("/login")
    response = locked.client.post("/login", data={"token": TOKEN})
    assert response.status_code == 403
    assert "sq_session" not in locked.client.cookies


def test_cookie_requests_need_the_csrf_token(locked: Web) -> None:
    assert _login(locked).status_code == 303
    csrf = locked.client.cookies["sq_csrf"]
    body = {"name": "c", "recipients": [{"email": "a@example.com"}],
            "templates": {"subject": "s", "body": "b"}}  # fmt: skip
    missing = locked.client.post("/api/campaigns", json=body)
    assert missing.status_code == 403
    assert "CSRF" in missing.json()["error"]["message"]
    wrong = locked.client.post("/api/campaigns", json=body, headers={"X-CSRF-Token": "x" * 43})
    assert wrong.status_code == 403
    assert locked.container.store.list_campaigns() == []
    ok = locked.client.post("/api/campaigns", json=body, headers={"X-CSRF-Token": csrf})
    assert ok.status_code == 201
    cid = ok.json()["id"]
    assert locked.client.post(f"/api/campaigns/{cid}/cancel").status_code == 403
    # a form field does as well as the header, in a multipart upload too (the body is
    # searched for it and handed on whole)
    form = locked.client.post(
        "/api/campaigns",
        data={"name": "form", "csrf_token": csrf, "timezone": "UTC"},
        files={"file": ("r.csv", csv_bytes(3), "text/csv")},
    )
    assert form.status_code == 201, form.text
    assert form.json()["recipients"] == 3
    bad_form = locked.client.post(
        "/api/campaigns",
        data={"name": "form", "csrf_token": "y" * 43},
        files={"file": ("r.csv", csv_bytes(3), "text/csv")},
    )
    assert bad_form.status_code == 403
    assert len(locked.container.store.list_campaigns()) == 2


def test_without_a_token_browsers_still_need_csrf_but_scripts_do_not(web: Web) -> None:
    body = {"name": "o", "recipients": [{"email": "a@example.com"}],
            "templates": {"subject": "s", "body": "b"}}  # fmt: skip
    # a page of another site making the user's browser post here
    forged = web.client.post("/api/campaigns", json=body, headers={"Origin": "http://evil.example"})
    assert forged.status_code == 403
    fetch = web.client.post("/api/campaigns", json=body, headers={"Sec-Fetch-Site": "same-origin"})
    assert fetch.status_code == 403
    csrf = web.client.cookies["sq_csrf"]
    page = web.client.post(
        "/api/campaigns", json=body, headers={"Origin": "http://testserver", "X-CSRF-Token": csrf}
    )
    assert page.status_code == 201
    script = web.client.post("/api/campaigns", json=body)  # curl sends no Origin
    assert script.status_code == 201


def test_security_headers_on_every_response(locked: Web) -> None:
    responses = [
        locked.client.get("/healthz"),
        locked.client.get("/login"),
        locked.client.get("/api/campaigns"),
        locked.client.get("/api/campaigns", headers=BEARER),
        locked.client.get("/api/campaigns/nope", headers=BEARER),
        locked.client.get("/", headers={"Accept": "text/html"}),
        locked.client.post("/api/campaigns", headers={**BEARER, "content-length": str(1 << 40)}),
    ]
    statuses = [r.status_code for r in responses]
    assert statuses == [200, 200, 401, 200, 404, 303, 413]
    for response in responses:
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["referrer-policy"] == "same-origin"
        assert response.headers["x-frame-options"] == "DENY"
        assert response.headers["content-security-policy"] == CSP
    assert "frame-ancestors 'none'" in CSP
    assert "'unsafe-inline'" not in CSP


def test_session_values_expire_and_cannot_be_forged() -> None:
    now = [1_000_000.0]
    signer = SessionSigner(TOKEN, ttl=3600, clock=lambda: now[0])
    value = signer.issue()
    assert signer.verify(value)
    assert SessionSigner(TOKEN, clock=lambda: now[0]).verify(value)  # another process
    assert not SessionSigner(TOKEN + "-rotated", clock=lambda: now[0]).verify(value)
    version, expires, *rest = value.split(".")
    assert not signer.verify(".".join([version, str(int(expires) + 10**6), *rest]))
    assert not signer.verify(value[:-2] + ("AA" if value[-2:] != "AA" else "BB"))
    assert not signer.verify("")
    assert not signer.verify("v1.1.2")
    now[0] += 3601
    assert not signer.verify(value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("/campaigns/c1?state=Failed", "/campaigns/c1?state=Failed"),
        ("/", "/"),
        ("//evil.example", "/"),
        ("https://evil.example/", "/"),
        ("/\\evil.example", "/"),
        ("campaigns", "/"),
        (None, "/"),
        ("/x\r\nSet-Cookie: a=b", "/"),
        # same-origin paths, queries and fragments are kept as they are
        ("/campaigns", "/campaigns"),
        ("/campaigns/c1/emails/c1-3#message-title", "/campaigns/c1/emails/c1-3#message-title"),
        ("/suppressions?after=a%40example.com", "/suppressions?after=a%40example.com"),
        ("/%2F%2Fevil.example", "/%2F%2Fevil.example"),  # a path on this site, never a host
        # another host, however spelt
        ("///evil.example", "/"),
        ("\\\\evil.example", "/"),
        ("/x/..\\..\\evil.example", "/"),
        ("http:/evil.example", "/"),
        ("javascript:alert(1)", "/"),
        (" /campaigns", "/"),
        # characters browsers drop or that split the header: /<TAB>/host would be //host
        ("/\t/evil.example", "/"),
        ("/\n/evil.example", "/"),
        ("/\x00x", "/"),
        ("/\x7f", "/"),
        ("/\x85/evil.example", "/"),
        ("/\u2028/evil.example", "/"),
        ("/\u200b/evil.example", "/"),
        ("/\u202e/evil.example", "/"),
        # no loop back to the form, nothing absurdly long, nothing that is not text
        ("/login", "/"),
        ("/login?next=/campaigns", "/"),
        ("/logout", "/"),
        ("/" + "a" * 2000, "/"),
        (b"/campaigns", "/"),
        (["/campaigns"], "/"),
    ],
)
def test_safe_next(value: object, expected: str) -> None:
    assert safe_next(value) == expected


@pytest.fixture
def cli_env(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    for key in list(os.environ):
        if key.startswith("SENDQUEUE_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SENDQUEUE_DATABASE_URL", f"sqlite:///{tmp_path / 'store.db'}")
    monkeypatch.setenv("SENDQUEUE_SCHEDULER_URL", f"sqlite:///{tmp_path / 'scheduler.db'}")
    return CliRunner()


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.10", "::", "example.com"])
def test_serve_refuses_a_public_address_without_a_token(cli_env: CliRunner, host: str) -> None:
    result = cli_env.invoke(cli_app, ["serve", "--host", host, "--port", "0"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "SENDQUEUE_API_TOKEN" in lines[0]
    assert host in lines[0]
    assert not os.path.exists("store.db")  # refused before anything was opened


def test_serve_refuses_a_bad_port(cli_env: CliRunner) -> None:
    result = cli_env.invoke(cli_app, ["serve", "--port", "70000"])
    assert result.exit_code == 2
    assert "port" in result.stderr
