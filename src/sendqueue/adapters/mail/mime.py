"""Turning an :class:`~sendqueue.ports.OutgoingMessage` into a MIME message, for every mailer.

:func:`build_message` gives an :class:`email.message.EmailMessage` whose policy is
:data:`email.policy.SMTP` (CRLF line endings, non-ASCII display names and subjects encoded as
RFC 2047 words), or :data:`email.policy.SMTPUTF8` when an address has a non-ASCII local part and
so can only travel over an SMTPUTF8 session. Bodies are always 7-bit safe (quoted-printable or
base64), so the message passes through servers that lack 8BITMIME.

Every header value is checked for CR and LF first: a newline in a subject or a name taken from an
imported CSV file must never let its author add headers of their own (``Bcc:``) to the mail.
"""

from __future__ import annotations

import email.policy
import email.utils
import functools
import re
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from email.contentmanager import _encode_text  # type: ignore[attr-defined]  # set_content's
from email.headerregistry import (
    Address,
    AddressHeader,
    BaseHeader,
    Group,
    HeaderRegistry,
    MessageIDHeader,
    UniqueAddressHeader,
    UniqueUnstructuredHeader,
)
from email.message import EmailMessage
from typing import TYPE_CHECKING, Any, cast

from sendqueue.domain.addresses import check_header_value, parse_mailbox
from sendqueue.domain.errors import InvalidField
from sendqueue.ports import OutgoingMessage

__all__ = [
    "RESERVED_HEADERS",
    "bare_envelope_sender",
    "build_message",
    "envelope_addresses",
    "envelope_of",
    "needs_smtputf8",
]

#: Headers that :func:`build_message` writes itself; ``OutgoingMessage.headers`` may not set them.
RESERVED_HEADERS = frozenset(
    {
        "from",
        "sender",
        "to",
        "cc",
        "bcc",
        "reply-to",
        "subject",
        "date",
        "message-id",
        "mime-version",
        "content-type",
        "content-transfer-encoding",
        "return-path",
    }
)

# Bodies are encoded 7-bit safe whatever the policy: cte_type="7bit" makes set_content pick
# quoted-printable or base64 for non-ASCII text instead of raw 8-bit.


class _HeaderRegistry(HeaderRegistry):
    """The email package's header registry, remembering the header class it makes per name
    (``HeaderRegistry[name]`` builds a new one at every call; it depends only on the name)."""

    def __init__(self) -> None:
        super().__init__()
        self._classes: dict[str, type[BaseHeader]] = {}

    def map_to_type(self, name: str, cls: type[BaseHeader]) -> None:
        super().map_to_type(name, cls)
        self._classes.clear()

    def __getitem__(self, name: str) -> type[BaseHeader]:
        key = name.lower()
        cls = self._classes.get(key)
        if cls is None:
            cls = self._classes[key] = super().__getitem__(name)
        return cls


if TYPE_CHECKING:
    _SmtpPolicy = email.policy.EmailPolicy[EmailMessage]
else:  # generic in the stubs only
    _SmtpPolicy = email.policy.EmailPolicy


class _Policy(_SmtpPolicy):
    """The SMTP policy, folding a header object shared by every email (a campaign's From, the
    text part's headers) once per policy: :func:`_fold_once` remembers its bytes on it."""

    def fold_binary(self, name: str, value: str) -> bytes:
        folded = getattr(value, _FOLDED, None)
        # only the two policies below: a clone (another linesep, say) folds each time
        if folded is None or (self is not _ASCII_POLICY and self is not _UTF8_POLICY):
            return super().fold_binary(name, value)
        cached: bytes | None = folded.get(self.utf8)
        if cached is None:
            cached = folded[self.utf8] = super().fold_binary(name, value)
        return cached


# The attribute of a shared header object holding its folded bytes, by the policy's utf8.
_FOLDED = "_sendqueue_folded"

_ASCII_POLICY = _Policy(linesep="\r\n", cte_type="7bit", header_factory=_HeaderRegistry())
_UTF8_POLICY = _ASCII_POLICY.clone(utf8=True, header_factory=_HeaderRegistry())


def _fold_once(header: Any) -> Any:
    """``header`` (immutable, reused in every email) marked to be folded once per policy."""
    setattr(header, _FOLDED, {})
    return header


# RFC 5322 field names: printable ASCII except the colon.
_FIELD_NAME = re.compile(r"[!-9;-~]+")
# A Message-ID as we produce and accept it: <left@right>, no whitespace, no nested brackets.
_MESSAGE_ID = re.compile(r"<[^<>@\s]+@[^<>@\s]+>")


# Text that goes out exactly as written: ASCII words of letters, digits and atext symbols
# (no RFC 5322 specials) with single spaces between them; addresses and Message-IDs of
# dot-atoms. Text with "=?" (which reads as an encoded word) is left to the parser.
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_DOT_ATOM = rf"{_ATOM}(?:\.{_ATOM})*"
_PLAIN_WORDS = re.compile(rf"{_ATOM}(?: {_ATOM})*")
_PLAIN_ADDR_SPEC = re.compile(rf"{_DOT_ATOM}@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*")
_PLAIN_MESSAGE_ID = re.compile(rf"<{_DOT_ATOM}@{_DOT_ATOM}>")


def _plain_words(text: str) -> bool:
    return bool(_PLAIN_WORDS.fullmatch(text)) and "=?" not in text


class _PlainHeader(BaseHeader):
    """A per-email header whose value the registry would write unchanged on one line: built
    without the header parser (about a fifth of a send's CPU went to parsing To, Subject and
    Message-ID), folded as ``Name: value``. Only :func:`_plain` makes one, after checking
    that; tests/unit/test_mime_shortcuts.py compares the bytes with the parsed path's."""

    @classmethod
    def parse(cls, value: Any, kwds: dict[str, Any]) -> None:
        kwds["decoded"] = str(value)
        kwds["parse_tree"] = None  # fold() below never needs it

    def fold(self, *, policy: Any) -> str:
        return f"{self.name}: {self}{policy.linesep}"


class _PlainTo(UniqueAddressHeader, _PlainHeader):  # type: ignore[misc]  # as the registry's
    @classmethod
    def parse(cls, value: Any, kwds: dict[str, Any]) -> None:
        _PlainHeader.parse(value, kwds)
        kwds["groups"] = [Group(None, [value])]


class _PlainSubject(UniqueUnstructuredHeader, _PlainHeader):  # type: ignore[misc]
    parse = _PlainHeader.parse


class _PlainMessageId(MessageIDHeader, _PlainHeader):  # type: ignore[misc]
    parse = _PlainHeader.parse


def _plain(cls: type[_PlainHeader], name: str, value: Any, text: str, policy: Any) -> Any:
    """``value`` as a ``cls`` header when its plain text ``text`` fits one line, else
    ``value`` itself (the registry parses it)."""
    if len(name) + 2 + len(text) > policy.max_line_length:
        return value
    return cls(name, value)


def _plain_mailbox(address: Address) -> bool:
    name = address.display_name
    return (not name or _plain_words(name)) and bool(_PLAIN_ADDR_SPEC.fullmatch(address.addr_spec))


def needs_smtputf8(message: EmailMessage) -> bool:
    """True when the message (an address's local part) can only be sent with SMTPUTF8."""
    return bool(getattr(message.policy, "utf8", False))


def envelope_addresses(msg: OutgoingMessage) -> tuple[str, str]:
    """The SMTP envelope (MAIL FROM, RCPT TO) of a message: bare addresses, IDNA domains."""
    sender = parse_mailbox(
        "from_addr", msg.from_addr, display_name=msg.from_name, name_field="from_name"
    )
    recipient = parse_mailbox(
        "to_addr", msg.to_addr, display_name=msg.to_name, name_field="to_name"
    )
    return sender.addr_spec, recipient.addr_spec


def build_message(msg: OutgoingMessage) -> EmailMessage:
    """The MIME message for ``msg``.

    Headers: From (``from_name`` and ``from_addr``, written by the header registry: a name with
    specials is quoted, a non-ASCII one RFC 2047-encoded), Reply-To (when set), To
    (``to_name <to_addr>``), Subject, Date (from ``msg.date``, which must be aware), Message-ID
    (exactly ``msg.message_id``, which must look like ``<left@right>``), then ``msg.headers``
    in their order. The body is ``text/plain``, or ``multipart/alternative`` with the text
    first and ``msg.html`` second.

    Raises InvalidField (naming the field or header) for a CR or LF in any header value, an
    unparseable address, a naive date, a malformed Message-ID, or an extra header that is
    malformed or one this function writes itself.
    """
    sender, from_header = _campaign_mailbox("from_addr", msg.from_addr, msg.from_name)
    recipient = parse_mailbox(
        "to_addr", msg.to_addr, display_name=msg.to_name, name_field="to_name"
    )
    reply_to, reply_to_header = (
        _campaign_mailbox("reply_to", msg.reply_to) if msg.reply_to else (None, None)
    )
    check_header_value("subject", msg.subject)
    check_header_value("message_id", msg.message_id)
    if not _MESSAGE_ID.fullmatch(msg.message_id) or not msg.message_id.isascii():
        raise InvalidField("message_id", msg.message_id, "expected <left@right>, ASCII")
    if msg.date.tzinfo is None or msg.date.utcoffset() is None:
        raise InvalidField("date", msg.date, "an aware datetime is required")
    extra = _extra_headers(msg.headers)

    addresses = [sender, recipient] + ([reply_to] if reply_to else [])
    utf8 = any(not a.username.isascii() for a in addresses)
    policy = _UTF8_POLICY if utf8 else _ASCII_POLICY
    out = EmailMessage(policy=policy)
    out["From"] = from_header
    if reply_to_header is not None:
        out["Reply-To"] = reply_to_header
    if _plain_mailbox(recipient):
        out["To"] = _plain(_PlainTo, "To", recipient, str(recipient), policy)
    else:
        out["To"] = recipient
    if _plain_words(msg.subject):
        out["Subject"] = _plain(_PlainSubject, "Subject", msg.subject, msg.subject, policy)
    else:
        out["Subject"] = msg.subject
    out["Date"] = _date_value(msg.date)
    if _PLAIN_MESSAGE_ID.fullmatch(msg.message_id):
        out["Message-ID"] = _plain(
            _PlainMessageId, "Message-ID", msg.message_id, msg.message_id, policy
        )
    else:
        out["Message-ID"] = msg.message_id
    for name, value in extra:
        out[name] = value
    if msg.html is None:
        _set_text(out, msg.text)
    else:
        out.set_content(msg.text, subtype="plain", charset="utf-8")
        out.add_alternative(msg.html, subtype="html", charset="utf-8")
    return out


# From and Reply-To are the campaign's or the sender's, the same in every email: parsed once,
# and their (immutable) header objects reused.
_HEADER_NAMES = {"from_addr": "From", "reply_to": "Reply-To"}


@functools.lru_cache(maxsize=256)
def _campaign_mailbox(field: str, value: str, name: str | None = None) -> tuple[Address, Any]:
    """The mailbox of ``value`` (``name``, when given, its display name) and its header."""
    mailbox = parse_mailbox(field, value, display_name=name, name_field="from_name")
    return mailbox, _fold_once(_ASCII_POLICY.header_factory(_HEADER_NAMES[field], mailbox))


def _text_part_headers(
    policy: email.policy.EmailPolicy[EmailMessage], sample: str
) -> tuple[str, list[tuple[str, Any]]]:
    """The transfer encoding ``set_content(sample, subtype="plain", charset="utf-8")`` picks, and
    the header objects it writes, taken from a part it built."""
    part = EmailMessage(policy=policy)
    part.set_content(sample, subtype="plain", charset="utf-8")
    headers = [(name, _fold_once(header)) for name, header in part.items()]
    names = [name for name, _ in headers]
    if names != ["Content-Type", "Content-Transfer-Encoding", "MIME-Version"]:
        raise RuntimeError(f"unexpected headers from set_content: {names}")
    return str(part["Content-Transfer-Encoding"]), headers


# set_content's headers for a text part, by policy and transfer encoding: samples that make it
# pick each of them (ASCII: 7bit; mostly ASCII: quoted-printable; mostly not: base64).
_TEXT_PART_HEADERS = {
    (id(policy), cte): headers
    for policy in (_ASCII_POLICY, _UTF8_POLICY)
    for cte, headers in (_text_part_headers(policy, s) for s in ("x", "xé", "éééé"))
}
if len(_TEXT_PART_HEADERS) != 6:
    raise RuntimeError("set_content no longer picks 7bit, quoted-printable and base64 as expected")


def _set_text(out: EmailMessage, text: str) -> None:
    """Set ``text`` as the body exactly as ``set_content(text, subtype="plain",
    charset="utf-8")`` would, without its header parsing (it re-parses Content-Type to add the
    charset): the payload from its own encoder, its fixed headers reused.
    tests/unit/test_mime_shortcuts.py checks the bytes are the same."""
    cte, payload = _encode_text(text, "utf-8", None, out.policy)
    for name, header in _TEXT_PART_HEADERS[id(out.policy), cte]:
        out[name] = header
    out.set_payload(payload)


def envelope_of(message: EmailMessage, envelope_from: str | None = None) -> tuple[str, str]:
    """The SMTP envelope (MAIL FROM, RCPT TO) of a message :func:`build_message` made: the
    same as :func:`envelope_addresses` of its OutgoingMessage, read from the headers' parsed
    addresses instead of parsing both addresses again. ``envelope_from``
    (``OutgoingMessage.envelope_from``, a VERP bounce address) replaces the From as MAIL FROM;
    it must be a bare address (InvalidField "envelope_from" otherwise)."""
    recipient = cast(AddressHeader, message["To"]).addresses[0]
    if envelope_from is not None:
        return bare_envelope_sender(envelope_from), recipient.addr_spec
    sender = cast(AddressHeader, message["From"]).addresses[0]
    return sender.addr_spec, recipient.addr_spec


def bare_envelope_sender(envelope_from: str) -> str:
    """``OutgoingMessage.envelope_from`` checked to be one bare address, IDNA domain."""
    check_header_value("envelope_from", envelope_from)
    mailbox = parse_mailbox("envelope_from", envelope_from)
    if mailbox.display_name or "<" in envelope_from:
        raise InvalidField("envelope_from", envelope_from, "a bare address, without a name")
    return mailbox.addr_spec


def _date_value(value: datetime) -> Any:
    """What Date is set to: the header of that second, shared by the emails sent in it; the
    text for an offset with seconds, which RFC 5322 cannot write."""
    whole = _whole_seconds(value)
    offset = cast(timedelta, whole.utcoffset())
    if offset % _MINUTE:
        return email.utils.format_datetime(whole)
    return _date_header(whole.replace(tzinfo=None), offset)


_MINUTE = timedelta(minutes=1)


@functools.lru_cache(maxsize=64)
def _date_header(wall: datetime, offset: timedelta) -> Any:
    """The Date header of a second (wall time at ``offset``): from the datetime, as the header
    would hold it parsed back from its text, so no text is formatted and parsed per email."""
    at = wall.replace(tzinfo=timezone(offset))
    return _fold_once(_ASCII_POLICY.header_factory("Date", at))


def _whole_seconds(value: datetime) -> datetime:
    # RFC 5322 dates have no fractions; format_datetime would drop them anyway, but rounding
    # down explicitly keeps Date equal to what a reader parses back.
    return value.replace(microsecond=0)


def _extra_headers(headers: Mapping[str, str]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for name, value in headers.items():
        if not _FIELD_NAME.fullmatch(name):
            raise InvalidField(name, name, "a header name is printable ASCII without ':'")
        if name.lower() in RESERVED_HEADERS:
            raise InvalidField(name, value, "this header is set from the message itself")
        out.append((name, check_header_value(name, value)))
    return out
