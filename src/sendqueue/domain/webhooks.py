"""Webhook endpoints and the events they receive, without I/O.

- :class:`WebhookEndpoint`: where events go (``wh_`` id, url, filters, enabled or disabled with
  a reason, its signing secret and the previous one during a rotation), plus its delivery
  position: ``cursor`` (the change-log id delivered up to), and the head event's failed
  ``attempts``, ``retry_at`` and ``failing_since``.
- :func:`event_of`: the one mapping from a change-log entry to an event type. An event exists
  if and only if its change was committed, and its id (:func:`event_id`) is derived from the
  change id, so it is the same on every retry and every redelivery.
- :func:`event_body`: the JSON an endpoint receives. Type, state, outcome and reason come from
  the change-log entry (a snapshot of the change); recipient, sender and message id from the
  task read at delivery time (:class:`EventTask`), which never change once the task is sent.
  The body is therefore the same on every attempt.
- :class:`DeliveryRecord`: one attempt as the delivery log keeps it (7 days), with the opaque
  cursor the log is paged by (:func:`delivery_cursor`, :func:`delivery_cursor_key`).
- :class:`RelayedLetter`: a dead letter as the change log records it (the ``dead_letter``
  event), copied there from the execution layer's dead-letter storage, once per letter id.

``sequence.stopped`` is not an event type: sequences do not exist yet.
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
import re
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypedDict
from urllib.parse import urlsplit, urlunsplit

from sendqueue.domain.addresses import ascii_domain
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.models import MAX_CURSOR, ChangeLogEntry, DeadLetter, Task, step_of, utc

__all__ = [
    "DEAD_LETTER",
    "DELIVERY_LOG_DAYS",
    "MAX_LETTER_ID_LENGTH",
    "MAX_URL_LENGTH",
    "PREVIOUS_SECRET_VALID",
    "DeliveryRecord",
    "EndpointChanges",
    "EventTask",
    "EventType",
    "RelayedLetter",
    "WebhookEndpoint",
    "WebhookEvent",
    "backoff",
    "change_id_of",
    "check_campaign_ids",
    "check_event_types",
    "check_url",
    "checked_endpoint_changes",
    "delivery_cursor",
    "delivery_cursor_id",
    "delivery_cursor_key",
    "event_body",
    "event_id",
    "event_of",
    "new_endpoint_id",
    "new_secret",
]

#: How long the previous secret still signs after a rotation.
PREVIOUS_SECRET_VALID = timedelta(hours=24)
#: The change log's ``to_state`` of a dead letter (``WebhookStore.relay_dead_letters``).
DEAD_LETTER = "dead_letter"
#: The longest dead-letter id a store keeps a relay marker for (an SQS message id has 36).
MAX_LETTER_ID_LENGTH = 128
#: A dead letter's error as the change log keeps it (its ``note``).
_NOTE_LENGTH = 500
#: How long the delivery log keeps an attempt.
DELIVERY_LOG_DAYS = 7
MAX_URL_LENGTH = 2000
_EVENT_PREFIX = "evt_"
# One encoder for every body (json.dumps would build one per call); a body is a tree of plain
# values, so the check for cycles is left out.
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, check_circular=False)


class EventType(enum.StrEnum):
    """What a webhook event reports."""

    EMAIL_SENT = "email.sent"
    """The mail provider accepted an email."""
    EMAIL_FAILED = "email.failed"
    """An email failed for good (permanent error, attempts exhausted, outcome unknown)."""
    EMAIL_BOUNCED = "email.bounced"
    """A sent email bounced."""
    EMAIL_COMPLAINED = "email.complained"
    """The recipient marked a sent email as spam."""
    EMAIL_REPLIED = "email.replied"
    """The recipient replied."""
    EMAIL_UNSUBSCRIBED = "email.unsubscribed"
    """The recipient unsubscribed."""
    EMAIL_CANCELLED = "email.cancelled"
    """An email was cancelled before it was sent (with the reason)."""
    CAMPAIGN_COMPLETED = "campaign.completed"
    """A campaign has no Pending or Running email left."""
    CAMPAIGN_PAUSED = "campaign.paused"
    """A campaign was paused (by a user, or automatically)."""
    DEAD_LETTER = "dead_letter"
    """An email's invocation ended in the dead-letter queue."""


_OUTCOME_TYPES = {
    "outcome: bounced": EventType.EMAIL_BOUNCED,
    "outcome: complained": EventType.EMAIL_COMPLAINED,
    "outcome: replied": EventType.EMAIL_REPLIED,
    "outcome: unsubscribed": EventType.EMAIL_UNSUBSCRIBED,
}
_OUTCOMES = {t: note.split(": ", 1)[1] for note, t in _OUTCOME_TYPES.items()}


def new_endpoint_id() -> str:
    """``wh_`` and 16 hex digits."""
    return "wh_" + secrets.token_hex(8)


def new_secret() -> str:
    """A Standard Webhooks secret: ``whsec_`` and the base64 of 24 random bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode("ascii")


def check_url(url: str, *, production: bool) -> str:
    """The endpoint's URL, stripped: ``https`` (``http`` too outside production), a host, no
    credentials, no fragment, no space or control character, ASCII after the host; a
    non-ASCII host in its IDNA 2008 form. InvalidField naming ``url`` otherwise. Whether its
    address may be reached is the delivery adapter's check (literal IPs and DNS answers)."""
    url = url.strip()
    if not url or len(url) > MAX_URL_LENGTH:
        raise InvalidField("url", url, f"must be 1 to {MAX_URL_LENGTH} characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidField("url", url, f"is not a valid URL: {exc}") from exc
    del port
    allowed = ("https",) if production else ("https", "http")
    if parts.scheme not in allowed:
        reason = "must be https in production" if production else "must be http or https"
        raise InvalidField("url", url, reason)
    if not parts.hostname:
        raise InvalidField("url", url, "must name a host")
    if parts.username is not None or parts.password is not None:
        raise InvalidField("url", url, "must not carry credentials")
    if parts.fragment:
        raise InvalidField("url", url, "must not have a #fragment")
    if any(ch.isspace() or not ch.isprintable() for ch in url):
        raise InvalidField("url", url, "must not contain spaces or control characters")
    if not (parts.path + parts.query).isascii():
        # an HTTP request line is ASCII: the transport could never send it
        reason = "must be ASCII after the host: percent-encode the rest (é is %C3%A9)"
        raise InvalidField("url", url, reason)
    if not parts.hostname.isascii():
        # stored as IDNA 2008 A-labels: the idna codec a socket would use is IDNA 2003
        host = ascii_domain("url", parts.hostname, url)
        netloc = host if parts.port is None else f"{host}:{parts.port}"
        url = urlunsplit(parts._replace(netloc=netloc))
    return url


def check_event_types(types: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The filter's types, each one of :class:`EventType` (InvalidField naming ``events``);
    empty means every type. Duplicates are dropped, order kept."""
    out: list[str] = []
    for value in types:
        try:
            kind = EventType(value).value
        except ValueError as exc:
            known = ", ".join(t.value for t in EventType)
            raise InvalidField("events", value, f"must be one of {known}") from exc
        if kind not in out:
            out.append(kind)
    return tuple(out)


def check_campaign_ids(ids: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The filter's campaign ids (InvalidField naming ``campaigns`` for an empty or overlong
    one); empty means every campaign."""
    out: list[str] = []
    for value in ids:
        value = value.strip()
        if not value or len(value) > 64:
            raise InvalidField("campaigns", value, "must be a campaign id of 1 to 64 characters")
        if value not in out:
            out.append(value)
    return tuple(out)


@dataclass(frozen=True)
class WebhookEndpoint:
    """An endpoint events are delivered to (see the module docstring)."""

    id: str
    url: str
    created_at: datetime
    secret: str = field(repr=False)  # never in a log line
    event_types: tuple[str, ...] = ()
    campaign_ids: tuple[str, ...] = ()
    enabled: bool = True
    disabled_reason: str | None = None
    previous_secret: str | None = field(default=None, repr=False)
    previous_secret_expires_at: datetime | None = None
    cursor: int = 0
    attempts: int = 0
    retry_at: datetime | None = None
    failing_since: datetime | None = None

    def wants(self, kind: str, campaign_id: str) -> bool:
        """Whether its filters let an event of ``kind`` about ``campaign_id`` through."""
        if self.event_types and kind not in self.event_types:
            return False
        return not self.campaign_ids or campaign_id in self.campaign_ids

    def signing_secrets(self, now: datetime) -> list[str]:
        """The secrets a delivery at ``now`` is signed with: the current one, and the previous
        one until it expires."""
        out = [self.secret]
        expires = self.previous_secret_expires_at
        if self.previous_secret and expires is not None and now < expires:
            out.append(self.previous_secret)
        return out


class EndpointChanges(TypedDict, total=False):
    """The fields :meth:`sendqueue.ports.webhooks.WebhookStore.update_endpoint` may set."""

    url: str
    event_types: tuple[str, ...]
    campaign_ids: tuple[str, ...]
    enabled: bool
    disabled_reason: str | None
    secret: str
    previous_secret: str | None
    previous_secret_expires_at: datetime | None
    cursor: int
    attempts: int
    retry_at: datetime | None
    failing_since: datetime | None


_FIELDS = frozenset(EndpointChanges.__annotations__)
_TIMES = ("previous_secret_expires_at", "retry_at", "failing_since")


def checked_endpoint_changes(changes: EndpointChanges) -> dict[str, Any]:
    """The changes as every store takes them: an unknown key is ``InvalidField("changes")``,
    times in UTC, filters as tuples."""
    values: dict[str, Any] = dict(changes)
    unknown = set(values) - _FIELDS
    if unknown:
        raise InvalidField("changes", sorted(unknown), f"may set {sorted(_FIELDS)}")
    for key in _TIMES:
        if values.get(key) is not None:
            values[key] = utc(values[key])
    for key in ("event_types", "campaign_ids"):
        if key in values:
            values[key] = tuple(values[key])
    return values


@dataclass(frozen=True)
class WebhookEvent:
    """One event: its change, its type, the id every delivery of it carries."""

    change: ChangeLogEntry
    type: EventType

    @property
    def id(self) -> str:
        return event_id(self.change.id)


@dataclass(frozen=True, slots=True)
class EventTask:
    """What an event's body says of its task, read when the event is delivered: the
    recipient, the sender (None: the campaign's From) and the Message-ID (None until sent)."""

    email: str
    sender: str | None
    message_id: str | None

    @classmethod
    def of(cls, task: Task) -> EventTask:
        return cls(task.email, task.sender, task.message_id)


@dataclass(frozen=True)
class DeliveryRecord:
    """One delivery attempt as the log keeps it. ``status`` is the HTTP status when one came
    back; ``error`` a short sanitized reason (None on success). ``attempt`` counts from 1;
    ``redelivery`` marks one asked for by a user. ``cursor`` is its opaque place in the log,
    set by the store that read it (None on an attempt not yet stored); equality ignores it."""

    endpoint_id: str
    event_id: str
    event_type: str
    at: datetime
    attempt: int
    latency_ms: int
    status: int | None = None
    error: str | None = None
    redelivery: bool = False
    cursor: str | None = field(default=None, compare=False)

    @property
    def ok(self) -> bool:
        return self.error is None


#: Unpadded urlsafe base64, and no longer than any cursor a store makes.
_CURSOR_TEXT = re.compile(r"[A-Za-z0-9_-]{1,400}")
_CURSOR_ID = re.compile(r"[1-9][0-9]{0,18}")


def delivery_cursor(store: str, endpoint_id: str, key: str) -> str:
    """The opaque cursor of one attempt in an endpoint's log: the unpadded urlsafe base64 of
    the store's kind, the endpoint and the store's own unique key of the attempt (a row id, a
    sort key), so a cursor of another store or endpoint is told apart and refused."""
    raw = f"{store}:{endpoint_id}:{key}".encode()
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def delivery_cursor_key(cursor: str, *, store: str, endpoint_id: str, key: re.Pattern[str]) -> str:
    """The store's key inside ``cursor``, made by :func:`delivery_cursor` for this store and
    endpoint and matching ``key`` in full; anything else is InvalidField naming ``before``."""
    raw = _decoded(cursor)
    prefix = f"{store}:{endpoint_id}:"
    found = raw[len(prefix) :] if raw is not None and raw.startswith(prefix) else None
    # the canonical spelling only, so that an attempt has one cursor
    if (
        found is None
        or not key.fullmatch(found)
        or delivery_cursor(store, endpoint_id, found) != cursor
    ):
        raise _bad_cursor(cursor)
    return found


def delivery_cursor_id(cursor: str, *, store: str, endpoint_id: str) -> int:
    """The row id or position inside the cursor of a store whose keys are positive integers
    (at most :data:`~sendqueue.domain.models.MAX_CURSOR`); InvalidField naming ``before``
    otherwise."""
    value = int(delivery_cursor_key(cursor, store=store, endpoint_id=endpoint_id, key=_CURSOR_ID))
    if value > MAX_CURSOR:
        raise _bad_cursor(cursor)
    return value


def _decoded(cursor: str) -> str | None:
    if not _CURSOR_TEXT.fullmatch(cursor):
        return None
    try:
        return base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


def _bad_cursor(cursor: str) -> InvalidField:
    reason = "is not a cursor of this webhook's delivery log (use a page's `next`)"
    return InvalidField("before", cursor, reason)


@dataclass(frozen=True)
class RelayedLetter:
    """A dead letter as the change log records it: the letter's id (the relay's idempotency
    key), its task, its error (cut to 500 characters) and when it failed (the entry's time,
    so relaying it late or twice gives the same entry)."""

    letter_id: str
    task_id: str
    error: str
    at: datetime

    def __post_init__(self) -> None:
        if not 1 <= len(self.letter_id) <= MAX_LETTER_ID_LENGTH:
            reason = f"must be 1 to {MAX_LETTER_ID_LENGTH} characters"
            raise InvalidField("letter_id", self.letter_id, reason)
        if not 1 <= len(self.task_id) <= MAX_LETTER_ID_LENGTH:
            reason = f"must be 1 to {MAX_LETTER_ID_LENGTH} characters"
            raise InvalidField("task_id", self.task_id, reason)
        object.__setattr__(self, "error", self.error[:_NOTE_LENGTH])
        object.__setattr__(self, "at", utc(self.at))

    @classmethod
    def of(cls, letter: DeadLetter) -> RelayedLetter | None:
        """What ``letter`` puts in the change log, or None for a letter of no task (a control
        schedule's, such as a provisioning continuation)."""
        task_id = letter.payload.get("task_id")
        if not task_id:
            return None
        return cls(letter.id, task_id, letter.error, letter.failed_at)


def event_id(change_id: int) -> str:
    """The event id of a change: ``evt_`` and the change id."""
    return f"{_EVENT_PREFIX}{change_id}"


def change_id_of(value: str) -> int:
    """The change id an event id was made from (InvalidField naming ``events`` otherwise)."""
    digits = value.strip().removeprefix(_EVENT_PREFIX)
    if not digits.isdigit() or len(digits) > 19:
        raise InvalidField("events", value, "must be an event id like evt_123")
    return int(digits)


def event_of(entry: ChangeLogEntry) -> WebhookEvent | None:
    """The event a change-log entry makes, or None (claims, give-backs, moves, progress)."""
    kind = _type_of(entry)
    return None if kind is None else WebhookEvent(entry, kind)


def _type_of(entry: ChangeLogEntry) -> EventType | None:
    if entry.task_id is None:
        if entry.to_state == "completed":
            return EventType.CAMPAIGN_COMPLETED
        if entry.to_state == "paused":
            return EventType.CAMPAIGN_PAUSED
        return None
    to = entry.to_state
    if to == DEAD_LETTER:
        return EventType.DEAD_LETTER
    if to == "Finished":
        if entry.from_state == "Finished":
            return _OUTCOME_TYPES.get(entry.note or "")
        return EventType.EMAIL_SENT
    if to == "Failed":
        return EventType.EMAIL_FAILED
    if to == "Cancelled":
        return EventType.EMAIL_CANCELLED
    return None


def event_body(event: WebhookEvent, task: EventTask | None) -> bytes:
    """The JSON body of ``event`` (compact, keys in a fixed order); ``task`` is what the store
    holds of the event's task now, or None (a campaign event, or a task since deleted)."""
    entry = event.change
    data: dict[str, object] = {
        "campaign_id": entry.campaign_id,
        "task_id": entry.task_id,
        "step": step_of(entry.task_id) if entry.task_id is not None else None,
        "sender": task.sender if task is not None else None,
        "recipient": task.email if task is not None else None,
        "state": entry.to_state,
        "outcome": _outcome(event.type),
        "reason": entry.note,
        "message_id": task.message_id if task is not None else None,
    }
    document = {
        "type": event.type.value,
        "id": event.id,
        "timestamp": entry.at.isoformat().replace("+00:00", "Z"),
        "data": data,
    }
    return _JSON.encode(document).encode()


def _outcome(kind: EventType) -> str | None:
    if kind is EventType.EMAIL_SENT:
        return "accepted"
    return _OUTCOMES.get(kind)


def backoff(attempts: int, *, base: float, cap: float) -> float:
    """Seconds before the next try after ``attempts`` failed ones: ``base`` doubling, at most
    ``cap``."""
    if attempts <= 0:
        return 0.0
    return float(min(cap, base * 2 ** min(attempts - 1, 40)))
