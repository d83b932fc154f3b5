"""build_message's shortcuts give the bytes the plain email-package path gives.

build_message reuses the campaign's From / Reply-To header objects, sets a text body without
``set_content``, builds plain To, Subject and Message-ID headers without the parser, and
remembers header classes per name. The reference here builds
the same message the straightforward way (stock policy and registry, ``set_content``, every
address parsed each time) and the two must be byte for byte the same.
"""

from __future__ import annotations

import email.policy
import email.utils
import re
from dataclasses import replace
from datetime import UTC, datetime
from email.headerregistry import Address
from email.message import EmailMessage

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sendqueue.adapters.mail.mime import build_message, envelope_addresses, envelope_of
from sendqueue.domain.errors import InvalidField

WHEN = datetime(2026, 5, 4, 8, 15, 30, 250000, tzinfo=UTC)


def outgoing(**changes: object):  # type: ignore[no-untyped-def]
    from sendqueue.ports import OutgoingMessage

    base = OutgoingMessage(
        message_id="<task0001@example.com>",
        from_addr="Campaign Desk <news@example.com>",
        to_addr="jane@example.org",
        to_name="Jane Doe",
        subject="Spring news",
        text="Hello Jane\n",
        date=WHEN,
        headers={"X-Sendqueue-Task": "task0001"},
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def _mailbox(value: str, name: str | None = None) -> Address:
    parsed_name, spec = email.utils.getaddresses([value])[0]
    local, _, domain = spec.rpartition("@")
    return Address(
        display_name=parsed_name if name is None else name,
        username=local,
        domain=domain.encode("idna").decode("ascii"),
    )


def reference(msg) -> bytes:  # type: ignore[no-untyped-def]
    return reference_message(msg).as_bytes()


def reference_message(msg) -> EmailMessage:  # type: ignore[no-untyped-def]
    """The message built the plain way, with the stock SMTP policies."""
    recipient = _mailbox(msg.to_addr, msg.to_name)
    sender = _mailbox(msg.from_addr)
    reply_to = _mailbox(msg.reply_to) if msg.reply_to else None
    utf8 = any(
        not a.username.isascii() for a in [sender, recipient] + ([reply_to] if reply_to else [])
    )
    policy = (email.policy.SMTPUTF8 if utf8 else email.policy.SMTP).clone(cte_type="7bit")
    out = EmailMessage(policy=policy)
    out["From"] = sender
    if reply_to is not None:
        out["Reply-To"] = reply_to
    out["To"] = recipient
    out["Subject"] = msg.subject
    out["Date"] = email.utils.format_datetime(msg.date.replace(microsecond=0))
    out["Message-ID"] = msg.message_id
    for name, value in msg.headers.items():
        out[name] = value
    out.set_content(msg.text, subtype="plain", charset="utf-8")
    if msg.html is not None:
        out.add_alternative(msg.html, subtype="html", charset="utf-8")
    return out


@pytest.mark.parametrize(
    "text",
    [
        "Hello Jane\n",
        "Hello Jane",
        "",
        "\n",
        "one\r\ntwo\rthree\nfour\n\n",
        "x" * 78,
        "x" * 79,  # longer than a line may be: quoted-printable
        "a\x0bvertical tab and \x0cform feed stay inside their line",
        "From the start of a line\n.\n",
        "Grüße\n",  # not ASCII: quoted-printable
    ],
)
def test_text_bodies_are_the_bytes_set_content_gives(text: str) -> None:
    msg = outgoing(text=text)

    assert build_message(msg).as_bytes() == reference(msg)


@given(st.text(alphabet=st.sampled_from("ab \t\r\n.=é-€😀"), max_size=400))
def test_any_text_body_is_the_bytes_set_content_gives(text: str) -> None:
    msg = outgoing(text=text)

    assert build_message(msg).as_bytes() == reference(msg)


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"reply_to": "Help Desk <help@example.com>"},
        {"from_addr": "Jörg Ünal <jorg@bücher.example>", "to_name": "Zoë Ångström"},
        {"from_addr": "news@example.com", "to_addr": "jörg@example.org"},  # SMTPUTF8
        {"to_name": 'Jane "JD" Doe, Sales'},
        {"html": "<p>Hello</p>"},
        {"subject": "A long subject " * 8},
    ],
)
def test_messages_are_the_bytes_of_the_plain_path(changes: dict[str, str]) -> None:
    msg = outgoing(**changes)

    built = build_message(msg)

    # a multipart boundary is random
    def same(raw: bytes) -> bytes:
        return re.sub(rb"=+\d+==", b"BOUNDARY", raw)

    assert same(built.as_bytes()) == same(reference(msg))
    assert envelope_of(built) == envelope_addresses(msg)


def test_a_reused_sender_header_belongs_to_its_own_campaign() -> None:
    first = build_message(outgoing(from_addr="A <a@example.com>"))
    second = build_message(outgoing(from_addr="B <b@example.com>"))
    again = build_message(outgoing(from_addr="A <a@example.com>", reply_to="r@example.com"))

    assert str(first["From"]) == "A <a@example.com>"
    assert str(second["From"]) == "B <b@example.com>"
    assert str(again["From"]) == "A <a@example.com>"
    assert str(again["Reply-To"]) == "r@example.com"
    assert envelope_of(second) == ("b@example.com", "jane@example.org")


# Plain-looking text near the edges: atext symbols, specials, dots, "=?", double spaces, and
# lengths around the 78-character line.
_PLAINISH = st.text(alphabet=st.sampled_from("aZ09 .!#'=?-_~\"(),"), min_size=1, max_size=90)


@given(
    name=_PLAINISH,
    subject=_PLAINISH,
    local=st.text(alphabet=st.sampled_from("aZ09.!#'=?-_~"), min_size=1, max_size=80),
)
def test_plain_to_subject_and_message_id_are_the_bytes_of_the_parsed_path(
    name: str, subject: str, local: str
) -> None:
    """To, Subject and Message-ID that go out without the header parser when they are plain
    and fit one line: the same bytes as the parsed path's, whatever the text."""
    name, subject = name.strip(), subject.strip() or "x"
    message_id = f"<{local}@example.com>"
    try:
        msg = outgoing(to_name=name or None, subject=subject, message_id=message_id)
        built = build_message(msg)
    except InvalidField:
        return  # refused alike, whichever path: not what this test compares
    assert built.as_bytes() == reference(msg)
    expected = reference_message(msg)
    for name in ("To", "Subject", "Message-ID"):
        assert str(built[name]) == str(expected[name])
    assert built["To"].addresses == expected["To"].addresses
    assert envelope_of(built) == envelope_addresses(msg)


def test_the_comparison_above_covers_the_plain_headers() -> None:
    """A plain To, Subject and Message-ID skip the parser (else the test above proves nothing);
    one that is not plain, or longer than a line, does not."""
    from sendqueue.adapters.mail.mime import _PlainHeader

    plain = build_message(outgoing(to_name="Jane Doe", subject="Spring news"))
    quoted = build_message(outgoing(to_name="Jane D. Doe", subject="Spring: news " + "x" * 70))

    assert all(isinstance(plain[n], _PlainHeader) for n in ("To", "Subject", "Message-ID"))
    assert not any(isinstance(quoted[n], _PlainHeader) for n in ("To", "Subject"))
