"""The bytes of the emails the send worker builds (outgoing_message, then build_message) are
pinned: work moved out of the per-send path (parsed From, Message-ID domain, header objects)
must not change a byte of a header, the MIME structure, the Message-ID or an encoding."""

from __future__ import annotations

import email.generator
import email.policy
import email.utils
import hashlib
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from email.message import EmailMessage
from zoneinfo import ZoneInfo

import pytest

from sendqueue.adapters.mail.mime import build_message, envelope_of
from sendqueue.domain.models import Campaign, Task
from sendqueue.domain.policy import SendingPolicy, Window
from sendqueue.domain.sender_fields import SENDER_PLACEHOLDERS
from sendqueue.domain.senders import Sender
from sendqueue.domain.unsubscribe import UnsubscribeLinks
from sendqueue.services.config import ServiceConfig
from sendqueue.services.sending.outgoing import outgoing_message

SECRET = "s3cret-key-for-the-pinned-bytes-0123456789"
WHEN = datetime(2026, 5, 4, 8, 15, 30, 250000, tzinfo=UTC)
POLICY = SendingPolicy(
    timezone="UTC", per_day=100, weekdays=frozenset(range(7)), windows=(Window(0, 1440),)
)
CAMPAIGN = Campaign(
    id="c0123456789ab", name="pinned", policy=POLICY, from_addr="Campaign Desk <news@example.com>",
    created_at=WHEN, updated_at=WHEN,
)  # fmt: skip
TASK = Task(
    id="c0123456789ab-7", campaign_id=CAMPAIGN.id, position=7, email="jane@example.org",
    name="Jane Doe", subject="Spring news", text="Hello Jane\n", html=None, send_at=WHEN,
    token="t0k3n",
)  # fmt: skip
PLAIN = ServiceConfig()
SIGNED = ServiceConfig(
    unsubscribe=UnsubscribeLinks("https://mail.example.com", SECRET, "leave@example.com"),
    bounce_address="bounce@example.com",
    secret_key=SECRET,
)
SENDER = Sender(
    id="s1", email="jörg@bücher.example", name="Jörg Müller, Sales", reply_to="desk@example.com",
    signature_text="Jörg\nSales desk", signature_html="<b>Jörg</b>",
)  # fmt: skip
NAME, MAIL, SIG = (SENDER_PLACEHOLDERS[k] for k in ("name", "email", "signature"))


@pytest.fixture(autouse=True)
def _fixed_boundary(monkeypatch: pytest.MonkeyPatch) -> None:
    """Multipart boundaries are random: a fixed one makes the bytes comparable."""
    fixed = classmethod(lambda cls, text=None: "===============0123456789==")
    monkeypatch.setattr(email.generator.Generator, "_make_boundary", fixed)


def _bytes(config: ServiceConfig, campaign: Campaign, task: Task, sender: Sender | None) -> bytes:
    msg = outgoing_message(config, campaign, task, sender, WHEN)
    built = build_message(msg)
    return built.as_bytes() + repr(envelope_of(built, msg.envelope_from)).encode()


def test_a_plain_email_is_these_bytes() -> None:
    assert _bytes(PLAIN, CAMPAIGN, TASK, None) == (
        b"From: Campaign Desk <news@example.com>\r\n"
        b"To: Jane Doe <jane@example.org>\r\n"
        b"Subject: Spring news\r\n"
        b"Date: Mon, 04 May 2026 08:15:30 +0000\r\n"
        b"Message-ID: <c0123456789ab-7@example.com>\r\n"
        b"X-Sendqueue-Task: c0123456789ab-7\r\n"
        b'Content-Type: text/plain; charset="utf-8"\r\n'
        b"Content-Transfer-Encoding: 7bit\r\n"
        b"MIME-Version: 1.0\r\n"
        b"\r\n"
        b"Hello Jane\r\n"
        b"('news@example.com', 'jane@example.org')"
    )


CASES = {
    "plain": (PLAIN, CAMPAIGN, TASK, None),
    "signed": (SIGNED, CAMPAIGN, TASK, None),
    "footer_html": (
        SIGNED,
        replace(CAMPAIGN, unsubscribe_footer=True, reply_to="Replies <r@example.com>"),
        replace(TASK, html="<p>Hello Jane</p>", text="Hello Jane, " + "long line " * 20),
        None,
    ),
    "sender_fields": (
        SIGNED,
        CAMPAIGN,
        replace(
            TASK,
            subject=f"News from {NAME} ({SIG})",
            text=f"Hello\n-- \n{SIG}\n{MAIL}\n",
            html=f"<p>{NAME} &lt;{MAIL}&gt;</p>{SIG}",
            name="Zoë Ünal",
        ),
        SENDER,
    ),
    "utf8_local_part": (PLAIN, CAMPAIGN, replace(TASK, email="zoë@exämple.org"), None),
    "hand_made_id": (SIGNED, CAMPAIGN, replace(TASK, id="handmade"), None),
}

# sha256 of each case's bytes (the message, then its envelope), as main built them before
# the per-send work was moved out.
PINNED = {
    "plain": "6d894148eab3e0ac84c97c6b796da4c77115c595b07162cfa0fe3b1a313f4541",
    "signed": "1c8889e18edde1a17953c2a86268857fdc82caa32e37ff7bdf479fe9e414b8e2",
    "footer_html": "2e50f5292d1bbc6aeea492efc168504fc0d35bf83f22126f7a2d2906d3e96800",
    "sender_fields": "ad2974b95af859ce9264e1244aefd12d3feb916c5175d757c113e512b8362062",
    "utf8_local_part": "fbfbbef03ca29ad81fb95857236b8d6687b8817c3b96861f35a5a7c63131bd8c",
    "hand_made_id": "534acd84b813aa9c59d34d2235470b54f0192aae9474a7427cf4210f2baa8a61",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_email_keeps_its_bytes(case: str) -> None:
    first = _bytes(*CASES[case])
    assert hashlib.sha256(first).hexdigest() == PINNED[case]
    assert _bytes(*CASES[case]) == first  # the second email of a campaign: caches warm


@pytest.mark.parametrize(
    "when",
    [
        WHEN,
        WHEN.astimezone(ZoneInfo("Europe/Berlin")),
        WHEN.astimezone(ZoneInfo("America/St_Johns")),
        WHEN.replace(tzinfo=timezone(timedelta(hours=1, seconds=30))),
    ],
)
def test_the_date_header_is_the_one_its_text_makes(when: datetime) -> None:
    msg = replace(outgoing_message(PLAIN, CAMPAIGN, TASK, None, when), date=when)
    reference = EmailMessage(policy=email.policy.SMTP)  # the text, set and parsed back
    reference["Date"] = email.utils.format_datetime(when.replace(microsecond=0))
    expected = reference.as_bytes().partition(b"\r\n")[0] + b"\r\n"
    for _ in range(2):  # the second email of the same second reuses its header
        built = build_message(msg)
        assert expected in built.as_bytes()
        assert expected.replace(b"\r\n", b"\n") in built.as_bytes(
            policy=built.policy.clone(linesep="\n")
        )
