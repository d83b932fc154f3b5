"""What happened to an email after the server accepted it: outcomes and feedback.

A Finished task carries an *outcome* (``accepted`` once sent; later ``bounced``, ``complained``,
``replied`` or ``unsubscribed``). The five task states never change for it; an outcome change is
logged like a state change (``from_state == to_state``, the note ``"outcome: <value>"``).

:class:`Feedback` is one piece of news about a sent email, whatever brought it: a DSN or an ARF
report read from the feedback mailbox, a reply in the sender's mailbox, an SES event, or a click
on the unsubscribe link. The parsers (:mod:`sendqueue.domain.reports`) make it from a message;
the feedback service applies it, as far as its :class:`Proof` allows. Pure, no I/O.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from sendqueue.domain.errors import InvalidField
from sendqueue.domain.lifecycle import StopOnReply, TaskOutcome
from sendqueue.domain.models import utc
from sendqueue.domain.suppression import SuppressionReason
from sendqueue.domain.tokens import TASK_ID_PATTERN, TokenPurpose, verify_task

__all__ = [
    "OUTCOME_NOTE_PREFIX",
    "SOFT_BOUNCE_LIMIT",
    "SOFT_BOUNCE_WINDOW",
    "UNVERIFIED_NOTE",
    "UNVERIFIED_REPLY",
    "Feedback",
    "FeedbackKind",
    "MailboxState",
    "Proof",
    "StopOnReply",
    "TaskOutcome",
    "outcome_note",
    "signed_task_of_message_id",
    "task_id_from_message_id",
]

#: How the change-log note of an outcome change starts: "outcome: bounced".
OUTCOME_NOTE_PREFIX = "outcome"
#: How the detail of a reply that proved nothing starts (noted on an ``accepted`` email).
UNVERIFIED_REPLY = "unverified reply"

#: Transient bounces (4.x.x) of one address that put it on the list, within the window.
SOFT_BOUNCE_LIMIT = 3
SOFT_BOUNCE_WINDOW = timedelta(days=7)


class FeedbackKind(enum.StrEnum):
    """What a piece of feedback says."""

    HARD_BOUNCE = "hard_bounce"
    """Permanent failure (DSN action ``failed`` with a 5.x.x status, SES ``Permanent``)."""
    SOFT_BOUNCE = "soft_bounce"
    """Transient failure (4.x.x, or ``delayed``); suppresses after a few in a week."""
    COMPLAINT = "complaint"
    """A spam complaint (ARF ``Feedback-Type: abuse`` and the like, SES complaint)."""
    REPLY = "reply"
    """A human reply to an email sendqueue sent."""
    UNSUBSCRIBE = "unsubscribe"
    """An unsubscribe request (the one-click link, the confirmation page, the mailto)."""
    AUTO_REPLY = "auto_reply"
    """An out-of-office notice naming its writer's return date (the detail, ``2026-12-14``):
    it stops nothing; the recipient's next step waits until that date."""

    @property
    def outcome(self) -> TaskOutcome | None:
        """The task outcome this feedback sets (None: a soft bounce only counts)."""
        return _OUTCOME_OF[self]

    @property
    def suppression(self) -> SuppressionReason | None:
        """The reason the address goes on the list at once (None: not at once, or never)."""
        return _SUPPRESS_AS[self]


_OUTCOME_OF = {
    FeedbackKind.HARD_BOUNCE: TaskOutcome.BOUNCED,
    FeedbackKind.SOFT_BOUNCE: None,
    FeedbackKind.COMPLAINT: TaskOutcome.COMPLAINED,
    FeedbackKind.REPLY: TaskOutcome.REPLIED,
    FeedbackKind.UNSUBSCRIBE: TaskOutcome.UNSUBSCRIBED,
    FeedbackKind.AUTO_REPLY: None,
}
_SUPPRESS_AS = {
    FeedbackKind.HARD_BOUNCE: SuppressionReason.BOUNCED,
    FeedbackKind.SOFT_BOUNCE: None,
    FeedbackKind.COMPLAINT: SuppressionReason.COMPLAINED,
    FeedbackKind.REPLY: None,
    FeedbackKind.UNSUBSCRIBE: SuppressionReason.UNSUBSCRIBED,
    FeedbackKind.AUTO_REPLY: None,
}


class Proof(enum.StrEnum):
    """How a piece of feedback shows what it is about: what it may change.

    Mail reaches the feedback and sender mailboxes from anyone, and task ids are guessable, so
    a message acts only on what it proves (docs/deliverability.md, "What is trusted")."""

    TRUSTED = "trusted"
    """From a channel only sendqueue and its provider write: an SES event from sendqueue's own
    queue, a click on a signed unsubscribe link, a caller of the service."""
    VERP = "verp"
    """Delivered to the signed VERP address of its task."""
    SIGNED = "signed"
    """Cites its task's signed Message-ID or List-Unsubscribe token. A reply so proven counts
    for the task only when it comes from the task's address; a report, only when the
    recipient it names (if any) is the task's address."""
    AUTHENTICATED = "authenticated"
    """A reply whose From domain a trusted server's Authentication-Results say passes DMARC
    (or aligned DKIM or SPF): it speaks for its From address."""
    NONE = "none"
    """Nothing proven: recorded as unverified, changes nothing."""


@dataclass(frozen=True)
class Feedback:
    """One piece of news about a sent email.

    ``task_id`` is the task it is about when the source could tell (a VERP address, a signed
    unsubscribe token, a Message-ID in ``In-Reply-To``/``References``, the ``X-Sendqueue-Task``
    header of a returned message); ``recipient`` is the address it is about (the DSN's
    ``Final-Recipient``, the complainer, the reply's From), used when the task is unknown and to
    suppress. At least one of the two is set. ``detail`` is what an operator reads: "5.1.1
    smtp; 550 5.1.1 user unknown", "abuse", a reply's subject. ``key`` identifies the message it
    came from (a mailbox's ``name:uidvalidity:uid``, an SES event's id) so that counting it twice
    is impossible; None for a click. ``proof`` says how it showed what it is about (the mail
    parser sets it; a caller of the service that made the item itself leaves it ``TRUSTED``).
    ``to`` holds a reply's To and Cc addresses: an authenticated reply counts only when it was
    written to the campaign (a message the recipient once signed for someone else, mailed to
    us again, is no reply).
    """

    kind: FeedbackKind
    at: datetime
    task_id: str | None = None
    recipient: str | None = None
    detail: str = ""
    key: str | None = None
    proof: Proof = Proof.TRUSTED
    to: tuple[str, ...] = ()
    mailbox_sender: str | None = None
    """The id of the sender whose own mailbox the message was read from (None: the feedback
    mailbox, or no mailbox): a reply there written to that sender was written to us."""

    def __post_init__(self) -> None:
        if not isinstance(self.kind, FeedbackKind):
            object.__setattr__(self, "kind", FeedbackKind(self.kind))
        if not isinstance(self.proof, Proof):
            object.__setattr__(self, "proof", Proof(self.proof))
        if self.task_id is None and not self.recipient:
            raise InvalidField("task_id", None, "feedback names a task or a recipient")
        object.__setattr__(self, "at", utc(self.at))


@dataclass(frozen=True)
class MailboxState:
    """What the passes over one mailbox saw: when the last one ended (``polled_at``), how many
    messages all of them read (``messages_read``), and the last one's error (None: it went
    through), its credentials masked."""

    mailbox: str
    polled_at: datetime | None = None
    messages_read: int = 0
    last_error: str | None = None


#: The change-log note of an unverified reply noted on an ``accepted`` email.
UNVERIFIED_NOTE = f"{OUTCOME_NOTE_PREFIX}: accepted ({UNVERIFIED_REPLY})"


def outcome_note(outcome: TaskOutcome, detail: str = "") -> str:
    """The change-log note of an outcome change: "outcome: bounced" (the detail is kept on the
    task, not in the log)."""
    del detail  # the log stays short; the task row carries the detail
    return f"{OUTCOME_NOTE_PREFIX}: {outcome.value}"


# A Message-ID sendqueue made (addresses.message_id_for): <task_id.mac@domain> with the key,
# <task_id@domain> without. Task ids are "<campaign id>-<position>", campaign ids "c" + 12 hex.
_OUR_MESSAGE_ID = re.compile(
    rf"<?\s*({TASK_ID_PATTERN})(?:\.([0-9a-f]{{32}}))?@[^<>\s@]+\s*>?", re.IGNORECASE
)


def task_id_from_message_id(value: str) -> str | None:
    """The task id in a Message-ID shaped like one sendqueue makes, signed or not
    (``<c0123456789ab-7.<mac>@example.com>``), or None for any other. Takes one id, with or
    without its brackets. Proves nothing (ids without the key are guessable, and this does not
    check the MAC): use it to recognise our own emails, never to act on feedback."""
    match = _OUR_MESSAGE_ID.fullmatch(value.strip())
    return match.group(1).lower() if match else None


def signed_task_of_message_id(value: str, secret: str) -> str | None:
    """The task id of a Message-ID sendqueue made with ``secret`` and whose MAC checks; None
    for an unsigned, altered or foreign one. Citing it proves having received that email."""
    match = _OUR_MESSAGE_ID.fullmatch(value.strip())
    if match is None or match.group(2) is None:
        return None
    token = f"{match.group(1)}.{match.group(2)}"
    return verify_task(token, secret, TokenPurpose.MESSAGE_ID)
