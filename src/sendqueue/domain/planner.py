"""The sending-window planner: when each email of a campaign goes out. Pure, no I/O.

:func:`plan` turns a :class:`~sendqueue.domain.policy.SendingPolicy` and a number of recipients
into one send instant per recipient, in recipient order, as aware datetimes in UTC.

How a plan is made
------------------
1. The effective start is the later of ``policy.start`` and ``now``.
2. Local calendar days (in the policy's timezone) are visited from the effective start's local
   date on. A day is a sending day when its weekday is allowed, it is not a skip date, and its
   windows contain real time (a day swallowed by a DST gap, such as 1994-12-31 in
   Pacific/Kiritimati, contains none).
3. A day's windows become real (UTC) intervals: exactly the instants whose local wall-clock time
   lies inside a window. So a window boundary inside a DST gap maps to the instant the gap ends,
   and the repeated hour of a fall-back is used, both times over, where it lies inside a window.
   This equals the "start at fold=0, end at fold=1" rule whenever no window boundary falls
   *inside* the repeated hour; where one does, the fold rule would also take instants whose wall
   time is outside the window, and this one does not.
4. ``per_day`` slots are spread evenly over the total real length ``L`` of those intervals, taken
   one after the other: slot ``j`` lies ``floor(j * L / per_day)`` milliseconds into them. Sends
   are therefore spread over the whole day and never bunched, and a wall time that does not
   exist is never produced.
5. The first day only gets the slots of its grid at or after the effective start; every later
   sending day is filled to ``per_day`` before the next one is used.
6. With ``jitter_seconds`` each send moves by a pseudo-random offset in ``[-jitter, +jitter]``
   drawn from ``random.Random(policy.seed)`` (one draw per send, in order), clamped to its real
   interval, to the effective start, and to the midpoints between it and its grid neighbours in
   the same interval, so the order of sends never changes.

Resolution: every instant is a whole millisecond. Window boundaries are whole minutes and
transitions whole seconds, so ``L`` is a whole number of milliseconds and the grid is exact to
the millisecond; the smallest spacing a valid policy allows (10,000 a day in a one-minute window)
is 6 ms, so sends stay strictly increasing. A day whose windows hold less real time than
``per_day`` milliseconds (only possible when a gap eats most of a window) gets one slot per
millisecond. Jitter is drawn in milliseconds too.

Determinism: the same policy, start and count always give the same plan, and a plan is a prefix
of any longer plan of the same policy and start (jitter included).

Cost: linear in ``count``. Each day costs a handful of operations (two zoneinfo lookups decide
whether the day holds a UTC offset change); the grid of an ordinary day is computed once per
plan and shifted, and only days with an offset change are worked out exactly. All arithmetic is
in integer milliseconds since the epoch (UTC).
"""

from __future__ import annotations

import random
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, time, timedelta
from functools import cached_property, lru_cache
from zoneinfo import ZoneInfo

from .errors import InvalidField, NoSendingDay
from .policy import WEEKDAY_NAMES, SendingPolicy, Window, load_timezone

__all__ = [
    "PLANNING_HORIZON_DAYS",
    "DaySummary",
    "forget_grids",
    "next_window_instant",
    "per_day_summary",
    "plan",
]

#: A plan fails with :class:`NoSendingDay` when this many consecutive days yield no send.
PLANNING_HORIZON_DAYS = 731

_MS_MINUTE = 60_000
_MS_DAY = 86_400_000
_ONE_MS = timedelta(milliseconds=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_MAX_ORDINAL = date.max.toordinal()
# UTC offsets are strictly within +-24 h, so this margin around a day's windows covers every
# instant whose wall time can fall inside them.
_MARGIN_MS = 25 * 3_600_000
# Offsets are sampled this often when a day holds a transition; two transitions closer than
# this never occur in the tz database.
_SAMPLE_MS = 15 * _MS_MINUTE


@dataclass(frozen=True)
class DaySummary:
    """The sends of one local calendar day (``first`` and ``last`` in the policy's zone)."""

    day: date
    count: int
    first: datetime
    last: datetime


class _Grid:
    """One day's slots in ms relative to some base; the derived lists are built on first use.

    The grid of an ordinary day is reused for every such day of a plan, so building it is a
    one-off; building it lazily keeps a short plan under a large ``per_day`` cheap.
    """

    def __init__(self, intervals: list[tuple[int, int]], slots: list[int], owner: list[int]):
        self.intervals = intervals
        self.slots = slots
        self.owner = owner
        """Index of the interval each slot lies in."""
        self.end = intervals[-1][1]
        """End of the day's last real interval (exclusive)."""

    @cached_property
    def ends(self) -> list[int]:
        """The end (exclusive) of the real interval each slot lies in: a later instant of the
        same day is inside the windows exactly while it is below this."""
        intervals = self.intervals
        return [intervals[k][1] for k in self.owner]

    @cached_property
    def deltas(self) -> list[timedelta]:
        """The slots as timedeltas, to add to the day's base instant."""
        return [timedelta(0, 0, 0, x) for x in self.slots]

    @cached_property
    def lows(self) -> list[int]:
        """Earliest jittered position of each slot."""
        slots, owner = self.slots, self.owner
        # Neighbours in one interval split the space between them at the midpoint; integer
        # slots a < b give one a range ending at (a+b)//2 and the other one starting after it,
        # so jittered sends keep their order.
        return [
            self.intervals[owner[j]][0]
            if j == 0 or owner[j - 1] != owner[j]
            else (slots[j - 1] + slots[j]) // 2 + 1
            for j in range(len(slots))
        ]

    @cached_property
    def highs(self) -> list[int]:
        """Latest jittered position of each slot."""
        slots, owner = self.slots, self.owner
        last = len(slots) - 1
        return [
            self.intervals[owner[j]][1] - 1
            if j == last or owner[j + 1] != owner[j]
            else (slots[j] + slots[j + 1]) // 2
            for j in range(len(slots))
        ]


def plan(policy: SendingPolicy, count: int, *, now: datetime | None = None) -> list[datetime]:
    """The send instants of ``count`` recipients under ``policy``, in recipient order.

    Returns aware datetimes in UTC (``tzinfo=datetime.UTC``) in whole milliseconds, strictly
    increasing (with or without jitter). See the module docstring for the rules.

    Raises :class:`InvalidField` for a bad ``count`` (``field="count"``), a naive ``now``
    (``field="now"``), or when neither ``policy.start`` nor ``now`` is given
    (``field="start"``); :class:`NoSendingDay` when :data:`PLANNING_HORIZON_DAYS` consecutive
    days in a row yield no send.
    """
    if isinstance(count, bool) or not isinstance(count, int):
        raise InvalidField("count", count, "expected a whole number of sends, 0 or more")
    if count < 0:
        raise InvalidField("count", count, "must be 0 or more")
    start = _effective_start(policy, now)
    if count == 0:
        return []
    try:
        return _plan(policy, start, count)
    except OverflowError as exc:
        raise InvalidField(
            "count",
            count,
            "the plan would leave the supported date range (years 1 to 9999); send fewer, "
            "raise per_day, or allow more days",
        ) from exc


def per_day_summary(sends: Sequence[datetime], timezone: str) -> list[DaySummary]:
    """Sends grouped by local calendar day in ``timezone``, in date order.

    ``first`` and ``last`` are the earliest and latest instants of the day (compared as
    instants, so the repeated hour of a fall-back sorts correctly), as local aware times.
    """
    zone = load_timezone(timezone)
    days: dict[date, tuple[int, datetime, datetime]] = {}
    for send in sends:
        if not isinstance(send, datetime) or send.utcoffset() is None:
            raise InvalidField("sends", send, "expected aware datetimes")
        instant = send.astimezone(UTC)
        day = instant.astimezone(zone).date()
        seen = days.get(day)
        if seen is None:
            days[day] = (1, instant, instant)
        else:
            n, first, last = seen
            days[day] = (n + 1, min(first, instant), max(last, instant))
    return [
        DaySummary(day, n, first.astimezone(zone), last.astimezone(zone))
        for day, (n, first, last) in sorted(days.items())
    ]


def next_window_instant(policy: SendingPolicy, at: datetime) -> datetime:
    """The earliest instant at or after ``at`` inside one of the policy's windows, on an
    allowed, non-skipped day (aware, UTC, whole milliseconds).

    Retries and recovered sends use it so that a resend never goes out at night: a transient
    retry due at 17:00:30 after a 09:00-17:00 window waits for 09:00 on the next sending day.
    It ignores ``per_day``: a retry is not a new send. Raises NoSendingDay like :func:`plan`.
    """
    if not isinstance(at, datetime) or at.utcoffset() is None:
        raise InvalidField("at", at, "expected an aware date and time")
    zone = policy.zone
    at_ms = -(-((at.astimezone(UTC) - _EPOCH) // timedelta(microseconds=1)) // 1000)
    allowed = tuple(d in policy.weekdays for d in range(7))
    skip = {d.toordinal() for d in policy.skip_dates}
    # the day before too: its last window may reach past local midnight's instant at a DST change
    ordinal = (_EPOCH + timedelta(milliseconds=at_ms)).astimezone(zone).date().toordinal() - 1
    for step in range(PLANNING_HORIZON_DAYS + 1):
        day = ordinal + step
        if allowed[(day - 1) % 7] and day not in skip:
            day_ms = (day - _EPOCH_ORDINAL) * _MS_DAY
            for start, end in _exact_intervals(zone, day_ms, policy.windows):
                if end > at_ms:
                    return _EPOCH + timedelta(milliseconds=max(start, at_ms))
    raise NoSendingDay(_no_sending_day_reason(policy, ordinal + 1))


def _effective_start(policy: SendingPolicy, now: datetime | None) -> int:
    """The later of ``policy.start`` and ``now``, in microseconds since the epoch."""
    if now is not None and (not isinstance(now, datetime) or now.utcoffset() is None):
        raise InvalidField("now", now, "expected an aware date and time")
    candidates = [t for t in (policy.start, now) if t is not None]
    if not candidates:
        raise InvalidField(
            "start", None, "give the policy a start, or pass now= (plans need a first moment)"
        )
    latest = max(t.astimezone(UTC) for t in candidates)
    return (latest - _EPOCH) // timedelta(microseconds=1)


def _plan(policy: SendingPolicy, start_us: int, count: int) -> list[datetime]:
    zone = policy.zone
    days = _Days(policy, zone)
    start_ms = -(-start_us // 1000)  # slots are whole ms: slot >= start iff slot >= ceil(start)
    start_local = (_EPOCH + timedelta(microseconds=start_us)).astimezone(zone)
    first_ordinal = start_local.date().toordinal()
    last_ordinal = date.max.toordinal()
    # date(1, 1, 1) has ordinal 1 and is a Monday.
    allowed = tuple(d in policy.weekdays for d in range(7))
    skip = {d.toordinal() for d in policy.skip_dates}
    jitter_ms = policy.jitter_seconds * 1000
    rng = random.Random(policy.seed) if jitter_ms else None
    span = 2 * jitter_ms + 1

    out: list[datetime] = []
    remaining = count
    prev_end: int | None = None
    empty_run = 0
    ordinal = first_ordinal
    while remaining:
        took = 0
        if allowed[(ordinal - 1) % 7] and ordinal not in skip:
            got = days.grid(ordinal, prev_end)
            if got is not None:
                base, grid = got
                slots = grid.slots
                first = 0 if base + slots[0] >= start_ms else bisect_left(slots, start_ms - base)
                stop = min(len(slots), first + remaining)
                # Adding ready-made timedeltas to one datetime per day is several times faster
                # than building a timedelta per send, and conversion dominates the cost.
                day_start = _EPOCH + timedelta(0, 0, 0, base)
                if rng is None and stop - first == len(slots):
                    out.extend([day_start + d for d in grid.deltas])
                elif rng is None:  # a partial first or last day: only what it needs
                    out.extend([day_start + timedelta(0, 0, 0, s) for s in slots[first:stop]])
                else:
                    lows, highs = grid.lows, grid.highs
                    for j in range(first, stop):
                        moved = base + slots[j] + int(rng.random() * span) - jitter_ms
                        low = max(base + lows[j], start_ms)
                        high = base + highs[j]
                        moved = low if moved < low else high if moved > high else moved
                        out.append(day_start + timedelta(0, 0, 0, moved - base))
                took = stop - first
                remaining -= took
                prev_end = base + grid.end
        if took:
            empty_run = 0
        else:
            empty_run += 1
            if empty_run >= PLANNING_HORIZON_DAYS:
                raise NoSendingDay(_no_sending_day_reason(policy, ordinal - empty_run + 1))
        if remaining and ordinal >= last_ordinal:
            raise OverflowError("past date.max")
        ordinal += 1
    return out


def _grid_ms(policy: SendingPolicy, now: datetime) -> Iterator[tuple[int, _Grid, int]]:
    """:func:`plan`'s grid without jitter, one sending day at a time, in integer ms.

    Yields ``(base, grid, first)``: that day's slots are ``base + grid.slots[j]`` for ``j >=
    first`` (ms since the epoch), each inside its real interval up to ``base + grid.ends[j]``.
    Endless: the caller stops when it has what it needs. Raises NoSendingDay when
    :data:`PLANNING_HORIZON_DAYS` days in a row hold no slot (as :func:`plan` does), and
    OverflowError past ``date.max``. The capacity planner walks it (``capacity.py``): it needs
    the grid as integers and each slot's window end, not datetimes. It repeats :func:`_plan`'s
    day loop rather than sharing it, so that loop (and plan()'s speed) stays as it is.
    """
    start_us = _effective_start(policy, now)
    policy = replace(policy, jitter_seconds=0) if policy.jitter_seconds else policy
    zone = policy.zone
    days = _Days(policy, zone)
    start_ms = -(-start_us // 1000)
    start_local = (_EPOCH + timedelta(microseconds=start_us)).astimezone(zone)
    ordinal = start_local.date().toordinal()
    allowed = tuple(d in policy.weekdays for d in range(7))
    skip = {d.toordinal() for d in policy.skip_dates}
    prev_end: int | None = None
    empty_run = 0
    while True:
        took = False
        if allowed[(ordinal - 1) % 7] and ordinal not in skip:
            got = days.grid(ordinal, prev_end)
            if got is not None:
                base, grid = got
                slots = grid.slots
                first = 0 if base + slots[0] >= start_ms else bisect_left(slots, start_ms - base)
                if first < len(slots):
                    took = True
                    yield base, grid, first
                prev_end = base + grid.end
        if took:
            empty_run = 0
        else:
            empty_run += 1
            if empty_run >= PLANNING_HORIZON_DAYS:
                raise NoSendingDay(_no_sending_day_reason(policy, ordinal - empty_run + 1))
        if ordinal >= _MAX_ORDINAL:
            raise OverflowError("past date.max")
        ordinal += 1


class _Days:
    """The slot grids of one policy's days; an ordinary day's grid is computed once."""

    def __init__(self, policy: SendingPolicy, zone: ZoneInfo) -> None:
        self.zone = zone
        self.per_day = policy.per_day
        self.windows = policy.windows
        first, last = self.windows[0], self.windows[-1]
        self.first_wall = _wall_time(first.start_minute, fold=0)
        # The last end is looked up with fold=1 and the first start with fold=0: if a day's
        # span holds a gap or a repeated hour, the two offsets differ and the day is worked out
        # exactly.
        self.last_wall = _wall_time(last.end_minute % 1440, fold=1)
        self.last_next_day = last.end_minute == 1440
        relative = _merge(
            [(w.start_minute * _MS_MINUTE, w.end_minute * _MS_MINUTE) for w in self.windows]
        )
        self.first_relative = relative[0][0]
        grid = _ordinary_grid(tuple(relative), self.per_day)
        if grid is None:  # pragma: no cover - a window is at least a minute = 60,000 ms
            raise AssertionError("windows without length")
        self.ordinary = grid
        self.offset_ms: dict[timedelta, int] = {}

    def grid(self, ordinal: int, prev_end: int | None) -> tuple[int, _Grid] | None:
        """``(base, grid)``: the day's slots are ``base + grid.slots[j]`` (ms since the epoch).

        ``None`` when the day holds no real window time. Intervals are cut to start at
        ``prev_end`` (the end of the previous sending day) so days never interleave, even
        where a fall-back crosses midnight.
        """
        day = date.fromordinal(ordinal)
        day_ms = (ordinal - _EPOCH_ORDINAL) * _MS_DAY
        if self.last_next_day and ordinal >= _MAX_ORDINAL:
            # a window ending at 24:00 reaches into 10000-01-01; plan() reports the overflow
            raise OverflowError("past date.max")
        end_day = date.fromordinal(ordinal + 1) if self.last_next_day else day
        off_first = self.zone.utcoffset(datetime.combine(day, self.first_wall))
        off_last = self.zone.utcoffset(datetime.combine(end_day, self.last_wall))
        if off_first == off_last and off_first is not None:
            off_ms = self.offset_ms.get(off_first)
            if off_ms is None:
                off_ms = self.offset_ms[off_first] = off_first // _ONE_MS
            base = day_ms - off_ms
            if prev_end is None or base + self.first_relative >= prev_end:
                return base, self.ordinary
        intervals = list(_exact_intervals(self.zone, day_ms, self.windows))
        if prev_end is not None:
            intervals = [(max(s, prev_end), e) for s, e in intervals if e > prev_end]
        grid = _grid(intervals, self.per_day)
        return None if grid is None else (0, grid)


def _wall_time(minute: int, *, fold: int) -> time:
    return time(minute // 60, minute % 60, fold=fold)


def _merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, touching intervals joined (windows 09-12 and 12-17 are one stretch of time)."""
    merged: list[tuple[int, int]] = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(e, merged[-1][1]))
        else:
            merged.append((s, e))
    return merged


@lru_cache(maxsize=8)
def _ordinary_grid(relative: tuple[tuple[int, int], ...], per_day: int) -> _Grid | None:
    """:func:`_grid` of an ordinary day, cached (a grid is never changed once built): the
    capacity planner plans every provisioning chunk anew, and a grid of ``per_day`` slots
    costs more to build than a chunk of sends costs to plan (docs/performance.md). The key
    holds no zone, so a local-time campaign's zones share one entry; a 10,000-a-day grid
    is about 2 MB, hence few entries."""
    return _grid(list(relative), per_day)


def forget_grids() -> None:
    """Drop the cached day grids: the next plan builds its grid again, as a campaign's first
    plan in a process does (the benchmarks measure every run that way)."""
    _ordinary_grid.cache_clear()


def _grid(intervals: list[tuple[int, int]], per_day: int) -> _Grid | None:
    """``per_day`` slots spread evenly over the intervals taken end to end."""
    total = sum(e - s for s, e in intervals)
    n = min(per_day, total)
    if n <= 0:
        return None
    slots: list[int] = []
    owner: list[int] = []
    k, before = 0, 0  # current interval, and the length of the intervals before it
    for j in range(n):
        x = j * total // n
        while x >= before + intervals[k][1] - intervals[k][0]:
            before += intervals[k][1] - intervals[k][0]
            k += 1
        slots.append(intervals[k][0] + x - before)
        owner.append(k)
    return _Grid(intervals, slots, owner)


def _offset_ms(zone: ZoneInfo, instant_ms: int) -> int:
    offset = (_EPOCH + timedelta(milliseconds=instant_ms)).astimezone(zone).utcoffset()
    assert offset is not None  # a ZoneInfo always has an offset for an aware instant
    return offset // _ONE_MS


def _pieces(zone: ZoneInfo, lo: int, hi: int) -> list[tuple[int, int, int]]:
    """``[lo, hi)`` cut at the zone's transitions: ``(start, end, offset)`` in ms."""
    pieces: list[tuple[int, int, int]] = []
    piece_start, offset = lo, _offset_ms(zone, lo)
    t = lo
    while t < hi:
        nxt = min(t + _SAMPLE_MS, hi)
        if _offset_ms(zone, nxt) != offset:
            # The offset changes in (t, nxt]: find the first instant with the new one.
            a, b = t, nxt
            while b - a > 1:
                mid = (a + b) // 2
                if _offset_ms(zone, mid) == offset:
                    a = mid
                else:
                    b = mid
            pieces.append((piece_start, b, offset))
            piece_start, offset = b, _offset_ms(zone, b)
            t = b
        else:
            t = nxt
    pieces.append((piece_start, hi, offset))
    return pieces


@lru_cache(maxsize=1024)
def _exact_intervals(
    zone: ZoneInfo, day_ms: int, windows: tuple[Window, ...]
) -> tuple[tuple[int, int], ...]:
    """The instants (ms) whose wall time on this day lies inside a window, as intervals.

    Cached: the worker checks every send against its policy (:func:`next_window_instant`), and
    the zone's offsets, sampled over the day, cost about a fifth of a send's CPU when
    worked out each time (docs/performance-history.md)."""
    lo = day_ms + windows[0].start_minute * _MS_MINUTE - _MARGIN_MS
    hi = day_ms + windows[-1].end_minute * _MS_MINUTE + _MARGIN_MS
    found: list[tuple[int, int]] = []
    pieces = _pieces(zone, lo, hi)
    for w in windows:
        wall_lo = day_ms + w.start_minute * _MS_MINUTE
        wall_hi = day_ms + w.end_minute * _MS_MINUTE
        for a, b, offset in pieces:
            # Within one piece wall time = instant + offset, so the window maps back directly.
            s, e = max(a + offset, wall_lo), min(b + offset, wall_hi)
            if s < e:
                found.append((s - offset, e - offset))
    return tuple(_merge(found))


def _no_sending_day_reason(policy: SendingPolicy, first_ordinal: int) -> str:
    """Why ``PLANNING_HORIZON_DAYS`` days from ``first_ordinal`` gave no send, in words."""
    last_ordinal = first_ordinal + PLANNING_HORIZON_DAYS - 1
    allowed = skipped = 0
    for ordinal in range(first_ordinal, last_ordinal + 1):
        if (ordinal - 1) % 7 in policy.weekdays:
            allowed += 1
            if date.fromordinal(ordinal) in policy.skip_dates:
                skipped += 1
    weekday_text = ",".join(WEEKDAY_NAMES[d] for d in sorted(policy.weekdays))
    windows_text = ", ".join(str(w) for w in policy.windows)
    span = (
        f"no sending day in {PLANNING_HORIZON_DAYS} days from "
        f"{date.fromordinal(first_ordinal)} to {date.fromordinal(last_ordinal)}"
    )
    if skipped == allowed:
        return (
            f"{span}: every one of the {allowed} days on the allowed weekdays ({weekday_text}) "
            "is a skip date; allow more weekdays or remove skip_dates"
        )
    return (
        f"{span}: of the {allowed} days on the allowed weekdays ({weekday_text}), {skipped} are "
        f"skip dates and {allowed - skipped} have no window time left ({windows_text} in "
        f"{policy.timezone}, after the start and outside DST gaps); check weekdays, windows "
        "and skip_dates"
    )


def per_zone_day_summary(
    sends: Sequence[datetime], zones: Sequence[str | None], default_zone: str
) -> dict[str, list[DaySummary]]:
    """Sends grouped by their recipient's zone, each group by local day in that zone.

    ``zones[i]`` is the IANA zone of the recipient of ``sends[i]``, None for ``default_zone``
    (the campaign's). Each zone present gets :func:`per_day_summary` of its sends in its own
    zone; ``default_zone`` comes first, the others in name order. InvalidField (``zones``) when
    the lengths differ, or (``timezone``) for an unknown zone.
    """
    if len(zones) != len(sends):
        raise InvalidField(
            "zones", len(zones), f"expected one zone (or None) per send, {len(sends)}"
        )
    groups: dict[str, list[datetime]] = {}
    for send, zone in zip(sends, zones, strict=True):
        name = zone or default_zone
        group = groups.get(name)
        if group is None:
            group = groups[name] = []
        group.append(send)
    order = sorted(groups, key=lambda name: (name != default_zone, name))
    return {name: per_day_summary(groups[name], name) for name in order}
