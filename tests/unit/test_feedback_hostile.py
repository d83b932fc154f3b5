"""Red team: feedback an outsider can make slow or make fail. Anyone can mail the feedback
mailbox, so a message made to stall the parser (bench/hostile_mail.py: addresses by the ten
thousand, tiny headers by the hundred thousand, parts nested hundreds deep...) must parse in
time that grows linearly, and a part or encoded word in a charset that decodes no text must
still be read (as UTF-8), never raise."""

from __future__ import annotations

from bench.hostile_mail import shape

from sendqueue.domain.feedback import FeedbackKind
from sendqueue.domain.mailparts import MAX_ADDRESS_TEXT, addresses
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
