"""Reading a received message defensively: decoded header text, addresses, the parts of a
report, and the ``Name: value`` blocks of a delivery-status or feedback-report part.

The helpers of :mod:`sendqueue.domain.reports`. :func:`parse_message` reads the bytes with the
stdlib parser (``compat32``, which never raises while parsing) within bounds, so a message
made to be slow is not (see :class:`_Parsed`); every other function takes what it made and
returns plain text without NULs, control characters or lone surrogates, so the result can be
stored as is. Work grows linearly with the message: addresses are de-duplicated in a dict,
encoded words read with a pattern that cannot backtrack far, and a charset that cannot decode
text falls back to UTF-8. Pure, no I/O.
"""

from __future__ import annotations

import binascii
import codecs
import email.utils
import itertools
import quopri
import re
from collections.abc import Iterable, Iterator
from datetime import datetime
from email.errors import MessageError
from email.feedparser import FeedParser
from email.message import Message
from email.parser import HeaderParser
from email.policy import Policy, compat32
from typing import Any, TypeVar, overload

__all__ = [
    "MAX_ADDRESS_TEXT",
    "MAX_CONTENT_TYPE",
    "MAX_DEPTH",
    "MAX_HEADER",
    "MAX_HEADERS",
    "MAX_LINES",
    "MAX_NESTING",
    "MAX_PARAMS",
    "MAX_PARTS",
    "FieldBlock",
    "addresses",
    "clean",
    "decode_text",
    "field_blocks",
    "first_address",
    "header",
    "header_date",
    "headers_of",
    "own_parts",
    "parse_headers",
    "parse_message",
    "part_text",
    "raw_header",
    "raw_headers_of",
]

#: One block of a report part: lower-cased field name -> its values, in order.
FieldBlock = dict[str, list[str]]

# Everything the stdlib can raise on malformed input while decoding a header or a payload.
# (RecursionError: the address parser recurses into nested comments, "((((...".)
_DECODE_ERRORS = (
    LookupError,
    UnicodeError,
    ValueError,
    TypeError,
    IndexError,
    MessageError,
    RecursionError,
)
#: Longest header value read (characters): decoding is slow on huge ones, and no header a
#: report needs is near this long.
MAX_HEADER = 32_768
#: Most header text :func:`addresses` reads, all values together (characters): the stdlib's
#: address parser takes up to 4 us a character on hostile text, and the headers addresses
#: are read from (From, Sender, To, Return-Path, a report's fields) hold a few each.
MAX_ADDRESS_TEXT = 8_192
#: Most headers kept of one message or part (a real one has tens, a long trace a hundred or
#: two): the stdlib looks a header up by walking them all, and so does :func:`header`.
MAX_HEADERS = 1_000
#: Most parts (messages, parts, delivery-status blocks) and lines :func:`parse_message`
#: reads before it stops: the stdlib parser spends about 10 us on each part and 1 to 3 us on
#: each line. What a report says comes first; after it only the returned message's body, of
#: which nothing is read (50,000 lines: nearly 4 MB of base64).
MAX_PARTS = 1_000
MAX_LINES = 50_000
#: How deep parts may nest before :func:`parse_message` gives up (as the stdlib parser does,
#: at its recursion limit, a few hundred levels down).
MAX_NESTING = 100
#: How much of a Content-Type is kept: its first 1,024 characters and 16 parameters. The
#: stdlib reads parameters (the boundary, the charset) in time that grows with their number
#: times the value's length; a real one has a few.
MAX_CONTENT_TYPE = 1_024
MAX_PARAMS = 16
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_SPACE = re.compile(r"\s+")
_LINE_END = re.compile(r"\r\n|\r|\n")
# Codecs that are no charset of text: domain-name encodings (punycode decodes in quadratic
# time, idna refuses to replace what it cannot decode), Python's literal escapes (a stray
# backslash is a DeprecationWarning, an error where warnings are) and the codec that refuses
# everything.
_NOT_CHARSETS = frozenset({"idna", "punycode", "unicode-escape", "raw-unicode-escape", "undefined"})


def clean(text: str) -> str:
    """``text`` as storable Unicode: raw 8-bit bytes the parser kept as surrogates decoded as
    UTF-8 (replaced where invalid), other lone surrogates replaced, control characters gone."""
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raw = text.encode("utf-8", "surrogatepass")
    return _CONTROL.sub("", raw.decode("utf-8", "replace"))


def _one_line(text: str) -> str:
    return _SPACE.sub(" ", clean(text)).strip()


def decode_text(data: bytes, charset: str | None) -> str:
    """``data`` decoded in ``charset``, or in UTF-8 when it names none, or one that is unknown or
    decodes no text (``undefined``, ``idna``, ``rot13``, ``base64``...); what does not decode is
    replaced. Never raises."""
    if charset:
        try:
            if codecs.lookup(charset).name not in _NOT_CHARSETS:
                return data.decode(charset, "replace")
        except _DECODE_ERRORS:
            pass  # unknown, no text encoding, or refused the bytes: read them as UTF-8
    return data.decode("utf-8", "replace")


# An RFC 2047 encoded word. None of its parts can hold a "?", so a match attempt ends within
# the next three; the stdlib's pattern scans to the end of the line from each "=?", which is
# quadratic on a header of words that never end ("=?x?q?a =?x?q?a ...").
_ENCODED_WORD = re.compile(r"=\?([^?\r\n]*)\?([bBqQ])\?([^?\r\n]*)\?=")


def _word_bytes(encoding: str, text: str) -> bytes | None:
    """The bytes of an encoded word's text (B: base64, Q: quoted-printable with "_" for a
    space), or None when they do not decode."""
    raw = text.encode("ascii", "surrogateescape")
    try:
        if encoding in "bB":
            return binascii.a2b_base64(raw + b"=" * (-len(raw) % 4))
        return binascii.a2b_qp(raw, header=True)
    except ValueError:  # binascii.Error
        return None


def _decode_words(value: str) -> str:
    """``value`` with its RFC 2047 encoded words decoded: the bytes of adjacent words in one
    charset joined before decoding (a character may be split between two), the blanks between
    two words dropped, a space put between a word and text right next to it (as the stdlib
    does); a word that does not decode is kept as it is."""
    chunks: list[tuple[str, bytes, str | None]] = []  # (text, word bytes, word charset)
    end = 0
    for match in _ENCODED_WORD.finditer(value):
        between = value[end : match.start()]
        charset = match.group(1).lower()
        data = _word_bytes(match.group(2), match.group(3))
        if between and not (between.isspace() and chunks and chunks[-1][2] is not None):
            chunks.append((between, b"", None))
        if data is None:
            chunks.append((match.group(0), b"", None))
        elif chunks and chunks[-1][2] == charset:
            chunks[-1] = ("", chunks[-1][1] + data, charset)
        else:
            chunks.append(("", data, charset))
        end = match.end()
    if not chunks:
        return value
    if value[end:]:
        chunks.append((value[end:], b"", None))
    out: list[str] = []
    for i, (text, data, word_charset) in enumerate(chunks):
        if word_charset is None:
            if i and chunks[i - 1][2] is not None and not text[:1].isspace():
                out.append(" ")
            out.append(text)
        else:
            if i and chunks[i - 1][2] is None and not chunks[i - 1][0][-1:].isspace():
                out.append(" ")
            out.append(decode_text(data, word_charset.partition("*")[0]))
    return "".join(out)


def _decoded(value: object) -> str:
    """A header value with its RFC 2047 encoded words decoded, unfolded to one line."""
    if value is None:
        return ""
    try:
        text = value if isinstance(value, str) else str(value)
    except _DECODE_ERRORS:
        return ""
    return _one_line(_decode_words(text[:MAX_HEADER]))


def header(msg: Message, name: str) -> str:
    """The first ``name`` header of ``msg``, decoded and unfolded ("" when absent)."""
    name = name.lower()
    for key, value in msg.raw_items():
        if key.strip().lower() == name:
            return _decoded(value)
    return ""


def raw_header(msg: Message, name: str) -> str:
    """The first ``name`` header of ``msg`` as written (see :func:`raw_headers_of`), or ""."""
    found = raw_headers_of(msg, name)
    return found[0] if found else ""


def headers_of(msg: Message, name: str) -> list[str]:
    """Every ``name`` header of ``msg``, decoded and unfolded, in order: text to show, never
    to parse as structure (see :func:`raw_headers_of`)."""
    name = name.lower()
    return [_decoded(v) for k, v in msg.raw_items() if k.strip().lower() == name]


def raw_headers_of(msg: Message, name: str) -> list[str]:
    """Every ``name`` header of ``msg`` as written, unfolded and cleaned, its RFC 2047 encoded
    words left encoded, in order. Addresses, Message-IDs and Authentication-Results are parsed
    from these: text decoded from an encoded word must never be read as structure (RFC 2047
    section 5), or ``=?utf-8?q?victim=40example.net_=28?= <attacker@example.org>`` would read
    as a From of victim@example.net."""
    wanted = name.lower()
    return [
        _one_line(str(v)[:MAX_HEADER]) for k, v in msg.raw_items() if k.strip().lower() == wanted
    ]


def addresses(values: Iterable[str], limit: int | None = None) -> list[str]:
    """The bare addresses (``local@domain``) in header values, in order, without duplicates:
    the first ``limit`` of them (all without one), found in the first
    :data:`MAX_ADDRESS_TEXT` characters of the values."""
    found: dict[str, None] = {}  # a dict keeps the order addresses were first seen in
    budget = MAX_ADDRESS_TEXT
    for value in values:
        text = value[:budget]
        budget -= len(text)
        try:
            pairs = email.utils.getaddresses([text])
        except _DECODE_ERRORS:
            pairs = []
        for _, addr in pairs:
            addr = addr.strip().strip("<>").strip()
            local, at, domain = addr.rpartition("@")
            if at and local and domain and not any(c.isspace() for c in addr):
                found[addr] = None
                if limit is not None and len(found) >= limit:
                    return list(found)
        if budget <= 0:
            break
    return list(found)


def first_address(value: str) -> str | None:
    """The first bare address in one header value, or None."""
    found = addresses([value], limit=1)
    return found[0] if found else None


def header_date(value: str) -> datetime | None:
    """An RFC 5322 date, when it parses and names its offset (None otherwise)."""
    if not value:
        return None
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except _DECODE_ERRORS:
        return None
    if parsed is None or parsed.tzinfo is None or parsed.utcoffset() is None:
        return None
    return parsed


#: How deep :func:`own_parts` looks; reports nest three or four levels.
MAX_DEPTH = 12


def own_parts(msg: Message, depth: int = 0) -> Iterator[Message]:
    """``msg`` and its parts, depth first, without entering an attached message (a returned
    message's own parts are not the report's) or going deeper than :data:`MAX_DEPTH`."""
    yield msg
    if msg.get_content_maintype() == "message" or depth >= MAX_DEPTH or not msg.is_multipart():
        return
    payload = msg.get_payload()  # a multipart's: its list of parts, never decoded
    if isinstance(payload, list):
        for part in payload:
            if isinstance(part, Message):
                yield from own_parts(part, depth + 1)


def part_text(part: Message) -> str:
    """The text of a part: a leaf's payload decoded (base64, quoted-printable) in its charset
    (see :func:`decode_text`), or for a ``message/*`` part the parser split up, its pieces
    written back as header blocks."""
    if part.is_multipart():
        payload = part.get_payload()
        pieces = payload if isinstance(payload, list) else []
        text = "\n\n".join(_message_text(p) for p in pieces if isinstance(p, Message))
        return _undo_transfer_encoding(text, str(part.get("content-transfer-encoding", "")))
    try:
        data = part.get_payload(decode=True)
        charset = part.get_content_charset()
    except _DECODE_ERRORS:
        return ""
    return clean(decode_text(data, charset)) if isinstance(data, bytes) else ""


def _raw_text(part: Message) -> str:
    """A leaf's payload as the parser kept it (its transfer encoding not undone). Where it has
    8-bit bytes, ``get_payload()`` decodes them in the part's charset and raises on one that
    decodes no text: then they are read as UTF-8."""
    if part.is_multipart():
        return ""
    try:
        payload = part.get_payload()
        return payload if isinstance(payload, str) else ""
    except _DECODE_ERRORS:
        pass
    try:
        data = part.get_payload(decode=True)
    except _DECODE_ERRORS:
        return ""
    return decode_text(data, None) if isinstance(data, bytes) else ""


def _undo_transfer_encoding(text: str, encoding: str) -> str:
    """A ``message/*`` part sent base64 or quoted-printable (which RFC 2046 forbids, and some
    mail systems do): the parser split the encoded text; decode it."""
    encoding = encoding.strip().lower()
    try:
        if encoding == "base64":
            return clean(
                binascii.a2b_base64(text.encode("ascii", "ignore")).decode("utf-8", "replace")
            )
        if encoding == "quoted-printable":
            return clean(
                quopri.decodestring(text.encode("utf-8", "replace")).decode("utf-8", "replace")
            )
    except ValueError:  # binascii.Error: not base64 after all
        return text
    return text


def _message_text(msg: Message) -> str:
    lines = [f"{k}: {v}" for k, v in msg.raw_items()]
    body = _raw_text(msg)
    return clean("\n".join(lines) + ("\n\n" + body if body.strip() else ""))


_T = TypeVar("_T")


class _TooDeep(Exception):
    """Parts nested deeper than :data:`MAX_NESTING`."""


class _Parsed(Message):
    """A message or part as :func:`parse_message` and :func:`parse_headers` make it: it keeps
    at most :data:`MAX_HEADERS` headers and the start of its Content-Type (see
    :data:`MAX_PARAMS`), knows how deep it is, and below :data:`MAX_DEPTH` (where
    :func:`own_parts` does not look) has no multipart boundary, so its parts stay text: the
    stdlib parser checks each line against every boundary open above it."""

    depth = 0

    def set_raw(self, name: str, value: str) -> None:
        if len(self) >= MAX_HEADERS:
            return
        if name.lower() == "content-type":
            value = _short_content_type(value)
        super().set_raw(name, value)

    def attach(self, payload: Message | str) -> None:
        if isinstance(payload, _Parsed):
            payload.depth = self.depth + 1
            if payload.depth > MAX_NESTING:
                raise _TooDeep
        super().attach(payload)

    @overload
    def get_boundary(self, failobj: None = None) -> str | None: ...
    @overload
    def get_boundary(self, failobj: _T) -> str | _T: ...
    def get_boundary(self, failobj: object = None) -> object:
        if self.depth >= MAX_DEPTH:
            return failobj
        return super().get_boundary(failobj)


def _short_content_type(value: str) -> str:
    """``value`` cut to :data:`MAX_CONTENT_TYPE` characters, and before its parameter after
    the :data:`MAX_PARAMS`-th."""
    value = value[:MAX_CONTENT_TYPE]
    cut = -1
    for _ in range(MAX_PARAMS + 1):
        cut = value.find(";", cut + 1)
        if cut < 0:
            return value
    return value[:cut]


class _Counted:
    """The parser's message factory: makes :class:`_Parsed` parts and counts them."""

    def __init__(self) -> None:
        self.made = 0

    def __call__(self, policy: Policy[Any] = compat32) -> _Parsed:
        self.made += 1
        return _Parsed(policy)


# What parse_message hands the stdlib parser at a time (the size it reads in itself).
_CHUNK = 8_192


def parse_message(raw: bytes) -> Message | None:
    """``raw`` as the stdlib parser reads it (as ``email.message_from_bytes`` with
    ``compat32``), within bounds: reading stops after :data:`MAX_PARTS` parts or
    :data:`MAX_LINES` lines, and each part is a :class:`_Parsed`. None for parts nested
    deeper than :data:`MAX_NESTING`."""
    text = bytes(raw).decode("ascii", "surrogateescape")
    factory = _Counted()
    parser = FeedParser(factory, policy=compat32)
    lines = 0
    try:
        for start in range(0, len(text), _CHUNK):
            chunk = text[start : start + _CHUNK]
            parser.feed(chunk)
            # LF, CR LF or CR lines: exact; a mix of LF and CR: at least half of them
            lines += max(chunk.count("\n"), chunk.count("\r"))
            if lines >= MAX_LINES or factory.made > MAX_PARTS:
                break
        return parser.close()
    except (_TooDeep, RecursionError):
        return None


def _first_lines(text: str, limit: int) -> str:
    """``text`` up to the end of its ``limit``-th line."""
    if text.count("\n") + text.count("\r") <= limit:
        return text
    end = next(itertools.islice(_LINE_END.finditer(text), limit - 1, None), None)
    return text if end is None else text[: end.end()]


def parse_headers(text: str) -> Message:
    """The header block at the start of ``text`` (a text/rfc822-headers part, or the copy of
    a returned message in a plain-text bounce) as a Message, read from its first
    :data:`MAX_LINES` lines."""
    head = _first_lines(text.lstrip("\r\n"), MAX_LINES)
    return HeaderParser(_Parsed, policy=compat32).parsestr(head)


_FIELD = re.compile(r"([!-9;-~]+)[ \t]*:(.*)")


def field_blocks(text: str) -> list[FieldBlock]:
    """The ``Name: value`` blocks of a report (blank-line separated; folded lines joined),
    names lower-cased. Lines that are not fields are skipped."""
    blocks: list[FieldBlock] = []
    block: FieldBlock = {}
    last: tuple[str, int] | None = None
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if not line.strip():
            if block:
                blocks.append(block)
            block, last = {}, None
            continue
        if line[0] in " \t" and last is not None:
            name, index = last
            block[name][index] = f"{block[name][index]} {line.strip()}"
            continue
        match = _FIELD.match(line)
        if match is None:
            last = None
            continue
        name = match.group(1).lower()
        block.setdefault(name, []).append(match.group(2).strip())
        last = (name, len(block[name]) - 1)
    if block:
        blocks.append(block)
    return [{k: [_one_line(v) for v in vs] for k, vs in b.items()} for b in blocks]
