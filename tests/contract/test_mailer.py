"""The Mailer contract (sendqueue.ports.Mailer), run against every adapter.

Each adapter runs against something real: the Maildir outbox against a directory, SMTP against
an aiosmtpd server in this process, SES against moto in server mode, and the in-memory fake.
To add an adapter, add a builder to ``BUILDERS``: it returns a :class:`Harness` with the mailer,
a way to read what arrived (as the recipient would: :class:`Arrived`) and the ways to make that
adapter refuse a message. A refusal the adapter cannot be made to give is None, and its test
skips with the reason.
"""

from __future__ import annotations

import email
import email.policy
import email.utils
import json
import shutil
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from email.message import EmailMessage
from pathlib import Path
from typing import cast

import pytest
from botocore.config import Config

from sendqueue.adapters.mail.maildir import MaildirMailer
from sendqueue.adapters.mail.ses import SesMailer
from sendqueue.adapters.mail.smtp import SmtpMailer
from sendqueue.domain.errors import MailError, PermanentMailError, TransientMailError
from sendqueue.ports import Mailer, OutgoingMessage
from sendqueue.testing.mailer import RecordingMailer
from tests.aws.test_eventbridge import throttling_url  # noqa: F401  (a fixture)
from tests.support import aws
from tests.support.smtp import SmtpSink

MESSAGE = OutgoingMessage(
    message_id="<c1-0.contract@example.com>",
    from_addr="news@example.com",
    to_addr="ada@example.org",
    subject="Your March letter",
    text="Hello Ada,\nthe March letter is here.\n",
    date=datetime(2026, 3, 20, 9, 30, 15, tzinfo=UTC),
    to_name="Ada Lovelace",
)


@dataclass(frozen=True)
class Arrived:
    """One message as its recipient sees it, whichever way it travelled."""

    message_id: str
    from_addr: str
    to_addr: str
    to_name: str
    subject: str
    date: datetime
    text: str


#: Makes the harness's adapter refuse ``message``: returns the mailer and the message to send.
Refusal = Callable[[OutgoingMessage], tuple[Mailer, OutgoingMessage]]


@dataclass
class Harness:
    mailer: Mailer
    #: What arrived so far, in arrival order (waits up to a few seconds for ``count``).
    arrived: Callable[[int], list[Arrived]]
    #: A refusal the adapter maps to TransientMailError (an SMTP 4xx, throttling, ...).
    transient: Refusal | None
    #: A refusal the adapter maps to PermanentMailError (an SMTP 5xx, a rejected sender, ...).
    permanent: Refusal | None
    #: A provider that cannot be reached at all (connection refused), or None.
    unreachable: Refusal | None


def _from_mime(message: EmailMessage) -> Arrived:
    to = message["To"].addresses[0]
    body = message.get_body(("plain",))
    assert body is not None, "the message has no text/plain part"
    date = email.utils.parsedate_to_datetime(str(message["Date"]))
    return Arrived(
        message_id=str(message["Message-ID"]),
        from_addr=message["From"].addresses[0].addr_spec,
        to_addr=to.addr_spec,
        to_name=to.display_name,
        subject=str(message["Subject"]),
        date=date,
        text=body.get_content().replace("\r\n", "\n"),
    )


def _parse(raw: bytes) -> EmailMessage:
    return email.message_from_bytes(raw.replace(b"\r\n", b"\n"), policy=email.policy.default)


def _wait(read: Callable[[], list[Arrived]], count: int, timeout: float = 10.0) -> list[Arrived]:
    # Every adapter here has delivered by the time send returns; the wait only covers a slow
    # server thread recording what it accepted.
    deadline = time.monotonic() + timeout
    found = read()
    while len(found) < count and time.monotonic() < deadline:
        time.sleep(0.05)
        found = read()
    return found


# --- adapters ---------------------------------------------------------------------------------


def _fake(request: pytest.FixtureRequest, tmp: Path) -> Iterator[Harness]:
    mailer = RecordingMailer()

    def arrived(count: int) -> list[Arrived]:
        return [
            Arrived(m.message_id, m.from_addr, m.to_addr, m.to_name, m.subject, m.date, m.text)
            for m in mailer.wait_for(count)
        ]

    def refuse(error: MailError) -> Refusal:
        def program(message: OutgoingMessage) -> tuple[Mailer, OutgoingMessage]:
            mailer.fail_next(error)
            return mailer, message

        return program

    yield Harness(
        mailer,
        arrived,
        transient=refuse(TransientMailError("451 4.3.0 try later")),
        permanent=refuse(PermanentMailError("550 5.1.1 no such user")),
        unreachable=None,
    )


def _maildir(request: pytest.FixtureRequest, tmp: Path) -> Iterator[Harness]:
    outbox = tmp / "outbox"
    mailer = MaildirMailer(outbox)

    def read() -> list[Arrived]:
        files = sorted((outbox / "new").iterdir(), key=lambda p: p.stat().st_mtime_ns)
        return [_from_mime(_parse(path.read_bytes())) for path in files]

    def unwritable(message: OutgoingMessage) -> tuple[Mailer, OutgoingMessage]:
        # Messages are written into tmp/ first: a file in its place makes every write fail.
        broken = tmp / "broken"
        other = MaildirMailer(broken)
        shutil.rmtree(broken / "tmp")
        (broken / "tmp").write_text("not a directory")
        return other, message

    def invalid(message: OutgoingMessage) -> tuple[Mailer, OutgoingMessage]:
        # A header with a line break can never be written: no retry will help.
        return mailer, replace(message, subject="Hello\nBcc: everyone@example.net")

    yield Harness(
        mailer,
        lambda count: _wait(read, count),
        transient=unwritable,
        permanent=invalid,
        unreachable=None,
    )


def _smtp(request: pytest.FixtureRequest, tmp: Path) -> Iterator[Harness]:
    sink = SmtpSink().start()
    closed_port = cast(int, request.getfixturevalue("closed_port"))
    mailer = SmtpMailer(sink.host, sink.port, security="none", timeout=10)
    refused: list[SmtpMailer] = []

    def arrived(count: int) -> list[Arrived]:
        return [_from_mime(mail.message) for mail in sink.wait_for(count)]

    def answer(reply: str) -> Refusal:
        def program(message: OutgoingMessage) -> tuple[Mailer, OutgoingMessage]:
            sink.reply_next(reply)
            return mailer, message

        return program

    def nobody_listens(message: OutgoingMessage) -> tuple[Mailer, OutgoingMessage]:
        other = SmtpMailer("127.0.0.1", closed_port, security="none", timeout=5)
        refused.append(other)
        return other, message

    try:
        yield Harness(
            mailer,
            arrived,
            transient=answer("451 4.3.0 mailbox busy, try later"),
            permanent=answer("550 5.1.1 no such user"),
            unreachable=nobody_listens,
        )
    finally:
        for other in refused:
            other.close()
        sink.stop()


#: One attempt, quickly: the refusal tests must not wait for botocore's retries.
_NO_RETRIES = Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=1)


def _ses(request: pytest.FixtureRequest, tmp: Path) -> Iterator[Harness]:
    closed_port = cast(int, request.getfixturevalue("closed_port"))
    aws.reset()
    ses = aws.client("sesv2")
    ses.create_email_identity(EmailIdentity="example.com")
    mailer = SesMailer(ses)
    others: list[SesMailer] = []
    throttled_url = cast(str, request.getfixturevalue("throttling_url"))

    def read() -> list[Arrived]:
        with urllib.request.urlopen(f"{aws.moto_url()}/moto-api/data.json", timeout=10) as got:
            data = json.load(got)
        raws = [str(m["raw_data"]) for m in data.get("ses", {}).get("RawMessage", [])]
        return [_from_mime(_parse(raw.encode())) for raw in raws]

    def at(url: str) -> SesMailer:
        other = SesMailer(aws.client("sesv2", url=url, config=_NO_RETRIES))
        others.append(other)
        return other

    def throttled(message: OutgoingMessage) -> tuple[Mailer, OutgoingMessage]:
        return at(throttled_url), message

    def unverified(message: OutgoingMessage) -> tuple[Mailer, OutgoingMessage]:
        # SES rejects a sender whose domain is not a verified identity (MessageRejected).
        return mailer, replace(message, from_addr="news@unverified.example.net")

    def nobody_listens(message: OutgoingMessage) -> tuple[Mailer, OutgoingMessage]:
        return at(f"http://127.0.0.1:{closed_port}"), message

    try:
        yield Harness(
            mailer,
            lambda count: _wait(read, count),
            transient=throttled,
            permanent=unverified,
            unreachable=nobody_listens,
        )
    finally:
        for other in others:
            other.close()


BUILDERS: dict[str, Callable[[pytest.FixtureRequest, Path], Iterator[Harness]]] = {
    "fake": _fake,
    "maildir": _maildir,
    "smtp": _smtp,
    "ses": _ses,
}


@pytest.fixture(params=sorted(BUILDERS))
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    built = BUILDERS[request.param](request, tmp_path)
    harness = next(built)
    try:
        yield harness
    finally:
        harness.mailer.close()
        next(built, None)


@pytest.fixture
def mailer(harness: Harness) -> Mailer:
    return harness.mailer


def expected(message: OutgoingMessage) -> Arrived:
    return Arrived(
        message.message_id,
        message.from_addr,
        message.to_addr,
        message.to_name,
        message.subject,
        message.date,
        message.text,
    )


# --- the contract -----------------------------------------------------------------------------


def test_send_returns_the_message_id(mailer: Mailer) -> None:
    assert mailer.send(MESSAGE) == "<c1-0.contract@example.com>"


def test_the_message_arrives_with_its_headers_and_body(harness: Harness) -> None:
    harness.mailer.send(MESSAGE)
    assert harness.arrived(1) == [expected(MESSAGE)]


def test_non_ascii_subject_name_and_body_survive(harness: Harness) -> None:
    message = replace(
        MESSAGE,
        message_id="<c1-1.contract@example.com>",
        to_name="Zoë Ångström-Łukasiewicz",
        subject="Grüße aus Köln, 100 € und ein Gruß auf 日本語",
        text="Liebe Zoë,\nschöne Grüße — ça va? 日本語もどうぞ。\n",
    )
    assert harness.mailer.send(message) == message.message_id
    assert harness.arrived(1) == [expected(message)]


def test_a_long_subject_arrives_whole(harness: Harness) -> None:
    # Long headers are folded on the wire; the recipient must read them back unfolded.
    subject = "An unusually long subject line, " * 6 + "ending here"
    harness.mailer.send(replace(MESSAGE, subject=subject))
    [arrived] = harness.arrived(1)
    assert arrived.subject == subject


def test_sends_from_several_threads_all_arrive_once(harness: Harness) -> None:
    messages = [
        replace(MESSAGE, message_id=f"<c1-{n}.threads@example.com>", to_addr=f"r{n}@example.org")
        for n in range(20)
    ]
    with ThreadPoolExecutor(4) as pool:  # a send that raises re-raises here
        returned = list(pool.map(harness.mailer.send, messages))
    wanted = [m.message_id for m in messages]
    assert returned == wanted
    arrived = harness.arrived(len(messages))
    assert sorted((a.message_id, a.to_addr) for a in arrived) == sorted(
        (m.message_id, m.to_addr) for m in messages
    )


def test_close_is_idempotent(harness: Harness) -> None:
    harness.mailer.send(MESSAGE)
    harness.mailer.close()
    harness.mailer.close()
    assert [a.message_id for a in harness.arrived(1)] == [MESSAGE.message_id]


def test_close_without_any_send_is_fine(mailer: Mailer) -> None:
    mailer.close()
    mailer.close()


def _refusal(harness: Harness, kind: str) -> Refusal:
    refusal: Refusal | None = getattr(harness, kind)
    if refusal is None:
        pytest.skip(f"this adapter has no {kind} refusal to provoke")
    return refusal


def test_a_temporary_refusal_raises_transient_mail_error(harness: Harness) -> None:
    mailer, message = _refusal(harness, "transient")(MESSAGE)
    with pytest.raises(TransientMailError):
        mailer.send(message)


def test_a_permanent_refusal_raises_permanent_mail_error(harness: Harness) -> None:
    mailer, message = _refusal(harness, "permanent")(MESSAGE)
    with pytest.raises(PermanentMailError):
        mailer.send(message)


def test_an_unreachable_provider_raises_transient_mail_error(harness: Harness) -> None:
    mailer, message = _refusal(harness, "unreachable")(MESSAGE)
    with pytest.raises(TransientMailError):
        mailer.send(message)


def test_a_refused_message_does_not_arrive_and_the_next_one_does(harness: Harness) -> None:
    for kind in ("transient", "permanent"):
        refusal: Refusal | None = getattr(harness, kind)
        if refusal is None:
            continue
        mailer, message = refusal(MESSAGE)
        if mailer is not harness.mailer:
            continue
        with pytest.raises(MailError):
            mailer.send(replace(message, message_id=f"<refused-{kind}@example.com>"))
    second = replace(MESSAGE, message_id="<c1-2.contract@example.com>")
    assert harness.mailer.send(second) == second.message_id
    assert [a.message_id for a in harness.arrived(1)] == [second.message_id]
