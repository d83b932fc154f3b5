"""Bounces that are no RFC 3464 report, for :mod:`sendqueue.domain.reports`.

Older Exim ("This message was created automatically by mail delivery software"), qmail ("Hi.
This is the qmail-send program") and similar mail systems return a plain-text message: an
explanation naming each failed address on a line of its own (Exim: indented; qmail:
``<address>:``) followed by what the remote server said, then a copy of the message or its
headers after a ``------ This is a copy of the message ...`` line. This module finds those
addresses, says for each whether the failure is permanent (a 5xx reply or 5.x.x status, else
"permanent error" wording) or transient (4xx, 4.x.x, "not yet been delivered"), and hands back
the returned headers so the caller can find the task. Pure, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from email.message import Message

from sendqueue.domain.feedback import FeedbackKind
from sendqueue.domain.mailparts import header, own_parts, parse_headers, part_text
from sendqueue.domain.replies import is_mail_system

__all__ = ["TextBounce", "is_text_bounce", "read_text_bounce"]

_BOUNCE_SUBJECT = re.compile(
    r"mail delivery (failed|failure|problem)|undeliver(ed|able)|delivery status notification"
    r"|delivery (has )?fail|failure notice|returned mail|non[- ]?delivery",
    re.IGNORECASE,
)
# "Warning: message ... delayed": looked for in two steps, as "warning: message.*delayed"
# would scan to the end from every "warning: message" of a subject made of them (quadratic).
_DELAY_SUBJECT = re.compile(r"warning: message", re.IGNORECASE)
_BOUNCE_BODY = re.compile(
    r"created automatically by mail delivery software|this is the qmail-send program"
    r"|could not be delivered|delivery to the following recipients? (failed|has been delayed)"
    r"|has not yet been delivered|permanent (error|failure)|undeliverable",
    re.IGNORECASE,
)
# The line after which the copy of the returned message (or its headers) starts.
_COPY_MARKER = re.compile(
    r"^[ \t]*+-{2,}+[^\n]*?(copy of the message|below this line|original message|returned message"
    r"|header of the original|undelivered message).*$",
    re.IGNORECASE | re.MULTILINE,
)
# A failed address on a line of its own (stripped): qmail's "<a@b>:" (what follows on the line
# is the reason), Exim's indented "  a@b". Quantifiers stay unambiguous: a mail can be huge.
_BRACKETED = re.compile(r"<([^\s<>@]+@[^\s<>@]+)>\s*:\s*(.*)")
_INDENTED = re.compile(r"([^\s<>@\"]+@[^\s<>@\":]+?):?")
_STATUS = re.compile(r"(?<![\d.])([45])\.\d{1,3}\.\d{1,3}(?![\d.])")
_REPLY_CODE = re.compile(r"(?<![\d.\w-])([45])\d\d(?![\d.\w])")
_PERMANENT = re.compile(
    r"permanent (error|failure)|permanently|given up|giving up|failed permanently",
    re.IGNORECASE,
)
_TRANSIENT = re.compile(
    r"temporar(y|ily)|not yet been delivered|has been delayed|will (continue|keep) trying",
    re.IGNORECASE,
)
# Mail-system addresses an explanation mentions that are not failed recipients.
_NOT_RECIPIENTS = frozenset({"postmaster", "mailer-daemon", "abuse", "hostmaster", "root"})


@dataclass(frozen=True)
class TextBounce:
    """One failed address of a plain-text bounce."""

    kind: FeedbackKind
    recipient: str
    detail: str


def _body(msg: Message) -> str:
    for part in own_parts(msg):
        if part.get_content_type() == "text/plain":
            return part_text(part)
    return ""


def _is_bounce_subject(subject: str) -> bool:
    if _BOUNCE_SUBJECT.search(subject):
        return True
    warning = _DELAY_SUBJECT.search(subject)
    return warning is not None and "delayed" in subject[warning.end() :].lower()


def is_text_bounce(msg: Message) -> bool:
    """Whether ``msg`` looks like a plain-text bounce: sent by a mail system or titled like a
    bounce, and worded like one."""
    if not (is_mail_system(msg) or _is_bounce_subject(header(msg, "subject"))):
        return False
    return _BOUNCE_BODY.search(_body(msg)) is not None


def read_text_bounce(msg: Message, *, limit: int) -> tuple[list[TextBounce], Message | None]:
    """The failed addresses of a plain-text bounce (the first ``limit``: the explanation is not
    read further), and the returned message's headers (an attached message, else the copy
    after the marker line) when there are any."""
    body = _body(msg)
    marker = _COPY_MARKER.search(body)
    explanation = body[: marker.start()] if marker else body
    returned = _attached(msg)
    if returned is None and marker is not None:
        returned = parse_headers(body[marker.end() :])
    fallback = _by_wording(explanation)
    bounces: list[TextBounce] = []
    seen: set[str] = set()
    for recipient, reason in _failed(explanation):
        if len(bounces) >= limit:
            break
        kind = _by_code(reason) or fallback
        if kind is None or recipient in seen:
            continue
        seen.add(recipient)
        status = _STATUS.search(reason)
        detail = f"{status.group(0)} {reason}" if status else reason
        bounces.append(TextBounce(kind, recipient, detail.strip()[:1000]))
    return bounces, returned


def _attached(msg: Message) -> Message | None:
    for part in own_parts(msg):
        if part.get_content_type() in ("message/rfc822", "text/rfc822-headers"):
            if not part.is_multipart():  # the headers as text (get_payload() could raise)
                return parse_headers(part_text(part))
            payload = part.get_payload()
            if isinstance(payload, list) and payload and isinstance(payload[0], Message):
                return payload[0]
    return None


def _failed(explanation: str) -> Iterator[tuple[str, str]]:
    """Each address on a line of its own, with the reason that follows it (its line's rest
    and the next lines up to a blank line or the next address), whitespace collapsed; each
    given as soon as its reason ends, so a caller can stop reading."""
    address: str | None = None
    reason: list[str] = []
    for line in explanation.splitlines():
        stripped = line.strip()
        bracketed = _BRACKETED.fullmatch(stripped)
        indented = _INDENTED.fullmatch(stripped) if line[:1] in (" ", "\t") else None
        found = bracketed.group(1) if bracketed else indented.group(1) if indented else None
        if found and found.rpartition("@")[0].lower() not in _NOT_RECIPIENTS:
            if address is not None:
                yield address, " ".join(" ".join(reason).split())
            address, reason = found, [bracketed.group(2)] if bracketed else []
        elif not stripped:
            if address is not None:
                yield address, " ".join(" ".join(reason).split())
            address, reason = None, []
        elif address is not None:
            reason.append(stripped)
    if address is not None:
        yield address, " ".join(" ".join(reason).split())


def _by_code(reason: str) -> FeedbackKind | None:
    """Hard for a 5.x.x status or 5xx reply in ``reason``, soft for 4.x.x or 4xx."""
    code = _STATUS.search(reason) or _REPLY_CODE.search(reason)
    if code is None:
        return None
    return FeedbackKind.HARD_BOUNCE if code.group(1) == "5" else FeedbackKind.SOFT_BOUNCE


def _by_wording(explanation: str) -> FeedbackKind | None:
    """The kind an explanation's wording gives every address without a code."""
    if _PERMANENT.search(explanation):
        return FeedbackKind.HARD_BOUNCE
    if _TRANSIENT.search(explanation):
        return FeedbackKind.SOFT_BOUNCE
    return None
