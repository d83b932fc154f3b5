"""The expected load of a sequence per local day and step, for a preview. Pure, no I/O.

Step 1 goes out as planned; each later step of each recipient at
:func:`~sendqueue.domain.followups.follow_up_earliest` of the step before it, as if no one
answered and every step went out at its earliest instant. It is an estimate: capacity,
``per_day`` and sender caps are not looked at, and answers stop many recipients early.

The rule is applied to every recipient, but not by calling ``follow_up_earliest`` once per
send (a million calls for 100,000 recipients x 10 steps take minutes):

* ``Nh`` / ``Nm``: the earliest window instant at or after ``sent + delay``, found by bisection
  in the zone's window intervals (the planner's own :func:`_exact_intervals`), built once per
  zone for the days the plan reaches.
* ``Nd``: the result depends on the local date of the previous send only, so it is worked out
  by ``follow_up_earliest`` at both ends of each UTC hour a send falls in, and kept for that
  hour when both ends agree (the rule is monotone within a local date) and the UTC offset is
  the same at both ends. Any other hour is worked out per send.
* Days are counted in one zone (the campaign's), each send's local date kept per UTC hour the
  same way.

Exact under one assumption, which the tz database meets: a zone's offset never changes twice
within one hour.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from itertools import repeat
from operator import floordiv
from zoneinfo import ZoneInfo

from .errors import InvalidField
from .followups import follow_up_earliest
from .planner import PLANNING_HORIZON_DAYS, _exact_intervals
from .policy import SendingPolicy, load_timezone
from .steps import Delay, Step

__all__ = ["StepLoad", "step_loads"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_ORDINAL = _EPOCH.date().toordinal()
_ONE_MS = timedelta(milliseconds=1)
_MS_HOUR = 3_600_000
_MS_DAY = 86_400_000
# The calendar of window intervals grows by this many days when a send reaches past it.
_CHUNK_DAYS = 31
_UNKNOWN = object()


@dataclass(frozen=True)
class StepLoad:
    """One step's expected sends per local day (of the zone they were counted in)."""

    step: int
    after: str | None
    """The step's delay as written (``3d``); None for step 1."""
    count: int
    days: tuple[tuple[date, int], ...]
    """``(day, sends)`` in date order, days without a send left out."""


def step_loads(
    policy: SendingPolicy,
    steps: Sequence[Step],
    first_sends: Sequence[datetime],
    zones: Sequence[str | None] | None = None,
) -> tuple[StepLoad, ...]:
    """The expected sends per local day of ``policy.timezone`` of every step (module
    docstring): ``first_sends[i]`` is step 1 of recipient ``i`` (aware), ``zones[i]`` the
    zone its windows are read in (a local-time campaign's recipient; None or no ``zones``:
    the policy's). InvalidField names ``zones`` when the lengths differ."""
    if zones is not None and len(zones) != len(first_sends):
        raise InvalidField(
            "zones", len(zones), f"expected one zone (or None) per send, {len(first_sends)}"
        )
    counter = _DayCounter(policy.zone)
    current = [(s - _EPOCH) // _ONE_MS for s in first_sends]
    loads = [StepLoad(1, None, len(current), counter.days(current))]
    groups = _by_zone(zones, len(current))
    calendars = {
        zone: _Calendar(policy, zone, min((current[i] for i in members), default=0))
        for zone, members in groups.items()
    }
    for step in steps[1:]:
        delay = step.after
        if delay is None:  # check_steps gives every later step a delay
            raise InvalidField(f"steps[{step.number}].after", None, "a later step needs a delay")
        following = [0] * len(current)
        for zone, members in groups.items():
            calendars[zone].follow_ups(current, members, delay, following)
        current = following
        loads.append(StepLoad(step.number, delay.text, len(current), counter.days(current)))
    return tuple(loads)


def _by_zone(zones: Sequence[str | None] | None, count: int) -> dict[str | None, list[int]]:
    """The indexes of the sends per zone (None: the policy's)."""
    if zones is None:
        return {None: list(range(count))}
    groups: dict[str | None, list[int]] = {}
    for i, zone in enumerate(zones):
        groups.setdefault(zone, []).append(i)
    return groups


class _Calendar:
    """The policy read in one zone: its window intervals (ms), grown on demand, and the
    ``Nd`` results kept per UTC hour."""

    def __init__(self, policy: SendingPolicy, zone: str | None, earliest_ms: int) -> None:
        if zone is not None and zone != policy.timezone:
            load_timezone(zone, "zone")
            policy = replace(policy, timezone=zone)
        self._policy = policy
        self._zone = policy.zone
        self._allowed = tuple(d in policy.weekdays for d in range(7))
        self._skip = {d.toordinal() for d in policy.skip_dates}
        self._starts: list[int] = []
        self._ends: list[int] = []
        # from two days before the earliest send: a day's windows may reach into the next
        # UTC day, and the exact rule looks from the day before too
        self._first_ordinal = earliest_ms // _MS_DAY + _EPOCH_ORDINAL - 2
        self._next_ordinal = self._first_ordinal  # the first day not in the intervals yet
        self._ordered = True

    def follow_ups(
        self, sends_ms: Sequence[int], members: Sequence[int], delay: Delay, out: list[int]
    ) -> None:
        """``out[i]`` = ``follow_up_earliest`` of ``sends_ms[i]`` (ms) for each ``i`` of
        ``members``; one loop per step, the hot path without a call per send."""
        elapsed = delay.elapsed
        if elapsed is not None:
            wait = elapsed // _ONE_MS
            self._cover_past(max((sends_ms[i] for i in members), default=0) + wait)
            starts, ends, count = self._starts, self._ends, len(self._ends)
            first_ms = (self._first_ordinal + 1 - _EPOCH_ORDINAL) * _MS_DAY
            for i in members:
                at = sends_ms[i] + wait
                j = bisect_right(ends, at)
                if j < count and at >= first_ms and self._ordered:
                    start = starts[j]
                    out[i] = start if start > at else at
                else:
                    out[i] = self._exact(sends_ms[i], delay)
            return
        kept: dict[int, int | None] = {}
        for i in members:
            sent = sends_ms[i]
            hour = sent // _MS_HOUR
            if hour in kept:
                result = kept[hour]
            else:
                result = kept[hour] = self._hour_result(hour, delay)
            out[i] = result if result is not None else self._exact(sent, delay)

    def _exact(self, sent_ms: int, delay: Delay) -> int:
        sent = _EPOCH + timedelta(milliseconds=sent_ms)
        return (follow_up_earliest(self._policy, sent, delay) - _EPOCH) // _ONE_MS

    def _hour_result(self, hour: int, delay: Delay) -> int | None:
        """The ``Nd`` result shared by every send in this UTC hour; None when it may differ."""
        lo, hi = hour * _MS_HOUR, hour * _MS_HOUR + _MS_HOUR - 1
        if _local(self._zone, lo) != _local(self._zone, hi):
            return None  # a local midnight or an offset change within the hour
        first, last = self._exact(lo, delay), self._exact(hi, delay)
        return first if first == last else None

    def _cover_past(self, at_ms: int) -> None:
        """Grow the intervals until one ends after ``at_ms``, or a planning horizon past it
        holds none (the exact rule then raises NoSendingDay)."""
        day = at_ms // _MS_DAY + _EPOCH_ORDINAL
        self._cover(day + 2)  # its local date and the day after, in any zone
        horizon = day + PLANNING_HORIZON_DAYS
        while (not self._ends or self._ends[-1] <= at_ms) and self._next_ordinal <= horizon:
            self._cover(self._next_ordinal + _CHUNK_DAYS)

    def _cover(self, last_ordinal: int) -> None:
        """Add the window intervals of the sending days up to ``last_ordinal``."""
        windows = self._policy.windows
        while self._next_ordinal <= last_ordinal:
            day = self._next_ordinal
            self._next_ordinal += 1
            if not self._allowed[(day - 1) % 7] or day in self._skip:
                continue
            for start, end in _exact_intervals(
                self._zone, (day - _EPOCH_ORDINAL) * _MS_DAY, windows
            ):
                if self._ends and start < self._ends[-1]:
                    self._ordered = False
                self._starts.append(start)
                self._ends.append(end)


class _DayCounter:
    """Counts sends per local date of one zone, the date kept per UTC hour."""

    def __init__(self, zone: ZoneInfo) -> None:
        self._zone = zone
        self._hours: dict[int, date | None] = {}

    def days(self, sends_ms: Sequence[int]) -> tuple[tuple[date, int], ...]:
        # counted per UTC hour in C first: a day has few distinct hours, a plan many sends
        per_hour = Counter(map(floordiv, sends_ms, repeat(_MS_HOUR)))
        counts: Counter[date] = Counter()
        split: set[int] = set()
        for hour, n in per_hour.items():
            day = self._hours.get(hour, _UNKNOWN)
            if day is _UNKNOWN:
                lo = _local(self._zone, hour * _MS_HOUR)
                hi = _local(self._zone, hour * _MS_HOUR + _MS_HOUR - 1)
                day = self._hours[hour] = lo[0] if lo == hi else None
            if isinstance(day, date):
                counts[day] += n
            else:
                split.add(hour)
        if split:  # an hour holding a local midnight: each send's own date
            for ms in sends_ms:
                if ms // _MS_HOUR in split:
                    counts[_local(self._zone, ms)[0]] += 1
        return tuple(sorted(counts.items()))


def _local(zone: ZoneInfo, ms: int) -> tuple[date, timedelta | None]:
    """The local date of an instant and the zone's offset then."""
    local = (_EPOCH + timedelta(milliseconds=ms)).astimezone(zone)
    return local.date(), local.utcoffset()
