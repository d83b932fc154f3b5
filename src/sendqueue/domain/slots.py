"""Free slots of a campaign's grid, and whether an instant lies inside its policy. Pure, no I/O.

After an outage, a retry or a resume, emails are moved onto slots that keep the campaign's
promise: :func:`free_slots` walks the same day grids as :func:`~sendqueue.domain.planner.plan`
(without jitter: a moved send lands on a grid slot) from ``now`` on, and takes a slot only

- when its local day (in the policy's timezone) still has room: the sends already booked on
  that day plus the slots already taken stay below ``per_day``;
- when it is at least half the nominal spacing away from every booked instant and from every
  slot already taken, so moved sends are never bunched.

The nominal spacing is ``policy.window_minutes * 60 / per_day`` seconds: the grid's spacing on
an ordinary day. (On a day whose windows a DST change shortens, the grid is denser; there a slot
may be refused for being too close and the send takes a later one.)
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta

from .errors import InvalidField, NoSendingDay
from .planner import next_window_instant, plan
from .policy import SendingPolicy

__all__ = ["free_slots", "in_policy", "into_slot", "nominal_spacing"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

#: Grid slots examined beyond the first batch's estimate; each further batch is twice as large.
_FIRST_BATCH = 64


def nominal_spacing(policy: SendingPolicy) -> timedelta:
    """The planned spacing of two sends on an ordinary day: window length / ``per_day``."""
    return timedelta(seconds=policy.window_minutes * 60 / policy.per_day)


def in_policy(
    policy: SendingPolicy,
    at: datetime,
    *,
    late: timedelta = timedelta(0),
    early: timedelta = timedelta(0),
) -> bool:
    """Whether a send at ``at`` keeps the policy: some instant of ``[at - late, at + early]``
    lies inside a window of an allowed, non-skipped day (in the policy's timezone).

    ``late`` is how long after a slot the execution layer may fire (its firing precision);
    ``early`` how early an invocation may come (clock skew).
    """
    if not isinstance(at, datetime) or at.utcoffset() is None:
        raise InvalidField("at", at, "expected an aware date and time")
    # next_window_instant rounds up to the next whole millisecond: floor the instant first, or
    # one inside a window with a sub-millisecond part would look outside it. Window bounds are
    # whole minutes, so flooring never moves an instant from outside a window to inside one.
    since = at - late
    since -= timedelta(microseconds=since.microsecond % 1000)
    try:
        return next_window_instant(policy, since) <= at + early
    except NoSendingDay:  # no window at all from here on
        return False


def free_slots(
    policy: SendingPolicy,
    count: int,
    *,
    now: datetime,
    booked_per_day: Mapping[date, int],
    booked: Sequence[datetime],
) -> list[datetime]:
    """The first ``count`` free slots of the policy's grid at or after ``now``, in order.

    ``booked_per_day`` holds the sends already counted against each local day;
    ``booked`` the instants to keep half the nominal spacing away from. The slots are aware
    UTC datetimes in whole milliseconds, strictly increasing, each at or after ``now`` (and
    ``policy.start``). Deterministic. Raises :class:`~sendqueue.domain.errors.NoSendingDay` as
    :func:`plan` does, and InvalidField for a bad ``count`` or ``now``.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise InvalidField("count", count, "expected a whole number of slots, 0 or more")
    if not isinstance(now, datetime) or now.utcoffset() is None:
        raise InvalidField("now", now, "expected an aware date and time")
    if count == 0:
        return []
    grid_policy = replace(policy, jitter_seconds=0) if policy.jitter_seconds else policy
    zone = policy.zone
    per_day = policy.per_day
    gap = nominal_spacing(policy) / 2
    # Booked instants sorted once; each candidate looks at its neighbours only (bisect).
    taken = sorted(b.astimezone(UTC) for b in booked)
    out: list[datetime] = []
    used: dict[date, int] = {}
    seen = 0
    # Enough for the usual case in one pass (a slot is refused for a booked instant nearby,
    # and a full day has its per_day instants in ``taken``); a plan of a million sends is a
    # lot of memory, so not twice that. Not a day's grid more: a retry plans one slot.
    batch = count + 2 * len(taken) + _FIRST_BATCH
    while True:
        # A plan is a prefix of any longer plan from the same start, so each batch only
        # examines the slots the previous one did not.
        grid = plan(grid_policy, seen + batch, now=now)
        for slot in grid[seen:]:
            day = slot.astimezone(zone).date()
            if booked_per_day.get(day, 0) + used.get(day, 0) >= per_day:
                continue
            if out and slot - out[-1] < gap:
                continue
            if _near(taken, slot, gap):
                continue
            out.append(slot)
            used[day] = used.get(day, 0) + 1
            if len(out) == count:
                return out
        seen = len(grid)
        batch *= 2


def _near(taken: Sequence[datetime], slot: datetime, gap: timedelta) -> bool:
    """Whether a sorted ``taken`` holds an instant less than ``gap`` away from ``slot``."""
    i = bisect_left(taken, slot)
    if i < len(taken) and taken[i] - slot < gap:
        return True
    return i > 0 and slot - taken[i - 1] < gap


def into_slot(send_at: datetime, precision: float) -> timedelta:
    """How far ``send_at`` lies into its ``precision``-second firing slot (zero when exact).

    Under EventBridge (60 s) an invocation may come anywhere in the minute of the schedule's
    ``at()`` time, so one from the start of send_at's minute is on time, not early. Sending then
    never leaves the campaign's windows: their bounds are whole local minutes (so is every zone
    offset in use since 1972, and so the UTC minute is the local one), and a planned send_at in
    ``[start, end)`` has its minute's start in it too. A send moves only within its minute, so
    each day's count is the planned one; the order of sends within one minute may change, as
    EventBridge's own firing already does. The one planned bound that need not be a whole minute
    is the campaign's start (``policy.start`` with seconds): its first sends may go out up to
    59 s before it, never before its minute. The state machine (tests/reliability) checks "never
    sent before its send time" on the exact embedded layer (precision 0): unchanged there.
    """
    if precision <= 0:
        return timedelta(0)
    step = round(precision * 1_000_000)
    return timedelta(microseconds=((send_at - _EPOCH) // timedelta(microseconds=1)) % step)
