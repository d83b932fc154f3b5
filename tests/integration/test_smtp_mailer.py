"""SmtpMailer against a real SMTP server (aiosmtpd, see tests/support/smtp.py)."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import pytest

from sendqueue.adapters.mail.factory import mailer_from_url
from sendqueue.adapters.mail.maildir import MaildirMailer
from sendqueue.adapters.mail.smtp import SmtpMailer
from sendqueue.domain.addresses import message_id_for
from sendqueue.domain.errors import (
    InvalidField,
    MailError,
    PermanentMailError,
    TransientMailError,
)
from sendqueue.ports import OutgoingMessage
from tests.support.smtp import SmtpSink, client_ssl_context

SENT_AT = datetime(2026, 3, 2, 9, 30, 15, tzinfo=timezone(timedelta(hours=1)))


def message(n: int = 1, **changes: object) -> OutgoingMessage:
    base = OutgoingMessage(
        message_id=message_id_for(f"c0123456789ab-{n}", "example.com"),
        from_addr="Campaign Desk <news@example.com>",
        to_addr=f"reader{n}@example.org",
        to_name="Zoë Ångström",
        subject="Grüße aus Köln",
        text="Hallo Zoë,\nthe text part.\n",
        date=SENT_AT,
        reply_to="Support <help@example.com>",
        html="<p>Hallo <b>Zoë</b></p>",
        headers={"List-Unsubscribe": "<mailto:unsub@example.com?subject=c0123456789ab-1>"},
    )
    return replace(base, **changes)  # type: ignore[arg-type]


@pytest.fixture
def mailer_for() -> Iterator[Callable[..., SmtpMailer]]:
    """SmtpMailers pointed at a sink, closed after the test."""
    made: list[SmtpMailer] = []

    def make(sink: SmtpSink, **kwargs: object) -> SmtpMailer:
        kwargs.setdefault("security", sink.security)
        kwargs.setdefault("timeout", 5.0)
        if sink.security != "none":
            kwargs.setdefault("ssl_context", client_ssl_context())
        mailer = SmtpMailer(sink.host, sink.port, **kwargs)  # type: ignore[arg-type]
        made.append(mailer)
        return mailer

    yield make
    for mailer in made:
        mailer.close()


def test_send_delivers_every_header_and_both_parts(
    smtp_sink: SmtpSink, mailer_for: Callable[..., SmtpMailer]
) -> None:
    mailer = mailer_for(smtp_sink)
    msg = message()

    accepted = mailer.send(msg)

    assert accepted == msg.message_id == "<c0123456789ab-1@example.com>"
    (mail,) = smtp_sink.wait_for(1)
    assert mail.mail_from == "news@example.com"
    assert mail.rcpt_tos == ("reader1@example.org",)
    m = mail.message
    assert m["From"].addresses[0].display_name == "Campaign Desk"
    assert m["From"].addresses[0].addr_spec == "news@example.com"
    assert m["Reply-To"].addresses[0].addr_spec == "help@example.com"
    assert m["To"].addresses[0].display_name == "Zoë Ångström"
    assert m["To"].addresses[0].addr_spec == "reader1@example.org"
    assert str(m["Subject"]) == "Grüße aus Köln"
    assert parsedate_to_datetime(str(m["Date"])) == SENT_AT
    assert str(m["Message-ID"]) == "<c0123456789ab-1@example.com>"
    assert str(m["List-Unsubscribe"]) == msg.headers["List-Unsubscribe"]
    # Non-ASCII names travel RFC 2047-encoded, never as raw 8-bit header bytes.
    head = mail.raw.split(b"\r\n\r\n", 1)[0]
    assert head.isascii()
    assert m.get_content_type() == "multipart/alternative"
    parts = list(m.iter_parts())
    assert [p.get_content_type() for p in parts] == ["text/plain", "text/html"]
    assert parts[0].get_content() == "Hallo Zoë,\nthe text part.\n"
    assert parts[1].get_content() == "<p>Hallo <b>Zoë</b></p>\n"


def test_an_internationalised_domain_is_sent_to_its_idna_2008_form(
    smtp_sink: SmtpSink, mailer_for: Callable[..., SmtpMailer]
) -> None:
    """faß.de is xn--fa-hia.de (IDNA 2008), not fass.de (IDNA 2003), in RCPT TO and To."""
    mailer_for(smtp_sink).send(message(to_addr="reader@faß.de", from_addr="news@βόλος.gr"))

    (mail,) = smtp_sink.wait_for(1)
    assert mail.rcpt_tos == ("reader@xn--fa-hia.de",)
    assert mail.mail_from == "news@xn--nxasmm1c.gr"
    assert mail.message["To"].addresses[0].addr_spec == "reader@xn--fa-hia.de"
    assert mail.message["From"].addresses[0].addr_spec == "news@xn--nxasmm1c.gr"


def test_text_only_message_is_a_single_text_part(
    smtp_sink: SmtpSink, mailer_for: Callable[..., SmtpMailer]
) -> None:
    mailer_for(smtp_sink).send(message(html=None, reply_to=None))

    (mail,) = smtp_sink.wait_for(1)
    assert mail.message.get_content_type() == "text/plain"
    assert mail.message["Reply-To"] is None


def test_three_sends_share_one_connection(
    smtp_sink: SmtpSink, mailer_for: Callable[..., SmtpMailer]
) -> None:
    mailer = mailer_for(smtp_sink)

    for n in range(3):
        mailer.send(message(n))

    mails = smtp_sink.wait_for(3)
    assert smtp_sink.connections == 1
    assert {m.connection for m in mails} == {1}
    assert [m.rcpt_tos[0] for m in mails] == [f"reader{n}@example.org" for n in range(3)]


def test_reconnects_once_after_the_server_dropped_the_connection(
    smtp_sink: SmtpSink, mailer_for: Callable[..., SmtpMailer]
) -> None:
    mailer = mailer_for(smtp_sink)
    mailer.send(message(1))
    smtp_sink.drop_connections()

    mailer.send(message(2))

    mails = smtp_sink.wait_for(2)
    assert [m.connection for m in mails] == [1, 2]
    assert smtp_sink.connections == 2


def test_idle_connection_is_checked_with_noop_and_replaced_when_dead(
    smtp_sink: SmtpSink, mailer_for: Callable[..., SmtpMailer]
) -> None:
    mailer = mailer_for(smtp_sink)
    mailer.IDLE_CHECK_AFTER = 0.0  # every reuse counts as idle
    mailer.send(message(1))
    mailer.send(message(2))  # alive: NOOP passes, same connection
    smtp_sink.drop_connections()

    mailer.send(message(3))

    assert [m.connection for m in smtp_sink.wait_for(3)] == [1, 1, 2]


def test_close_quits_and_a_later_send_opens_a_new_connection(
    smtp_sink: SmtpSink, mailer_for: Callable[..., SmtpMailer]
) -> None:
    mailer = mailer_for(smtp_sink)
    mailer.send(message(1))
    mailer.close()

    mailer.send(message(2))

    assert [m.connection for m in smtp_sink.wait_for(2)] == [1, 2]


def test_starttls_with_auth(
    make_smtp_sink: Callable[..., SmtpSink], mailer_for: Callable[..., SmtpMailer]
) -> None:
    sink = make_smtp_sink(security="starttls", auth=("campaigns", "s3cret"))
    mailer = mailer_for(sink, username="campaigns", password="s3cret")

    mailer.send(message())

    (mail,) = sink.wait_for(1)
    assert mail.tls is True
    assert mail.login == "campaigns"


def test_starttls_refuses_a_certificate_it_does_not_trust(
    make_smtp_sink: Callable[..., SmtpSink], mailer_for: Callable[..., SmtpMailer]
) -> None:
    sink = make_smtp_sink(security="starttls")
    mailer = mailer_for(sink, ssl_context=None)  # the system trust store: the test CA is unknown

    with pytest.raises(MailError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        mailer.send(message())
    assert sink.messages == []


def test_implicit_tls_with_auth(
    make_smtp_sink: Callable[..., SmtpSink], mailer_for: Callable[..., SmtpMailer]
) -> None:
    sink = make_smtp_sink(security="tls", auth=("campaigns", "s3cret"))
    mailer = mailer_for(sink, username="campaigns", password="s3cret")

    mailer.send(message())

    (mail,) = sink.wait_for(1)
    assert mail.tls is True
    assert mail.login == "campaigns"


def test_wrong_password_is_permanent(
    make_smtp_sink: Callable[..., SmtpSink], mailer_for: Callable[..., SmtpMailer]
) -> None:
    sink = make_smtp_sink(security="starttls", auth=("campaigns", "s3cret"))
    mailer = mailer_for(sink, username="campaigns", password="wrong")

    with pytest.raises(PermanentMailError, match="535") as info:
        mailer.send(message())

    assert "AUTH" in str(info.value)
    assert sink.auth_failures >= 1  # smtplib tries PLAIN, then LOGIN
    assert sink.messages == []


def test_server_requiring_auth_refuses_an_anonymous_sender_permanently(
    make_smtp_sink: Callable[..., SmtpSink], mailer_for: Callable[..., SmtpMailer]
) -> None:
    sink = make_smtp_sink(auth=("campaigns", "s3cret"))

    with pytest.raises(PermanentMailError, match="530"):
        mailer_for(sink).send(message())


def test_451_is_transient_550_permanent_then_sending_goes_on(
    smtp_sink: SmtpSink, mailer_for: Callable[..., SmtpMailer]
) -> None:
    mailer = mailer_for(smtp_sink)
    smtp_sink.reply_next("451 4.3.0 try later", "550 5.1.1 no such user")

    with pytest.raises(TransientMailError, match=r"451 4.3.0 try later"):
        mailer.send(message(1))
    with pytest.raises(PermanentMailError, match=r"550 5.1.1 no such user"):
        mailer.send(message(2))
    mailer.send(message(3))

    (mail,) = smtp_sink.wait_for(1)
    assert mail.rcpt_tos == ("reader3@example.org",)
    assert smtp_sink.connections == 1  # refusals leave the connection usable


def test_refused_recipient_is_permanent_and_names_it(
    smtp_sink: SmtpSink, mailer_for: Callable[..., SmtpMailer]
) -> None:
    smtp_sink.reply_next("550 5.1.1 mailbox unavailable", command="RCPT")

    with pytest.raises(PermanentMailError, match="RCPT") as info:
        mailer_for(smtp_sink).send(message(7))

    assert "reader7@example.org" in str(info.value)
    assert "550 5.1.1 mailbox unavailable" in str(info.value)


def test_recipient_greylisted_is_transient(
    smtp_sink: SmtpSink, mailer_for: Callable[..., SmtpMailer]
) -> None:
    smtp_sink.reply_next("450 4.2.0 greylisted", command="RCPT")

    with pytest.raises(TransientMailError, match=r"450 4.2.0 greylisted"):
        mailer_for(smtp_sink).send(message())


def test_421_closing_is_transient_and_the_next_send_reconnects(
    smtp_sink: SmtpSink, mailer_for: Callable[..., SmtpMailer]
) -> None:
    mailer = mailer_for(smtp_sink)
    smtp_sink.reply_next("421 4.3.2 shutting down", command="MAIL")

    with pytest.raises(TransientMailError, match="421"):
        mailer.send(message(1))
    mailer.send(message(2))

    assert [m.connection for m in smtp_sink.wait_for(1)] == [2]


def test_connection_refused_is_transient(closed_port: int) -> None:
    mailer = SmtpMailer("127.0.0.1", closed_port, security="none", timeout=5)

    with pytest.raises(TransientMailError, match="ConnectionRefused"):
        mailer.send(message())


def test_silent_server_times_out_as_transient(silent_smtp_server: tuple[str, int]) -> None:
    host, port = silent_smtp_server
    mailer = SmtpMailer(host, port, security="none", timeout=1)

    started = time.monotonic()
    with pytest.raises(TransientMailError, match="timed out after 1s"):
        mailer.send(message())
    # The timeout is the behaviour under test; the margin is generous.
    assert time.monotonic() - started < 10


def test_the_probe_signs_in_over_starttls_and_sends_nothing(
    make_smtp_sink: Callable[..., SmtpSink], mailer_for: Callable[..., SmtpMailer]
) -> None:
    sink = make_smtp_sink(security="starttls", auth=("campaigns", "s3cret"))
    mailer = mailer_for(sink, username="campaigns", password="s3cret")

    answer = mailer.probe(5)

    assert re.fullmatch(
        rf"SMTP 127\.0\.0\.1:{sink.port}: EHLO \S+, STARTTLS, AUTH as campaigns", answer
    ), answer
    assert sink.messages == []
    assert sink.connections == 1
    mailer.send(message())  # the probe's connection was its own: sending opens another
    assert sink.wait_for(1)[0].connection == 2


def test_the_probe_fails_as_a_send_would(
    make_smtp_sink: Callable[..., SmtpSink],
    mailer_for: Callable[..., SmtpMailer],
    silent_smtp_server: tuple[str, int],
) -> None:
    sink = make_smtp_sink(security="starttls", auth=("campaigns", "s3cret"))
    with pytest.raises(PermanentMailError, match="AUTH failed: 535"):
        mailer_for(sink, username="campaigns", password="wrong").probe(5)
    plain = make_smtp_sink()
    with pytest.raises(PermanentMailError, match="does not offer STARTTLS"):
        mailer_for(plain, security="starttls").probe(5)
    host, port = silent_smtp_server
    silent = SmtpMailer(host, port, security="none", timeout=30)
    with pytest.raises(TransientMailError, match=r"timed out after 0\.5s while connecting"):
        silent.probe(0.5)  # the probe's timeout, shorter than the mailer's own


def test_the_maildir_probe_says_it_delivers_nothing(tmp_path: Path) -> None:
    mailer = MaildirMailer(tmp_path / "outbox")
    assert (
        mailer.probe(5) == f"Maildir outbox {tmp_path / 'outbox'} is writable (it delivers nothing)"
    )
    (tmp_path / "outbox" / "new").rmdir()
    with pytest.raises(TransientMailError, match="new is missing or not writable"):
        mailer.probe(5)


class StallingSink(SmtpSink):
    """A real aiosmtpd server that stops answering once, at one command, until released (a
    relay that hangs mid-conversation; the silent server above never greets at all)."""

    def __init__(self, stall_at: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stall_at: str | None = stall_at
        self.release = threading.Event()

    async def _stall(self, command: str) -> None:
        if self.stall_at == command:
            self.stall_at = None
            await asyncio.to_thread(self.release.wait, 30)

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, *args: Any) -> str:
        await self._stall("RCPT")
        return await super().handle_RCPT(server, session, envelope, *args)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        await self._stall("DATA")
        return await super().handle_DATA(server, session, envelope)


@pytest.fixture
def stalling_sink() -> Iterator[Callable[[str], StallingSink]]:
    made: list[StallingSink] = []

    def make(stall_at: str) -> StallingSink:
        sink = StallingSink(stall_at).start()
        made.append(sink)
        return sink

    yield make
    for sink in made:
        sink.release.set()
        sink.stop()


def test_a_server_that_hangs_before_the_data_times_out_and_the_retry_sends_once(
    stalling_sink: Callable[[str], StallingSink], mailer_for: Callable[..., SmtpMailer]
) -> None:
    sink = stalling_sink("RCPT")
    mailer = mailer_for(sink, timeout=1)

    started = time.monotonic()
    with pytest.raises(TransientMailError, match="timed out after 1s"):
        mailer.send(message(1))
    # The timeout is the behaviour under test; the margin is generous.
    assert time.monotonic() - started < 10
    sink.release.set()

    mailer.send(message(1))  # the caller's retry, on a new connection
    (mail,) = sink.wait_for(1)
    assert mail.connection == 2
    time.sleep(0.5)
    assert len(sink.messages) == 1  # the hung transaction delivered nothing


def test_a_server_that_hangs_after_the_data_times_out_as_transient(
    stalling_sink: Callable[[str], StallingSink], mailer_for: Callable[..., SmtpMailer]
) -> None:
    sink = stalling_sink("DATA")
    mailer = mailer_for(sink, timeout=1)

    started = time.monotonic()
    with pytest.raises(TransientMailError, match="timed out after 1s while sending"):
        mailer.send(message(1))
    assert time.monotonic() - started < 10
    # The server had the whole message; a relay may still deliver it although the client saw
    # a timeout, so the mailer does not resend it by itself (the stale and retry policies
    # decide, with the same Message-ID: docs/operations.md). aiosmtpd drops the transaction of
    # a client that went away. The next send takes a new connection.
    sink.release.set()
    mailer.send(message(2))
    (mail,) = sink.wait_for(1)
    assert (mail.connection, str(mail.message["Message-ID"])) == (2, message(2).message_id)
    time.sleep(0.5)
    assert len(sink.messages) == 1


def test_non_ascii_local_part_goes_out_over_smtputf8(
    smtp_sink: SmtpSink, mailer_for: Callable[..., SmtpMailer]
) -> None:
    mailer_for(smtp_sink).send(message(to_addr="jörg@bücher.example"))

    (mail,) = smtp_sink.wait_for(1)
    assert mail.rcpt_tos == ("jörg@xn--bcher-kva.example",)
    assert mail.message["To"].addresses[0].username == "jörg"


def test_invalid_message_is_permanent_and_nothing_is_sent(
    smtp_sink: SmtpSink, mailer_for: Callable[..., SmtpMailer]
) -> None:
    with pytest.raises(PermanentMailError, match="subject"):
        mailer_for(smtp_sink).send(message(subject="hi\r\nBcc: victim@example.net"))

    assert smtp_sink.connections == 0


def test_threads_sending_at_once_all_arrive(
    smtp_sink: SmtpSink, mailer_for: Callable[..., SmtpMailer]
) -> None:
    mailer = mailer_for(smtp_sink)
    threads, per_thread = 6, 5
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def work(t: int) -> None:
        try:
            start.wait()
            for i in range(per_thread):
                mailer.send(message(t * 100 + i))
        except BaseException as exc:
            errors.append(exc)

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join(30)

    assert errors == []
    mails = smtp_sink.wait_for(threads * per_thread)
    ids = sorted(str(m.message["Message-ID"]) for m in mails)
    expected = sorted(
        message_id_for(f"c0123456789ab-{t * 100 + i}", "example.com")
        for t in range(threads)
        for i in range(per_thread)
    )
    assert ids == expected
    # One connection per thread, each reused for that thread's sends.
    assert smtp_sink.connections == threads


# -- configuration by URL ---------------------------------------------------------------------


def test_from_url_decodes_credentials_and_logs_in(make_smtp_sink: Callable[..., SmtpSink]) -> None:
    user, password = "ops@example.com", "p@ss:w/rd%+ ok"
    sink = make_smtp_sink(security="starttls", auth=(user, password))
    url = (
        f"smtp://ops%40example.com:p%40ss%3Aw%2Frd%25%2B%20ok@{sink.host}:{sink.port}"
        "?security=starttls&timeout=4"
    )

    mailer = SmtpMailer.from_url(url, ssl_context=client_ssl_context())
    try:
        mailer.send(message())
    finally:
        mailer.close()

    assert (mailer.username, mailer.timeout, mailer.security) == (user, 4.0, "starttls")
    assert sink.wait_for(1)[0].login == user


@pytest.mark.parametrize(
    ("url", "port", "security"),
    [
        ("smtp://mail.example.com", 587, "starttls"),
        ("smtp://mail.example.com?security=tls", 465, "tls"),
        ("smtp://mail.example.com?security=none", 25, "none"),
        ("smtp://mail.example.com:2525?security=none", 2525, "none"),
    ],
)
def test_from_url_default_ports(url: str, port: int, security: str) -> None:
    mailer = SmtpMailer.from_url(url)

    assert (mailer.host, mailer.port, mailer.security) == ("mail.example.com", port, security)
    assert mailer.username is None
    assert mailer.timeout == 30.0


@pytest.mark.parametrize(
    "url",
    [
        "http://mail.example.com",
        "smtp://",
        "smtp://u:topsecret@mail.example.com?security=ssl",
        "smtp://u:topsecret@mail.example.com?timeout=soon",
        "smtp://u:topsecret@mail.example.com?timeout=0",
        "smtp://u:topsecret@mail.example.com?tls=yes",
        "smtp://u:topsecret@mail.example.com:99999",
        "smtp://u:topsecret@mail.example.com/path",
    ],
)
def test_from_url_refuses_bad_urls_without_echoing_the_password(url: str) -> None:
    with pytest.raises(InvalidField) as info:
        SmtpMailer.from_url(url)

    assert info.value.field == "mailer"
    assert "topsecret" not in str(info.value)


def test_mailer_from_url_builds_each_kind(tmp_path: Path) -> None:
    maildir = mailer_from_url(f"maildir:{tmp_path / 'outbox'}")
    smtp = mailer_from_url("smtp://u:p@mail.example.com:2525?security=tls")

    assert isinstance(maildir, MaildirMailer)
    assert maildir.path == tmp_path / "outbox"
    assert (tmp_path / "outbox" / "new").is_dir()
    assert isinstance(smtp, SmtpMailer)
    assert (smtp.port, smtp.security, smtp.username) == (2525, "tls", "u")


@pytest.mark.parametrize("url", ["", "maildir:", "ses://eu-west-1", "smtps://u:pw@host"])
def test_mailer_from_url_refuses_unknown_kinds(url: str) -> None:
    with pytest.raises(InvalidField) as info:
        mailer_from_url(url)

    assert info.value.field == "mailer"


def test_send_time_date_header_is_utc_safe(
    smtp_sink: SmtpSink, mailer_for: Callable[..., SmtpMailer]
) -> None:
    when = datetime(2026, 10, 25, 0, 30, 0, 999_999, tzinfo=UTC)
    mailer_for(smtp_sink).send(message(date=when))

    (mail,) = smtp_sink.wait_for(1)
    assert parsedate_to_datetime(str(mail.message["Date"])) == when.replace(microsecond=0)


def test_the_envelope_sender_is_mail_from_and_the_from_header_stays(
    smtp_sink: SmtpSink, mailer_for: Callable[..., SmtpMailer]
) -> None:
    mailer = mailer_for(smtp_sink)
    verp = "bounces+c0123456789ab-1.0123456789abcdef0123456789abcdef@example.com"
    mailer.send(message(envelope_from=verp))
    (mail,) = smtp_sink.wait_for(1)
    assert mail.mail_from == verp
    assert mail.message["From"].addresses[0].addr_spec == "news@example.com"
    assert "Return-Path" not in mail.message  # the receiving MTA writes it


@pytest.mark.parametrize(
    "envelope_from", ["Bounces <b@example.com>", "b@example.com\r\nRCPT TO:<x@y>", "nope"]
)
def test_an_envelope_sender_that_is_no_bare_address_is_permanent(
    smtp_sink: SmtpSink, mailer_for: Callable[..., SmtpMailer], envelope_from: str
) -> None:
    with pytest.raises(PermanentMailError, match="envelope_from"):
        mailer_for(smtp_sink).send(message(envelope_from=envelope_from))
    assert smtp_sink.messages == []


def test_a_non_ascii_envelope_sender_goes_out_over_smtputf8(
    smtp_sink: SmtpSink, mailer_for: Callable[..., SmtpMailer]
) -> None:
    """A VERP bounce address with a non-ASCII local part (SENDQUEUE_BOUNCE_ADDRESS accepts one)
    needs SMTPUTF8 even when every header address is ASCII."""
    verp = "rückläufer+c0123456789ab-1.0123456789abcdef0123456789abcdef@example.com"
    mailer_for(smtp_sink).send(message(envelope_from=verp))

    (mail,) = smtp_sink.wait_for(1)
    assert mail.mail_from == verp
