"""Senders: the mailboxes campaigns send from. Pure, no I/O.

A sender is a value, validated on construction: every invalid field raises
:class:`~sendqueue.domain.errors.InvalidField` naming it. Its daily cap is counted per local day
in the sender's own timezone, and with a warm-up it ramps: ``warmup_start`` emails on its first
sending day, ``warmup_step`` more after each sending day, up to ``daily_cap``
(:meth:`Sender.cap_on`).

A *sending day* is a local day, on or after ``warmup_from`` (the day the warm-up was set), that
has held a booking: it stays one when its emails are cancelled or moved away (the store keeps
its day row). So the number of sending days before a day only ever grows, and a cap given to a
booking is never above the cap the final books give that day: cancelling an earlier day cannot
leave a later day over its ramp. Weekends and idle weeks hold no booking and do not count.

A transport may hold credentials (``smtp://user:secret@host``): :func:`masked_transport` is the
one form shown outside the store (logs, reprs, the API, the UI).
"""

from __future__ import annotations

import secrets
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo

from .addresses import check_header_value, normalize_sender
from .errors import InvalidField
from .policy import MAX_PER_DAY, load_timezone
from .transports import mask_url

__all__ = [
    "DEFAULT_DAILY_CAP",
    "DEFAULT_MIN_GAP_SECONDS",
    "MAX_MIN_GAP_SECONDS",
    "TRANSPORT_SCHEMES",
    "Booking",
    "OAuthGrant",
    "Sender",
    "SenderDay",
    "epoch_ms",
    "masked_transport",
    "new_sender_id",
    "planned_booking",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)
DEFAULT_DAILY_CAP = 50
DEFAULT_MIN_GAP_SECONDS = 60
#: One send a day at most, at the strictest gap a sender may have.
MAX_MIN_GAP_SECONDS = 86_400
MAX_NAME_CHARS = 200
#: A signature's size: the text form, and the optional HTML form.
MAX_SIGNATURE_TEXT_CHARS = 4_000
MAX_SIGNATURE_HTML_CHARS = 20_000
#: The longest OAuth field kept (a refresh token is opaque; Microsoft's run to about 1.5 kB).
MAX_OAUTH_FIELD_CHARS = 8_000
#: The transports a sender may name; the mail adapters parse the rest of the URL.
TRANSPORT_SCHEMES = ("smtp", "ses", "maildir")


def epoch_ms(at: datetime) -> int:
    """Whole milliseconds since the epoch (rounded down) of an aware instant."""
    return (at - _EPOCH) // _ONE_MS


def new_sender_id() -> str:
    """A short random id, ``s`` and 12 hex digits (never an address: no ``@``)."""
    return "s" + secrets.token_hex(6)


def masked_transport(url: str | None) -> str | None:
    """``url`` with any password replaced by ``***`` (``smtp://user:***@host:587``); the query
    is dropped too, since a provider may take a key there (:func:`mask_url`)."""
    return None if url is None else mask_url(url)


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


def _scheme(url: str) -> str:
    """The scheme of ``url``, "" for a URL ``urlsplit`` cannot read (``https://[x``)."""
    try:
        return urlsplit(url).scheme
    except ValueError:
        return ""


def _check_text(name: str, value: object, limit: int, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not isinstance(value, str) or len(value) > limit:
        raise InvalidField(name, None, f"expected text of at most {limit:,} characters")


@dataclass(frozen=True)
class OAuthGrant:
    """How a sender signs in with OAuth 2.0 (``XOAUTH2``) instead of a password: the provider's
    token endpoint, the app's client id (and secret, for a confidential client), and the
    refresh token that access tokens are got with. Secrets never appear in its repr."""

    token_url: str
    client_id: str
    refresh_token: str = field(repr=False)
    client_secret: str | None = field(default=None, repr=False)
    scope: str | None = None

    def __post_init__(self) -> None:
        url = self.token_url
        if not isinstance(url, str) or _scheme(url) not in ("https", "http"):
            raise InvalidField(
                "oauth.token_url", None, "expected the provider's token endpoint (https://...)"
            )
        check_header_value("oauth.token_url", url)
        for name in ("token_url", "client_id", "refresh_token"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise InvalidField(f"oauth.{name}", None, "must not be empty")
            _check_text(f"oauth.{name}", value, MAX_OAUTH_FIELD_CHARS)
        _check_text("oauth.client_secret", self.client_secret, MAX_OAUTH_FIELD_CHARS, optional=True)
        _check_text("oauth.scope", self.scope, MAX_OAUTH_FIELD_CHARS, optional=True)

    def as_dict(self) -> dict[str, str | None]:
        """The grant as stored (secrets included: only a store calls this)."""
        return {
            "token_url": self.token_url,
            "client_id": self.client_id,
            "refresh_token": self.refresh_token,
            "client_secret": self.client_secret,
            "scope": self.scope,
        }

    @classmethod
    def from_dict(cls, doc: dict[str, str | None] | None) -> OAuthGrant | None:
        """The grant :meth:`as_dict` stored, or None."""
        if doc is None:
            return None
        return cls(
            token_url=doc["token_url"] or "",
            client_id=doc["client_id"] or "",
            refresh_token=doc["refresh_token"] or "",
            client_secret=doc.get("client_secret"),
            scope=doc.get("scope"),
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
    imap: str | None = field(default=None, repr=False)
    """The sender's own mailbox (an ``imaps://`` URL, credentials included), where its
    replies, bounces and unsubscribe emails land; None: only the feedback mailbox is read."""
    signature_text: str = ""
    """The sender's signature as text (templates see it as ``sender.signature``)."""
    signature_html: str | None = None
    """The signature's HTML form, for HTML bodies; None: the text form, escaped."""
    oauth: OAuthGrant | None = field(default=None, repr=False)
    """OAuth 2.0 sign-in for its SMTP and IMAP (``XOAUTH2``); None: the URLs' passwords."""

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
        _check_text("imap", self.imap, 2_000, optional=True)
        if self.imap is not None:
            check_header_value("imap", self.imap)
        _check_text("signature_text", self.signature_text, MAX_SIGNATURE_TEXT_CHARS)
        _check_text("signature_html", self.signature_html, MAX_SIGNATURE_HTML_CHARS, optional=True)
        if self.oauth is not None and not isinstance(self.oauth, OAuthGrant):
            raise InvalidField("oauth", None, "expected a token endpoint, client id and token")
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

    def cap_after(self, steps: int) -> int:
        """The cap on a day with ``steps`` sending days of the ramp before it: ``daily_cap``,
        or ``warmup_start + warmup_step * steps`` where that is lower."""
        if self.warmup_start is None or self.warmup_step is None:
            return self.daily_cap
        return min(self.daily_cap, self.warmup_start + self.warmup_step * max(0, steps))

    def cap_on(self, day: date, sending_days: Sequence[date]) -> int:
        """How many emails the sender may send on its local ``day``, given its sending days
        (sorted; see the module docstring): the ramp counts those in ``[warmup_from, day)``.
        A day before ``warmup_from`` gets the ramp's start."""
        start = self.warmup_from
        if start is None or self.warmup_start is None:
            return self.daily_cap
        if self.warmup_start >= self.daily_cap:
            return self.daily_cap
        steps = bisect_left(sending_days, day) - bisect_left(sending_days, start)
        return self.cap_after(steps)


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


def planned_booking(
    sender_id: str,
    at: datetime,
    day: date,
    task_id: str,
    campaign_id: str,
    recipient: str,
    cap: int,
) -> Booking:
    """``Booking(...)``, built without a frozen dataclass's per-field ``__init__`` when ``at``
    is in UTC and ``cap`` a whole number of at least 1 (a planner's send: what the checks of
    ``__post_init__`` would let through unchanged); anything else goes to the constructor.
    Provisioning books one per email."""
    if at.tzinfo is not UTC or type(cap) is not int or cap < 1:
        return Booking(sender_id, at, day, task_id, campaign_id, recipient, cap)
    booking = object.__new__(Booking)
    object.__setattr__(booking, "__dict__", {
        "sender_id": sender_id, "at": at, "day": day, "task_id": task_id,
        "campaign_id": campaign_id, "recipient": recipient, "cap": cap,
        "at_ms": (at - _EPOCH) // _ONE_MS,
    })  # fmt: skip
    return booking


@dataclass(frozen=True)
class SenderDay:
    """A sender's usage on one of its local days: sends still planned, and sends made."""

    day: date
    planned: int
    sent: int
