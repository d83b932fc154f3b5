"""Senders: the mailboxes campaigns send from (issue 13). Pure, no I/O.

A sender is a value, validated on construction: every invalid field raises
:class:`~sendqueue.domain.errors.InvalidField` naming it. Its daily cap is counted per local day
in the sender's own timezone, and with a warm-up it ramps: ``warmup_start`` emails on the ramp's
first day, ``warmup_step`` more on each calendar day after it, up to ``daily_cap``.

The ramp counts calendar days from ``warmup_from`` (by default the day the sender is added),
not days on which mail went out: a cap that depended on which earlier days sent would shrink
when an earlier day's emails were cancelled, and could leave a later day overbooked.

A transport may hold credentials (``smtp://user:secret@host``): :func:`masked_transport` is the
one form shown outside the store (logs, reprs, the API, the UI).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from urllib.parse import urlsplit, urlunsplit
from zoneinfo import ZoneInfo

from .addresses import check_header_value, normalize_sender
from .errors import InvalidField
from .policy import MAX_PER_DAY, load_timezone

__all__ = [
    "DEFAULT_DAILY_CAP",
    "DEFAULT_MIN_GAP_SECONDS",
    "MAX_MIN_GAP_SECONDS",
    "TRANSPORT_SCHEMES",
    "Booking",
    "Sender",
    "SenderDay",
    "epoch_ms",
    "masked_transport",
    "new_sender_id",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
DEFAULT_DAILY_CAP = 50
DEFAULT_MIN_GAP_SECONDS = 60
#: One send a day at most, at the strictest gap a sender may have.
MAX_MIN_GAP_SECONDS = 86_400
MAX_NAME_CHARS = 200
#: The transports a sender may name; the mail adapters parse the rest of the URL.
TRANSPORT_SCHEMES = ("smtp", "ses", "maildir")


def epoch_ms(at: datetime) -> int:
    """Whole milliseconds since the epoch (rounded down) of an aware instant."""
    return (at - _EPOCH) // timedelta(milliseconds=1)


def new_sender_id() -> str:
    """A short random id, ``s`` and 12 hex digits (never an address: no ``@``)."""
    return "s" + secrets.token_hex(6)


def masked_transport(url: str | None) -> str | None:
    """``url`` with any password replaced by ``***`` (``smtp://user:***@host:587``); the query
    is dropped too, since a provider may take a key there."""
    if url is None:
        return None
    parts = urlsplit(url)
    if parts.password is None and not parts.query:
        return url
    netloc = parts.netloc
    if parts.password is not None:
        userinfo, _, hostport = netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:***@{hostport}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _check_transport(url: str | None) -> None:
    if url is None:
        return
    if not isinstance(url, str) or not url.strip():
        raise InvalidField("transport", url, "expected a mailer URL such as smtp://host:587")
    check_header_value("transport", url)
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme not in TRANSPORT_SCHEMES:
        raise InvalidField(
            "transport",
            masked_transport(url),
            f"the scheme must be one of {', '.join(TRANSPORT_SCHEMES)} "
            "(smtp://user:password@host:587?security=starttls, ses:eu-west-1, maildir:PATH)",
        )


def _check_count(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidField(name, value, f"expected a whole number from {low} to {high}")
    if not low <= value <= high:
        raise InvalidField(name, value, f"must be from {low} to {high}")
    return value


@dataclass(frozen=True)
class Sender:
    """A mailbox: its From, its transport, and what it may send a day."""

    id: str
    email: str
    name: str = ""
    reply_to: str | None = None
    transport: str | None = field(default=None, repr=False)
    """A mailer URL (credentials included), or None for the configured mailer."""
    daily_cap: int = DEFAULT_DAILY_CAP
    min_gap_seconds: int = DEFAULT_MIN_GAP_SECONDS
    timezone: str = "Europe/Berlin"
    warmup_start: int | None = None
    warmup_step: int | None = None
    warmup_from: date | None = None
    """The ramp's first day (the sender's local date); required with a warm-up."""

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id or "@" in self.id:
            raise InvalidField("id", self.id, "expected a sender id such as s1a2b3c4d5e6")
        email = normalize_sender(self.email, "email")
        if "<" in email:
            raise InvalidField(
                "email", self.email, "expected the bare address; give the display name as name"
            )
        object.__setattr__(self, "email", email)
        if not isinstance(self.name, str) or len(self.name) > MAX_NAME_CHARS:
            raise InvalidField("name", self.name, f"expected text of at most {MAX_NAME_CHARS}")
        check_header_value("name", self.name)
        if self.reply_to is not None:
            object.__setattr__(self, "reply_to", normalize_sender(self.reply_to, "reply_to"))
        _check_transport(self.transport)
        _check_count("daily_cap", self.daily_cap, 1, MAX_PER_DAY)
        _check_count("min_gap_seconds", self.min_gap_seconds, 1, MAX_MIN_GAP_SECONDS)
        load_timezone(self.timezone)
        if (self.warmup_start is None) != (self.warmup_step is None):
            raise InvalidField(
                "warmup_start" if self.warmup_start is None else "warmup_step",
                None,
                "a warm-up needs both warmup_start and warmup_step",
            )
        if self.warmup_start is not None and self.warmup_step is not None:
            _check_count("warmup_start", self.warmup_start, 1, self.daily_cap)
            _check_count("warmup_step", self.warmup_step, 1, self.daily_cap)
            if not isinstance(self.warmup_from, date):
                raise InvalidField(
                    "warmup_from", self.warmup_from, "a warm-up needs its first day (YYYY-MM-DD)"
                )

    @property
    def zone(self) -> ZoneInfo:
        """The sender's timezone, where its days (and so its cap) are counted."""
        return load_timezone(self.timezone)

    @property
    def from_header(self) -> str:
        """The From this sender writes: ``Name <address>``, or the address alone."""
        return f"{self.name} <{self.email}>" if self.name else self.email

    def cap_on(self, day: date) -> int:
        """How many emails the sender may send on its local ``day``: ``daily_cap``, or the
        warm-up's ramp where it is lower. A day before the ramp's first day gets its start."""
        if self.warmup_start is None or self.warmup_step is None or self.warmup_from is None:
            return self.daily_cap
        days_in = max(0, (day - self.warmup_from).days)
        return min(self.daily_cap, self.warmup_start + self.warmup_step * days_in)


@dataclass(frozen=True)
class Booking:
    """One planned send holding a slot on its sender's day (what the store books atomically).

    ``at`` is the send instant, a slot start of the sender (see
    :mod:`sendqueue.domain.capacity`); ``day`` its local day in the sender's timezone; ``cap``
    the sender's cap on that day as the planner read it (planned plus sent there never passes
    it); ``recipient`` the compared address (``key_of_normalized``), which the store remembers
    as sent from this sender (sticky).
    """

    sender_id: str
    at: datetime
    day: date
    task_id: str
    campaign_id: str
    recipient: str
    cap: int
    at_ms: int = field(init=False, repr=False, compare=False)
    """``at`` in whole milliseconds since the epoch: the slot's key in a store (worked out
    once here: a store reads it several times per booking)."""

    def __post_init__(self) -> None:
        at = self.at
        if at.tzinfo is not UTC:  # the planner's instants are UTC already
            if at.utcoffset() is None:
                raise InvalidField("at", at, "expected an aware date and time")
            at = at.astimezone(UTC)
            object.__setattr__(self, "at", at)
        object.__setattr__(self, "at_ms", epoch_ms(at))
        if isinstance(self.cap, bool) or not isinstance(self.cap, int) or self.cap < 1:
            raise InvalidField("cap", self.cap, "expected a whole number of at least 1")


@dataclass(frozen=True)
class SenderDay:
    """A sender's usage on one of its local days: sends still planned, and sends made."""

    day: date
    planned: int
    sent: int
