"""Feedback from a received message: DSNs, ARF complaints, replies, unsubscribes.

:func:`parse_feedback` reads one message from the feedback or a sender's mailbox and says what
it reports, as :class:`~sendqueue.domain.feedback.Feedback` items (none for a message that is
not feedback). It understands:

- delivery status notifications (RFC 3464 ``multipart/report; report-type=delivery-status``),
  one item per failed or delayed recipient, and the plain-text bounces of older Exim, qmail and
  the like (:mod:`sendqueue.domain.textbounces`);
- complaint reports (RFC 5965 ``report-type=feedback-report``, the ARF of the mailbox
  providers' feedback loops);
- a reply to an email sendqueue sent (its ``In-Reply-To``/``References``), or a plain message
  from someone (the service decides whether that someone has Pending emails); auto-replies are
  not replies (:mod:`sendqueue.domain.replies`);
- an unsubscribe by mail (the ``mailto:`` of ``List-Unsubscribe``: subject
  ``unsubscribe <token>``).

A report counts only for an email sendqueue sent, and only when it proves which: it was
delivered to the task's signed VERP address, or the returned message carries the task's signed
List-Unsubscribe token or signed Message-ID (all checked with the secret key). A report that
proves nothing gives nothing, whatever address it names: the bounce address is public and task
ids are guessable. Each item says how it was proven (:class:`~sendqueue.domain.feedback.Proof`).
Pure, no I/O; never raises on any bytes.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, replace
from datetime import datetime
from email.message import Message

from sendqueue.domain.errors import InvalidField
from sendqueue.domain.feedback import Feedback, FeedbackKind, Proof, signed_task_of_message_id
from sendqueue.domain.mailparts import (
    FieldBlock,
    addresses,
    field_blocks,
    first_address,
    header,
    header_date,
    own_parts,
    parse_headers,
    parse_message,
    part_text,
    raw_header,
    raw_headers_of,
)
from sendqueue.domain.replies import reply_feedback
from sendqueue.domain.textbounces import is_text_bounce, read_text_bounce
from sendqueue.domain.tokens import (
    MIN_SECRET_LENGTH,
    TASK_ID_PATTERN,
    TokenPurpose,
    verify_task,
    verp_task,
)

__all__ = ["MAX_ITEMS", "MAX_REPORT", "parse_feedback"]

# Where a report's own headers may name the address it was delivered to (a VERP address).
_DELIVERED_TO = (
    "to",
    "delivered-to",
    "x-original-to",
    "envelope-to",
    "x-envelope-to",
    "return-path",
    "cc",
)
_STATUS = re.compile(r"\b([245])\.(\d{1,3})\.(\d{1,3})\b")
_REPLY_CODE = re.compile(r"(?<![\d.])([245])\d\d(?![\d.])")
# An unsubscribe token in a List-Unsubscribe link (https /u/TOKEN or the mailto: subject).
_LINK_TOKEN = re.compile(rf"{TASK_ID_PATTERN}\.[0-9a-f]{{32}}(?![0-9a-z])")
_DELIVERY_STATUS = frozenset({"message/delivery-status", "message/global-delivery-status"})
_FEEDBACK_REPORT = "message/feedback-report"
_RETURNED_MESSAGE = frozenset({"message/rfc822", "message/global"})
_RETURNED_HEADERS = frozenset({"text/rfc822-headers", "message/global-headers"})
#: Most items one message gives: a report about more recipients than this is not about one
#: email sendqueue sent (each has one recipient), so the rest is not read.
MAX_ITEMS = 100
#: Longest report part read (characters); a real one is a few hundred.
MAX_REPORT = 262_144
#: ARF feedback types that are no complaint: a "this is not spam" report, an SPF/DKIM/DMARC
#: failure report (RFC 6591).
_NOT_COMPLAINTS = frozenset({"not-spam", "auth-failure"})


@dataclass(frozen=True)
class _Context:
    """What every parser needs: the message, when it came and how to check what it proves."""

    msg: Message
    received_at: datetime
    bounce_address: str | None
    secret: str | None
    trusted_authserv: Collection[str] = ()

    def verp(self, candidates: list[str]) -> str | None:
        """The task of the first candidate that is a genuine VERP address of ours."""
        if not self.bounce_address or not self.secret:
            return None
        for address in candidates:
            task_id = verp_task(address, self.bounce_address, self.secret)
            if task_id:
                return task_id
        return None

    def signed_link(self, returned: Message | None) -> str | None:
        """The task of the returned email's own List-Unsubscribe token, checked with the key:
        a complaint's copy keeps it when its envelope sender is gone (Original-Mail-From is
        optional, the Return-Path is written at final delivery)."""
        if returned is None or not self.secret:
            return None
        for value in raw_headers_of(returned, "list-unsubscribe"):
            for token in _LINK_TOKEN.findall(value.lower()):
                task_id = verify_task(token, self.secret, TokenPurpose.UNSUBSCRIBE)
                if task_id:
                    return task_id
        return None

    def signed_id(self, returned: Message | None) -> str | None:
        """The task of the returned email's signed Message-ID, checked with the key."""
        if returned is None or not self.secret:
            return None
        return signed_task_of_message_id(raw_header(returned, "message-id"), self.secret)

    def at(self, *dates: str) -> datetime:
        """The first of ``dates`` that parses with an offset and is not after the message came;
        else when it came."""
        for value in dates:
            parsed = header_date(value)
            if parsed is not None and parsed <= self.received_at:
                return parsed
        return self.received_at


def parse_feedback(
    raw: bytes,
    *,
    received_at: datetime,
    key: str | None = None,
    bounce_address: str | None = None,
    secret: str | None = None,
    trusted_authserv: Collection[str] = (),
) -> list[Feedback]:
    """What the message ``raw`` reports, one item per recipient it reports on; [] for a message
    that is no feedback (an auto-reply, a delivery success, a reply to someone else's email).

    ``received_at`` (aware) is the time of an item unless the report dates it; ``key``
    identifies the message (``mailbox:uidvalidity:uid``): an item's key is ``key`` itself, or
    ``key#1``, ``key#2``... when the message reports on several recipients (at most
    :data:`MAX_ITEMS`). With both ``bounce_address`` and ``secret`` (the settings' bounce
    address and secret key), a report delivered to a VERP address names its task even without
    the returned message; with ``secret``, a report is proven by the returned email's signed
    Message-ID or List-Unsubscribe token, a reply by citing a signed Message-ID, and a mailed
    ``unsubscribe <token>`` is understood. ``trusted_authserv`` names the servers whose
    ``Authentication-Results`` prove a reply's From (:mod:`sendqueue.domain.authresults`).
    Raises InvalidField only for a short secret or a naive ``received_at`` (configuration, not
    the message); never for the bytes.
    """
    if received_at.tzinfo is None or received_at.utcoffset() is None:
        raise InvalidField("received_at", received_at, "expected an aware datetime")
    if secret is not None and len(secret) < MIN_SECRET_LENGTH:
        raise InvalidField("secret_key", "***", f"at least {MIN_SECRET_LENGTH} characters")
    msg = parse_message(raw)
    if msg is None:
        return []  # parts nested hundreds deep: no mail, and not read
    ctx = _Context(msg, received_at, bounce_address, secret, tuple(trusted_authserv))
    parts = list(own_parts(msg))
    types = [p.get_content_type() for p in parts]
    if any(t in _DELIVERY_STATUS for t in types):
        items = _dsn(ctx, parts)
    elif _FEEDBACK_REPORT in types:
        items = _arf(ctx, parts)
    elif msg.get_content_type() == "multipart/report":
        items = []  # read receipts (RFC 8098) and other reports: no feedback
    elif is_text_bounce(msg) and (bounces := _text_bounce(ctx)):
        items = bounces
    else:  # a person's message that only reads like a bounce is read as a reply
        items = reply_feedback(msg, received_at, secret, ctx.trusted_authserv)
    items = items[:MAX_ITEMS]
    if len(items) == 1:
        return [_keyed(items[0], key)]
    return [_keyed(item, f"{key}#{i}" if key else None) for i, item in enumerate(items, 1)]


def _keyed(item: Feedback, key: str | None) -> Feedback:
    return replace(item, key=key)


# -- the returned message ------------------------------------------------------------------


def _returned(parts: list[Message]) -> Message | None:
    """The returned message, or its headers, attached to a report."""
    for part in parts:
        kind = part.get_content_type()
        if kind in _RETURNED_MESSAGE:
            payload = part.get_payload()
            if isinstance(payload, list) and payload and isinstance(payload[0], Message):
                return payload[0]
        if kind in _RETURNED_HEADERS:
            return parse_headers(part_text(part))
    return None


def _task(ctx: _Context, returned: Message | None, *extra: str) -> tuple[str, Proof] | None:
    """The task a report is about and how it is proven: the VERP address it was delivered to
    (its own headers, ``extra`` report fields, the returned message's Return-Path), else the
    returned email's signed List-Unsubscribe token or signed Message-ID; None when it proves
    no task (see the module's docstring)."""
    if ctx.bounce_address and ctx.secret:
        delivered = [v for name in _DELIVERED_TO for v in raw_headers_of(ctx.msg, name)]
        candidates = addresses(delivered)
        candidates += addresses(list(extra))
        if returned is not None:
            candidates += addresses(raw_headers_of(returned, "return-path"))
        task_id = ctx.verp(candidates)
        if task_id:
            return task_id, Proof.VERP
    task_id = ctx.signed_link(returned) or ctx.signed_id(returned)
    return (task_id, Proof.SIGNED) if task_id else None


# -- delivery status notifications (RFC 3464) ------------------------------------------------


def _dsn(ctx: _Context, parts: list[Message]) -> list[Feedback]:
    blocks: list[FieldBlock] = []
    for part in parts:
        if part.get_content_type() in _DELIVERY_STATUS:
            blocks += field_blocks(part_text(part)[:MAX_REPORT])
    per_message = next((b for b in blocks if not _is_recipient_block(b)), {})
    recipients = [b for b in blocks if _is_recipient_block(b)]
    proven = _task(ctx, _returned(parts))
    if proven is None:
        return []  # names no email sendqueue sent in a way that proves it: possibly forged
    task_id, proof = proven
    items = []
    for block in recipients[: MAX_ITEMS * 2]:
        status = _first(block, "status")
        diagnostic = _first(block, "diagnostic-code")
        kind = _bounce_kind(_first(block, "action"), status, diagnostic)
        if kind is None:
            continue
        code = _STATUS.search(status)
        detail = f"{code.group(0) if code else status} {diagnostic}".strip()
        at = ctx.at(_first(block, "last-attempt-date"), _first(per_message, "arrival-date"))
        recipient = _recipient(block)
        items.append(Feedback(kind, at, task_id, recipient, detail[:1000], proof=proof))
    return items


def _is_recipient_block(block: FieldBlock) -> bool:
    return any(k in block for k in ("final-recipient", "original-recipient", "action", "status"))


def _first(block: FieldBlock, name: str) -> str:
    values = block.get(name)
    return values[0] if values else ""


def _recipient(block: FieldBlock) -> str | None:
    """``Final-Recipient: rfc822; a@b`` (or ``utf-8;``), else ``Original-Recipient``."""
    for name in ("final-recipient", "original-recipient"):
        for value in block.get(name, []):
            kind, sep, address = value.partition(";")
            if not sep:
                kind, address = "rfc822", value
            if kind.strip().lower() in ("rfc822", "utf-8"):
                found = first_address(address)
                if found:
                    return found
    return None


def _bounce_kind(action: str, status: str, diagnostic: str) -> FeedbackKind | None:
    """Hard for a permanent failure (5.x.x), soft for a transient one (4.x.x) or a delay,
    nothing for a delivery; without a status, the diagnostic's codes decide."""
    verb = action.split(" ", 1)[0].split(";", 1)[0].lower()
    if verb in ("delivered", "relayed", "expanded"):
        return None
    if verb == "delayed":
        return FeedbackKind.SOFT_BOUNCE
    code = _STATUS.search(status) or _STATUS.search(diagnostic)
    reply = _REPLY_CODE.search(diagnostic.partition(";")[2] or diagnostic)
    klass = code.group(1) if code else reply.group(1) if reply else None
    if klass == "5":
        return FeedbackKind.HARD_BOUNCE
    if klass == "4":
        return FeedbackKind.SOFT_BOUNCE
    if klass is None and verb == "failed":
        return FeedbackKind.HARD_BOUNCE  # "failed" is final (RFC 3464 2.3.3)
    return None


def _text_bounce(ctx: _Context) -> list[Feedback]:
    """A plain-text bounce (:mod:`sendqueue.domain.textbounces`): one item per failed address,
    dated by the bounce's Date."""
    bounces, returned = read_text_bounce(ctx.msg, limit=MAX_ITEMS)
    proven = _task(ctx, returned)
    if proven is None:
        return []  # names no email sendqueue sent in a way that proves it: possibly forged
    task_id, proof = proven
    at = ctx.at(header(ctx.msg, "date"))
    return [Feedback(b.kind, at, task_id, b.recipient, b.detail, proof=proof) for b in bounces]


# -- complaints (RFC 5965) -----------------------------------------------------------------


def _arf(ctx: _Context, parts: list[Message]) -> list[Feedback]:
    fields: FieldBlock = {}
    for part in parts:
        if part.get_content_type() == _FEEDBACK_REPORT:
            for block in field_blocks(part_text(part)[:MAX_REPORT]):
                for name, values in block.items():
                    fields.setdefault(name, []).extend(values)
    feedback_type = _first(fields, "feedback-type").split(";", 1)[0].strip().lower()
    if not feedback_type or feedback_type in _NOT_COMPLAINTS:
        return []
    returned = _returned(parts)
    proven = _task(ctx, returned, *fields.get("original-mail-from", []))
    if proven is None:
        return []  # names no email sendqueue sent in a way that proves it: possibly forged
    task_id, proof = proven
    recipients: list[str | None] = [*addresses(fields.get("original-rcpt-to", []), limit=MAX_ITEMS)]
    if not recipients and returned is not None:
        recipients = [*addresses(raw_headers_of(returned, "to"), limit=1)]
    at = ctx.at(_first(fields, "arrival-date"), _first(fields, "received-date"))
    return [
        Feedback(FeedbackKind.COMPLAINT, at, task_id, r, feedback_type, proof=proof)
        for r in recipients or [None]
    ]
