"""The :class:`SenderStore` port: senders, and the slots their sends book.

Every task store is a sender store too, in the same database, so a booking and the task it is
for live side by side.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import date, datetime
from typing import Protocol

from sendqueue.domain.senders import Booking, Sender, SenderDay

__all__ = ["SenderStore"]


class SenderStore(Protocol):
    """Senders and their bookings.

    Contract:

    - A sender's id and its address are each unique: ``add_sender`` raises
      :class:`~sendqueue.domain.errors.Conflict` for either taken, ``update_sender`` for an
      address another sender has. Unknown ids raise
      :class:`~sendqueue.domain.errors.NotFound`. The transport (credentials included) is
      stored as given and read back as given: masking is for what leaves the service layer.
    - A booking holds one slot, ``(sender_id, at)``, for one task, and counts as *planned* on
      the sender's ``day`` until :meth:`mark_sent` makes it *sent*. A task holds at most one
      booking.
    - :meth:`book` is atomic, all or nothing, across processes: it raises
      :class:`~sendqueue.domain.errors.Overbooked` and books nothing when a slot is held by
      another task, or when a day would go past a booking's ``cap`` (planned plus sent,
      counting the call's own bookings of that day; the lowest ``cap`` given for a day is the
      one checked). SQL stores do it in one transaction that locks the sender's day rows;
      DynamoDB with conditional writes in transactions, undoing the ones already written when
      a later one is refused. Booking a task that holds a booking already *moves* it: the old
      slot is freed in the same write (booking the same slot again changes nothing). A sent
      booking never moves: booking its task on another slot is refused (Overbooked).
    - :meth:`release` frees the planned bookings of the given tasks (a sent one stays: a sent
      email used its slot); idempotent, unknown task ids are ignored.
    - A day a booking was made on stays one of the sender's *sending days*
      (:meth:`sending_days`) when its bookings are released or moved away, until the sender
      is removed; a refused call leaves no day behind (the warm-up's ramp counts these days,
      and must never count fewer later than a booking's ``cap`` did). On DynamoDB, where a
      call too large for one transaction commits in parts and ``insert_tasks`` books before
      it inserts, a call refused after a part committed (or tasks refused after their
      bookings) leaves the days those bookings held: others may have counted them meanwhile,
      as after a release.
    - Reads go per sender and range (:meth:`booked_times`, :meth:`sender_usage`,
      :meth:`sending_days`), through an index, never a scan of every booking.
    - Sticky senders: the first sender a recipient (its compared address) was booked on is
      remembered, and :meth:`sticky_senders` reads it back, however many campaigns later.
    """

    def add_sender(self, sender: Sender) -> None:
        """Store a new sender; Conflict when its id or address is taken."""
        ...

    def get_sender(self, sender_id: str) -> Sender:
        """The sender, or NotFound."""
        ...

    def list_senders(self) -> list[Sender]:
        """Every sender, by address."""
        ...

    def update_sender(self, sender: Sender) -> None:
        """Replace the sender of ``sender.id``; NotFound if unknown, Conflict when its address
        belongs to another sender."""
        ...

    def remove_sender(self, sender_id: str) -> None:
        """Delete the sender; NotFound if unknown, Conflict while it still has planned
        bookings (cancel or re-plan those first). Its sent bookings are deleted with it."""
        ...

    def book(self, bookings: Sequence[Booking]) -> None:
        """Book every slot, or none (Overbooked); see the class docstring."""
        ...

    def release(self, task_ids: Collection[str]) -> int:
        """Free the planned bookings of these tasks; returns how many were freed."""
        ...

    def mark_sent(self, task_id: str) -> bool:
        """Count the task's booking as sent (once: True the first time, False after, or when
        the task holds no booking)."""
        ...

    def booking_of(self, task_id: str) -> Booking | None:
        """The task's booking (its ``cap`` is the day's cap as booked), or None."""
        ...

    def booked_times(self, sender_id: str, *, since: datetime, until: datetime) -> list[datetime]:
        """The instants (UTC) of the sender's bookings, planned and sent, in ``[since, until)``,
        in time order."""
        ...

    def sender_usage(self, sender_id: str, *, since: date, until: date) -> list[SenderDay]:
        """The sender's local days in ``[since, until)`` that have bookings, in day order."""
        ...

    def sending_days(self, sender_id: str, *, since: date) -> list[date]:
        """The sender's local days from ``since`` on that have held a booking (planned, sent,
        or released or moved away since), in day order."""
        ...

    def sticky_senders(self, recipients: Collection[str]) -> dict[str, str]:
        """Compared address -> the first sender it was booked on, for those that have one."""
        ...
