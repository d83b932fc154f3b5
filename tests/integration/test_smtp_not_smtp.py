"""A server that does not speak SMTP (an HTTP server's answer, another protocol's banner, garbage
in place of a reply): SmtpMailer says so in a fixed sentence, and neither the error, its
traceback, the task's error nor any log quotes the server's bytes. Real sockets on 127.0.0.1."""

from __future__ import annotations

import logging
import socket
import threading
import traceback
import warnings
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sendqueue.adapters.mail.smtp import SmtpMailer
from sendqueue.bootstrap import bootstrap
from sendqueue.domain.addresses import message_id_for
from sendqueue.domain.errors import TransientMailError
from sendqueue.ports import OutgoingMessage
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.web.app import create_app
from tests.support.app import T0
from tests.web.conftest import Web, sqlite_settings

with warnings.catch_warnings():  # as tests/web/conftest.py: httpx works as httpx2 does
    warnings.filterwarnings("ignore", message=".*install `httpx2`")
    from fastapi.testclient import TestClient

MARK = "Kx7-banner-bytes"
HTTP = f"HTTP/1.1 400 Bad Request\r\nServer: {MARK}\r\n\r\n<h1>{MARK}</h1>\r\n".encode()
#: What each server sends: its greeting, then one answer per line the client sends.
SCRIPTS = {
    "http": [HTTP],
    "ssh banner": [f"SSH-2.0-OpenSSH_{MARK}\r\n".encode()],
    "http after the greeting": [b"220 mx.test ESMTP\r\n", HTTP],
    "garbage for MAIL FROM": [
        b"220 mx.test ESMTP\r\n",
        b"250 mx.test\r\n",
        f"+OK {MARK}\r\n".encode(),
    ],
    "a code no SMTP reply has": [f"999 {MARK}\r\n".encode()],
}


def _serve(listener: socket.socket, script: list[bytes]) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(5)
            replies = iter(script)
            try:
                conn.sendall(next(replies))
                reader = conn.makefile("rb")
                for line in reader:
                    if line.upper().startswith(b"QUIT"):
                        break
                    conn.sendall(next(replies, b""))
            except OSError:
                continue


@pytest.fixture
def not_smtp() -> Iterator[Callable[[str], int]]:
    """Starts a loopback server for one of SCRIPTS; returns its port."""
    listeners: list[socket.socket] = []

    def start(kind: str) -> int:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listeners.append(listener)
        threading.Thread(target=_serve, args=(listener, SCRIPTS[kind]), daemon=True).start()
        return int(listener.getsockname()[1])

    yield start
    for listener in listeners:
        listener.close()


def _message() -> OutgoingMessage:
    return OutgoingMessage(
        message_id=message_id_for("c0123456789ab-1", "example.com"),
        from_addr="news@example.com",
        to_addr="reader@example.org",
        to_name="",
        subject="Hello",
        text="Hi\n",
        date=datetime(2026, 3, 2, 9, 30, tzinfo=UTC),
    )


@pytest.mark.parametrize("kind", sorted(SCRIPTS))
def test_the_error_says_the_server_did_not_speak_smtp_and_quotes_none_of_it(
    not_smtp: Callable[[str], int], kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    port = not_smtp(kind)
    caplog.set_level(logging.DEBUG)
    mailer = SmtpMailer("127.0.0.1", port, security="none", timeout=5)
    try:
        with pytest.raises(TransientMailError) as raised:
            mailer.send(_message())
    finally:
        mailer.close()
    assert str(raised.value) == f"the server at 127.0.0.1:{port} did not speak SMTP"
    shown = "".join(traceback.format_exception(raised.value)) + caplog.text
    assert MARK not in shown and "HTTP/1.1" not in shown and "SSH-2.0" not in shown


def test_a_sender_whose_server_does_not_speak_smtp_fails_its_task_quoting_none_of_it(
    not_smtp: Callable[[str], int], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port = not_smtp("http")
    settings = sqlite_settings(tmp_path, max_attempts=1)
    clock = FakeClock(T0)
    container = bootstrap(settings, clock=clock)
    client = TestClient(create_app(container), base_url="http://testserver")
    web = Web(container, client.app, client, clock, RecordingMailer())  # type: ignore[arg-type]
    caplog.set_level(logging.DEBUG)
    try:
        sender = container.senders.add(
            email="anna@example.com", transport=f"smtp://127.0.0.1:{port}?security=none"
        )
        cid = web.create(1, senders=[sender.id])["id"]
        assert container.provisioner.provision(cid).status == "done"
        clock.advance(minutes=1)
        web.fire_due()
        [task] = client.get(f"/api/campaigns/{cid}/tasks").json()["tasks"]
    finally:
        client.close()
        container.close()
    assert f"the server at 127.0.0.1:{port} did not speak SMTP" in task["error"], task
    assert MARK not in task["error"] and MARK not in caplog.text
