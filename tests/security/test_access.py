"""Access control under attack. tests/web/test_security.py already walks every route without
credentials; this module walks every route again with *forged* ones (a wrong or truncated
token, another scheme, a token in the query or a cookie, session cookies signed with another
token or expired) and with raw paths that try to slip past the check (dot segments through
the public ``/static/`` and ``/login``, double slashes, encodings, other cases, trailing
slashes), plus the methods no route declares (OPTIONS, HEAD, TRACE).

A campaign exists throughout, so a request that got through would show its data: every
answer must be 401 / a redirect to the login page / 404 / 405, and no body may carry the
campaign's id.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.routing import Mount, Route

from sendqueue.bootstrap import Container, bootstrap
from sendqueue.services.importing.recipients import Templates
from sendqueue.settings import Settings
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.web.app import create_app
from sendqueue.web.session import SESSION_COOKIE, SessionSigner
from tests.support.app import T0, csv_bytes, open_policy

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*install `httpx2`")
    from fastapi.testclient import TestClient

TOKEN = "the-real-token-0123456789"
# Open without the token (the unsubscribe route: RFC 8058 one-click, tests/web/test_unsubscribe.py).
PUBLIC = {"/login", "/healthz", "/u/{token}"}


class Locked:
    """The app with a token set, one campaign in the store, and its id."""

    def __init__(self, home: Path) -> None:
        self.container: Container = bootstrap(
            Settings(
                _env_file=None,
                database_url=f"sqlite:///{home / 'store.db'}",
                scheduler_url=f"sqlite:///{home / 'scheduler.db'}",
                mailer=f"maildir:{home / 'outbox'}",
                api_token=TOKEN,
                # hundreds of forgeries from one client: the back-off (its own tests) stays out
                auth_max_failures=1000,
            ),
            clock=FakeClock(T0),
            mailer=RecordingMailer(),
        )
        self.app: FastAPI = create_app(self.container)
        self.client = TestClient(self.app, base_url="http://testserver", follow_redirects=False)
        self.campaign_id = self.container.campaign_import.create(
            name="secret plans",
            recipients=csv_bytes(2),
            policy=open_policy(),
            templates=Templates(),
        ).campaign.id


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Locked]:
    app = Locked(tmp_path_factory.mktemp("locked"))
    with app.client:
        yield app
    app.container.close()


def routes(app: FastAPI) -> list[tuple[str, str]]:
    """(method, path) of every route, with included routers flattened."""

    def flatten(items: list[Any]) -> Iterator[Any]:
        for route in items:
            inner = getattr(route, "original_router", None)
            yield from flatten(inner.routes) if inner is not None else [route]

    found = []
    for route in flatten(app.routes):
        if isinstance(route, Mount):
            continue
        assert isinstance(route, APIRoute | Route), route
        found += [(m, route.path) for m in sorted(route.methods or {"GET"})]
    return found


def concrete(path: str, campaign_id: str) -> str:
    # aim at the real campaign, so that a request that got through would return its data
    return re.sub(r"\{[^}]+\}", campaign_id, path)


def assert_refused(response: Any, campaign_id: str, what: object) -> None:
    assert response.status_code in {401, 303, 404, 405}, (what, response.status_code)
    if response.status_code == 303:
        assert response.headers["location"].startswith("/login"), what
    assert campaign_id not in response.text, what  # (a redirect names it only in next=)
    assert "secret plans" not in response.text, what


def _forged_cookies() -> dict[str, str]:
    other = SessionSigner("another-token-0123456789").issue()
    expired = SessionSigner(TOKEN, ttl=-10).issue()
    good = SessionSigner(TOKEN).issue()
    version, expires, *rest = good.split(".")
    return {
        "signed with another token": other,
        "expired": expired,
        "expiry pushed back": ".".join([version, str(int(expires) + 10**7), *rest]),
        "signature cut": good[:-4],
        "the token itself": TOKEN,
        "empty": "",
        "huge": "v1." + "9" * 5000,
    }


FORGED_HEADERS: dict[str, dict[str, str]] = {
    "wrong token": {"Authorization": "Bearer wrong-token-0123456789"},
    "token with a suffix": {"Authorization": f"Bearer {TOKEN}x"},
    "token cut short": {"Authorization": f"Bearer {TOKEN[:-1]}"},
    "empty bearer": {"Authorization": "Bearer "},
    "no scheme": {"Authorization": TOKEN},
    "basic scheme": {"Authorization": f"Basic {TOKEN}"},
    "token scheme": {"Authorization": f"Token {TOKEN}"},
    "two tokens": {"Authorization": f"Bearer wrong, Bearer {TOKEN}"},
    "token in another header": {"X-Api-Token": TOKEN, "X-Auth-Token": TOKEN},
    "forwarded as local": {"X-Forwarded-For": "127.0.0.1", "X-Real-IP": "127.0.0.1"},
}


def test_every_route_refuses_forged_credentials(locked: Locked) -> None:
    cid = locked.campaign_id
    checked = 0
    for method, path in routes(locked.app):
        if path in PUBLIC:
            continue
        url = concrete(path, cid)
        for name, headers in FORGED_HEADERS.items():
            response = locked.client.request(method, url, headers=headers)
            assert response.status_code == 401, (method, path, name, response.status_code)
            assert_refused(response, cid, (method, path, name))
        for name, value in _forged_cookies().items():
            locked.client.cookies.set(SESSION_COOKIE, value)
            try:
                response = locked.client.request(method, url, headers={"Accept": "text/html"})
            finally:
                locked.client.cookies.clear()
            assert_refused(response, cid, (method, path, f"cookie {name}"))
        query = locked.client.request(method, url, params={"token": TOKEN, "access_token": TOKEN})
        assert query.status_code == 401, (method, path, "token in the query")
        checked += 1
    assert checked >= 20
    # the real token works, so the refusals above are about the forgery, not the route
    ok = locked.client.get(f"/api/campaigns/{cid}", headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200
    assert ok.json()["name"] == "secret plans"


def _raw(app: FastAPI, method: str, raw_path: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    """One request straight into the ASGI app, its path exactly as given (HTTP clients
    normalise ``..`` and ``//`` away before sending; an attacker's client does not)."""
    from urllib.parse import unquote_to_bytes

    path, _, query = raw_path.partition(b"?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": unquote_to_bytes(path).decode("utf-8", "replace"),
        "raw_path": path,
        "root_path": "",
        "query_string": query,
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("192.0.2.7", 40000),
        "server": ("testserver", 80),
        "state": {},
    }
    status = 0
    body = b""

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        nonlocal status, body
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            body += message.get("body", b"")

    async def call() -> None:
        await app(scope, receive, send)

    anyio.run(call)
    return status, body


RAW_PATHS = [
    "/static/../api/campaigns",
    "/static/%2e%2e/api/campaigns",
    "/static/..%2fapi/campaigns",
    "/static/x/../../api/campaigns/{cid}",
    "/static//../api/campaigns",
    "/login/../api/campaigns",
    "/login/..%2fapi/campaigns",
    "/healthz/../api/campaigns",
    "//api/campaigns",
    "/api//campaigns",
    "/api/campaigns/",
    "/api/campaigns/{cid}/",
    "/API/campaigns",
    "/Api/Campaigns/{cid}",
    "/%61pi/campaigns",
    "/api%2Fcampaigns",
    "/api/campaigns;/{cid}",
    "/api/campaigns/{cid}%00",
    "/./api/campaigns",
    "/api/./campaigns",
    "/metrics/",
    "/openapi.json/",
    "/docs/../api/campaigns",
    "/static/../metrics",
    "/login?next=/api/campaigns/../../api/campaigns",
]


@pytest.mark.parametrize("raw", RAW_PATHS)
@pytest.mark.parametrize("method", ["GET", "POST"])
def test_raw_paths_do_not_slip_past_the_check(locked: Locked, raw: str, method: str) -> None:
    cid = locked.campaign_id
    path = raw.replace("{cid}", cid).encode()
    for accept in ("application/json", "text/html"):
        status, body = _raw(locked.app, method, path, {"host": "testserver", "accept": accept})
        if raw.startswith("/login?") and method == "GET":
            assert status == 200  # the login page itself
            assert cid.encode() not in body
            continue
        assert status in {401, 303, 403, 404, 405}, (raw, method, accept, status, body[:300])
        assert cid.encode() not in body, (raw, method, body[:300])
        assert b"secret plans" not in body


@pytest.mark.parametrize("method", ["OPTIONS", "TRACE", "HEAD", "PROPFIND"])
def test_undeclared_methods_are_refused_on_every_path(locked: Locked, method: str) -> None:
    cid = locked.campaign_id
    for _, path in routes(locked.app):
        if path in PUBLIC:
            continue
        response = locked.client.request(method, concrete(path, cid))
        assert response.status_code in {401, 405}, (method, path, response.status_code)
        assert cid not in response.text


def test_websocket_handshakes_get_nothing(locked: Locked) -> None:
    # the auth middleware passes non-HTTP scopes through: no websocket route may exist
    from starlette.websockets import WebSocketDisconnect

    for path in ("/api/campaigns", f"/api/campaigns/{locked.campaign_id}/events", "/"):
        with pytest.raises(WebSocketDisconnect), locked.client.websocket_connect(path):
            pass
