"""Senders as the CLI, the API and the pages act on them: add, read, update, remove, and each
sender's usage against its cap over the coming days.

A sender is named by its id or its address wherever a user names one (:meth:`SenderService.get`).
Its transport may hold credentials: :class:`SenderView` is the one form that leaves this
module, with the transport masked (``smtp://user:***@host:587``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from datetime import date, timedelta
from typing import Any

from sendqueue.domain.addresses import normalize_sender
from sendqueue.domain.errors import InvalidField, NotFound
from sendqueue.domain.policy import load_timezone
from sendqueue.domain.senders import (
    DEFAULT_DAILY_CAP,
    DEFAULT_MIN_GAP_SECONDS,
    Sender,
    masked_transport,
    new_sender_id,
)
from sendqueue.domain.wording import plural
from sendqueue.ports import Clock, SenderStore

__all__ = ["USAGE_DAYS", "DayUsage", "SenderService", "SenderView"]

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
    }
)


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

    @classmethod
    def of(cls, sender: Sender) -> SenderView:
        values = {f.name: getattr(sender, f.name) for f in fields(cls)}
        values["transport"] = masked_transport(sender.transport)
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly (dates as ISO strings)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.warmup_from is not None:
            out["warmup_from"] = self.warmup_from.isoformat()
        return out


@contextmanager
def _transport_masked() -> Iterator[None]:
    """A bad transport's error as InvalidField ``transport`` with the URL masked: the domain
    quotes the URL as given for a line break, the mail adapters' check names it ``mailer``, and
    ``urlsplit`` raises a bare ValueError (``[::1``); none of them may show a password."""
    try:
        yield
    except InvalidField as exc:
        if exc.field not in {"transport", "mailer"}:
            raise
        shown = exc.value
        if isinstance(shown, str):
            try:
                shown = masked_transport(shown)
            except ValueError:
                shown = "***"
        raise InvalidField("transport", shown, exc.reason) from None
    except ValueError as exc:
        raise InvalidField("transport", "***", f"malformed URL: {exc}") from None


class SenderService:
    """See the module docstring. ``default_timezone`` is a new sender's zone when none is
    given (``SENDQUEUE_DEFAULT_TIMEZONE``)."""

    def __init__(
        self,
        senders: SenderStore,
        clock: Clock,
        *,
        default_timezone: str,
        check_transport: Callable[[str], object] | None = None,
    ) -> None:
        self._senders = senders
        self._clock = clock
        self._default_timezone = default_timezone
        # The mail adapters' own URL check (bootstrap passes it): a transport that the
        # worker could not open is refused when the sender is added, not at its first send.
        self._check_transport = check_transport

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
    ) -> Sender:
        """Add a sender; InvalidField naming the field for a bad value, Conflict when the
        address belongs to a sender already. A warm-up is set today (the sender's day): its
        ramp starts on the first day the sender has an email."""
        zone = timezone or self._default_timezone
        with _transport_masked():
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
            )
            self._check(sender)
        self._senders.add_sender(sender)
        return sender

    def _check(self, sender: Sender) -> None:
        if sender.transport is not None and self._check_transport is not None:
            self._check_transport(sender.transport)

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
        count); clearing it ends it."""
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
        with _transport_masked():
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
