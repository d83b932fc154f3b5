"""What happened to an email after the server accepted it (issue 14): outcomes and feedback.

A Finished task carries an *outcome* (``accepted`` once sent; later ``bounced``, ``complained``,
``replied`` or ``unsubscribed``). The five task states never change for it; an outcome change is
logged like a state change (``from_state == to_state``, the note ``"outcome: <value>"``).

:class:`Feedback` is one piece of news about a sent email, whatever brought it: a DSN or an ARF
report read from the feedback mailbox, a reply in the sender's mailbox, an SES event, or a click
on the unsubscribe link. The parsers (:mod:`sendqueue.domain.reports`) make it from a message;
the feedback service applies it. Pure, no I/O.
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

__all__ = [
    "OUTCOME_NOTE_PREFIX",
    "SOFT_BOUNCE_LIMIT",
    "SOFT_BOUNCE_WINDOW",
    "Feedback",
    "FeedbackKind",
    "StopOnReply",
    "TaskOutcome",
    "outcome_note",
    "task_id_from_message_id",
]

#: How the change-log note of an outcome change starts: "outcome: bounced".
OUTCOME_NOTE_PREFIX = "outcome"

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
}
_SUPPRESS_AS = {
    FeedbackKind.HARD_BOUNCE: SuppressionReason.BOUNCED,
    FeedbackKind.SOFT_BOUNCE: None,
    FeedbackKind.COMPLAINT: SuppressionReason.COMPLAINED,
    FeedbackKind.REPLY: None,
    FeedbackKind.UNSUBSCRIBE: SuppressionReason.UNSUBSCRIBED,
}


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
    is impossible; None for a click.
    """

    kind: FeedbackKind
    at: datetime
    task_id: str | None = None
    recipient: str | None = None
    detail: str = ""
    key: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, FeedbackKind):
            object.__setattr__(self, "kind", FeedbackKind(self.kind))
        if self.task_id is None and not self.recipient:
            raise InvalidField("task_id", None, "feedback names a task or a recipient")
        object.__setattr__(self, "at", utc(self.at))


def outcome_note(outcome: TaskOutcome, detail: str = "") -> str:
    """The change-log note of an outcome change: "outcome: bounced" (the detail is kept on the
    task, not in the log)."""
    del detail  # the log stays short; the task row carries the detail
    return f"{OUTCOME_NOTE_PREFIX}: {outcome.value}"


# A Message-ID sendqueue made (addresses.message_id_for): <task_id@domain>. Task ids are
# "<campaign id>-<position>", campaign ids "c" + 12 hex digits.
_OUR_MESSAGE_ID = re.compile(r"<?\s*(c[0-9a-f]{12}-[0-9]{1,9})@[^<>\s@]+\s*>?")


def task_id_from_message_id(value: str) -> str | None:
    """The task id in a Message-ID sendqueue made (``<c0123456789ab-7@example.com>``), or None
    for any other. Takes one id, with or without its brackets."""
    match = _OUR_MESSAGE_ID.fullmatch(value.strip())
    return match.group(1) if match else None
