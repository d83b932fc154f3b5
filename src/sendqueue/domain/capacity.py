"""Capacity-aware planning: a campaign's sends placed where its senders have room. Pure, no
I/O.

Several campaigns share a sender's mailbox, so a sender's day holds at most its cap (with the
warm-up's ramp, :meth:`~sendqueue.domain.senders.Sender.cap_on`) across all of them, and two of
its sends are never closer than its minimum gap. The ramp counts the sender's sending days: a
book knows those the store has (:attr:`SenderBook.sending`), and every day a plan books joins
them, so a plan's later days count its earlier ones. :class:`SenderBook` is what a sender already
has booked; :func:`plan_with_senders` takes a campaign's slots from the same day grids as
:func:`~sendqueue.domain.planner.plan` and gives each to a sender that still has room.

The gap is kept by construction: a sender's time is cut into slots of ``min_gap_seconds``
counted from the epoch, a send takes the start of one slot, and a slot holds one send. Two
sends of one sender are then a whole number of gaps apart, and a store can refuse a second
booking of a slot with a unique key (a conditional write), which is what makes booking atomic
across processes. A grid instant is moved up to the next slot start of its sender; where that
leaves the grid slot's window, the sender does not take it.

Which sender sends to whom is decided before planning (:func:`assign_senders`: sticky, then
round-robin); each grid slot goes to the next sender in rotation that has a recipient waiting
and room on its day, so one full mailbox does not hold back the others. A recipient without a
sender (``None``: the campaign's own From) takes a grid slot as it is, with no cap and no gap.

Local-time campaigns: each recipient may have its own zone, whose wall clock the windows,
weekdays and skip dates are read in. Every distinct zone gets :func:`plan`'s grid of the policy
moved to that zone, and the grids are walked together in time order (a heap of zones, each
walked on while its next slot is the earliest), so the campaign's ``per_day`` (counted in its
own timezone) is shared by all of them and goes to the earliest slots first.

The placing itself, written for speed, is :mod:`sendqueue.domain.capacity_walk`.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections import Counter
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from typing import cast

from . import capacity_clock as cc
from . import capacity_walk as cw
from .errors import InvalidField
from .planner import _grid_ms
from .policy import SendingPolicy, load_timezone
from .senders import Sender, SenderDay
from .slots import nominal_spacing

__all__ = [
    "SenderBook",
    "assign_senders",
    "plan_with_senders",
    "slot_index",
    "slot_start",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)


def _ms(at: datetime) -> int:
    """Milliseconds since the epoch, rounded up (slot starts are whole milliseconds)."""
    return -(-((at.astimezone(UTC) - _EPOCH) // _ONE_US) // 1000)


def slot_index(at: datetime, gap_seconds: int) -> int:
    """The sender slot ``at`` lies in: ``floor(ms since the epoch / gap)``."""
    return _ms(at) // (gap_seconds * 1000)


def slot_start(index: int, gap_seconds: int) -> datetime:
    """The first instant of sender slot ``index`` (aware, UTC)."""
    return _EPOCH + timedelta(milliseconds=index * gap_seconds * 1000)


def _held(at_ms: int, gap_ms: int) -> tuple[int, ...]:
    """The slots (their starts, ms) a send at ``at_ms`` keeps to itself: its own, and the
    next one as well when it is not a slot start (a booking made under another
    ``min_gap_seconds``), since that slot's start is then less than a gap after it."""
    start = at_ms // gap_ms * gap_ms
    return (start,) if start == at_ms else (start, start + gap_ms)


@dataclass
class SenderBook:
    """What one sender has booked: sends per local day (its timezone) and the slots taken.

    Built from the store's bookings of the days a plan may touch (:meth:`load`);
    :func:`plan_with_senders` adds what it plans to it, so one book can serve several plans in
    a row, and :meth:`remove` takes out what a re-plan is about to move.
    """

    sender: Sender
    per_day: dict[date, int] = field(default_factory=dict)
    """Sends (planned and sent) per local day of the sender."""
    slots: dict[int, int] = field(default_factory=dict)
    """The start (ms since the epoch) of every slot of the sender's current gap that a booked
    send holds -> how many hold it (more than one only where bookings made under another
    ``min_gap_seconds`` share a slot of the current one). Keyed by the start rather than the
    slot's index: the planner then looks a snapped instant up as it is."""
    sending: list[date] = field(default_factory=list)
    """The sender's sending days (sorted): days that have held a booking, which its warm-up's
    ramp counts (:meth:`~sendqueue.domain.senders.Sender.cap_on`)."""

    @classmethod
    def load(
        cls,
        sender: Sender,
        times: Iterable[datetime],
        days: Iterable[SenderDay],
        sending_days: Iterable[date] = (),
    ) -> SenderBook:
        """The book from the store's reads: ``times`` (``booked_times``: every booked instant,
        planned or sent) held as slots of the sender's current ``min_gap_seconds``, ``days``
        (``sender_usage``: planned plus sent per local day) as the day counts, and
        ``sending_days`` (``sending_days``, needed only with a warm-up) with the days of
        ``days`` as the sending days."""
        book = cls(sender, {d.day: d.planned + d.sent for d in days if d.planned + d.sent})
        book.sending = sorted({*sending_days, *book.per_day})
        gap = sender.min_gap_seconds * 1000
        slots = book.slots
        for at in times:
            for start in _held(_ms(at), gap):
                slots[start] = slots.get(start, 0) + 1
        return book

    def cap_on(self, day: date) -> int:
        """The sender's cap on its local ``day``, counting the sending days in this book."""
        return self.sender.cap_on(day, self.sending)

    def hold(self, day: date) -> bool:
        """Count ``day`` as a sending day (a plan books it); False when it was one already."""
        sending = self.sending
        i = bisect_left(sending, day)
        if i < len(sending) and sending[i] == day:
            return False
        sending.insert(i, day)
        return True

    def unhold(self, day: date) -> None:
        """Take back :meth:`hold` (a failed plan's day)."""
        sending = self.sending
        i = bisect_left(sending, day)
        if i < len(sending) and sending[i] == day:
            del sending[i]

    def day_of(self, at: datetime) -> date:
        """The sender's local day of ``at``."""
        return at.astimezone(self.sender.zone).date()

    def has_room(self, at: datetime, day: date) -> bool:
        """Whether a send at ``at`` (a slot start) on the sender's ``day`` fits."""
        if self.per_day.get(day, 0) >= self.cap_on(day):
            return False
        gap = self.sender.min_gap_seconds * 1000
        return not any(start in self.slots for start in _held(_ms(at), gap))

    def add(self, at: datetime) -> None:
        """Book a send at ``at``."""
        day = self.day_of(at)
        self.per_day[day] = self.per_day.get(day, 0) + 1
        self.hold(day)
        for start in _held(_ms(at), self.sender.min_gap_seconds * 1000):
            self.slots[start] = self.slots.get(start, 0) + 1

    def remove(self, at: datetime) -> None:
        """Take one booked send at ``at`` out (a re-plan frees the slots of the tasks it moves
        before planning them again). InvalidField (``at``) when no send holds its slot. Its day
        stays a sending day, as the store keeps it one."""
        held = _held(_ms(at), self.sender.min_gap_seconds * 1000)
        if any(start not in self.slots for start in held):
            raise InvalidField("at", at.isoformat(), f"no send of {self.sender.id} booked there")
        for start in held:
            left = self.slots[start] - 1
            if left:
                self.slots[start] = left
            else:
                del self.slots[start]
        day = self.day_of(at)
        left = self.per_day.get(day, 0) - 1
        if left > 0:
            self.per_day[day] = left
        else:
            self.per_day.pop(day, None)


def assign_senders(
    recipients: Sequence[str],
    sender_ids: Sequence[str],
    sticky: Mapping[str, Collection[str]],
) -> list[str]:
    """The sender of each recipient (by its compared address), in order: the sender it was
    sent from before, when that one is among ``sender_ids`` (the first such in their order),
    else the next one in rotation. A repeated address gets the same sender each time.

    ``sticky`` maps an address to the senders it was sent from, or to the one sender id
    (:meth:`~sendqueue.ports.senders.SenderStore.sticky_senders` gives that form)."""
    if not sender_ids:
        raise InvalidField("senders", [], "a campaign with senders needs at least one")
    chosen: dict[str, str] = {}
    out: list[str] = []
    turn = 0
    for key in recipients:
        sender = chosen.get(key)
        if sender is None:
            before = sticky.get(key)
            if before is not None:  # most were never sent to: no generator for them
                # one id as a plain string: `in` would match substrings ("s1" in "s12")
                if isinstance(before, str):
                    before = (before,)
                sender = next((s for s in sender_ids if s in before), None)
            if sender is None:
                sender = sender_ids[turn % len(sender_ids)]
                turn += 1
            chosen[key] = sender
        out.append(sender)
    return out


def plan_with_senders(
    policy: SendingPolicy,
    assignments: Sequence[str | None],
    books: Mapping[str, SenderBook],
    *,
    now: datetime,
    zones: Sequence[str | None] | None = None,
    campaign_per_day: Mapping[date, int] | None = None,
    campaign_booked: Sequence[datetime] = (),
) -> list[datetime]:
    """The send instant of each recipient (``assignments[i]`` is its sender id, or None for no
    sender: no cap, no gap), as aware UTC datetimes, ``out[i]`` for recipient ``i``. Sends of
    one sender and zone are in recipient order; each is a slot start of its sender.

    ``zones[i]`` is the IANA zone whose wall clock recipient ``i``'s windows, weekdays and skip
    dates are read in (None, or no ``zones``: ``policy.timezone``). Every send lies inside the
    windows on an allowed day in its recipient's zone, at or after ``now`` (and
    ``policy.start``); each local day of the campaign (``policy.timezone``) holds at most
    ``per_day`` counting ``campaign_per_day``, whatever the recipients' zones; each sender's
    local day holds at most its cap counting ``books``, and no two of its sends share a slot.
    With ``campaign_booked`` (a re-plan), sends keep half the nominal spacing away from those
    instants, as :func:`~sendqueue.domain.slots.free_slots` does. Jitter is not applied (a send
    is a sender's slot start). ``books`` is updated with what is planned, and left as it was
    when planning fails.

    Raises NoSendingDay as :func:`plan` does, or when no recipient gets a slot for
    :data:`~sendqueue.domain.planner.PLANNING_HORIZON_DAYS` days; InvalidField for an unknown
    sender id (``senders``), a bad ``zones`` or a naive ``now``.
    """
    if not isinstance(now, datetime) or now.utcoffset() is None:
        raise InvalidField("now", now, "expected an aware date and time")
    count = len(assignments)
    if zones is not None and len(zones) != count:
        raise InvalidField(
            "zones", len(zones), f"expected one zone (or None) per recipient, {count}"
        )
    if not count:
        return []
    zone_names = [] if zones is None else [z or policy.timezone for z in zones]
    names = [policy.timezone] if zones is None else list(dict.fromkeys(zone_names))
    keys: Sequence[Hashable] = (
        assignments if zones is None else list(zip(zone_names, assignments, strict=True))
    )
    senders, lanes, by_zone, days = _lanes(policy, assignments, books, keys, names, zones)
    used = {d.toordinal(): n for d, n in (campaign_per_day or {}).items()}
    campaign = cw.Campaign(days[policy.timezone], policy.per_day, used)
    taken = sorted((b.astimezone(UTC) - _EPOCH) // _ONE_US for b in campaign_booked)
    near = cc.Near(taken, nominal_spacing(policy) / 2 // _ONE_US)
    try:
        _walk_zones(policy, names, by_zone, campaign, near, now=now, count=count)
    except BaseException:
        cw.undo(senders.values(), lanes.values())
        raise
    for lane in lanes.values():
        lane.count()
    for sender in senders.values():
        sender.flush()
    sends = {key: iter(lane.placed) for key, lane in lanes.items()}
    # recipient i gets the next send of its lane; map() keeps the per-recipient steps in C
    return list(map(next, map(sends.__getitem__, keys)))


def _lanes(
    policy: SendingPolicy,
    assignments: Sequence[str | None],
    books: Mapping[str, SenderBook],
    keys: Sequence[Hashable],
    names: list[str],
    zones: Sequence[str | None] | None,
) -> tuple[
    dict[str | None, cw.Sender],
    dict[Hashable, cw.Lane],
    dict[str, list[cw.Lane]],
    dict[str, cc.ZoneDays],
]:
    """The plan's senders, its lanes by key (``keys[i]``: recipient ``i``'s sender id, or its
    zone and sender id), the lanes of each zone, and the local days of every zone involved.

    One lane per (zone, sender), ranked by the sender's first recipient. Counted (Counter runs
    in C) rather than a queue of recipient indexes each: a lane's sends go to its recipients
    in order, which the caller matches up by the same keys."""
    sizes = Counter(keys)
    first: dict[str | None, None] = dict.fromkeys(
        cast("Iterable[str | None]", sizes) if zones is None else assignments
    )
    unknown = sorted(str(s) for s in first if s is not None and s not in books)
    if unknown:
        raise InvalidField("senders", unknown, "no such sender in this plan")
    rank = {sender_id: n for n, sender_id in enumerate(first)}
    days = {name: cc.ZoneDays(load_timezone(name, "zones")) for name in names}
    days.setdefault(policy.timezone, cc.ZoneDays(policy.zone))
    senders: dict[str | None, cw.Sender] = {}
    lanes: dict[Hashable, cw.Lane] = {}
    by_zone: dict[str, list[cw.Lane]] = {name: [] for name in names}
    for key, size in sizes.items():
        if zones is None:
            name, sender_id = policy.timezone, cast("str | None", key)
        else:
            name, sender_id = cast("tuple[str, str | None]", key)
        sender = senders.get(sender_id)
        if sender is None:
            book = None if sender_id is None else books[sender_id]
            zone_days = None if book is None else days.get(book.sender.timezone)
            if book is not None and zone_days is None:
                zone_days = days[book.sender.timezone] = cc.ZoneDays(book.sender.zone)
            sender = senders[sender_id] = cw.Sender(book, zone_days)
        lane = lanes[key] = cw.Lane(sender, rank[sender_id], size)
        by_zone[name].append(lane)
    return senders, lanes, by_zone, days


def _walk_zones(
    policy: SendingPolicy,
    names: list[str],
    by_zone: dict[str, list[cw.Lane]],
    campaign: cw.Campaign,
    near: cc.Near,
    *,
    now: datetime,
    count: int,
) -> None:
    """Place every lane's sends: each zone's grid walked in time order with the others'.
    InvalidField (``assignments``) when the plan would leave the supported date range."""
    clock = cc.Instants()
    try:
        grids = [
            cw.Zone(_grid_ms(_in_zone(policy, name), now), sorted(by_zone[name], key=_rank))
            for name in names
        ]
        # Each zone is walked on while its next slot is the earliest of all (up to the next
        # zone's), so a zone's run of slots costs one heap step, not one per slot.
        heap = [(z.next_at, n) for n, z in enumerate(grids)]
        heapq.heapify(heap)
        while heap:
            _, n = heapq.heappop(heap)
            zone = grids[n]
            limit = heap[0][0] if heap else cw.NEVER
            if cw.walk(zone, campaign, limit, near, clock, policy):
                heapq.heappush(heap, (zone.next_at, n))
    except OverflowError as exc:
        raise InvalidField(
            "assignments",
            count,
            "the plan would leave the supported date range (years 1 to 9999)",
        ) from exc


def _rank(lane: cw.Lane) -> int:
    return lane.rank


def _in_zone(policy: SendingPolicy, name: str) -> SendingPolicy:
    """The policy with its windows, weekdays and skip dates read in zone ``name``."""
    return policy if name == policy.timezone else replace(policy, timezone=name)
