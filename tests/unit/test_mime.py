"""build_message and message_id_for: the MIME every mailer sends."""

from __future__ import annotations

import email
import email.policy
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from email.header import decode_header, make_header
from email.message import EmailMessage
from email.utils import parsedate_to_datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sendqueue.adapters.mail.mime import build_message, envelope_addresses, needs_smtputf8
from sendqueue.domain.addresses import FALLBACK_DOMAIN, message_id_for
from sendqueue.domain.errors import InvalidField
from sendqueue.ports import OutgoingMessage

WHEN = datetime(2026, 5, 4, 10, 15, 30, tzinfo=timezone(timedelta(hours=2)))


def outgoing(**changes: object) -> OutgoingMessage:
    base = OutgoingMessage(
        message_id="<c00ffee00001-3@example.com>",
        from_addr="Campaign Desk <news@example.com>",
        to_addr="jane@example.org",
        to_name="Jane Doe",
        subject="Spring news",
        text="Hello Jane\n",
        date=WHEN,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def reparse(msg: EmailMessage) -> EmailMessage:
    """What a receiver parses from the bytes on the wire."""
    raw = msg.as_bytes().replace(b"\r\n", b"\n")
    return email.message_from_bytes(raw, policy=email.policy.default)


def test_headers_are_set_from_the_message() -> None:
    msg = outgoing(reply_to="help@example.com", headers={"X-Campaign": "c00ffee00001"})

    parsed = reparse(build_message(msg))

    assert parsed["From"].addresses[0].display_name == "Campaign Desk"
    assert parsed["From"].addresses[0].addr_spec == "news@example.com"
    assert parsed["Reply-To"].addresses[0].addr_spec == "help@example.com"
    assert str(parsed["To"]) == "Jane Doe <jane@example.org>"
    assert str(parsed["Subject"]) == "Spring news"
    assert parsedate_to_datetime(str(parsed["Date"])) == WHEN
    assert str(parsed["Date"]) == "Mon, 04 May 2026 10:15:30 +0200"
    assert str(parsed["Message-ID"]) == "<c00ffee00001-3@example.com>"
    assert str(parsed["X-Campaign"]) == "c00ffee00001"
    assert parsed.get_content_type() == "text/plain"
    assert parsed.get_content() == "Hello Jane\n"


def test_headers_appear_in_a_fixed_order_with_extra_ones_last() -> None:
    msg = outgoing(reply_to="help@example.com", headers={"X-B": "2", "X-A": "1"})

    names = list(build_message(msg).keys())

    assert names[:6] == ["From", "Reply-To", "To", "Subject", "Date", "Message-ID"]
    assert names.index("X-B") < names.index("X-A")


def test_without_reply_to_there_is_no_such_header() -> None:
    assert build_message(outgoing())["Reply-To"] is None


def test_html_makes_a_multipart_alternative_text_first() -> None:
    parsed = reparse(build_message(outgoing(html="<p>Hello <i>Jane</i></p>")))

    assert parsed.get_content_type() == "multipart/alternative"
    parts = list(parsed.iter_parts())
    assert [p.get_content_type() for p in parts] == ["text/plain", "text/html"]
    assert parts[0].get_content() == "Hello Jane\n"
    assert parts[1].get_content() == "<p>Hello <i>Jane</i></p>\n"


def test_non_ascii_names_and_subject_are_encoded_and_round_trip() -> None:
    msg = outgoing(
        from_addr="Jörg Ünal <jorg@example.com>",
        to_name="Zoë Ångström",
        subject="Grüße — 你好",
        text="Grüße\n",
    )

    built = build_message(msg)
    parsed = reparse(built)

    head, _, body = built.as_bytes().partition(b"\r\n\r\n")
    assert head.isascii()
    assert body.isascii()  # 7-bit safe body (quoted-printable), no 8BITMIME needed
    assert not needs_smtputf8(built)
    assert parsed["From"].addresses[0].display_name == "Jörg Ünal"
    assert parsed["To"].addresses[0].display_name == "Zoë Ångström"
    assert str(parsed["Subject"]) == "Grüße — 你好"
    # A text part's canonical form has CRLF line ends; a base64 body keeps them when decoded.
    assert parsed.get_content().replace("\r\n", "\n") == "Grüße\n"


@pytest.mark.parametrize("name", ["Doe, Jane", 'Jane "JD" Doe', "O'Brien (Sales)", "a@b <c>"])
def test_display_names_with_specials_are_quoted(name: str) -> None:
    parsed = reparse(build_message(outgoing(to_name=name)))

    assert parsed["To"].addresses[0].display_name == name
    assert parsed["To"].addresses[0].addr_spec == "jane@example.org"
    assert len(parsed["To"].addresses) == 1


def test_a_long_non_ascii_name_is_folded_into_valid_encoded_words() -> None:
    name = "Zoë Ångström-Johansson, Geschäftsführerin der Müller & Söhne GmbH, Köln"

    raw = build_message(outgoing(to_name=name)).as_bytes().decode("ascii")
    header = raw.split("To: ", 1)[1].split("\r\nSubject:", 1)[0]

    assert all(len(line) <= 78 for line in raw.split("\r\n"))
    # An RFC 2047 decoder ignores the whitespace between adjacent encoded words. (The modern
    # email parser does not, CPython's bug, so decode with the older API here.)
    assert str(make_header(decode_header(header.replace("\r\n", "")))) == (
        f"{name} <jane@example.org>"
    )


def test_idna_domain_is_encoded_and_ascii_mail_needs_no_smtputf8() -> None:
    msg = outgoing(to_addr="jane@bücher.example")

    built = build_message(msg)

    assert built["To"].addresses[0].domain == "xn--bcher-kva.example"
    assert envelope_addresses(msg) == ("news@example.com", "jane@xn--bcher-kva.example")
    assert not needs_smtputf8(built)


def test_non_ascii_local_part_needs_smtputf8() -> None:
    msg = outgoing(to_addr="jörg@example.org")

    built = build_message(msg)

    assert needs_smtputf8(built)
    assert "jörg@example.org".encode() in built.as_bytes()
    assert envelope_addresses(msg)[1] == "jörg@example.org"


@given(
    st.text(
        alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), max_size=300
    ).filter(lambda s: s == s.strip())
)
def test_any_subject_round_trips(subject: str) -> None:
    parsed = reparse(build_message(outgoing(subject=subject)))

    assert str(parsed["Subject"]) == subject


# -- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"subject": "Hi\r\nBcc: victim@example.net"}, "subject"),
        ({"subject": "Hi\nBcc: victim@example.net"}, "subject"),
        ({"subject": "Hi\rthere"}, "subject"),
        ({"to_name": "Jane\r\nBcc: victim@example.net"}, "to_name"),
        ({"to_addr": "jane@example.org\r\nBcc: victim@example.net"}, "to_addr"),
        ({"from_addr": "News <news@example.com>\nBcc: v@example.net"}, "from_addr"),
        ({"reply_to": "help@example.com\r\nBcc: v@example.net"}, "reply_to"),
        ({"message_id": "<a@b>\r\nBcc: v@example.net"}, "message_id"),
        ({"headers": {"X-Tag": "ok\r\nBcc: v@example.net"}}, "X-Tag"),
        ({"subject": "vertical\x0btab"}, "subject"),
        ({"subject": "next\x85line"}, "subject"),
        ({"to_name": "line\u2028separator"}, "to_name"),
    ],
)
def test_line_breaks_in_a_header_are_refused_naming_it(
    changes: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidField) as info:
        build_message(outgoing(**changes))

    assert info.value.field == field
    assert field in str(info.value)


def test_a_tab_in_a_subject_is_allowed() -> None:
    assert str(reparse(build_message(outgoing(subject="a\tb")))["Subject"]) == "a\tb"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"to_addr": "not-an-address"}, "to_addr"),
        ({"to_addr": "a@example.org, b@example.org"}, "to_addr"),
        ({"to_addr": "jane doe@example.org"}, "to_addr"),
        ({"from_addr": ""}, "from_addr"),
        ({"from_addr": "News <news@exa mple.com>"}, "from_addr"),
        ({"reply_to": "nobody"}, "reply_to"),
        ({"message_id": "c00ffee00001-3@example.com"}, "message_id"),
        ({"message_id": "<no-at-sign>"}, "message_id"),
        ({"message_id": "<a b@example.com>"}, "message_id"),
        ({"date": datetime(2026, 5, 4, 10, 15)}, "date"),
        ({"headers": {"Bcc": "victim@example.net"}}, "Bcc"),
        ({"headers": {"subject": "override"}}, "subject"),
        ({"headers": {"Bad Name": "x"}}, "Bad Name"),
        ({"headers": {"X-Colon:": "x"}}, "X-Colon:"),
    ],
)
def test_malformed_fields_are_refused(changes: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidField) as info:
        build_message(outgoing(**changes))

    assert info.value.field == field


# -- message_id_for ---------------------------------------------------------------------------


def test_message_id_for_is_derived_from_the_task_id() -> None:
    first = message_id_for("c00ffee00001-3", "example.com")

    assert first == "<c00ffee00001-3@example.com>"
    assert message_id_for("c00ffee00001-3", "example.com") == first
    assert message_id_for("c00ffee00001-4", "example.com") != first


@pytest.mark.parametrize(
    ("domain", "expected"),
    [
        ("Example.COM", "<t-1@example.com>"),
        ("Campaign Desk <news@mail.example.com>", "<t-1@mail.example.com>"),
        ("news@example.com", "<t-1@example.com>"),
        ("bücher.example", "<t-1@xn--bcher-kva.example>"),
        ("", f"<t-1@{FALLBACK_DOMAIN}>"),
        ("not a domain", f"<t-1@{FALLBACK_DOMAIN}>"),
        ("localhost", "<t-1@localhost>"),
    ],
)
def test_message_id_for_takes_the_senders_domain_or_falls_back(domain: str, expected: str) -> None:
    assert message_id_for("t-1", domain) == expected


def test_message_id_for_output_is_accepted_by_build_message() -> None:
    mid = message_id_for("c00ffee00001-3", "Campaign Desk <news@example.com>")

    assert str(build_message(outgoing(message_id=mid))["Message-ID"]) == mid


@pytest.mark.parametrize("task_id", ["", "a b", "a@b", "<a>", "tä", "a\r\nb"])
def test_message_id_for_refuses_unusable_task_ids(task_id: str) -> None:
    with pytest.raises(InvalidField) as info:
        message_id_for(task_id, "example.com")

    assert info.value.field == "task_id"


def test_date_keeps_the_offset_and_drops_fractions() -> None:
    when = datetime(2026, 1, 1, 12, 0, 0, 750_000, tzinfo=UTC)

    assert str(build_message(outgoing(date=when))["Date"]) == "Thu, 01 Jan 2026 12:00:00 +0000"


# -- IDNA 2008 ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("to_addr", "ascii_addr"),
    [("jane@faß.de", "jane@xn--fa-hia.de"), ("jane@βόλος.gr", "jane@xn--nxasmm1c.gr")],
)
def test_the_to_header_and_envelope_name_the_idna_2008_domain(
    to_addr: str, ascii_addr: str
) -> None:
    """IDNA 2003 (Python's codec) would send these to jane@fass.de and jane@xn--nxasmq6b.gr."""
    msg = outgoing(to_addr=to_addr, from_addr=f"News <news@{to_addr.split('@')[1]}>")

    built = build_message(msg)

    assert built["To"].addresses[0].addr_spec == ascii_addr
    assert built["From"].addresses[0].domain == ascii_addr.split("@")[1]
    assert envelope_addresses(msg) == (f"news@{ascii_addr.split('@')[1]}", ascii_addr)
    assert not needs_smtputf8(built)


def test_a_domain_idna_2008_refuses_is_an_invalid_field_naming_the_address() -> None:
    with pytest.raises(InvalidField) as refused:
        build_message(outgoing(to_addr="jane@a\u200db.de"))

    assert refused.value.field == "to_addr"
    assert "IDNA 2008" in refused.value.reason


# -- the From as a structured name and address --------------------------------------------------

FROM_NAMES = ["Doe, John", "News: Weekly", "Zoë Ünal-Çelik", 'Say "hi" (team)', "a@b <c>"]


@pytest.mark.parametrize("name", FROM_NAMES)
def test_a_from_name_given_apart_parses_back_to_exactly_that_name(name: str) -> None:
    message = outgoing(from_addr="news@example.org", from_name=name)

    parsed = reparse(build_message(message))

    (sender,) = parsed["From"].addresses
    assert (sender.display_name, sender.addr_spec) == (name, "news@example.org")
    assert build_message(message).as_bytes().isascii()  # quoted or RFC 2047-encoded
    assert envelope_addresses(message)[0] == "news@example.org"


def test_a_from_without_a_name_is_the_bare_address() -> None:
    parsed = reparse(build_message(outgoing(from_addr="news@example.org", from_name="")))

    assert str(parsed["From"]) == "news@example.org"


@pytest.mark.parametrize(
    "from_addr", ['"Doe, John" <john@example.org>', '"News: Weekly" <news@example.org>']
)
def test_a_campaign_from_string_with_a_quoted_name_keeps_working(from_addr: str) -> None:
    (sender,) = reparse(build_message(outgoing(from_addr=from_addr)))["From"].addresses

    assert f'"{sender.display_name}" <{sender.addr_spec}>' == from_addr


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"from_addr": "Doe, John <john@example.org>"}, "from_addr"),
        ({"from_addr": "News: Weekly <news@example.org>"}, "from_addr"),
        ({"from_addr": "news@example.org", "from_name": "Bad\r\nBcc: x@example.net"}, "from_name"),
    ],
)
def test_an_unquoted_name_that_would_change_the_from_is_refused(
    changes: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidField) as info:
        build_message(outgoing(**changes))

    assert info.value.field == field
