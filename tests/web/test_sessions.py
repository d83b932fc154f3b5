"""Sessions end at logout, everywhere (issue 17, Low 2), and the CSRF token is bound to the
session, so one planted before login does not count after it (Low 6)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import httpx
import pytest
from starlette.testclient import TestClient

import sendqueue
from sendqueue.bootstrap import bootstrap
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.testing.store import InMemoryTaskStore
from sendqueue.web.app import create_app
from sendqueue.web.session import (
    GENERATION_CACHE_SECONDS,
    SESSION_GENERATION,
    SessionGenerations,
    SessionSigner,
)
from tests.support.app import T0
from tests.web.conftest import TOKEN, Web

BODY = {"name": "c", "recipients": [{"email": "a@example.com"}],
        "templates": {"subject": "s", "body": "b"}}  # fmt: skip
ATTACKER_CSRF = "attacker-chosen-csrf-token-0123456789abcdef"


@pytest.fixture
def locked(make_web: Callable[..., Web]) -> Web:
    return make_web(api_token=TOKEN)


def login(client: TestClient | httpx.Client) -> tuple[str, str]:
    """Log in through the form, as a new browser; the session cookie's value and the CSRF
    token it came with. The client's cookie jar is left empty: tests send cookies explicitly."""
    client.cookies.clear()
    page = client.get("/login")
    assert page.status_code == 200
    before = page.cookies["sq_csrf"]
    response = client.post("/login", data={"token": TOKEN, "csrf_token": before, "next": "/"})
    assert response.status_code == 303, response.text
    client.cookies.clear()
    # (The login form's token where a login sets none: the double submit before issue 17.)
    return response.cookies["sq_session"], response.cookies.get("sq_csrf") or before


def as_cookie(session: str, csrf: str | None = None) -> dict[str, str]:
    """Only the given cookies, whatever the client's jar holds."""
    value = f"sq_session={session}" + (f"; sq_csrf={csrf}" if csrf else "")
    return {"Cookie": value}


@pytest.fixture
def other(locked: Web) -> Iterator[TestClient]:
    """Another app on the same database: its own container, engine and generation cache."""
    container = bootstrap(locked.container.settings, clock=FakeClock(T0), mailer=RecordingMailer())
    try:
        with TestClient(
            create_app(container), base_url="http://testserver", follow_redirects=False
        ) as client:
            yield client
    finally:
        container.close()


# --- Low 2: logout ends the session -------------------------------------------------------------


def test_logout_refuses_the_old_cookie_here_and_in_another_instance(
    locked: Web, other: TestClient
) -> None:
    session, csrf = login(locked.client)
    kept_elsewhere, _ = login(locked.client)  # another browser's session
    for client in (locked.client, other):
        assert client.get("/api/campaigns", headers=as_cookie(session)).status_code == 200
        assert client.get("/api/campaigns", headers=as_cookie(kept_elsewhere)).status_code == 200

    logout = locked.client.post(
        "/logout", data={"csrf_token": csrf}, headers=as_cookie(session, csrf)
    )
    assert logout.status_code == 303
    assert logout.headers["location"] == "/login"

    # Here at once; every session issued before the logout, not only the one that left.
    for value in (session, kept_elsewhere):
        api = locked.client.get("/api/campaigns", headers=as_cookie(value))
        assert api.status_code == 401
        page = locked.client.get("/", headers={**as_cookie(value), "Accept": "text/html"})
        assert page.status_code == 303
        assert page.headers["location"].startswith("/login")
    # The other instance read generation 0 a moment ago: it refuses once its cache is old.
    time.sleep(GENERATION_CACHE_SECONDS + 0.2)
    assert other.get("/api/campaigns", headers=as_cookie(session)).status_code == 401

    # A new login works at once in both, though the other one's cache has not expired.
    fresh, _ = login(locked.client)
    assert other.get("/api/campaigns", headers=as_cookie(fresh)).status_code == 200
    assert locked.client.get("/api/campaigns", headers=as_cookie(fresh)).status_code == 200


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serve_process(home: Path, database_url: str) -> Iterator[str]:
    """``sendqueue serve --no-worker`` in its own process on the given task store."""
    src = str(Path(sendqueue.__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDQUEUE_")}
    env.update(
        SENDQUEUE_DATABASE_URL=database_url,
        SENDQUEUE_SCHEDULER_URL=f"sqlite:///{home / 'scheduler2.db'}",
        SENDQUEUE_MAILER=f"maildir:{home / 'outbox2'}",
        SENDQUEUE_API_TOKEN=TOKEN,
        PYTHONPATH=os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")])),
    )
    port = _free_port()
    log = home / "serve2.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sendqueue.cli", "serve", "--no-worker",
             "--host", "127.0.0.1", "--port", str(port)],
            env=env, cwd=home, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, "serve did not start:\n" + log.read_text()
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.mark.slow
def test_a_logout_in_one_server_process_ends_the_session_in_another(locked: Web) -> None:
    settings = locked.container.settings
    home = Path(settings.database_url.removeprefix("sqlite:///")).parent
    with (
        serve_process(home, settings.database_url) as url,
        httpx.Client(base_url=url, follow_redirects=False) as remote,
    ):
        session, _ = login(remote)  # issued by the other process
        assert locked.client.get("/api/campaigns", headers=as_cookie(session)).status_code == 200
        assert remote.get("/api/campaigns", headers=as_cookie(session)).status_code == 200

        page = locked.client.get("/", headers={**as_cookie(session), "Accept": "text/html"})
        csrf = page.cookies["sq_csrf"]  # this process hands the session's token back
        logout = locked.client.post(
            "/logout", data={"csrf_token": csrf}, headers=as_cookie(session, csrf)
        )
        assert logout.status_code == 303

        deadline = time.monotonic() + GENERATION_CACHE_SECONDS + 1.0
        while remote.get("/api/campaigns", headers=as_cookie(session)).status_code == 200:
            assert time.monotonic() < deadline, "the other process still takes the cookie"
            time.sleep(0.1)
        assert remote.get("/api/campaigns", headers=as_cookie(session)).status_code == 401
        # ... and a restart does not bring it back: the generation is in the store.
    with (
        serve_process(home, settings.database_url) as url,
        httpx.Client(base_url=url, follow_redirects=False) as restarted,
    ):
        assert restarted.get("/api/campaigns", headers=as_cookie(session)).status_code == 401


def test_the_generation_check_fails_closed_when_the_store_is_down(
    make_web: Callable[..., Web],
) -> None:
    web = make_web(api_token=TOKEN, flaky=True)
    web.app.state.session_generations.max_age = 0.0  # read the store on every request
    session, _ = login(web.client)
    web.store.down = True
    answer = web.client.get("/api/campaigns", headers=as_cookie(session))
    assert answer.status_code == 503
    assert "session" in answer.json()["error"]["message"]
    web.store.down = False
    assert web.client.get("/api/campaigns", headers=as_cookie(session)).status_code == 200


class CountingStore(InMemoryTaskStore):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def counter(self, name: str) -> int:
        self.reads += 1
        return super().counter(name)


def test_generations_cache_reads_and_refresh_for_a_newer_cookie() -> None:
    store = CountingStore()
    now = [0.0]
    generations = SessionGenerations(store, max_age=2.0, clock=lambda: now[0])

    async def check(generation: int) -> bool:
        return await generations.accepts(generation)

    assert anyio.run(check, 0)
    assert anyio.run(check, 0)
    assert store.reads == 1  # cached
    store.increment_counter(SESSION_GENERATION)  # a logout elsewhere
    assert anyio.run(check, 0)  # still cached: honoured within max_age
    now[0] = 2.0
    assert not anyio.run(check, 0)
    assert store.reads == 2
    store.increment_counter(SESSION_GENERATION)  # logout and login elsewhere: a newer cookie
    assert anyio.run(check, 2)
    assert store.reads == 3
    assert generations.bump() == 3
    assert not anyio.run(check, 2)
    assert store.reads == 3  # bump remembers what it wrote


def test_cookies_carry_their_generation_and_old_formats_are_refused() -> None:
    signer = SessionSigner(TOKEN)
    value = signer.issue(7)
    session = signer.session(value)
    assert session is not None
    assert session.generation == 7
    version, expires, _, nonce, signature = value.split(".")
    assert not signer.verify(".".join([version, expires, "8", nonce, signature]))
    assert not signer.verify(f"v1.{expires}.{nonce}.{signature}")
    assert not signer.verify(value.replace("v2.", "v2.²", 1))
    assert not signer.verify("v2.1.2.3.4")


# --- Low 6: the CSRF token is bound to the session -----------------------------------------------


def test_a_csrf_cookie_planted_before_login_does_not_count_after_it(locked: Web) -> None:
    # The attacker's cookie is in the browser before login; the login form takes it.
    page = locked.client.get("/login", headers={"Cookie": f"sq_csrf={ATTACKER_CSRF}"})
    assert ATTACKER_CSRF in page.text
    response = locked.client.post(
        "/login",
        data={"token": TOKEN, "csrf_token": ATTACKER_CSRF},
        headers={"Cookie": f"sq_csrf={ATTACKER_CSRF}"},
    )
    assert response.status_code == 303
    session = response.cookies["sq_session"]

    # The attacker's token refused, even with the attacker's cookie planted again beside it.
    planted = as_cookie(session, ATTACKER_CSRF)
    refused = locked.client.post(
        "/api/campaigns", json=BODY, headers={**planted, "X-CSRF-Token": ATTACKER_CSRF}
    )
    assert refused.status_code == 403
    rotated = response.cookies["sq_csrf"]  # login handed out the session's own token
    assert rotated != ATTACKER_CSRF
    assert refused.headers.get("set-cookie", "").startswith(f"sq_csrf={rotated};")
    form = locked.client.post("/logout", data={"csrf_token": ATTACKER_CSRF}, headers=planted)
    assert form.status_code == 403
    assert locked.container.store.list_campaigns() == []

    # The session's token works, whatever the sq_csrf cookie says; pages carry it.
    ok = locked.client.post(
        "/api/campaigns", json=BODY, headers={**planted, "X-CSRF-Token": rotated}
    )
    assert ok.status_code == 201, ok.text
    home = locked.client.get("/", headers={**planted, "Accept": "text/html"})
    assert rotated in home.text
    assert ATTACKER_CSRF not in home.text


def test_each_login_gets_its_own_csrf_token(locked: Web) -> None:
    first_session, first = login(locked.client)
    second_session, second = login(locked.client)
    assert first != second
    # One session's token does not serve another.
    crossed = locked.client.post(
        "/api/campaigns",
        json=BODY,
        headers={**as_cookie(second_session, first), "X-CSRF-Token": first},
    )
    assert crossed.status_code == 403
    signer = SessionSigner(TOKEN)
    parsed = signer.session(first_session)
    assert parsed is not None
    assert signer.csrf_token(parsed) == first
    assert SessionSigner(TOKEN + "-other").csrf_token(parsed) != first
