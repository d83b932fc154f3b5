"""DNS rebinding against the token-less loopback server, on a real uvicorn on 127.0.0.1.

A page served as ``http://attacker.example:PORT``, whose name the attacker then makes resolve
to 127.0.0.1, talks to the server as the same origin: its browser sends
``Host: attacker.example:PORT`` and ``Origin: http://attacker.example:PORT`` and may read the
``sq_csrf`` cookie set for that name. Before the trusted-host check it read every campaign,
created one and provisioned it. Now every such request gets 400; the same requests with the
server's own name still work. A state change whose ``Origin`` or ``Referer`` names another
origin gets 403.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sendqueue.bootstrap import Container, bootstrap
from sendqueue.settings import Settings
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from tests.support.app import T0
from tests.web.conftest import live_server, sqlite_settings

CAMPAIGN = {
    "name": "News",
    "recipients": [{"email": "victim@example.com"}],
    "templates": {"subject": "s", "body": "b"},
    "policy": {"timezone": "UTC", "weekdays": "mon-sun", "windows": ["00:00-24:00"]},
}


@pytest.fixture
def container(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Container]:
    monkeypatch.delenv("SENDQUEUE_ALLOWED_HOSTS", raising=False)
    settings: Settings = sqlite_settings(tmp_path)  # no SENDQUEUE_API_TOKEN: the open mode
    built = bootstrap(settings, clock=FakeClock(T0), mailer=RecordingMailer())
    try:
        yield built
    finally:
        built.close()


def _browser(base: str, origin: str) -> httpx.Client:
    """A browser on a page of ``origin``: it names that host, and echoes the CSRF cookie."""
    authority = origin.split("://", 1)[1]
    return httpx.Client(base_url=base, timeout=10, headers={"Host": authority, "Origin": origin})


def _post(client: httpx.Client, path: str, **kwargs: Any) -> httpx.Response:
    client.get("/healthz")  # the page's first load sets sq_csrf
    csrf = client.cookies.get("sq_csrf") or ""
    return client.post(path, headers={"X-CSRF-Token": csrf}, **kwargs)


def test_a_rebound_page_cannot_read_create_or_provision(container: Container) -> None:
    with live_server(container) as (base, _):
        port = base.rsplit(":", 1)[1]
        with _browser(base, f"http://127.0.0.1:{port}") as own:
            created = _post(own, "/api/campaigns", json=CAMPAIGN)
            assert created.status_code == 201, created.text
            cid = created.json()["id"]
            assert own.get("/api/campaigns").json()["campaigns"][0]["id"] == cid

        with _browser(base, f"http://attacker.example:{port}") as attacker:
            read = attacker.get("/api/campaigns")
            one = attacker.get(f"/api/campaigns/{cid}")
            create = _post(attacker, "/api/campaigns", json=CAMPAIGN)
            provision = _post(attacker, f"/api/campaigns/{cid}/provision")
        for response in (read, one, create, provision):
            assert response.status_code == 400, response.text
            assert cid not in response.text
            error = response.json()["error"]
            assert error["field"] == "Host"
            assert "SENDQUEUE_ALLOWED_HOSTS" in error["message"]
            assert response.headers["x-frame-options"] == "DENY"
        assert [c.id for c in container.store.list_campaigns()] == [cid]
        assert container.store.get_campaign(cid).state.value == "draft"

        # the loopback names and the server's own origin still work, at any port
        for host in (f"localhost:{port}", f"[::1]:{port}", "127.0.0.1"):
            with httpx.Client(base_url=base, timeout=10, headers={"Host": host}) as script:
                assert script.get("/api/campaigns").status_code == 200, host
        with _browser(base, f"http://localhost:{port}") as own:
            assert _post(own, f"/api/campaigns/{cid}/provision").status_code == 202


def test_allowed_hosts_are_answered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SENDQUEUE_ALLOWED_HOSTS", "mail.example.org, 192.0.2.7")
    built = bootstrap(sqlite_settings(tmp_path), clock=FakeClock(T0), mailer=RecordingMailer())
    try:
        with live_server(built) as (base, _):
            for host, status in [
                ("mail.example.org:8812", 200),
                ("MAIL.example.org", 200),
                ("192.0.2.7", 200),
                ("example.org", 400),
                ("mail.example.org.attacker.example", 400),
                ("mail.example.org:99999", 400),
            ]:
                with httpx.Client(base_url=base, timeout=10, headers={"Host": host}) as client:
                    assert client.get("/api/campaigns").status_code == status, host
    finally:
        built.close()


@pytest.mark.parametrize(
    ("headers", "named"),
    [
        ({"Origin": "http://localhost:{port}"}, "Origin"),  # another origin, same machine
        ({"Origin": "https://127.0.0.1:{port}"}, "Origin"),  # another scheme
        ({"Origin": "http://127.0.0.1:1"}, "Origin"),  # another port
        ({"Origin": "null"}, "Origin"),  # a sandboxed frame
        ({"Referer": "http://evil.example/page"}, "Referer"),
        ({"Sec-Fetch-Site": "same-origin"}, "Origin"),  # a browser, without Origin
    ],
)
def test_a_state_change_from_another_origin_is_a_403(
    container: Container, headers: dict[str, str], named: str
) -> None:
    with live_server(container) as (base, _):
        port = base.rsplit(":", 1)[1]
        sent = {k: v.format(port=port) for k, v in headers.items()}
        with httpx.Client(base_url=base, timeout=10) as client:
            client.get("/healthz")
            csrf = client.cookies.get("sq_csrf") or ""
            response = client.post(
                "/api/campaigns", json=CAMPAIGN, headers={**sent, "X-CSRF-Token": csrf}
            )
            assert response.status_code == 403, response.text
            assert named in response.json()["error"]["message"]
            same = client.post(
                "/api/campaigns",
                json=CAMPAIGN,
                headers={
                    "Origin": f"http://127.0.0.1:{port}",
                    "Referer": f"http://127.0.0.1:{port}/campaigns/new",
                    "X-CSRF-Token": csrf,
                },
            )
            assert same.status_code == 201, same.text
    assert len(container.store.list_campaigns()) == 1


def _serve(tmp_path: Path, host: str, **env: str) -> subprocess.Popen[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SENDQUEUE_")}
    clean.update(
        SENDQUEUE_DATABASE_URL=f"sqlite:///{tmp_path / 'store.db'}",
        SENDQUEUE_SCHEDULER_URL=f"sqlite:///{tmp_path / 'scheduler.db'}",
        SENDQUEUE_MAILER=f"maildir:{tmp_path / 'outbox'}",
        PYTHONPATH=os.pathsep.join(sys.path),
        **env,
    )
    command = [sys.executable, "-m", "sendqueue.cli", "serve", "--no-worker", "--port", "0"]
    return subprocess.Popen(
        [*command, "--host", host], env=clean, cwd=tmp_path, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _served_url(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    line = process.stdout.readline()
    assert "serving" in line, line
    return line.split()[3].rstrip("/")


def test_serve_answers_the_address_it_binds(tmp_path: Path) -> None:
    process = _serve(tmp_path, "127.0.0.2")
    try:
        url = _served_url(process)
        assert url.startswith("http://127.0.0.2:")
        assert httpx.get(f"{url}/api/campaigns", timeout=10).status_code == 200
        other = httpx.get(f"{url}/api/campaigns", headers={"Host": "attacker.example"})
        assert other.status_code == 400
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)


def test_serve_on_every_interface_says_what_to_set(tmp_path: Path) -> None:
    process = _serve(tmp_path, "0.0.0.0", SENDQUEUE_API_TOKEN="a-token-of-twenty-chars")
    try:
        _served_url(process)
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    warning = [line for line in stderr.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1
    assert "SENDQUEUE_ALLOWED_HOSTS" in warning[0]
    assert "0.0.0.0" in warning[0]
