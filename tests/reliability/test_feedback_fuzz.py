"""Fuzzing the feedback parser with hostile messages (hypothesis): random headers holding
addresses by the thousand and encoded words in any charset, random MIME trees (multiparts,
attached messages, delivery-status and feedback-report blocks, plain-text bounces) with random
charsets and transfer encodings, and random bytes in bodies.

Whatever the message, :func:`parse_feedback` returns a list of at most ``MAX_ITEMS`` Feedback
items (of storable text: ``check_items`` of tests/unit/test_reports.py), never raises, and
spends CPU time in proportion to the message's size (a generous bound: ten times what the
slowest shape of bench/hostile_mail.py takes per byte, plus a constant; the quadratic parser
took twice to five times this bound already at 100 kB).

Hypothesis runs ``EXAMPLES`` examples (more with ``SENDQUEUE_FUZZ_EXAMPLES=N``).
"""

from __future__ import annotations

import base64
import gc
import os
import quopri
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sendqueue.domain.reports import MAX_ITEMS, parse_feedback
from tests.unit.test_reports import RECEIVED, check_items

EXAMPLES = int(os.environ.get("SENDQUEUE_FUZZ_EXAMPLES", "100"))
SECRET = "feedback-fuzz-secret-0123456789abcdef"
BOUNCES = "bounces@mail.example.net"
#: CPU seconds a parse may take: a constant, and this much per byte of the message.
CONSTANT_S = 0.05
PER_BYTE_S = 2e-6

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

CHARSETS = st.sampled_from(
    ["utf-8", "us-ascii", "latin-1", "utf-16", "utf-7", "gb18030", "iso-2022-jp",
     "unicode_escape", "idna", "undefined", "punycode", "rot13", "base64", "hex", "zlib",
     "x-no-such-charset", "", "utf-8\x00", "utf-8'en'"]
)  # fmt: skip
ADDRESSES = st.sampled_from(
    ["anna@example.org", "Anna <anna@example.org>", '"Doe, J" <j@example.org>',
     "MAILER-DAEMON@mx.example.org", "postmaster@x.example", "<>", "a@", "@b", "(c) d@e.example",
     "bounces+c0a1b2c3d4e5f-1.0839bbb0683ad4fd73f5de68a6f7d31c@mail.example.net",
     "bounces+c0a1b2c3d4e5f-1.00000000000000000000000000000000@mail.example.net",
     "\u00e4@b.example", "((((", "<<<@>>>", "a@b@c", '"@"@x.example']
)  # fmt: skip
WORDS = st.sampled_from(
    ["Undelivered Mail", "Warning: message", "delayed", "unsubscribe", "Re:", "Out of Office",
     "c0a1b2c3d4e5f-2", "<c0a1b2c3d4e5f-2@shop.example.com>", "=?", "?=", "=?utf-8?q?a",
     "permanent error", "550 5.1.1", "4.2.2", "\u00e9", "\t", ";", '"', "(", "\\"]
)  # fmt: skip
HEADER_NAMES = st.sampled_from(
    ["From", "To", "Cc", "Sender", "Return-Path", "Delivered-To", "X-Original-To", "Subject",
     "References", "In-Reply-To", "Message-ID", "Auto-Submitted", "Precedence", "Date",
     "X-Sendqueue-Task", "List-Unsubscribe", "X-Autoreply", "X-Junk"]
)  # fmt: skip


@st.composite
def encoded_words(draw: st.DrawFn) -> str:
    """An RFC 2047 word in a random charset, its text valid or junk, sometimes unterminated."""
    charset = draw(CHARSETS.filter(lambda c: "\x00" not in c))
    data = draw(st.binary(max_size=30))
    if draw(st.booleans()):
        kind, text = "b", base64.b64encode(data).decode()
    else:
        kind, text = "q", quopri.encodestring(data, header=True).decode().replace("\n", "")
    text = draw(st.sampled_from([text, text[:-1], text + "!", "***"]))
    return f"=?{charset}?{kind}?{text}" + draw(st.sampled_from(["?=", "?=", "", "?"]))


@st.composite
def header_values(draw: st.DrawFn) -> str:
    """A header value: pieces (addresses, encoded words, words, random text), and sometimes a
    run of thousands of distinct or repeated addresses."""
    pieces = draw(st.lists(ADDRESSES | encoded_words() | WORDS | st.text(max_size=20), max_size=6))
    value = draw(st.sampled_from([", ", " ", ""])).join(pieces)
    many = draw(st.integers(0, 3_000) if draw(st.integers(0, 4)) == 0 else st.just(0))
    if many:
        distinct = draw(st.booleans())
        value += ", ".join(f"u{i if distinct else 0}@x.example" for i in range(many))
    return value.replace("\r", " ").replace("\n", " ")


@st.composite
def headers(draw: st.DrawFn) -> str:
    """A header block: a few random headers, and at times thousands of tiny ones before or
    after them."""
    named = draw(st.lists(st.tuples(HEADER_NAMES, header_values()), max_size=8))
    lines = [f"{name}: {value}\r\n" for name, value in named]
    junk = draw(st.integers(0, 5_000) if draw(st.integers(0, 6)) == 0 else st.just(0))
    tiny = [f"X-{i % 7}: {i}\r\n" for i in range(junk)]
    return "".join(tiny + lines if draw(st.booleans()) else lines + tiny)


@st.composite
def report_blocks(draw: st.DrawFn) -> str:
    """Delivery-status or feedback-report fields, blocks by the thousand at times."""
    count = draw(st.integers(1, 3) if draw(st.booleans()) else st.integers(1, 2_000))
    action = draw(st.sampled_from(["failed", "delayed", "delivered", "", "x"]))
    status = draw(st.sampled_from(["5.1.1", "4.2.2", "2.0.0", "", "9.9"]))
    blank = draw(st.sampled_from(["\r\n", ""]))  # DSN blocks, or ARF fields in one block
    return "Feedback-Type: abuse\r\nReporting-MTA: dns; mx.example.org\r\n\r\n" + "".join(
        f"Final-Recipient: rfc822; u{i}@x.example\r\nOriginal-Rcpt-To: <u{i}@x.example>\r\n"
        f"Action: {action}\r\nStatus: {status}\r\n{blank}"
        for i in range(count)
    )


@st.composite
def bounce_text(draw: st.DrawFn) -> str:
    """A plain-text bounce's explanation naming failed addresses, one a line."""
    count = draw(st.integers(0, 5) if draw(st.booleans()) else st.integers(0, 3_000))
    distinct = draw(st.integers(1, 3_000))  # addresses repeat after this many
    lines = "".join(f"  u{i % distinct}@x.example\r\n" for i in range(count))
    return (
        "This message was created automatically by mail delivery software.\r\n"
        "This is a permanent error. The following address(es) failed:\r\n\r\n" + lines
    )


LEAF_TYPES = st.sampled_from(
    ["text/plain", "text/html", "text/rfc822-headers", "message/delivery-status",
     "message/feedback-report", "application/octet-stream", "multipart/mixed"]
)  # fmt: skip
TRANSFER = st.sampled_from(["", "7bit", "8bit", "base64", "quoted-printable", "x-uuencode"])


@st.composite
def leaves(draw: st.DrawFn) -> str:
    kind = draw(LEAF_TYPES)
    charset = draw(st.none() | CHARSETS)
    cte = draw(TRANSFER)
    body = draw(
        st.binary(max_size=300).map(lambda b: b.decode("latin-1"))
        | report_blocks()
        | bounce_text()
        | headers()
        | st.just("")
    )
    if cte == "base64" and draw(st.booleans()):
        body = base64.encodebytes(body.encode("latin-1", "replace")).decode()
    head = f"Content-Type: {kind}" + (f"; charset={charset}" if charset is not None else "")
    head += f"\r\nContent-Transfer-Encoding: {cte}\r\n" if cte else "\r\n"
    return head + "\r\n" + body


def _multipart(parts: tuple[str, list[str], str]) -> str:
    subtype, children, boundary = parts
    body = "".join(f"--{boundary}\r\n{child}\r\n" for child in children)
    return f"Content-Type: multipart/{subtype}; boundary={boundary}\r\n\r\n{body}--{boundary}--\r\n"


def _attached(inner: tuple[str, str]) -> str:
    head, part = inner
    return f"Content-Type: message/rfc822\r\n\r\n{head}{part}"


SUBTYPES = st.sampled_from(
    ["mixed", "alternative", "report; report-type=delivery-status",
     "report; report-type=feedback-report"]
)  # fmt: skip
TREES = st.recursive(
    leaves(),
    lambda inner: (
        st.tuples(SUBTYPES, st.lists(inner, max_size=4), st.sampled_from(["b", "b1", "=_x"])).map(
            _multipart
        )
        | st.tuples(headers(), inner).map(_attached)
    ),
    max_leaves=8,
)


@st.composite
def messages(draw: st.DrawFn) -> bytes:
    text = draw(headers()) + draw(TREES)
    raw = text.encode("utf-8", "surrogateescape")
    if draw(st.booleans()):  # random bytes somewhere in it
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.binary(max_size=64)) + raw[at:]
    return raw


@FUZZ
@given(raw=messages())
def test_hostile_messages_give_at_most_max_items_in_time_linear_in_their_size(raw: bytes) -> None:
    gc.collect()
    started = time.process_time()
    for options in ({}, {"bounce_address": BOUNCES, "secret": SECRET}):
        items = parse_feedback(raw, received_at=RECEIVED, key="inbox:1:1", **options)
        assert isinstance(items, list) and len(items) <= MAX_ITEMS
        check_items(items, key="inbox:1:1")  # Feedback items of storable text, keys numbered
    spent = time.process_time() - started
    assert spent <= CONSTANT_S + PER_BYTE_S * len(raw), f"{spent:.3f} s for {len(raw):,} bytes"
