"""The capacity planner's clocks (see :mod:`sendqueue.domain.capacity_walk`): local days as
tables of millisecond stretches per zone, send instants made once each, and the campaign's
booked sends a re-plan keeps away from. Pure, no I/O.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

from .planner import _offset_ms, _pieces

__all__: list[str] = []  # internal to sendqueue.domain.capacity

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_MS_DAY = 86_400_000


def _stretch(zone: ZoneInfo, t: int) -> tuple[int, int, int]:
    """``(start, end, ordinal)``: the stretch of ``t``'s local day around it in which the
    date is that day's (the whole day, or its piece on one side of an offset change)."""
    offset = _offset_ms(zone, t)
    days = (t + offset) // _MS_DAY
    lo = days * _MS_DAY - offset
    hi = lo + _MS_DAY
    if _offset_ms(zone, lo) != offset or _offset_ms(zone, hi - 1) != offset:
        # the offset changes that day: only the piece with t's offset, where the wall time
        # (and so the date) follows from the instant
        for a, b, _ in _pieces(zone, lo, hi):
            if a <= t < b:
                lo, hi = a, b
                break
    return lo, hi, days + _EPOCH_ORDINAL


class ZoneDays:
    """One zone's local days as a growing table of adjacent stretches: ``starts[i]`` to
    ``starts[i + 1]`` is local day ``ordinals[i]``. Shared by the campaign and every sender in
    the zone; instants move forward, so the table mostly grows at its end."""

    __slots__ = ("ordinals", "starts", "zone")

    def __init__(self, zone: ZoneInfo) -> None:
        self.zone = zone
        self.starts: list[int] = []
        self.ordinals: list[int] = []

    def find(self, t: int) -> tuple[int, int, int]:
        """``(start, end, ordinal)`` of the stretch holding ``t``."""
        starts = self.starts
        i = bisect_right(starts, t) - 1
        if 0 <= i < len(self.ordinals):
            return starts[i], starts[i + 1], self.ordinals[i]
        lo, hi, ordinal = _stretch(self.zone, t)
        if starts and starts[-1] == lo:
            starts.append(hi)
            self.ordinals.append(ordinal)
        elif starts and starts[0] == hi:
            starts.insert(0, lo)
            self.ordinals.insert(0, ordinal)
        else:
            self.starts, self.ordinals = [lo, hi], [ordinal]
        return lo, hi, ordinal


class Near:
    """The campaign's own booked instants (µs, sorted), kept half the spacing away from."""

    __slots__ = ("half", "taken")

    def __init__(self, taken: list[int], half: int) -> None:
        self.taken = taken
        self.half = half

    def __bool__(self) -> bool:
        return bool(self.taken)

    def __call__(self, at_ms: int) -> bool:
        """Whether a send at ``at_ms`` would be closer than half the spacing to one of them."""
        taken, at, half = self.taken, at_ms * 1000, self.half
        i = bisect_left(taken, at)
        if i < len(taken) and taken[i] - at < half:
            return True
        return i > 0 and at - taken[i - 1] < half


class Instants:
    """Ms as aware UTC datetimes, for the sends as they are taken. Building a timedelta costs
    more than the rest of a send, so a datetime is its UTC midnight plus its offset into the
    day, both cached (a grid's offsets repeat day after day), and each instant is made once:
    a uniform zone makes one per slot start, which its lanes share."""

    __slots__ = ("made", "midnights", "offsets")

    def __init__(self) -> None:
        self.made: dict[int, datetime] = {}
        self.midnights: dict[int, datetime] = {}
        self.offsets: dict[int, timedelta] = {}

    def __call__(self, ms: int) -> datetime:
        at = self.made.get(ms)
        if at is None:
            day, into = divmod(ms, _MS_DAY)
            midnight = self.midnights.get(day)
            if midnight is None:
                midnight = self.midnights[day] = _EPOCH + timedelta(days=day)
            offset = self.offsets.get(into)
            if offset is None:
                offset = self.offsets[into] = timedelta(0, 0, 0, into)
            at = self.made[ms] = midnight + offset
        return at
