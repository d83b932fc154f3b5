"""Red team: feedback an outsider can make slow or make fail. Anyone can mail the feedback
mailbox, so a message made to stall the parser (bench/hostile_mail.py: addresses by the ten
thousand, tiny headers by the hundred thousand, parts nested hundreds deep...) must parse in
time that grows linearly, and a part or encoded word in a charset that decodes no text must
still be read (as UTF-8), never raise."""

from __future__ import annotations

from bench.hostile_mail import shape

from sendqueue.domain.feedback import FeedbackKind
from sendqueue.domain.mailparts import (
    MAX_ADDRESS_TEXT,
    MAX_DEPTH,
    MAX_HEADERS,
    MAX_LINES,
    MAX_NESTING,
    addresses,
    header,
    own_parts,
    parse_message,
)
from sendqueue.domain.reports import MAX_ITEMS
from tests.unit.test_reports import T, check_items, fixture, parse, summary

H, R = FeedbackKind.HARD_BOUNCE, FeedbackKind.REPLY
KIB = 1 << 10


# --- what the bounds keep: first-seen order, at most MAX_ITEMS, the report before the cut ------


def test_addresses_keep_the_first_seen_order_without_duplicates_up_to_the_limit() -> None:
    values = ["b@x.example, a@x.example", "Anna <a@x.example>, c@x.example", "d@x.example"]
    assert addresses(values) == ["b@x.example", "a@x.example", "c@x.example", "d@x.example"]
    assert addresses(values, limit=3) == ["b@x.example", "a@x.example", "c@x.example"]
    assert addresses(values, limit=1) == ["b@x.example"]
    late = ["x" * MAX_ADDRESS_TEXT, "late@x.example"]
    assert addresses(late) == []  # past the text addresses() reads


def test_a_text_bounce_of_thousands_of_addresses_gives_the_first_max_items_once_each() -> None:
    raw = shape("text_bounce_lines", 64 * KIB)
    raw = raw.replace(b"  user3@example.org\r\n", b"  user3@example.org\r\n  user1@example.org\r\n")
    items = parse(raw, verp=False)
    assert len(items) == MAX_ITEMS
    assert [i.recipient for i in items] == [f"user{n}@example.org" for n in range(MAX_ITEMS)]
    assert {i.kind for i in items} == {H}
    check_items(items)


def test_a_reply_from_headers_full_of_addresses_is_from_the_first() -> None:
    items = parse(shape("from_addresses", 256 * KIB))
    assert [(i.kind, i.recipient) for i in items] == [(R, "user0@example.org")]


def test_a_dsn_names_its_verp_address_before_thousands_of_other_addresses() -> None:
    raw = fixture("postfix-hard-bounce.eml")
    crowd = b"To: " + b", ".join(b"user%d@example.org" % i for i in range(20_000)) + b"\n"
    raw = raw.replace(b"Auto-Submitted:", crowd + b"Auto-Submitted:")
    assert summary(parse(raw)) == [(H, T + "1", "nobody@example.org")]


def test_a_report_is_read_before_a_returned_message_longer_than_the_lines_read() -> None:
    marker = b"List-Unsubscribe-Post: List-Unsubscribe=One-Click\n"
    raw = fixture("postfix-hard-bounce.eml")
    assert raw.count(marker) == 1
    raw = raw.replace(marker, marker + b"\n" + b"a body line\n" * (2 * MAX_LINES))
    assert summary(parse(raw)) == [(H, T + "1", "nobody@example.org")]
    assert summary(parse(raw, verp=False)) == [(H, T + "1", "nobody@example.org")]


def test_what_comes_after_the_lines_read_is_not_read() -> None:
    # (read in chunks of 8 kB: a few thousand lines more may be read)
    filler = b"--b\nContent-Type: text/plain\n\n" + b"x\n" * (MAX_LINES + 10_000)
    report = (
        b"--b\nContent-Type: message/delivery-status\n\n"
        b"Final-Recipient: rfc822; a@b.example\nAction: failed\nStatus: 5.1.1\n\n--b--\n"
    )
    head = b"From: x@y.example\nContent-Type: multipart/report; report-type=delivery-status;"
    head += b" boundary=b\n\n"
    assert summary(parse(head + report, verp=False)) == [(H, None, "a@b.example")]
    assert parse(head + filler + report, verp=False) == []


def test_only_the_first_max_headers_headers_are_kept() -> None:
    raw = b"".join(b"X-%d: v\n" % i for i in range(MAX_HEADERS)) + b"Subject: late\n\nhi\n"
    msg = parse_message(raw)
    assert msg is not None and len(msg) == MAX_HEADERS
    assert header(msg, "x-0") == "v" and header(msg, "subject") == ""


def test_multiparts_below_max_depth_stay_text_and_deeper_nesting_gives_nothing() -> None:
    head = b"Content-Type: multipart/mixed; boundary=b0\n\n"
    body = b"".join(
        b"--b%d\nContent-Type: multipart/mixed; boundary=b%d\n\n" % (i, i + 1)
        for i in range(MAX_DEPTH + 5)
    )
    msg = parse_message(head + body)
    assert msg is not None
    deepest = list(own_parts(msg))[-1]
    assert deepest.get_content_type() == "multipart/mixed"
    assert isinstance(deepest.get_payload(), str)  # the rest, as text
    assert len(list(own_parts(msg))) == MAX_DEPTH + 1
    nested = b"From: a@b.example\nContent-Type: message/rfc822\n\n"
    assert parse_message(nested * MAX_NESTING) is not None
    assert parse_message(nested * (MAX_NESTING + 1)) is None
    assert parse(nested * (MAX_NESTING + 1)) == []
