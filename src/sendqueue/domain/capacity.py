"""Capacity-aware planning: a campaign's sends placed where its senders have room (issue 13).
Pure, no I/O.

Several campaigns share a sender's mailbox, so a sender's day holds at most its cap (with the
warm-up's ramp, :meth:`~sendqueue.domain.senders.Sender.cap_on`) across all of them, and two of
its sends are never closer than its minimum gap. :class:`SenderBook` is what a sender already
has booked; :func:`plan_with_senders` takes a campaign's slots from the same day grids as
:func:`~sendqueue.domain.planner.plan` and gives each to a sender that still has room.

The gap is kept by construction: a sender's time is cut into slots of ``min_gap_seconds``
counted from the epoch, a send takes the start of one slot, and a slot holds one send. Two
sends of one sender are then a whole number of gaps apart, and a store can refuse a second
booking of a slot with a unique key (a conditional write), which is what makes booking atomic
across processes. A grid instant is moved up to the next slot start of its sender; where that
leaves the campaign's window, the sender does not take it.

Which sender sends to whom is decided before planning (:func:`assign_senders`: sticky, then
round-robin); each grid slot goes to the next sender in rotation that has a recipient waiting
and room on its day, so one full mailbox does not hold back the others.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from .errors import InvalidField, NoSendingDay
from .planner import PLANNING_HORIZON_DAYS, plan
from .policy import SendingPolicy
from .senders import Sender
from .slots import _near, in_policy, nominal_spacing

__all__ = [
    "SenderBook",
    "assign_senders",
    "plan_with_senders",
    "slot_index",
    "slot_start",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_FIRST_BATCH = 64


def _ms(at: datetime) -> int:
    """Milliseconds since the epoch, rounded up (slot starts are whole milliseconds)."""
    return -(-((at.astimezone(UTC) - _EPOCH) // timedelta(microseconds=1)) // 1000)


def slot_index(at: datetime, gap_seconds: int) -> int:
    """The sender slot ``at`` lies in: ``floor(ms since the epoch / gap)``."""
    return _ms(at) // (gap_seconds * 1000)


def slot_start(index: int, gap_seconds: int) -> datetime:
    """The first instant of sender slot ``index`` (aware, UTC)."""
    return _EPOCH + timedelta(milliseconds=index * gap_seconds * 1000)


@dataclass
class SenderBook:
    """What one sender has booked: sends per local day (its timezone) and the slots taken.

    Built from the store's bookings of the days a plan may touch; :func:`plan_with_senders`
    adds what it plans to it, so one book can serve several plans in a row.
    """

    sender: Sender
    per_day: dict[date, int] = field(default_factory=dict)
    slots: set[int] = field(default_factory=set)

    def day_of(self, at: datetime) -> date:
        """The sender's local day of ``at``."""
        return at.astimezone(self.sender.zone).date()

    def has_room(self, at: datetime, day: date) -> bool:
        """Whether a send at ``at`` (a slot start) on the sender's ``day`` fits."""
        if self.per_day.get(day, 0) >= self.sender.cap_on(day):
            return False
        return slot_index(at, self.sender.min_gap_seconds) not in self.slots

    def add(self, at: datetime) -> None:
        """Book a send at ``at``."""
        day = self.day_of(at)
        self.per_day[day] = self.per_day.get(day, 0) + 1
        self.slots.add(slot_index(at, self.sender.min_gap_seconds))


def assign_senders(
    recipients: Sequence[str],
    sender_ids: Sequence[str],
    sticky: Mapping[str, Collection[str]],
) -> list[str]:
    """The sender of each recipient (by its compared address), in order: the sender it was
    sent from before, when that one is among ``sender_ids`` (the first such in their order),
    else the next one in rotation. A repeated address gets the same sender each time."""
    if not sender_ids:
        raise InvalidField("senders", [], "a campaign with senders needs at least one")
    chosen: dict[str, str] = {}
    out: list[str] = []
    turn = 0
    for key in recipients:
        sender = chosen.get(key)
        if sender is None:
            before = sticky.get(key, ())
            sender = next((s for s in sender_ids if s in before), None)
            if sender is None:
                sender = sender_ids[turn % len(sender_ids)]
                turn += 1
            chosen[key] = sender
        out.append(sender)
    return out


def plan_with_senders(
    policy: SendingPolicy,
    assignments: Sequence[str],
    books: Mapping[str, SenderBook],
    *,
    now: datetime,
    campaign_per_day: Mapping[date, int] | None = None,
    campaign_booked: Sequence[datetime] = (),
) -> list[datetime]:
    """The send instant of each recipient (``assignments[i]`` is its sender id), in recipient
    order per sender, each a slot start of its sender.

    Every send lies inside the policy's windows on an allowed day, at or after ``now`` (and
    ``policy.start``); each local day of the campaign (its timezone) holds at most ``per_day``
    counting ``campaign_per_day``; each sender's local day holds at most its cap counting
    ``books``, and no two of its sends share a slot. With ``campaign_booked`` (a re-plan),
    sends keep half the nominal spacing away from those instants, as
    :func:`~sendqueue.domain.slots.free_slots` does. ``books`` is updated with what is planned.
    Raises NoSendingDay as :func:`plan` does, InvalidField for an unknown sender id.
    """
    if not isinstance(now, datetime) or now.utcoffset() is None:
        raise InvalidField("now", now, "expected an aware date and time")
    unknown = set(assignments) - books.keys()
    if unknown:
        raise InvalidField("senders", sorted(unknown), "no such sender in this plan")
    count = len(assignments)
    out: list[datetime | None] = [None] * count
    if not count:
        return []
    queues: dict[str, deque[int]] = {}
    for i, sender_id in enumerate(assignments):
        queues.setdefault(sender_id, deque()).append(i)
    rotation = list(queues)
    grid_policy = replace(policy, jitter_seconds=0) if policy.jitter_seconds else policy
    zone = policy.zone
    per_day = policy.per_day
    used: dict[date, int] = dict(campaign_per_day or {})
    near = nominal_spacing(policy) / 2
    taken = sorted(b.astimezone(UTC) for b in campaign_booked)
    zones = {sid: books[sid].sender.zone for sid in rotation}
    horizon = timedelta(days=PLANNING_HORIZON_DAYS)
    last_placed: datetime | None = None
    gaps = {sid: books[sid].sender.min_gap_seconds * 1000 for sid in rotation}
    # A sender whose local day is full is skipped until its next local midnight (ms) by one
    # integer comparison, so a grid slot does not try every full mailbox again.
    blocked = dict.fromkeys(rotation, -(2**63))
    turn, placed, seen = 0, 0, 0
    batch = count + 2 * len(taken) + per_day + _FIRST_BATCH
    while True:
        grid = plan(grid_policy, seen + batch, now=now)
        for instant in grid[seen:]:
            instant_ms = _ms(instant)
            instant_day = instant.astimezone(zone).date()
            if used.get(instant_day, 0) >= per_day:
                continue
            for step in range(len(rotation)):
                sender_id = rotation[(turn + step) % len(rotation)]
                queue = queues[sender_id]
                if not queue or instant_ms < blocked[sender_id]:
                    continue
                book = books[sender_id]
                gap = gaps[sender_id]
                index = -(-instant_ms // gap)
                if index in book.slots:
                    continue
                at_ms = index * gap
                at = instant if at_ms == instant_ms else _EPOCH + timedelta(milliseconds=at_ms)
                sender_day = at.astimezone(zones[sender_id]).date()
                if book.per_day.get(sender_day, 0) >= book.sender.cap_on(sender_day):
                    blocked[sender_id] = _ms(_local_midnight(sender_day, zones[sender_id]))
                    continue
                day = instant_day if at is instant else at.astimezone(zone).date()
                if day != instant_day and used.get(day, 0) >= per_day:
                    continue
                if at is not instant and not in_policy(policy, at):
                    continue
                if taken and _near(taken, at, near):
                    continue
                out[queue.popleft()] = at
                book.per_day[sender_day] = book.per_day.get(sender_day, 0) + 1
                book.slots.add(index)
                used[day] = used.get(day, 0) + 1
                placed += 1
                last_placed = at if last_placed is None else max(last_placed, at)
                turn = (turn + step + 1) % len(rotation)
                break
            if placed == count:
                return [at for at in out if at is not None]
            if last_placed is None:
                last_placed = instant
            elif instant - last_placed > horizon:
                raise NoSendingDay(
                    f"no sender slot inside the windows for {PLANNING_HORIZON_DAYS} days after "
                    f"{last_placed:%Y-%m-%d}: the senders' minimum gaps never line up with "
                    f"the windows ({', '.join(map(str, policy.windows))} in "
                    f"{policy.timezone}); shorten min_gap_seconds or widen the windows"
                )
        seen = len(grid)
        batch *= 2


def _local_midnight(day: date, zone: ZoneInfo) -> datetime:
    """The start of the day after ``day`` in ``zone`` (fold 0: never after the real start, so
    a sender is never skipped past a day it has room on)."""
    return datetime.combine(day + timedelta(days=1), time(), tzinfo=zone)
