"""The suppression list's records: addresses that must not be sent to, and why.

One global list, compared case-insensitively. An entry's address is kept in its
compared form, :func:`suppression_key`: the address as email-validator normalises it
(:mod:`sendqueue.domain.addresses` checks it first), then case-folded whole (``casefold``, not
``lower``, which spells a Greek final sigma two ways and keeps "ß" apart from "SS"). Pure, no
I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from email_validator import EmailNotValidError, validate_email

from sendqueue.domain.addresses import parse_mailbox
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.models import utc

__all__ = [
    "SUPPRESSED_PREFIX",
    "Suppression",
    "SuppressionReason",
    "first_entries",
    "key_of_normalized",
    "suppressed_reason",
    "suppression_key",
]

#: How a task cancelled because of the list starts its ``reason``: "suppressed: bounced".
SUPPRESSED_PREFIX = "suppressed"

#: Longest address kept (RFC 5321's path limit less its brackets, as email-validator allows).
_MAX_ADDRESS = 254

#: Longest task id an entry refers to (the stores' column, as for a task's own id).
MAX_TASK_ID = 200


class SuppressionReason(enum.StrEnum):
    """Why an address is on the list."""

    UNSUBSCRIBED = "unsubscribed"
    """The recipient asked to get no more email (an unsubscribe link or request)."""
    BOUNCED = "bounced"
    """A permanent delivery failure: the mailbox does not exist."""
    COMPLAINED = "complained"
    """The recipient marked an email as spam (a feedback-loop report)."""
    REPLIED = "replied"
    """The recipient replied (only where a campaign stops on replies)."""
    MANUAL = "manual"
    """Added by an operator."""

    @classmethod
    def parse(cls, value: object, *, field: str = "reason") -> SuppressionReason:
        """The reason spelled ``value`` in any case; InvalidField naming ``field`` otherwise."""
        wanted = value.strip().lower() if isinstance(value, str) else None
        for reason in cls:
            if reason.value == wanted:
                return reason
        raise InvalidField(field, value, f"one of {', '.join(r.value for r in cls)}")


@dataclass(frozen=True)
class Suppression:
    """One address on the list: ``email`` in its compared form (:func:`suppression_key`), why,
    the task it came from (None when added by hand or imported) and when (aware, UTC)."""

    email: str
    reason: SuppressionReason
    task_id: str | None
    at: datetime

    def __post_init__(self) -> None:
        if not isinstance(self.reason, SuppressionReason):
            object.__setattr__(self, "reason", SuppressionReason.parse(self.reason))
        if self.task_id is not None and not 0 < len(self.task_id) <= MAX_TASK_ID:
            raise InvalidField("task_id", self.task_id, f"1 to {MAX_TASK_ID} characters")
        object.__setattr__(self, "at", utc(self.at))


def first_entries(entries: Iterable[Suppression]) -> dict[str, Suppression]:
    """The first entry of each address, by address: of two entries for one address in one
    call to ``SuppressionList.suppress``, the first is the one kept."""
    first: dict[str, Suppression] = {}
    for entry in entries:
        first.setdefault(entry.email, entry)
    return first


def suppression_key(value: object, *, field: str = "email") -> str:
    """The compared form of an address: validated, normalised, case-folded whole.

    Takes a bare address (``a@example.com``, surrounding blanks ignored); a display name, a
    second address, a line break or anything email-validator refuses raises InvalidField
    naming ``field``. A non-ASCII domain is kept in Unicode, as the import keeps it.
    """
    if not isinstance(value, str) or not value.strip():
        raise InvalidField(field, value, "expected an address like someone@example.com")
    text = value.strip()
    if len(text) > _MAX_ADDRESS * 4:
        raise InvalidField(field, value, f"too long for an address (at most {_MAX_ADDRESS})")
    mailbox = parse_mailbox(field, text)
    if mailbox.display_name or "<" in text:
        raise InvalidField(field, value, "expected a bare address, without a name or <>")
    try:
        valid = validate_email(text, check_deliverability=False)
    except EmailNotValidError as exc:
        raise InvalidField(field, value, str(exc)) from exc
    return valid.normalized.casefold()


def key_of_normalized(email: str) -> str:
    """The compared form of an address already normalised by email-validator (every stored
    recipient's is, by the import): case-folding it is all that is left to do, without the
    ~50 us of validating it again. A property test holds this equal to
    :func:`suppression_key` of such an address."""
    return email.casefold()


def suppressed_reason(reason: SuppressionReason) -> str:
    """The ``reason`` of a task cancelled because its address is on the list."""
    return f"{SUPPRESSED_PREFIX}: {reason.value}"
