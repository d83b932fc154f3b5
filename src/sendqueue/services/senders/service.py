"""Senders as the CLI, the API and the pages act on them: add, read, update, remove, and each
sender's usage against its cap over the coming days.

A sender is named by its id or its address wherever a user names one (:meth:`SenderService.get`).
Its transport and its mailbox may hold credentials, its OAuth grant holds secrets:
:class:`SenderView` is the one form that leaves this module, with the URLs masked
(``smtp://user:***@host:587``) and the grant's secrets as ``***``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from datetime import date, timedelta
from typing import Any, cast

from sendqueue.domain.addresses import normalize_sender
from sendqueue.domain.errors import InvalidField, NotFound
from sendqueue.domain.policy import load_timezone
from sendqueue.domain.senders import (
    DEFAULT_DAILY_CAP,
    DEFAULT_MIN_GAP_SECONDS,
    OAuthGrant,
    Sender,
    masked_transport,
    new_sender_id,
)
from sendqueue.domain.transports import mask_url
from sendqueue.domain.wording import plural
from sendqueue.ports import Clock, SenderStore

__all__ = ["MASK", "USAGE_DAYS", "DayUsage", "SenderService", "SenderView", "masked_grant"]

#: How many days ahead ``usage`` reports by default (today included).
USAGE_DAYS = 14
#: The most days ``usage`` reports at once.
MAX_USAGE_DAYS = 366

#: The fields ``update`` may change (the id never changes; the ramp's first day follows the
#: warm-up).
_UPDATABLE = frozenset(
    {
        "email",
        "name",
        "reply_to",
        "transport",
        "daily_cap",
        "min_gap_seconds",
        "timezone",
        "warmup_start",
        "warmup_step",
        "imap",
        "signature_text",
        "signature_html",
        "oauth",
    }
)
#: What a view shows in place of a secret.
MASK = "***"


@dataclass(frozen=True)
class DayUsage:
    """One of a sender's local days: planned and sent emails against the day's cap (with a
    warm-up, its ramp after the sending days before it, as if the day were sending next)."""

    date: date
    planned: int
    sent: int
    cap: int


@dataclass(frozen=True)
class SenderView:
    """A sender as shown outside the service layer: the transport masked."""

    id: str
    email: str
    name: str
    reply_to: str | None
    transport: str | None
    daily_cap: int
    min_gap_seconds: int
    timezone: str
    warmup_start: int | None
    warmup_step: int | None
    warmup_from: date | None
    imap: str | None
    """Its own mailbox's URL, masked (``imaps://user:***@host:993/INBOX``)."""
    signature_text: str
    signature_html: str | None
    oauth: dict[str, str | None] | None
    """The grant without its secrets: ``refresh_token`` and a ``client_secret`` as ``***``."""

    @classmethod
    def of(cls, sender: Sender) -> SenderView:
        values = {f.name: getattr(sender, f.name) for f in fields(cls) if f.name != "oauth"}
        values["transport"] = masked_transport(sender.transport)
        values["imap"] = masked_transport(sender.imap)
        return cls(**values, oauth=masked_grant(sender.oauth))

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly (dates as ISO strings)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.warmup_from is not None:
            out["warmup_from"] = self.warmup_from.isoformat()
        return out


def masked_grant(grant: OAuthGrant | None) -> dict[str, str | None] | None:
    """An OAuth grant as a view shows it: its secrets as ``***``."""
    if grant is None:
        return None
    return {
        "token_url": masked_transport(grant.token_url),
        "client_id": grant.client_id,
        "scope": grant.scope,
        "refresh_token": MASK,
        "client_secret": MASK if grant.client_secret is not None else None,
    }


#: The fields whose errors quote a URL, and the name the user gave it (the adapters' checks
#: name the setting they share the parser with).
_URL_FIELDS = {
    "transport": "transport",
    "mailer": "transport",
    "imap": "imap",
    "feedback_imap": "imap",
}


@contextmanager
def _urls_masked() -> Iterator[None]:
    """A bad URL's error as InvalidField ``transport`` or ``imap`` with the URL masked: the
    domain quotes a URL as given for a line break, and the adapters' checks name their
    setting; none of them may show a password."""
    try:
        yield
    except InvalidField as exc:
        name = _URL_FIELDS.get(exc.field)
        if name is None:
            raise
        shown = mask_url(exc.value) if isinstance(exc.value, str) else exc.value
        raise InvalidField(name, shown, exc.reason) from None


def _grant(value: OAuthGrant | Mapping[str, object] | None) -> OAuthGrant | None:
    """The grant a caller gave: an OAuthGrant, or a mapping of its fields (InvalidField
    naming ``oauth`` or the field otherwise; never quoting a secret)."""
    if value is None or isinstance(value, OAuthGrant):
        return value
    if not isinstance(value, Mapping):
        raise InvalidField("oauth", None, "expected token_url, client_id and refresh_token")
    known = {"token_url", "client_id", "refresh_token", "client_secret", "scope"}
    unknown = sorted(set(value) - known)
    if unknown:
        raise InvalidField(f"oauth.{unknown[0]}", None, f"unknown; one of {sorted(known)}")
    return OAuthGrant(
        token_url=cast(str, value.get("token_url")),
        client_id=cast(str, value.get("client_id")),
        refresh_token=cast(str, value.get("refresh_token")),
        client_secret=cast("str | None", value.get("client_secret") or None),
        scope=cast("str | None", value.get("scope") or None),
    )


def _merged_grant(grant: OAuthGrant | None, changes: Mapping[str, object]) -> OAuthGrant | None:
    """``grant`` with the fields ``changes`` gives (a new grant when there was none)."""
    base: dict[str, object] = dict(grant.as_dict()) if grant is not None else {}
    return _grant({**base, **changes})


class SenderService:
    """See the module docstring. ``default_timezone`` is a new sender's zone when none is
    given (``SENDQUEUE_DEFAULT_TIMEZONE``)."""

    def __init__(
        self,
        senders: SenderStore,
        clock: Clock,
        *,
        default_timezone: str,
        check_transport: Callable[..., object] | None = None,
        check_imap: Callable[..., object] | None = None,
        check_token_url: Callable[[str], object] | None = None,
    ) -> None:
        self._senders = senders
        self._clock = clock
        self._default_timezone = default_timezone
        # The adapters' own URL checks under the transport rules (bootstrap passes them): a
        # transport or mailbox the worker or the poll would refuse is refused when written.
        # Both are told (``oauth=...``) whether the sender signs in with a token; the token
        # endpoint's own check refuses a refresh token sent in clear text.
        self._check_transport = check_transport
        self._check_imap = check_imap
        self._check_token_url = check_token_url

    def add(
        self,
        *,
        email: str,
        name: str = "",
        daily_cap: int = DEFAULT_DAILY_CAP,
        min_gap_seconds: int = DEFAULT_MIN_GAP_SECONDS,
        timezone: str | None = None,
        warmup_start: int | None = None,
        warmup_step: int | None = None,
        transport: str | None = None,
        reply_to: str | None = None,
        imap: str | None = None,
        signature_text: str = "",
        signature_html: str | None = None,
        oauth: OAuthGrant | Mapping[str, object] | None = None,
    ) -> Sender:
        """Add a sender; InvalidField naming the field for a bad value, Conflict when the
        address belongs to a sender already. A warm-up is set today (the sender's day): its
        ramp starts on the first day the sender has an email."""
        zone = timezone or self._default_timezone
        with _urls_masked():
            sender = Sender(
                id=new_sender_id(),
                email=email,
                name=name,
                reply_to=reply_to or None,
                transport=transport or None,
                daily_cap=daily_cap,
                min_gap_seconds=min_gap_seconds,
                timezone=zone,
                warmup_start=warmup_start,
                warmup_step=warmup_step,
                warmup_from=self._today(zone) if warmup_start is not None else None,
                imap=imap or None,
                signature_text=signature_text,
                signature_html=signature_html or None,
                oauth=_grant(oauth),
            )
            self._check(sender)
        self._senders.add_sender(sender)
        return sender

    def _check(self, sender: Sender) -> None:
        oauth = sender.oauth is not None
        if (sender.transport is not None or oauth) and self._check_transport is not None:
            # an OAuth sign-in sends a token, as secret as a password: to its own transport,
            # or (None) to the configured mailer
            self._check_transport(sender.transport, oauth=oauth)
        if sender.imap is not None and self._check_imap is not None:
            self._check_imap(sender.imap, oauth=sender.oauth is not None)
        if sender.oauth is not None and self._check_token_url is not None:
            self._check_token_url(sender.oauth.token_url)

    def get(self, ref: str) -> Sender:
        """The sender with this id or address; NotFound otherwise."""
        if not isinstance(ref, str) or not ref.strip():
            raise InvalidField("sender", ref, "give a sender's id or address")
        ref = ref.strip()
        if "@" not in ref:
            return self._senders.get_sender(ref)
        try:
            address = normalize_sender(ref, "sender").lower()
        except InvalidField:
            raise NotFound("sender", ref) from None
        for sender in self._senders.list_senders():
            if sender.email.lower() == address:
                return sender
        raise NotFound("sender", ref)

    def resolve(self, refs: Sequence[str]) -> tuple[str, ...]:
        """The ids of the senders a campaign names (by id or address, in order); every
        unknown one is an InvalidField ``senders`` naming it, a repeated one too."""
        ids: list[str] = []
        for ref in refs:
            try:
                sender = self.get(ref)
            except NotFound:
                raise InvalidField(
                    "senders", ref, "no such sender; add it with `sendqueue sender add`"
                ) from None
            if sender.id in ids:
                raise InvalidField("senders", ref, "named twice")
            ids.append(sender.id)
        return tuple(ids)

    def all(self) -> list[Sender]:
        return self._senders.list_senders()

    def update(self, ref: str, changes: Mapping[str, object]) -> Sender:
        """Change some fields (see ``_UPDATABLE``); a value of None clears an optional one.
        Setting a warm-up (again) restarts its ramp (the sending days before today no longer
        count); clearing it ends it. ``oauth`` as a mapping changes the fields it gives and
        keeps the grant's others."""
        unknown = sorted(set(changes) - _UPDATABLE)
        if unknown:
            raise InvalidField(
                unknown[0], changes[unknown[0]], f"cannot be changed; one of {sorted(_UPDATABLE)}"
            )
        sender = self.get(ref)
        values: dict[str, Any] = dict(changes)
        if "warmup_start" in values or "warmup_step" in values:
            zone = str(values.get("timezone") or sender.timezone)
            ramp = values.get("warmup_start", sender.warmup_start) is not None
            values["warmup_from"] = self._today(zone) if ramp else None
        if values.get("name") is None and "name" in values:
            values["name"] = ""
        if values.get("signature_text", "") is None:
            values["signature_text"] = ""
        for name in ("transport", "imap", "signature_html", "reply_to"):
            if name in values and not values[name]:
                values[name] = None  # "" clears, as None does
        with _urls_masked():
            if isinstance(values.get("oauth"), Mapping):
                values["oauth"] = _merged_grant(sender.oauth, values["oauth"])
            updated = replace(sender, **values)
            self._check(updated)
        self._check_planned(sender, updated)
        self._senders.update_sender(updated)
        return updated

    def _check_planned(self, sender: Sender, updated: Sender) -> None:
        """Refuse a change that the sends already planned would break (InvalidField naming
        it): a cap (or ramp) below a day's planned and sent emails, or a new gap or timezone
        while any send is planned, since those were placed by the old one."""
        today = self._today(sender.timezone) - timedelta(days=1)
        days = self._senders.sender_usage(sender.id, since=today, until=date(9999, 12, 30))
        planned = [d for d in days if d.planned]
        if not planned:
            return
        for name in ("min_gap_seconds", "timezone"):
            if getattr(updated, name) != getattr(sender, name):
                raise InvalidField(
                    name,
                    getattr(updated, name),
                    f"the sender has {plural(sum(d.planned for d in planned), 'planned send')} "
                    "placed by the current value; pause or cancel their campaigns first",
                )
        sending = self._sending_days(updated)
        for day in days:
            cap = updated.cap_on(day.day, sending)
            if cap < day.planned + day.sent:
                used = day.planned + day.sent
                raise InvalidField(
                    "daily_cap" if updated.daily_cap < used else "warmup_start",
                    cap,
                    f"{day.day} already has {plural(used, 'email')} planned or sent; "
                    "a lower cap would be passed (pause or cancel campaigns first)",
                )

    def remove(self, ref: str) -> Sender:
        """Delete the sender; Conflict while it still has planned sends."""
        sender = self.get(ref)
        self._senders.remove_sender(sender.id)
        return sender

    def usage(self, ref: str, *, days: int = USAGE_DAYS) -> list[DayUsage]:
        """The sender's next ``days`` local days from today: planned, sent and the cap."""
        if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= MAX_USAGE_DAYS:
            raise InvalidField("days", days, f"expected a whole number from 1 to {MAX_USAGE_DAYS}")
        sender = self.get(ref)
        return self.usage_of(sender, days=days)

    def usage_of(self, sender: Sender, *, days: int = USAGE_DAYS) -> list[DayUsage]:
        today = self._today(sender.timezone)
        until = today + timedelta(days=days)
        found = {d.day: d for d in self._senders.sender_usage(sender.id, since=today, until=until)}
        sending = self._sending_days(sender)
        out: list[DayUsage] = []
        for n in range(days):
            day = today + timedelta(days=n)
            got = found.get(day)
            planned, sent = (got.planned, got.sent) if got else (0, 0)
            out.append(DayUsage(day, planned, sent, sender.cap_on(day, sending)))
        return out

    def _sending_days(self, sender: Sender) -> list[date]:
        """The sending days the sender's warm-up counts (none without one)."""
        if sender.warmup_from is None:
            return []
        return self._senders.sending_days(sender.id, since=sender.warmup_from)

    def _today(self, zone: str) -> date:
        return self._clock.now().astimezone(load_timezone(zone, "timezone")).date()
