"""The exception hierarchy of sendqueue, in one place.

    SendqueueError
    ├── DomainError                 a request that breaks a rule; nothing was changed
    │   ├── InvalidField            one input field is wrong (names field, value, what is allowed)
    │   ├── InvalidInput            several problems at once (e.g. CSV rows), each an InvalidField
    │   ├── InvalidSettings         the SENDQUEUE_* settings were refused (a sentence per problem)
    │   ├── NoSendingDay            the policy allows no sending day within the planning horizon
    │   ├── IllegalTransition       a task or campaign state change the lifecycle forbids
    │   ├── NotFound                an unknown campaign, task, schedule or dead letter
    │   └── Conflict                the object exists in another form (e.g. schedule token clash)
    │       └── Overbooked          a sender's slot or day is taken (another campaign booked it)
    ├── NotChecked                  ``sendqueue check`` cannot try a part from here (says why)
    └── InfrastructureError         a backing system failed; retrying later may succeed
        ├── StoreUnavailable        the task store could not be reached or failed to write
        ├── SchedulerError          the execution layer failed
        │   └── Throttled           the execution layer asked us to slow down
        ├── FeedbackUnavailable     the feedback mailbox (IMAP) could not be read
        ├── FeedbackParseFailed     one feedback message's parser failed, timed out or died
        ├── OAuthTokenError         a sender's OAuth token endpoint gave no access token
        ├── WebhookDeliveryFailed   a webhook endpoint did not answer 2xx (or was refused)
        └── MailError               the mail provider refused or failed
            ├── TransientMailError  4xx, connection errors, timeouts: try again later
            └── PermanentMailError  5xx: do not try again

Adapters wrap vendor exceptions at their edge (``raise StoreUnavailable(...) from exc``) so the
service layer only ever sees these types.
"""

from __future__ import annotations

from collections.abc import Sequence

from sendqueue.domain.wording import plural

__all__ = [
    "Conflict",
    "DomainError",
    "FeedbackParseFailed",
    "FeedbackUnavailable",
    "IllegalTransition",
    "InfrastructureError",
    "InvalidField",
    "InvalidInput",
    "InvalidSettings",
    "MailError",
    "NoSendingDay",
    "NotChecked",
    "NotFound",
    "OAuthTokenError",
    "Overbooked",
    "PermanentMailError",
    "SchedulerError",
    "SendqueueError",
    "StoreUnavailable",
    "Throttled",
    "TransientMailError",
    "WebhookDeliveryFailed",
]


class SendqueueError(Exception):
    """Base of every error sendqueue raises on purpose."""


class DomainError(SendqueueError):
    """A request broke a rule of the domain. Nothing was changed."""


class InvalidField(DomainError, ValueError):
    """One input field is invalid.

    ``field`` names the field as the user spelled it (``per_day``, ``windows``, ``email``),
    ``value`` is what was given and ``reason`` says what is allowed. ``row`` is set for errors
    that come from a row of an imported file (1-based, the header is row 1).
    """

    def __init__(self, field: str, value: object, reason: str, *, row: int | None = None) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        self.row = row
        where = f"row {row}: " if row is not None else ""
        super().__init__(f"{where}{field}: {reason} (got {value!r})")

    def as_dict(self) -> dict[str, object]:
        """A JSON-friendly form, for the CLI's and the API's error output."""
        out: dict[str, object] = {"field": self.field, "reason": self.reason}
        if self.row is not None:
            out["row"] = self.row
        out["value"] = (
            self.value if isinstance(self.value, str | int | float | None) else str(self.value)
        )
        return out


class InvalidInput(DomainError, ValueError):
    """Several invalid fields at once, for instance the bad rows of a CSV file.

    ``errors`` holds at most the first ``limit`` problems found; ``total`` counts them all.
    """

    def __init__(self, summary: str, errors: Sequence[InvalidField], *, total: int | None = None):
        self.summary = summary
        self.errors = list(errors)
        self.total = total if total is not None else len(self.errors)
        super().__init__(f"{summary}: {plural(self.total, 'problem')}")


class InvalidSettings(DomainError, ValueError):
    """The settings (the ``SENDQUEUE_*`` variables, a ``.env`` file) were refused.

    ``problems`` holds one plain sentence per problem, each naming its variable or variables
    and never quoting a value (it may be a secret); ``str()`` is those sentences, one a line.
    """

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(self.problems))


class NoSendingDay(DomainError):
    """The policy allows no sending day within the planning horizon."""


class IllegalTransition(DomainError):
    """The lifecycle forbids this state change (e.g. resuming a cancelled campaign)."""

    def __init__(self, kind: str, current: object, target: object, detail: str = "") -> None:
        self.kind = kind
        self.current = current
        self.target = target
        msg = f"{kind} cannot go from {current} to {target}"
        super().__init__(f"{msg}: {detail}" if detail else msg)


class NotFound(DomainError, LookupError):
    """An unknown campaign, task, schedule or dead letter."""

    def __init__(self, kind: str, ident: object) -> None:
        self.kind = kind
        self.ident = ident
        super().__init__(f"{kind} {ident!r} not found")


class Conflict(DomainError):
    """The object already exists in another form (e.g. a schedule name with another token)."""


class Overbooked(Conflict):
    """A booking was refused: ``sender_id``'s slot at ``at`` is held by another task, or its
    local ``day`` is full. Nothing of the call was booked; re-read the books and plan again."""

    def __init__(self, sender_id: str, *, day: object = None, at: object = None) -> None:
        self.sender_id = sender_id
        self.day = day
        self.at = at
        what = f"day {day} is full" if at is None else f"slot {at} is taken"
        super().__init__(f"sender {sender_id}: {what}")


class NotChecked(SendqueueError):
    """A part of the set-up that cannot be tried from here (no credentials for it, nothing to
    sign in to); the message says why. Neither a success nor a failure of the part."""


class InfrastructureError(SendqueueError):
    """A backing system failed. Retrying later may succeed."""


class StoreUnavailable(InfrastructureError):
    """The task store could not be reached, or a write failed."""


class FeedbackUnavailable(InfrastructureError):
    """The feedback mailbox could not be reached, logged in to or read (or its messages not
    parsed at all: the parser's process could not start)."""


class FeedbackParseFailed(InfrastructureError):
    """One feedback message could not be parsed: its parser raised, ran out of its time
    budget or died. The message is skipped; the next one is parsed afresh."""


class SchedulerError(InfrastructureError):
    """The execution layer failed."""


class Throttled(SchedulerError):
    """The execution layer asked us to slow down; back off and retry."""


class OAuthTokenError(InfrastructureError):
    """A sender's OAuth 2.0 token endpoint gave no access token. The message names the sender
    and the ``oauth`` field, never a token. ``permanent`` when asking again cannot help (the
    grant was revoked or expired: ``invalid_grant``, a refused client), so the grant must be
    replaced; otherwise (5xx, a timeout, an unreachable endpoint) a later try may succeed."""

    def __init__(self, message: str, *, permanent: bool) -> None:
        super().__init__(message)
        self.permanent = permanent


class WebhookDeliveryFailed(InfrastructureError):
    """A webhook delivery failed: a refused target, no connection, a timeout or a non-2xx
    answer. The message is short and safe to log (never the response body); ``status`` is the
    HTTP status when one came back."""

    def __init__(self, reason: str, *, status: int | None = None) -> None:
        self.reason = reason
        self.status = status
        super().__init__(reason)


class MailError(InfrastructureError):
    """The mail provider failed or refused a message."""


class TransientMailError(MailError):
    """A temporary failure (SMTP 4xx, connection error, timeout): try again later."""


class PermanentMailError(MailError):
    """A permanent refusal (SMTP 5xx): sending again will not help."""
