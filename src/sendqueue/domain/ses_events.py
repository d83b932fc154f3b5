"""Amazon SES bounce and complaint events as :class:`~sendqueue.domain.feedback.Feedback`
(what the AWS feedback function reads). Pure, no I/O.

SES publishes one JSON document per event: through a configuration set's event destination
(``"eventType": "Bounce" | "Complaint"``) or an identity's feedback notifications
(``"notificationType"``), both with the same ``bounce``/``complaint`` and ``mail`` objects.
It reaches the feedback queue through SNS, so an SQS message's body is either that document
(raw message delivery on) or SNS's envelope around it (``"Type": "Notification"`` with the
document as the ``Message`` string). :func:`feedback_from_ses` takes any of the three.

Mapping:

- ``Permanent`` bounce: one :attr:`~FeedbackKind.HARD_BOUNCE` per bounced recipient, detail
  "<status> <diagnosticCode>" (e.g. "5.1.1 smtp; 550 5.1.1 user unknown");
- ``Transient`` and ``Undetermined`` bounces: :attr:`~FeedbackKind.SOFT_BOUNCE` (SES itself
  only suppresses permanent ones; an undetermined bounce counts towards the soft limit);
- ``Complaint``: one :attr:`~FeedbackKind.COMPLAINT` per complained recipient, detail the
  ``complaintFeedbackType`` ("abuse", ...) or "complaint"; a ``not-spam`` report gives none.

The task comes from the ``X-Sendqueue-Task`` header SES returns in ``mail.headers``, else
from the Message-ID sendqueue made (:func:`~sendqueue.domain.feedback.task_id_from_message_id`
of ``mail.commonHeaders.messageId`` or the ``Message-ID`` header). ``key`` is the event's
``feedbackId`` and the recipient's place in it (``<feedbackId>#<i>``), so that the same event
delivered twice is counted once. Anything else (other event types, SNS subscription messages,
SES's set-up test message, broken JSON) gives ``[]``; nothing here raises on input.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sendqueue.domain.feedback import Feedback, FeedbackKind, task_id_from_message_id
from sendqueue.domain.tokens import TASK_ID_PATTERN

__all__ = ["NOT_SPAM", "TASK_HEADER", "feedback_from_ses", "ses_event_of"]

#: The header the send worker writes into every email (SES echoes it in ``mail.headers``).
TASK_HEADER = "X-Sendqueue-Task"
#: The ARF feedback type of a recipient who marked the email as *not* spam.
NOT_SPAM = "not-spam"

# A task id: "<campaign id>-<position>" (models.task_id); anything else in the header is ignored.
_TASK_ID = re.compile(TASK_ID_PATTERN)
_BOUNCE_KINDS = {
    "Permanent": FeedbackKind.HARD_BOUNCE,
    "Transient": FeedbackKind.SOFT_BOUNCE,
    "Undetermined": FeedbackKind.SOFT_BOUNCE,
}
_MAX_DETAIL = 1000


def ses_event_of(body: object) -> Mapping[str, Any] | None:
    """The SES event in an SQS message body (a str or bytes of JSON, or already decoded): the
    document itself, or the one inside an SNS ``Notification`` envelope. None for anything
    else."""
    document = _json(body)
    if not isinstance(document, Mapping):
        return None
    if document.get("Type") == "Notification" and "Message" in document:
        document = _json(document["Message"])
        if not isinstance(document, Mapping):
            return None
    if _type_of(document) not in ("Bounce", "Complaint"):
        return None
    return document


def feedback_from_ses(body: object, *, received_at: datetime) -> list[Feedback]:
    """The feedback in one SES event (see the module docstring); ``received_at`` is the time
    used when the event carries none that parses. Never raises on its input."""
    event = ses_event_of(body)
    if event is None:
        return []
    mail = event.get("mail")
    mail = mail if isinstance(mail, Mapping) else {}
    task_id = _task_of(mail)
    if _type_of(event) == "Bounce":
        part = event.get("bounce")
        if not isinstance(part, Mapping):
            return []
        bounce_type = part.get("bounceType")
        kind = _BOUNCE_KINDS.get(bounce_type) if isinstance(bounce_type, str) else None
        if kind is None:
            return []
        recipients = part.get("bouncedRecipients")
    else:
        part = event.get("complaint")
        if not isinstance(part, Mapping):
            return []
        feedback_type = part.get("complaintFeedbackType")
        if isinstance(feedback_type, str) and feedback_type.strip().lower() == NOT_SPAM:
            return []
        kind = FeedbackKind.COMPLAINT
        recipients = part.get("complainedRecipients")
    if not isinstance(recipients, list):
        return []
    at = _time(part.get("timestamp")) or _time(mail.get("timestamp")) or received_at
    feedback_id = part.get("feedbackId")
    found: list[Feedback] = []
    for index, recipient in enumerate(recipients):
        if not isinstance(recipient, Mapping):
            continue
        address = recipient.get("emailAddress")
        address = address.strip() if isinstance(address, str) and address.strip() else None
        if address is None and task_id is None:
            continue
        found.append(
            Feedback(
                kind,
                at,
                task_id=task_id,
                recipient=address,
                detail=_detail(kind, part, recipient),
                key=f"{feedback_id}#{index}" if isinstance(feedback_id, str) else None,
            )
        )
    return found


def _type_of(document: Mapping[str, Any]) -> object:
    """An event's type: ``eventType`` (event publishing) or ``notificationType``."""
    return document.get("eventType", document.get("notificationType"))


def _json(value: object) -> object:
    if isinstance(value, bytes | bytearray):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return None
    if isinstance(value, str):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):
            return None
    return value


def _task_of(mail: Mapping[str, Any]) -> str | None:
    """The task an email was: its X-Sendqueue-Task header, else its Message-ID."""
    message_ids: list[object] = []
    headers = mail.get("headers")
    if isinstance(headers, list):
        for header in headers:
            if not isinstance(header, Mapping) or not isinstance(header.get("name"), str):
                continue
            name, value = header["name"].strip().lower(), header.get("value")
            if not isinstance(value, str):
                continue
            if name == TASK_HEADER.lower() and _TASK_ID.fullmatch(value.strip()):
                return value.strip()
            if name == "message-id":
                message_ids.append(value)
    common = mail.get("commonHeaders")
    if isinstance(common, Mapping):
        message_ids.insert(0, common.get("messageId"))
    for value in message_ids:
        if isinstance(value, str) and (task_id := task_id_from_message_id(value)):
            return task_id
    return None


def _time(value: object) -> datetime | None:
    """An ISO 8601 time with its offset ("2026-12-01T10:00:00.000Z"); None otherwise."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        return parsed.astimezone(UTC) if parsed.utcoffset() is not None else None
    except (ValueError, OverflowError):  # not a time, or one UTC cannot hold
        return None


def _detail(kind: FeedbackKind, part: Mapping[str, Any], recipient: Mapping[str, Any]) -> str:
    """What an operator reads: the status and diagnostic of a bounce, the complaint's type."""
    if kind is FeedbackKind.COMPLAINT:
        feedback_type = part.get("complaintFeedbackType")
        text = feedback_type if isinstance(feedback_type, str) and feedback_type else "complaint"
    else:
        pieces = [recipient.get("status"), recipient.get("diagnosticCode")]
        text = " ".join(p.strip() for p in pieces if isinstance(p, str) and p.strip())
        if not text:
            sub = part.get("bounceSubType")
            text = f"SES {part.get('bounceType')} bounce" + (
                f" ({sub})" if isinstance(sub, str) else ""
            )
    return text[:_MAX_DETAIL]
