"""A sender's mailbox whose server refuses the login quoting what it was sent (as some do):
the error kept and logged shows no part of the password, however IMAP quoted it on the wire
(``\\"`` and ``\\\\``) and however the IMAP library wrote the reply (a bytes repr)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from urllib.parse import quote

import pytest

from sendqueue.bootstrap import bootstrap
from sendqueue.domain.senders import Sender
from sendqueue.settings import Settings
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.testing.scheduler import FakeScheduler
from sendqueue.testing.store import InMemoryTaskStore
from tests.support.app import T0


def _serve(conn: socket.socket) -> None:
    with conn, conn.makefile("rwb") as f:
        f.write(b"* OK IMAP4rev1 ready\r\n")
        f.flush()
        for line in f:
            tag, _, rest = line.rstrip(b"\r\n").partition(b" ")
            if rest.upper().startswith(b"CAPABILITY"):
                f.write(b"* CAPABILITY IMAP4rev1 AUTH=PLAIN\r\n" + tag + b" OK done\r\n")
            elif rest.upper().startswith(b"LOGIN"):
                f.write(tag + b" NO [AUTHENTICATIONFAILED] refused: " + rest + b"\r\n")
            else:
                f.write(tag + b" BAD unknown\r\n")
            f.flush()


@pytest.fixture
def echoing_imap() -> Iterator[int]:
    """An IMAP server on loopback that refuses every LOGIN, echoing its command line."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=_serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


@pytest.mark.parametrize(
    "password", ["plain-Zq8Wx4", 'quo"te-Zq8Wx4', "back\\slash-Zq8Wx4", 'it\'s-"both"-Zq8Wx4']
)
def test_an_echoed_login_shows_no_part_of_the_password(
    echoing_imap: int, password: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock(T0)
    app = bootstrap(
        Settings(_env_file=None),
        clock=clock,
        store=InMemoryTaskStore(),
        scheduler=FakeScheduler(clock, seed=1),
        mailer=RecordingMailer(),
        parse_feedback=lambda raw, **_: [],
    )
    url = f"imap://ann:{quote(password, safe='')}@127.0.0.1:{echoing_imap}/INBOX?security=none"
    sender = Sender(id="s0123456789ab", email="ann@example.com", imap=url)
    app.sender_store.add_sender(sender)

    report = app.feedback_poller.poll()

    state = app.mailboxes.states_of([sender])[sender.id]
    assert state.last_error is not None and "refused" in state.last_error
    for text in (state.last_error, *report.errors, caplog.text):
        assert "Zq8Wx4" not in text, text


def test_the_feedback_mailbox_s_echoed_login_shows_no_part_of_its_password(
    echoing_imap: int, caplog: pytest.LogCaptureFixture
) -> None:
    password = 'quo"te-Zq8Wx4'
    url = f"imap://fb:{quote(password, safe='')}@127.0.0.1:{echoing_imap}/INBOX?security=none"
    clock = FakeClock(T0)
    app = bootstrap(
        Settings(_env_file=None, feedback_imap=url, secret_key="Hq3vN8xLr2Tp6Wd9Ks4Bz7Jm1Fy5Gc0Ae"),
        clock=clock,
        store=InMemoryTaskStore(),
        scheduler=FakeScheduler(clock, seed=1),
        mailer=RecordingMailer(),
        parse_feedback=lambda raw, **_: [],
    )

    report = app.feedback_poller.poll()

    assert report.errors and "refused" in report.errors[0]
    for text in (*report.errors, caplog.text):
        assert "Zq8Wx4" not in text, text
