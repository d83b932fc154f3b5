"""Messages an outsider can mail to the feedback mailbox to make the parser slow, one generator
per shape, and an ordinary message of the same size to compare them with.

Each generator takes a size in bytes and returns a message of about that size (at most
``size``, at most a line or a header shorter). :data:`SHAPES` names them in a fixed order; the
feedback benchmark (``bench/feedback_parse.py``) and the parser's tests both use them. Each
shape aims at a spot where the work could grow faster than the message: de-duplicating
addresses (From or To headers full of them, a plain-text bounce with one per line, a complaint
with thousands of Original-Rcpt-To), header lookups (tens of thousands of tiny headers), the
stdlib parser's own costs per line, per part and per parameter (parts nested hundreds deep,
hundreds of thousands of empty parts, one Content-Type line of a megabyte), decoding encoded
words that never end, and reading Message-IDs and report blocks by the thousand.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

__all__ = ["CONTROL", "SHAPES", "control", "shape"]

_CRLF = "\r\n"
_DSN_HEAD = (
    "From: Mail Delivery System <MAILER-DAEMON@mx.example.org>\r\n"
    "Subject: Undelivered Mail Returned to Sender\r\n"
    "Date: Tue, 01 Dec 2026 11:02:44 +0000\r\n"
    "MIME-Version: 1.0\r\n"
)
_REPLY_HEAD = (
    "To: news@shop.example.com\r\n"
    "Subject: Re: Your December offers\r\n"
    "Date: Tue, 01 Dec 2026 11:02:44 +0000\r\n"
    "Message-ID: <r1@example.org>\r\n"
)


def _fill(size: int, head: str, lines: Iterator[str], tail: str = "") -> bytes:
    """``head``, then lines from ``lines`` while the message stays within ``size``, then
    ``tail`` (ASCII, so characters are bytes)."""
    out = [head]
    total = len(head) + len(tail)
    for line in lines:
        if total + len(line) > size:
            break
        out.append(line)
        total += len(line)
    out.append(tail)
    return "".join(out).encode("ascii")


def _count() -> Iterator[int]:
    n = 0
    while True:
        yield n
        n += 1


def _address_headers(name: str, size: int) -> Iterator[str]:
    """``name`` headers of 400 distinct addresses each (fewer in a small message), folded one
    a line."""
    per_header = max(1, min(400, size // 100))
    for n in _count():
        first = n * per_header
        folded = ",\r\n ".join(f"user{i}@example.org" for i in range(first, first + per_header))
        yield f"{name}: {folded}\r\n"


def from_addresses(size: int) -> bytes:
    """A reply whose From headers hold tens of thousands of distinct addresses."""
    return _fill(size, _REPLY_HEAD, _address_headers("From", size), "\r\nYes please.\r\n")


def dsn_to_addresses(size: int) -> bytes:
    """A delivery status notification whose To headers hold tens of thousands of addresses."""
    tail = (
        'Content-Type: multipart/report; report-type=delivery-status; boundary="b"\r\n\r\n'
        "--b\r\nContent-Type: text/plain\r\n\r\nYour message could not be delivered.\r\n"
        "--b\r\nContent-Type: message/delivery-status\r\n\r\n"
        "Reporting-MTA: dns; mx.example.org\r\n\r\n"
        "Final-Recipient: rfc822; gone@example.de\r\nAction: failed\r\nStatus: 5.1.1\r\n\r\n"
        "--b\r\nContent-Type: text/rfc822-headers\r\n\r\n"
        "Message-ID: <c0a1b2c3d4e5f-3@shop.example.com>\r\n\r\n--b--\r\n"
    )
    return _fill(size, _DSN_HEAD, _address_headers("To", size), tail)


def text_bounce_lines(size: int) -> bytes:
    """An Exim-style plain-text bounce naming tens of thousands of failed addresses, one a
    line."""
    head = (
        "From: Mail Delivery System <Mailer-Daemon@mx.example.org>\r\n"
        "Subject: Mail delivery failed: returning message to sender\r\n\r\n"
        "This message was created automatically by mail delivery software.\r\n\r\n"
        "A message that you sent could not be delivered to one or more of its\r\n"
        "recipients. This is a permanent error. The following address(es) failed:\r\n\r\n"
    )
    tail = (
        "\r\n------ This is a copy of the message, including all the headers. ------\r\n\r\n"
        "Message-ID: <c0a1b2c3d4e5f-3@shop.example.com>\r\n"
    )
    lines = (f"  user{i}@example.org\r\n" for i in _count())
    return _fill(size, head, lines, tail)


def many_headers(size: int) -> bytes:
    """A reply with a hundred thousand tiny headers before the ones that matter."""
    lines = (f"X-{i % 10}: {i % 10}\r\n" for i in _count())
    tail = "From: Anna <anna@example.org>\r\n" + _REPLY_HEAD + "\r\nYes please.\r\n"
    return _fill(size, "", lines, tail)


def nested_multipart(size: int, depth: int = 500) -> bytes:
    """Multiparts nested ``depth`` deep (less in a small message: half its size), the
    innermost part's text one short line after another (the stdlib parser checks every line
    against every open boundary)."""
    depth = min(depth, size // 130)
    head = [_DSN_HEAD, "Content-Type: multipart/mixed; boundary=b0\r\n\r\n"]
    head += [
        f"--b{i}\r\nContent-Type: multipart/mixed; boundary=b{i + 1}\r\n\r\n" for i in range(depth)
    ]
    head.append(f"--b{depth}\r\nContent-Type: text/plain\r\n\r\n")
    return _fill(size, "".join(head), (f"{i % 10}\r\n" for i in _count()))


def many_parts(size: int) -> bytes:
    """A multipart of hundreds of thousands of empty parts, under a thousand headers (fewer in
    a small message)."""
    head = "".join(f"X-{i % 10}: {i % 10}\r\n" for i in range(min(1000, size // 40)))
    head += _DSN_HEAD + "Content-Type: multipart/mixed; boundary=b\r\n\r\n"
    return _fill(size, head, ("--b\r\n\r\n" for _ in _count()))


def huge_header(size: int) -> bytes:
    """One Content-Type line of the whole size: a multipart's tens of thousands of parameters,
    one with an opening quote (the stdlib's parameter parser is quadratic in both)."""
    head = _DSN_HEAD + 'Content-Type: multipart/mixed; q="x'
    tail = "; boundary=b\r\n\r\n--b\r\nContent-Type: text/plain\r\n\r\nhi\r\n--b--\r\n"
    return _fill(size, head, (f"; p{i % 10}=v" for i in _count()), tail)


def part_params(size: int) -> bytes:
    """A multipart of parts whose Content-Type has a long run of parameters after an opening
    quote, each read for a boundary."""
    head = _DSN_HEAD + "Content-Type: multipart/mixed; boundary=b\r\n\r\n"
    part = '--b\r\nContent-Type: multipart/mixed; q="x' + ";" * 1_000 + "\r\n\r\n"
    return _fill(size, head, (part for _ in _count()))


def bounce_subject(size: int) -> bytes:
    """A message from a person whose Subject, of the whole size, starts a delay warning again
    and again ("Warning: message ... delayed" is a bounce's subject)."""
    head = "From: Anna <anna@example.org>\r\n"
    tail = "\r\n\r\nHi\r\n"
    words = "Warning: message " * ((size - len(head) - len(tail) - 9) // 17)
    return (head + "Subject: " + words + tail).encode()


def encoded_words(size: int) -> bytes:
    """A reply whose Subject, From and References headers are full of encoded words that
    never end (``=?x?q?a`` without ``?=``), 32 kB a header (less in a small message)."""
    words = "=?utf-8?q?a " * min(2_700, size // 40)

    def lines() -> Iterator[str]:
        for name in ("Subject", "From"):
            yield f"{name}: {words}\r\n"
        while True:
            yield f"References: {words}\r\n"

    return _fill(size, "To: news@shop.example.com\r\n", lines(), "\r\nYes please.\r\n")


def many_references(size: int) -> bytes:
    """A reply whose References headers name tens of thousands of Message-IDs, 500 a header
    (fewer in a small message)."""

    per_header = max(1, min(500, size // 100))

    def lines() -> Iterator[str]:
        for n in _count():
            first = n * per_header
            ids = "\r\n ".join(f"<m{i}@example.org>" for i in range(first, first + per_header))
            yield f"References: {ids}\r\n"

    head = "From: Anna <anna@example.org>\r\n" + _REPLY_HEAD
    return _fill(size, head, lines(), "\r\nYes please.\r\n")


def report_blocks(size: int) -> bytes:
    """A delivery status notification with tens of thousands of recipient blocks."""
    head = (
        _DSN_HEAD + 'Content-Type: multipart/report; report-type=delivery-status; boundary="b"'
        "\r\n\r\n--b\r\nContent-Type: message/delivery-status\r\n\r\n"
        "Reporting-MTA: dns; mx.example.org\r\n\r\n"
    )
    blocks = (
        f"Final-Recipient: rfc822; user{i}@example.org\r\nAction: failed\r\nStatus: 5.1.1\r\n\r\n"
        for i in _count()
    )
    return _fill(size, head, blocks, "--b--\r\n")


def arf_recipients(size: int) -> bytes:
    """A complaint report naming tens of thousands of distinct Original-Rcpt-To addresses."""
    head = (
        "From: Feedback <feedback@arf.example.org>\r\nSubject: FW: offers\r\n"
        'Content-Type: multipart/report; report-type=feedback-report; boundary="b"\r\n\r\n'
        "--b\r\nContent-Type: message/feedback-report\r\n\r\n"
        "Feedback-Type: abuse\r\nVersion: 1\r\n"
    )
    lines = (f"Original-Rcpt-To: <user{i}@example.org>\r\n" for i in _count())
    tail = (
        "\r\n--b\r\nContent-Type: text/rfc822-headers\r\n\r\n"
        "Message-ID: <c0a1b2c3d4e5f-6@shop.example.com>\r\n\r\n--b--\r\n"
    )
    return _fill(size, head, lines, tail)


def control(size: int) -> bytes:
    """An ordinary reply of the same size: a few headers and a long quoted text."""
    head = "From: Anna <anna@example.org>\r\n" + _REPLY_HEAD + "\r\nYes please.\r\n\r\n"
    line = "> Our December offers: everything you liked last year, and a few new things.\r\n"
    return _fill(size, head, (line for _ in _count()))


#: The hostile shapes, by name, in the order the benchmark reports them.
SHAPES: dict[str, Callable[[int], bytes]] = {
    "from_addresses": from_addresses,
    "dsn_to_addresses": dsn_to_addresses,
    "text_bounce_lines": text_bounce_lines,
    "many_headers": many_headers,
    "nested_multipart": nested_multipart,
    "many_parts": many_parts,
    "huge_header": huge_header,
    "part_params": part_params,
    "bounce_subject": bounce_subject,
    "encoded_words": encoded_words,
    "many_references": many_references,
    "report_blocks": report_blocks,
    "arf_recipients": arf_recipients,
}
#: The name of the ordinary message in the benchmark's figures.
CONTROL = "control"


def shape(name: str, size: int) -> bytes:
    """The message of shape ``name`` (one of :data:`SHAPES`, or :data:`CONTROL`)."""
    return control(size) if name == CONTROL else SHAPES[name](size)
