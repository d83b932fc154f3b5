"""Limits and timeouts, where a hostile or broken peer could otherwise hold resources.

Covered elsewhere, not repeated here: the upload limit (413 by Content-Length, by counting a
chunked body, and for the CSV part: tests/web/test_api.py), the live-stream cap (503:
tests/web/test_stream.py) and the SMTP adapter's own timeout (tests/integration/
test_smtp_mailer.py). Here:

- the SMTP timeout from ``SENDQUEUE_MAILER``'s ``timeout=`` through the worker: a server
  that accepts the connection and never speaks costs one transient failure within the
  timeout, and the email is retried later;
- the web server closes an idle keep-alive connection (uvicorn's keep-alive timeout, 5 s);
  the deadlines for headers and bodies that never finish (slowloris) and the size and
  connection limits are in test_request_timeouts.py;
- a client that disconnects half way through an upload is no server error: no traceback at
  ERROR, nothing written, and the server goes on answering.
"""

from __future__ import annotations

import logging
import socket
import time
from datetime import timedelta
from pathlib import Path

import pytest

from sendqueue.bootstrap import bootstrap
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import expected_schedule_name, schedule_group
from sendqueue.services.importing.recipients import Templates
from sendqueue.settings import Settings
from sendqueue.testing.clock import FakeClock
from tests.support.app import T0, csv_bytes, open_policy
from tests.web.conftest import live_server


def test_a_silent_smtp_server_costs_one_transient_failure_within_the_timeout(
    tmp_path: Path, silent_smtp_server: tuple[str, int]
) -> None:
    host, port = silent_smtp_server
    app = bootstrap(
        Settings(
            _env_file=None,
            database_url=f"sqlite:///{tmp_path / 'store.db'}",
            scheduler_url=f"sqlite:///{tmp_path / 'scheduler.db'}",
            mailer=f"smtp://{host}:{port}?security=none&timeout=1",
            retry_backoff=60,
        ),
        clock=FakeClock(T0),
    )
    try:
        cid = app.campaign_import.create(
            name="silent", recipients=csv_bytes(1), policy=open_policy(), templates=Templates()
        ).campaign.id
        assert app.provisioner.provision(cid).status == "done"
        app.clock.advance(60)  # type: ignore[attr-defined]
        started = time.monotonic()
        app.scheduler.fire_due(app.invoke)  # type: ignore[attr-defined]
        elapsed = time.monotonic() - started
        # the timeout is the behaviour under test; the margin is generous
        assert elapsed < 15, elapsed
        (task,) = app.store.list_tasks(cid)
        assert task.state is TaskState.PENDING
        assert task.attempts == 1
        assert task.error is not None and "timed out" in task.error
        assert task.send_at >= app.clock.now() + timedelta(seconds=59)  # retried later
        (retry,) = app.scheduler.list(schedule_group(cid))
        assert retry.name == expected_schedule_name(task)
    finally:
        app.close()


def _settings(home: Path) -> Settings:
    return Settings(
        _env_file=None,
        database_url=f"sqlite:///{home / 'store.db'}",
        scheduler_url=f"sqlite:///{home / 'scheduler.db'}",
        mailer=f"maildir:{home / 'outbox'}",
        max_upload_bytes=64 * 1024,
    )


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_an_idle_keep_alive_connection_is_closed(tmp_path: Path) -> None:
    app = bootstrap(_settings(tmp_path))
    try:
        with (
            live_server(app) as (url, _),
            socket.create_connection(("127.0.0.1", _port(url)), timeout=30) as conn,
        ):
            conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
            answer = conn.recv(4096)
            assert answer.startswith(b"HTTP/1.1 200")
            started = time.monotonic()
            # the server closes the idle connection: recv returns b"" (no timeout error)
            while conn.recv(4096):
                pass
            # uvicorn's keep-alive timeout is 5 s; the margin is generous
            assert time.monotonic() - started < 25
    finally:
        app.close()


def test_a_client_that_disconnects_mid_upload_is_no_server_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    app = bootstrap(_settings(tmp_path))
    try:
        with live_server(app) as (url, _):
            for content_type in ("application/json", "multipart/form-data; boundary=b"):
                with socket.create_connection(("127.0.0.1", _port(url)), timeout=10) as conn:
                    conn.sendall(
                        b"POST /api/campaigns HTTP/1.1\r\nHost: test\r\n"
                        b"Content-Type: " + content_type.encode() + b"\r\n"
                        b"Content-Length: 5000\r\n\r\n" + b'{"name": "half' + b"x" * 100
                    )
                    time.sleep(0.3)  # the route is reading the body
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and "disconnected" not in caplog.text:
                time.sleep(0.05)
            with socket.create_connection(("127.0.0.1", _port(url)), timeout=10) as conn:
                conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
                assert conn.recv(4096).startswith(b"HTTP/1.1 200")
        assert app.store.list_campaigns() == []
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert errors == [], [r.getMessage() for r in errors]
        assert "the client disconnected before its body was read" in caplog.text
    finally:
        app.close()
