"""Planning over shared senders, and booking what is planned.

A campaign with senders (``Campaign.sender_ids``), or with local time, is planned with
:func:`~sendqueue.domain.capacity.plan_with_senders` over its senders' books as the store has
them; what is planned is then booked atomically: a provisioning chunk together with its tasks
(``TaskStore.insert_tasks(..., bookings=...)``, see :meth:`CapacityPlanner.plan_chunk`), a
re-plan by :meth:`~sendqueue.ports.SenderStore.book`. When another process booked first
(:class:`~sendqueue.domain.errors.Overbooked`), the books are read again and the same sends
planned again, a bounded number of times: that is how two campaigns provisioned at once by two
processes share a sender without overbooking it.

A campaign without senders or local time is planned by ``plan`` / ``free_slots`` alone:
nothing here runs for it.

Books are read per sender and range: from a day before the plan starts (a local day starts at
most 26 hours before an instant in it) to the end of what the sender has booked; for a sender
with a warm-up, its sending days from the ramp's restart on as well (one read per sender and
plan), which the ramp counts. A booking's cap counts the sending days the store had when read
and the plan's own earlier days: every one of them stays a sending day, so the cap is never
above the one the final books give the day.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from typing import TypeVar

from sendqueue.domain.capacity import SenderBook, assign_senders, plan_with_senders
from sendqueue.domain.errors import Conflict, NotFound, Overbooked
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import Campaign, Task
from sendqueue.domain.policy import SendingPolicy
from sendqueue.domain.senders import Booking, Sender, planned_booking
from sendqueue.domain.suppression import key_of_normalized
from sendqueue.ports import SenderStore, Tasks

__all__ = [
    "BOOKING_TRIES",
    "CapacityPlanner",
    "Placement",
    "PlannedRun",
    "policy_for",
    "uses_capacity",
]

log = logging.getLogger(__name__)

#: A local day starts at most this long before any instant in it (a 25-hour DST day and a
#: margin): bookings from then on are all a plan from an instant has to read.
_DAY_BACK = timedelta(hours=26)
#: The end of every range read: the last instant any store keeps.
_FAR = datetime(9999, 12, 30, tzinfo=UTC)
#: How many times a plan is made again after another process booked first.
BOOKING_TRIES = 20
_ONE_MS = timedelta(milliseconds=1)
_T = TypeVar("_T")

#: Where a new task goes: its send time, its sender's id and address (None without one).
Placement = tuple[datetime, str | None, str | None]


def uses_capacity(campaign: Campaign) -> bool:
    """Whether the campaign is planned here (senders or local time) rather than by ``plan``."""
    return bool(campaign.sender_ids) or campaign.local_time


def policy_for(campaign: Campaign, zone: str | None) -> SendingPolicy:
    """The policy a send of the campaign is judged by: in a local-time campaign, the campaign's
    windows read in the recipient's ``zone``."""
    if campaign.local_time and zone and zone != campaign.policy.timezone:
        return replace(campaign.policy, timezone=zone)
    return campaign.policy


@dataclass
class PlannedRun:
    """What one provisioning run keeps between its chunks: the books as planned so far, the
    campaign's own sends per local day, and where the next chunk's plan starts."""

    books: dict[str, SenderBook]
    per_day: Counter[date]
    cursor: datetime
    turn: int = 0
    senders: dict[str, Sender] = field(default_factory=dict)
    rebooked: int = 0
    """Chunks planned again because another process booked first."""


class CapacityPlanner:
    """See the module docstring."""

    def __init__(self, store: Tasks, senders: SenderStore) -> None:
        self._store = store
        self._senders = senders

    # reading the books -----------------------------------------------------------------------

    def senders_of(self, campaign: Campaign, extra: Collection[str] = ()) -> dict[str, Sender]:
        """The campaign's senders (and ``extra`` ids, e.g. the senders its tasks name), by id;
        a removed one is left out (its tasks then go out from the campaign's From)."""
        found: dict[str, Sender] = {}
        for sender_id in dict.fromkeys([*campaign.sender_ids, *extra]):
            try:
                found[sender_id] = self._senders.get_sender(sender_id)
            except NotFound:
                log.warning("campaign %s: sender %s was removed", campaign.id, sender_id)
        return found

    def load(self, senders: Collection[Sender], *, since: datetime) -> dict[str, SenderBook]:
        """The books of ``senders`` from a local day before ``since`` on."""
        start = since - _DAY_BACK
        books: dict[str, SenderBook] = {}
        for sender in senders:
            times = self._senders.booked_times(sender.id, since=start, until=_FAR)
            days = self._senders.sender_usage(
                sender.id, since=start.astimezone(sender.zone).date(), until=date(9999, 12, 30)
            )
            books[sender.id] = SenderBook.load(sender, times, days, self._sending_days(sender))
        return books

    def _sending_days(self, sender: Sender) -> list[date]:
        """The sender's sending days that its warm-up counts (none read without one)."""
        if sender.warmup_from is None or sender.cap_after(0) >= sender.daily_cap:
            return []
        return self._senders.sending_days(sender.id, since=sender.warmup_from)

    def campaign_days(
        self, campaign: Campaign, *, since: datetime
    ) -> tuple[Counter[date], list[datetime]]:
        """The campaign's own sends (sent, being sent, planned) from a day before ``since``:
        counted per local day of its timezone, and their instants."""
        zone = campaign.policy.zone
        instants = [when for _, when in self._store.booked(campaign.id, since=since - _DAY_BACK)]
        return Counter(when.astimezone(zone).date() for when in instants), instants

    # provisioning ----------------------------------------------------------------------------

    def start_run(self, campaign: Campaign, *, plan_start: datetime, now: datetime) -> PlannedRun:
        """Books and counts for a provisioning run that starts (or resumes) now: the next plan
        starts after the campaign's last booked send, never before ``plan_start``."""
        per_day, instants = self.campaign_days(campaign, since=plan_start)
        cursor = plan_start
        if instants:
            cursor = max(cursor, max(instants) + _ONE_MS)
        senders = self.senders_of(campaign)
        missing = [s for s in campaign.sender_ids if s not in senders]
        if campaign.sender_ids and not senders:
            raise Conflict(
                f"campaign {campaign.id}: its senders {', '.join(missing)} were removed; "
                "add them again or cancel the campaign"
            )
        books = self.load(senders.values(), since=min(plan_start, now))
        return PlannedRun(books, per_day, cursor, senders=senders)

    def plan_chunk(
        self,
        campaign: Campaign,
        run: PlannedRun,
        items: Sequence[tuple[str, str, str | None]],
        write: Callable[[list[Placement], list[Booking]], _T],
    ) -> _T:
        """Plan ``(task id, address, zone)`` of new tasks (in position order) and store them:
        ``write(placements, bookings)`` gets each one's :data:`Placement` and the bookings, and
        writes the tasks with their bookings in one atomic write (``TaskStore.insert_tasks``
        with ``bookings``), raising Overbooked and writing nothing when another process booked
        first. Sends go after the previous chunk's, in the run's books; on Overbooked the books
        are read again and the chunk planned and written again (up to :data:`BOOKING_TRIES`).
        Returns what ``write`` returned."""
        if not items:
            return write([], [])
        ids = [s for s in campaign.sender_ids if s in run.senders]
        keys = [key_of_normalized(email) for _, email, _ in items]
        if ids:
            sticky = self._senders.sticky_senders(set(keys))
            turn = run.turn % len(ids)
            rotated = ids[turn:] + ids[:turn]
            chosen: list[str | None] = list(
                assign_senders(keys, rotated, {k: [v] for k, v in sticky.items()})
            )
            run.turn += len(items)
        else:
            chosen = [None] * len(items)
        zones = [zone for _, _, zone in items] if campaign.local_time else None
        for attempt in range(BOOKING_TRIES):
            sends = plan_with_senders(
                campaign.policy,
                chosen,
                run.books,
                now=run.cursor,
                zones=zones,
                campaign_per_day=run.per_day,
            )
            bookings = _bookings_of(campaign.id, items, keys, sends, chosen, run.books)
            placements: list[Placement] = [
                (at, sid, run.senders[sid].email if sid else None)
                for at, sid in zip(sends, chosen, strict=True)
            ]
            try:
                written = write(placements, bookings)
            except Overbooked as exc:
                run.rebooked += 1
                log.info(
                    "campaign %s: %s (another campaign booked first); planning again (%d)",
                    campaign.id,
                    exc,
                    attempt + 1,
                )
                run.books = self.load(run.senders.values(), since=run.cursor)
                continue
            zone = campaign.policy.zone
            run.per_day.update(at.astimezone(zone).date() for at in sends)
            run.cursor = max(run.cursor, max(sends) + _ONE_MS)
            return written
        raise Conflict(
            f"campaign {campaign.id}: its senders' slots kept being taken by other campaigns "
            f"({BOOKING_TRIES} tries); provisioning resumes from its checkpoint"
        )

    def preview(
        self, campaign: Campaign, recipients: Sequence[tuple[str, str | None]], *, start: datetime
    ) -> list[datetime]:
        """The send instants ``(address, zone)`` recipients would get from ``start`` over the
        senders' books as they are now, booking nothing (a draft's preview)."""
        senders = self.senders_of(campaign)
        chosen = self._assign(campaign, senders, [email for email, _ in recipients])
        return plan_with_senders(
            campaign.policy,
            chosen,
            self.load(senders.values(), since=start),
            now=start,
            zones=[zone for _, zone in recipients] if campaign.local_time else None,
        )

    def preview_senders(
        self, campaign: Campaign, emails: Sequence[str]
    ) -> tuple[list[str | None], dict[str, Sender]]:
        """The sender id each of ``emails`` would be given (None: the campaign's From), as
        :meth:`preview` plans them, and those senders by id (what a preview names)."""
        senders = self.senders_of(campaign)
        return self._assign(campaign, senders, emails), senders

    def _assign(
        self, campaign: Campaign, senders: Collection[str], emails: Sequence[str]
    ) -> list[str | None]:
        """Round-robin over the campaign's senders still there, sticky ones first."""
        ids = [s for s in campaign.sender_ids if s in senders]
        keys = [key_of_normalized(email) for email in emails]
        if not ids:
            return [None] * len(keys)
        sticky = self._senders.sticky_senders(set(keys))
        return list(assign_senders(keys, ids, {k: [v] for k, v in sticky.items()}))

    # re-planning ----------------------------------------------------------------------------

    def place(
        self,
        campaign: Campaign,
        tasks: Sequence[Task],
        *,
        not_before: datetime,
        fixed: Sequence[datetime],
    ) -> list[datetime]:
        """New send times for ``tasks`` (each keeps its sender), from ``not_before``, with the
        campaign's ``fixed`` sends kept where they are (counted per day, kept half the spacing
        away), booked. The tasks' own bookings are freed first."""
        if not tasks:
            return []
        self._senders.release([t.id for t in tasks])
        senders = self.senders_of(campaign, {t.sender_id for t in tasks if t.sender_id})
        chosen = [t.sender_id if t.sender_id in senders else None for t in tasks]
        zones = [t.timezone for t in tasks] if campaign.local_time else None
        zone = campaign.policy.zone
        per_day = Counter(when.astimezone(zone).date() for when in fixed)
        for attempt in range(BOOKING_TRIES):
            books = self.load(senders.values(), since=not_before)
            sends = plan_with_senders(
                campaign.policy,
                chosen,
                books,
                now=not_before,
                zones=zones,
                campaign_per_day=per_day,
                campaign_booked=fixed,
            )
            placed = [
                replace(t, send_at=at, sender_id=sid)
                for t, at, sid in zip(tasks, sends, chosen, strict=True)
            ]
            try:
                self._book(placed, books)
            except Overbooked as exc:
                log.info("campaign %s: %s; re-planning again (%d)", campaign.id, exc, attempt + 1)
                continue
            return sends
        raise Conflict(
            f"campaign {campaign.id}: its senders' slots kept being taken by other campaigns "
            f"({BOOKING_TRIES} tries)"
        )

    def book_in_place(self, task: Task) -> bool:
        """Book a task's current slot again (a task found without its booking, e.g. after a
        crash between a release and a re-booking); False when that slot is no longer free."""
        if task.sender_id is None:
            return True
        try:
            sender = self._senders.get_sender(task.sender_id)
        except NotFound:
            return True  # removed: it goes out from the campaign's From, uncounted
        day = task.send_at.astimezone(sender.zone).date()
        cap = sender.cap_on(day, self._sending_days(sender))
        try:
            self._senders.book([_booking(task, sender, day, cap)])
        except Overbooked:
            return False
        return True

    def settle(self, task: Task) -> None:
        """Put the task's booking where the task is: freed for a Cancelled or Failed one,
        booked again at its send time otherwise (a sent booking stays as it is)."""
        if task.sender_id is None:
            return
        if task.state in (TaskState.CANCELLED, TaskState.FAILED):
            self._senders.release([task.id])
        elif not self.booked(task) and not self.book_in_place(task):
            log.warning("task %s: its slot at %s was taken meanwhile", task.id, task.send_at)

    def booked(self, task: Task) -> bool:
        """Whether the task holds a booking at its send time."""
        booking = self._senders.booking_of(task.id)
        return booking is not None and booking.at == task.send_at

    def mark_sent(self, task_id: str) -> bool:
        return self._senders.mark_sent(task_id)

    def release(self, task_ids: Collection[str]) -> int:
        return self._senders.release(task_ids) if task_ids else 0

    def _book(self, tasks: Sequence[Task], books: dict[str, SenderBook]) -> None:
        bookings = []
        for t in tasks:
            if t.sender_id is not None:
                book = books[t.sender_id]
                day = book.day_of(t.send_at)
                bookings.append(_booking(t, book.sender, day, book.cap_on(day)))
        if bookings:
            self._senders.book(bookings)


def _bookings_of(
    campaign_id: str,
    items: Sequence[tuple[str, str, str | None]],
    keys: Sequence[str],
    sends: Sequence[datetime],
    chosen: Sequence[str | None],
    books: dict[str, SenderBook],
) -> list[Booking]:
    """The bookings of a chunk's planned sends (those with a sender); each sender's zone is
    looked up once, and its cap once per day."""
    zones = {sid: book.sender.zone for sid, book in books.items()}
    caps: dict[tuple[str, date], int] = {}
    out: list[Booking] = []
    for (task, _, _), key, at, sid in zip(items, keys, sends, chosen, strict=True):
        if sid is None:
            continue
        day = at.astimezone(zones[sid]).date()
        cap = caps.get((sid, day))
        if cap is None:
            cap = caps[(sid, day)] = books[sid].cap_on(day)
        out.append(planned_booking(sid, at, day, task, campaign_id, key, cap))
    return out


def _booking(task: Task, sender: Sender, day: date, cap: int) -> Booking:
    return Booking(
        sender_id=sender.id,
        at=task.send_at,
        day=day,
        task_id=task.id,
        campaign_id=task.campaign_id,
        recipient=key_of_normalized(task.email),
        cap=cap,
    )
