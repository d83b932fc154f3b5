"""The in-memory :class:`~sendqueue.ports.SenderStore`, a base of the in-memory task store
(it shares the store's lock and its simulated outages)."""

from __future__ import annotations

import threading
from bisect import bisect_left, insort
from collections.abc import Collection, Sequence
from datetime import date, datetime

from sendqueue.domain.errors import Conflict, NotFound, Overbooked
from sendqueue.domain.models import utc
from sendqueue.domain.senders import Booking, Sender, SenderDay, epoch_ms
from sendqueue.testing.guard import guarded

__all__ = ["InMemorySenders"]


class InMemorySenders:
    """:class:`~sendqueue.ports.SenderStore` in memory: bookings by slot and by task, a sorted
    list of instants per sender (the range reads) and a (planned, sent) count per day."""

    _lock: threading.RLock
    _available: bool

    def __init__(self) -> None:
        self._senders: dict[str, Sender] = {}
        self._slots: dict[tuple[str, int], Booking] = {}
        self._booking_of: dict[str, Booking] = {}
        self._sent: set[str] = set()
        self._times: dict[str, list[int]] = {}
        self._days: dict[tuple[str, date], list[int]] = {}
        self._sticky: dict[str, str] = {}

    # senders -------------------------------------------------------------------------------

    @guarded
    def add_sender(self, sender: Sender) -> None:
        if sender.id in self._senders:
            raise Conflict(f"sender {sender.id} exists")
        self._check_address(sender)
        self._senders[sender.id] = sender

    def _check_address(self, sender: Sender) -> None:
        for other in self._senders.values():
            if other.id != sender.id and other.email.lower() == sender.email.lower():
                raise Conflict(f"the address {sender.email} belongs to sender {other.id}")

    @guarded
    def get_sender(self, sender_id: str) -> Sender:
        try:
            return self._senders[sender_id]
        except KeyError:
            raise NotFound("sender", sender_id) from None

    @guarded
    def list_senders(self) -> list[Sender]:
        return sorted(self._senders.values(), key=lambda s: (s.email.lower(), s.id))

    @guarded
    def update_sender(self, sender: Sender) -> None:
        if sender.id not in self._senders:
            raise NotFound("sender", sender.id)
        self._check_address(sender)
        self._senders[sender.id] = sender

    @guarded
    def remove_sender(self, sender_id: str) -> None:
        if sender_id not in self._senders:
            raise NotFound("sender", sender_id)
        mine = [b for b in self._booking_of.values() if b.sender_id == sender_id]
        planned = sum(1 for b in mine if b.task_id not in self._sent)
        if planned:
            raise Conflict(
                f"sender {sender_id} has {planned} planned sends; cancel or re-plan them first"
            )
        for booking in mine:
            self._drop(booking)
            self._sent.discard(booking.task_id)
        for key in [k for k in self._days if k[0] == sender_id]:
            del self._days[key]
        del self._senders[sender_id]

    # bookings ------------------------------------------------------------------------------

    @guarded
    def book(self, bookings: Sequence[Booking]) -> None:
        # Check everything first, then write: all or nothing.
        caps: dict[tuple[str, date], int] = {}
        added: dict[tuple[str, date], int] = {}
        freed: dict[tuple[str, date], int] = {}
        claimed: dict[tuple[str, int], str] = {}
        todo: list[Booking] = []
        for booking in bookings:
            key = (booking.sender_id, booking.at_ms)
            old = self._booking_of.get(booking.task_id)
            if old is not None and (old.sender_id, old.at_ms) == key:
                continue
            holder = self._slots.get(key)
            if old is not None and old.task_id in self._sent:
                raise Overbooked(booking.sender_id, at=booking.at)  # a sent email stays put
            if (holder is not None and holder.task_id != booking.task_id) or (
                claimed.get(key, booking.task_id) != booking.task_id
            ):
                raise Overbooked(booking.sender_id, at=booking.at)
            claimed[key] = booking.task_id
            day = (booking.sender_id, booking.day)
            caps[day] = min(caps.get(day, booking.cap), booking.cap)
            added[day] = added.get(day, 0) + 1
            if old is not None and old.task_id not in self._sent:
                old_day = (old.sender_id, old.day)
                freed[old_day] = freed.get(old_day, 0) + 1
            todo.append(booking)
        for day, count in added.items():
            planned, sent = self._days.get(day, [0, 0])
            if planned + sent - freed.get(day, 0) + count > caps[day]:
                raise Overbooked(day[0], day=day[1])
        for booking in todo:
            old = self._booking_of.get(booking.task_id)
            if old is not None:
                self._drop(old)
                self._sent.discard(old.task_id)
            self._slots[(booking.sender_id, booking.at_ms)] = booking
            self._booking_of[booking.task_id] = booking
            insort(self._times.setdefault(booking.sender_id, []), booking.at_ms)
            self._days.setdefault((booking.sender_id, booking.day), [0, 0])[0] += 1
            self._sticky.setdefault(booking.recipient, booking.sender_id)

    def _drop(self, booking: Booking) -> None:
        """Forget ``booking`` (its slot, its instant, its count on the day)."""
        del self._slots[(booking.sender_id, booking.at_ms)]
        del self._booking_of[booking.task_id]
        times = self._times[booking.sender_id]
        times.pop(bisect_left(times, booking.at_ms))
        counts = self._days[(booking.sender_id, booking.day)]
        counts[1 if booking.task_id in self._sent else 0] -= 1

    @guarded
    def release(self, task_ids: Collection[str]) -> int:
        freed = 0
        for task_id in set(task_ids):
            booking = self._booking_of.get(task_id)
            if booking is not None and task_id not in self._sent:
                self._drop(booking)
                freed += 1
        return freed

    @guarded
    def mark_sent(self, task_id: str) -> bool:
        booking = self._booking_of.get(task_id)
        if booking is None or task_id in self._sent:
            return False
        counts = self._days[(booking.sender_id, booking.day)]
        counts[0] -= 1
        counts[1] += 1
        self._sent.add(task_id)
        return True

    @guarded
    def booking_of(self, task_id: str) -> Booking | None:
        return self._booking_of.get(task_id)

    @guarded
    def booked_times(self, sender_id: str, *, since: datetime, until: datetime) -> list[datetime]:
        low, high = epoch_ms(utc(since)), epoch_ms(utc(until))
        times = self._times.get(sender_id, [])
        return [
            self._slots[(sender_id, ms)].at
            for ms in times[bisect_left(times, low) : bisect_left(times, high)]
        ]

    @guarded
    def sender_usage(self, sender_id: str, *, since: date, until: date) -> list[SenderDay]:
        return [
            SenderDay(day, planned, sent)
            for (sid, day), (planned, sent) in sorted(self._days.items())
            if sid == sender_id and since <= day < until and planned + sent
        ]

    @guarded
    def sending_days(self, sender_id: str, *, since: date) -> list[date]:
        # a day's counts stay (at zero) when its bookings go: it has held one
        return sorted(day for sid, day in self._days if sid == sender_id and day >= since)

    @guarded
    def sticky_senders(self, recipients: Collection[str]) -> dict[str, str]:
        return {r: self._sticky[r] for r in recipients if r in self._sticky}
