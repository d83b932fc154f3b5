"""The sending-window planner: properties over many timezones, and exact DST examples."""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter, defaultdict
from collections.abc import Sequence
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sendqueue.domain.errors import InvalidField, NoSendingDay
from sendqueue.domain.planner import (
    PLANNING_HORIZON_DAYS,
    DaySummary,
    per_day_summary,
    plan,
)
from sendqueue.domain.policy import SendingPolicy, Window, parse_window

EVERY_DAY = frozenset(range(7))

ZONES = [
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "Asia/Kathmandu",
    "Pacific/Kiritimati",
    "UTC",
]

# Instants (UTC) at or near each zone's interesting transitions; starts are drawn around them.
ANCHORS: dict[str, list[datetime]] = {
    "Europe/Berlin": [
        datetime(2026, 3, 29, 1, tzinfo=UTC),
        datetime(2026, 10, 25, 1, tzinfo=UTC),
        datetime(2026, 7, 1, tzinfo=UTC),
    ],
    "America/New_York": [
        datetime(2026, 3, 8, 7, tzinfo=UTC),
        datetime(2026, 11, 1, 6, tzinfo=UTC),
    ],
    "Australia/Lord_Howe": [
        datetime(2026, 4, 4, 15, tzinfo=UTC),
        datetime(2026, 10, 3, 15, 30, tzinfo=UTC),
    ],
    "Asia/Kathmandu": [datetime(2026, 6, 1, tzinfo=UTC), datetime(1985, 12, 31, 18, tzinfo=UTC)],
    "Pacific/Kiritimati": [datetime(1994, 12, 31, 10, tzinfo=UTC)],
    "UTC": [datetime(2026, 1, 1, tzinfo=UTC), datetime(2028, 2, 28, tzinfo=UTC)],
}

# Window sets that put boundaries in, at and around the DST gaps and repeated hours above.
INTERESTING_WINDOWS = [
    ["00:00-24:00"],
    ["01:00-03:30"],
    ["02:00-03:00"],
    ["02:30-05:00"],
    ["00:00-02:00"],
    ["02:15-02:45"],
    ["01:30-02:30"],
    ["01:45-02:00"],
    ["09:00-12:00", "13:00-17:00"],
    ["00:00-02:30", "02:30-24:00"],
    ["01:45-02:15", "02:45-03:15", "20:00-20:01"],
    ["23:59-24:00"],
    ["00:00-00:01", "12:00-12:30"],
]


_INTERESTING = st.sampled_from(INTERESTING_WINDOWS)
_WINDOW_COUNT = st.integers(1, 3)
_POINTS = {
    k: st.lists(st.integers(0, 1440), min_size=2 * k, max_size=2 * k, unique=True)
    for k in (1, 2, 3)
}
_ZONE_AND_ANCHOR = st.sampled_from(ZONES).flatmap(
    lambda tz: st.tuples(
        st.just(tz), st.sampled_from([*ANCHORS[tz], datetime(2026, 12, 31, 23, tzinfo=UTC)])
    )
)
_SHIFT_MINUTES = st.integers(-4 * 1440, 4 * 1440)
_MICROSECONDS = st.sampled_from([0, 0, 1, 999_999, 123_456])
_SKIP_OFFSETS = st.frozensets(st.integers(-2, 40), max_size=10)
_PER_DAY = st.one_of(st.integers(1, 30), st.integers(1, 10_000))
_WEEKDAYS = st.frozensets(st.integers(0, 6), min_size=1)
_JITTER = st.one_of(st.just(0), st.integers(1, 7200))
_SEED = st.integers(0, 2**32)


@st.composite
def window_sets(draw: st.DrawFn) -> tuple[Window, ...]:
    if draw(st.booleans()):
        return tuple(parse_window(w) for w in draw(_INTERESTING))
    k = draw(_WINDOW_COUNT)
    points = sorted(draw(_POINTS[k]))
    return tuple(Window(points[2 * i], points[2 * i + 1]) for i in range(k))


_WINDOW_SETS = window_sets()


@st.composite
def policies(draw: st.DrawFn, *, jitter: bool = True) -> SendingPolicy:
    tz, anchor = draw(_ZONE_AND_ANCHOR)
    zone = ZoneInfo(tz)
    start = anchor + timedelta(minutes=draw(_SHIFT_MINUTES), microseconds=draw(_MICROSECONDS))
    if draw(st.booleans()):
        # a naive start is wall-clock time in the policy's zone
        start = start.astimezone(zone).replace(tzinfo=None)
    local_date = (start if start.tzinfo is None else start.astimezone(zone)).date()
    return SendingPolicy(
        timezone=tz,
        per_day=draw(_PER_DAY),
        weekdays=draw(_WEEKDAYS),
        windows=draw(_WINDOW_SETS),
        start=start,
        skip_dates=frozenset(local_date + timedelta(days=n) for n in draw(_SKIP_OFFSETS)),
        jitter_seconds=draw(_JITTER) if jitter else 0,
        seed=draw(_SEED),
    )


# -- oracles, written independently of the planner's arithmetic --------------------------------


def wall_ms(local: datetime) -> int:
    """Milliseconds after local midnight (the planner's resolution is whole milliseconds)."""
    return ((local.hour * 60 + local.minute) * 60 + local.second) * 1000 + local.microsecond // 1000


def in_window(policy: SendingPolicy, local: datetime) -> bool:
    ms = wall_ms(local)
    return any(w.start_minute * 60_000 <= ms < w.end_minute * 60_000 for w in policy.windows)


def wall_exists(zone: ZoneInfo, local: datetime) -> bool:
    """The wall time reads back to the same instant and the same wall time."""
    naive = local.replace(tzinfo=None)
    back = naive.replace(tzinfo=zone, fold=local.fold)
    return back.astimezone(UTC) == local.astimezone(UTC) and back.astimezone(zone) == local


def day_offset(zone: ZoneInfo, day: date) -> timedelta | None:
    """The day's UTC offset when it holds no transition, else None."""
    nxt = day + timedelta(days=1)
    offsets = {
        zone.utcoffset(datetime.combine(d, time(0, fold=f))) for d in (day, nxt) for f in (0, 1)
    }
    return offsets.pop() if len(offsets) == 1 else None


def minute_exists(zone: ZoneInfo, day: date, minute: int) -> bool:
    wall = datetime.combine(day, time(minute // 60, minute % 60))
    return any(
        wall.replace(tzinfo=zone, fold=f).astimezone(UTC).astimezone(zone).replace(tzinfo=None)
        == wall
        for f in (0, 1)
    )


def eligible(policy: SendingPolicy, day: date) -> bool:
    """Allowed weekday, not skipped, and some window wall time on it exists."""
    if day.weekday() not in policy.weekdays or day in policy.skip_dates:
        return False
    zone = policy.zone
    if day_offset(zone, day) is not None:
        return True
    return any(
        minute_exists(zone, day, m)
        for w in policy.windows
        for m in range(w.start_minute, w.end_minute)
    )


def full_grid(policy: SendingPolicy, day: date) -> list[datetime]:
    """The slot grid of a day without transitions: per_day slots evenly over the windows."""
    offset = day_offset(policy.zone, day)
    assert offset is not None
    total = sum(w.minutes for w in policy.windows) * 60_000
    midnight = datetime.combine(day, time(0), tzinfo=UTC) - offset
    grid = []
    for j in range(policy.per_day):
        x = j * total // policy.per_day
        for w in policy.windows:
            if x < w.minutes * 60_000:
                grid.append(midnight + timedelta(milliseconds=w.start_minute * 60_000 + x))
                break
            x -= w.minutes * 60_000
    return grid


def by_local_day(sends: Sequence[datetime], zone: ZoneInfo) -> dict[date, list[datetime]]:
    days: dict[date, list[datetime]] = defaultdict(list)
    for s in sends:
        days[s.astimezone(zone).date()].append(s)
    return days


def effective_start(policy: SendingPolicy) -> datetime:
    assert policy.start is not None
    return policy.start.astimezone(UTC)


# -- properties ---------------------------------------------------------------------------------

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(policy=policies(), count=st.integers(0, 250))
def test_every_send_obeys_the_policy(policy: SendingPolicy, count: int) -> None:
    sends = plan(policy, count)
    zone = policy.zone
    start = effective_start(policy)
    assert len(sends) == count
    for s in sends:
        assert s.tzinfo is UTC
        assert s >= start
        assert s.microsecond % 1000 == 0
        local = s.astimezone(zone)
        assert wall_exists(zone, local)
        assert in_window(policy, local), (s, local)
        assert local.weekday() in policy.weekdays
        assert local.date() not in policy.skip_dates
    # strictly increasing, jitter or not (jitter is clamped between neighbours)
    assert all(a < b for a, b in itertools.pairwise(sends))
    per_day = Counter(s.astimezone(zone).date() for s in sends)
    assert all(n <= policy.per_day for n in per_day.values())


@SETTINGS
@given(policy=policies(jitter=False), count=st.integers(1, 250))
def test_days_are_filled_in_order_on_an_even_grid(policy: SendingPolicy, count: int) -> None:
    sends = plan(policy, count)
    zone = policy.zone
    start = effective_start(policy)
    first_day = start.astimezone(zone).date()
    days = by_local_day(sends, zone)
    last_day = max(days)
    day = first_day + timedelta(days=1)
    # every sending day after the start's day and before the last one is full; others empty
    while day < last_day:
        expected = policy.per_day if eligible(policy, day) else 0
        assert len(days.get(day, [])) == expected, day
        day += timedelta(days=1)
    # on days without a DST transition the sends are exactly the even grid over the windows,
    # only from the start on (a partial first day), and cut by count on the last day
    for day, got in days.items():
        if day_offset(zone, day) is None:
            continue
        grid = [g for g in full_grid(policy, day) if g >= start]
        assert got == grid[: len(got)], day
        if day != last_day:
            assert len(got) == len(grid)


@SETTINGS
@given(policy=policies(), count=st.integers(1, 200), data=st.data())
def test_same_seed_same_plan_and_plans_are_prefixes(
    policy: SendingPolicy, count: int, data: st.DataObject
) -> None:
    sends = plan(policy, count)
    assert plan(policy, count) == sends
    k = data.draw(st.integers(0, count))
    assert plan(policy, k) == sends[:k]


@SETTINGS
@given(policy=policies(), count=st.integers(1, 200))
def test_jitter_moves_within_bounds_and_keeps_day_and_order(
    policy: SendingPolicy, count: int
) -> None:
    jittered = plan(policy, count)
    steady = plan(dataclasses.replace(policy, jitter_seconds=0), count)
    zone = policy.zone
    bound = timedelta(seconds=policy.jitter_seconds)
    for a, b in zip(jittered, steady, strict=True):
        assert abs(a - b) <= bound
        assert a.astimezone(zone).date() == b.astimezone(zone).date()
    if policy.jitter_seconds >= 60 and count >= 20:
        # with a minute or more of jitter some send does move (clamping cannot pin all of them)
        moved = sum(a != b for a, b in zip(jittered, steady, strict=True))
        assert moved > 0 or policy.per_day * 60 >= 86_400


@settings(max_examples=100, deadline=None)
@given(policy=policies(jitter=False), shift=st.integers(-3 * 86_400, 3 * 86_400))
def test_the_later_of_start_and_now_wins(policy: SendingPolicy, shift: int) -> None:
    start = effective_start(policy)
    now = start + timedelta(seconds=shift)
    later = max(start, now)
    assert plan(policy, 30, now=now) == plan(dataclasses.replace(policy, start=later), 30)
    assert plan(dataclasses.replace(policy, start=None), 30, now=now) == plan(
        dataclasses.replace(policy, start=now), 30
    )


@settings(max_examples=200, deadline=None)
@given(policy=policies(), count=st.integers(0, 120))
def test_per_day_summary_agrees_with_the_plan(policy: SendingPolicy, count: int) -> None:
    sends = plan(policy, count)
    summary = per_day_summary(sends, policy.timezone)
    zone = policy.zone
    assert sum(d.count for d in summary) == count
    assert [d.day for d in summary] == sorted({s.astimezone(zone).date() for s in sends})
    for d in summary:
        assert d.count <= policy.per_day
        assert d.first.tzinfo == zone
        assert d.first.date() == d.last.date() == d.day
        # compared as instants: same-zone comparison would use wall time, wrong in a fold
        assert d.first.astimezone(UTC) <= d.last.astimezone(UTC)


# -- exact examples -----------------------------------------------------------------------------


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


def policy_for(
    tz: str, per_day: int, windows: Sequence[str], start: datetime, **kw: object
) -> SendingPolicy:
    return SendingPolicy(
        timezone=tz,
        per_day=per_day,
        weekdays=kw.pop("weekdays", EVERY_DAY),  # type: ignore[arg-type]
        windows=tuple(parse_window(w) for w in windows),
        start=start,
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("tz", "per_day", "windows", "start", "expected"),
    [
        pytest.param(
            "Europe/Berlin", 5, ["00:00-06:00"], datetime(2026, 3, 29),
            [utc(2026, 3, 28, 23), utc(2026, 3, 29, 0), utc(2026, 3, 29, 1), utc(2026, 3, 29, 2),
             utc(2026, 3, 29, 3)],
            id="berlin-spring-forward-gap-skipped",
        ),
        pytest.param(
            "Europe/Berlin", 7, ["00:00-06:00"], datetime(2026, 10, 25),
            [utc(2026, 10, 24, 22), utc(2026, 10, 24, 23), utc(2026, 10, 25, 0),
             utc(2026, 10, 25, 1), utc(2026, 10, 25, 2), utc(2026, 10, 25, 3),
             utc(2026, 10, 25, 4)],
            id="berlin-fall-back-repeated-hour-used",
        ),
        pytest.param(
            "Europe/Berlin", 2, ["02:30-04:30"], datetime(2026, 3, 29),
            [utc(2026, 3, 29, 1), utc(2026, 3, 29, 1, 45)],
            id="berlin-window-starting-in-the-gap-starts-when-it-ends",
        ),
        pytest.param(
            # wall 02:30-03:30 happens as 02:30-03:00 CEST and 02:30-03:30 CET: 1.5 real hours
            "Europe/Berlin", 3, ["02:30-03:30"], datetime(2026, 10, 25),
            [utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 1, 30), utc(2026, 10, 25, 2)],
            id="berlin-window-boundary-inside-the-repeated-hour",
        ),
        pytest.param(
            # ends where the repeated hour begins: only the first pass up to 02:00 CEST counts
            "Europe/Berlin", 4, ["00:00-02:00"], datetime(2026, 10, 25),
            [utc(2026, 10, 24, 22), utc(2026, 10, 24, 22, 30), utc(2026, 10, 24, 23),
             utc(2026, 10, 24, 23, 30)],
            id="berlin-window-ending-at-the-repeated-hour",
        ),
        pytest.param(
            "America/New_York", 2, ["01:00-04:00"], datetime(2026, 3, 8),
            [utc(2026, 3, 8, 6), utc(2026, 3, 8, 7)],
            id="new-york-spring-forward",
        ),
        pytest.param(
            "America/New_York", 3, ["00:30-02:00"], datetime(2026, 11, 1),
            # 00:30 EDT .. 02:00 EST is 2.5 real hours
            [utc(2026, 11, 1, 4, 30), utc(2026, 11, 1, 5, 20), utc(2026, 11, 1, 6, 10)],
            id="new-york-fall-back",
        ),
        pytest.param(
            # 30-minute DST: 02:00 becomes 02:30 on 2026-10-04
            "Australia/Lord_Howe", 5, ["01:00-04:00"], datetime(2026, 10, 4),
            [utc(2026, 10, 3, 14, 30), utc(2026, 10, 3, 15), utc(2026, 10, 3, 15, 30),
             utc(2026, 10, 3, 16), utc(2026, 10, 3, 16, 30)],
            id="lord-howe-half-hour-gap",
        ),
        pytest.param(
            # 02:00 becomes 01:30 on 2026-04-05: 01:30-02:00 happens twice
            "Australia/Lord_Howe", 5, ["01:00-03:00"], datetime(2026, 4, 5),
            [utc(2026, 4, 4, 14), utc(2026, 4, 4, 14, 30), utc(2026, 4, 4, 15),
             utc(2026, 4, 4, 15, 30), utc(2026, 4, 4, 16)],
            id="lord-howe-half-hour-repeat",
        ),
        pytest.param(
            "Asia/Kathmandu", 2, ["09:00-17:00"], datetime(2026, 6, 1),
            [utc(2026, 6, 1, 3, 15), utc(2026, 6, 1, 7, 15)],
            id="kathmandu-quarter-hour-offset",
        ),
        pytest.param(
            # 1994-12-31 does not exist there: the day after the 30th is 1995-01-01
            "Pacific/Kiritimati", 1, ["09:00-17:00"], datetime(1994, 12, 30),
            [utc(1994, 12, 30, 19), utc(1994, 12, 31, 19), utc(1995, 1, 1, 19)],
            id="kiritimati-skipped-day",
        ),
        pytest.param(
            # spread over both windows, not bunched: 7 real hours, slots 3.5 h apart
            "Europe/Berlin", 2, ["09:00-12:00", "13:00-17:00"], datetime(2026, 6, 1),
            [utc(2026, 6, 1, 7), utc(2026, 6, 1, 11, 30), utc(2026, 6, 2, 7),
             utc(2026, 6, 2, 11, 30)],
            id="spread-over-two-windows",
        ),
        pytest.param(
            # 8 h / 7 is not a whole number of ms: slot j at floor(j * 28,800,000 / 7) ms
            "UTC", 7, ["09:00-17:00"], datetime(2026, 6, 1),
            [utc(2026, 6, 1, 9) + timedelta(milliseconds=j * 28_800_000 // 7) for j in range(7)],
            id="millisecond-floor",
        ),
    ],
)  # fmt: skip
def test_exact_instants(
    tz: str, per_day: int, windows: list[str], start: datetime, expected: list[datetime]
) -> None:
    policy = policy_for(tz, per_day, windows, start)
    sends = plan(policy, len(expected))
    assert sends == expected
    zone = ZoneInfo(tz)
    assert all(in_window(policy, s.astimezone(zone)) for s in sends)


def test_partial_first_day_gets_only_the_slots_after_the_start() -> None:
    # 8 a day in 09-17 is one an hour; starting 12:30 on Monday leaves 13:00..16:00
    policy = policy_for("Europe/Berlin", 8, ["09:00-17:00"], datetime(2026, 6, 1, 12, 30))
    local = [s.astimezone(policy.zone) for s in plan(policy, 6)]
    assert [(d.day, d.hour) for d in local] == [(1, 13), (1, 14), (1, 15), (1, 16), (2, 9), (2, 10)]


def test_start_after_the_windows_moves_to_the_next_allowed_day() -> None:
    # Friday 2026-06-05 after 17:00, Mon-Fri, Monday the 8th is a skip date
    policy = SendingPolicy(
        timezone="America/New_York",
        per_day=2,
        start=datetime(2026, 6, 5, 17, 0),
        skip_dates=frozenset({date(2026, 6, 8)}),
    )
    local = [s.astimezone(policy.zone) for s in plan(policy, 3)]
    assert [(d.date(), d.hour) for d in local] == [
        (date(2026, 6, 9), 9),
        (date(2026, 6, 9), 13),
        (date(2026, 6, 10), 9),
    ]


def test_ten_thousand_in_one_minute_are_6_ms_apart_and_distinct() -> None:
    policy = policy_for("UTC", 10_000, ["12:00-12:01"], datetime(2026, 6, 1))
    sends = plan(policy, 10_001)
    assert sends[1] - sends[0] == timedelta(milliseconds=6)
    assert len(set(sends)) == 10_001
    assert sends[9_999] < utc(2026, 6, 1, 12, 1) <= sends[10_000] == utc(2026, 6, 2, 12)


def test_jitter_is_deterministic_per_seed_and_differs_between_seeds() -> None:
    base = policy_for(
        "Europe/Berlin", 20, ["09:00-17:00"], datetime(2026, 6, 1), jitter_seconds=600
    )
    a = plan(base, 100)
    assert a == plan(base, 100)
    assert a != plan(dataclasses.replace(base, seed=1), 100)
    assert a != plan(dataclasses.replace(base, jitter_seconds=0), 100)


def test_jitter_never_passes_the_start_or_the_window_edge() -> None:
    # jitter far larger than the spacing: every send is clamped, order is kept
    policy = policy_for(
        "Europe/Berlin", 50, ["09:00-09:10"], datetime(2026, 6, 1, 9, 3), jitter_seconds=86_400
    )
    sends = plan(policy, 60)
    local = [s.astimezone(policy.zone) for s in sends]
    assert all(a < b for a, b in itertools.pairwise(sends))
    assert all(in_window(policy, d) for d in local)
    assert sends[0] >= policy.start  # type: ignore[operator]


def test_now_or_start_is_required() -> None:
    with pytest.raises(InvalidField) as err:
        plan(SendingPolicy(), 3)
    assert err.value.field == "start"


def test_naive_now_is_refused() -> None:
    with pytest.raises(InvalidField) as err:
        plan(SendingPolicy(), 3, now=datetime(2026, 6, 1))
    assert err.value.field == "now"


@pytest.mark.parametrize("count", [-1, 2.0, "3", True, None])
def test_bad_count_is_refused(count: object) -> None:
    with pytest.raises(InvalidField) as err:
        plan(SendingPolicy(start=datetime(2026, 6, 1)), count)  # type: ignore[arg-type]
    assert err.value.field == "count"


def test_count_zero_is_an_empty_plan() -> None:
    assert plan(SendingPolicy(start=datetime(2026, 6, 1)), 0) == []


def test_a_plan_past_the_year_9999_is_refused_by_count() -> None:
    policy = SendingPolicy(per_day=1, start=datetime(9999, 12, 1))
    with pytest.raises(InvalidField) as err:
        plan(policy, 100)
    assert err.value.field == "count"


def _mondays(first: date, last: date) -> frozenset[date]:
    days = (first + timedelta(days=n) for n in range((last - first).days + 1))
    return frozenset(d for d in days if d.weekday() == 0)


def test_no_sending_day_when_every_allowed_day_is_skipped() -> None:
    policy = SendingPolicy(
        timezone="UTC",
        weekdays=frozenset({0}),
        start=datetime(2026, 1, 1),
        skip_dates=_mondays(date(2026, 1, 1), date(2028, 12, 31)),
    )
    with pytest.raises(NoSendingDay, match="skip date") as err:
        plan(policy, 1)
    assert "mon" in str(err.value)
    assert "731 days" in str(err.value)


def test_the_horizon_is_731_days() -> None:
    start = date(2026, 1, 1)
    blocked = frozenset(start + timedelta(days=n) for n in range(PLANNING_HORIZON_DAYS - 1))
    policy = policy_for("UTC", 1, ["09:00-17:00"], datetime(2026, 1, 1), skip_dates=blocked)
    # the 731st day, 2028-01-01, is the first one not skipped
    assert plan(policy, 1) == [utc(2028, 1, 1, 9)]
    one_more = blocked | {start + timedelta(days=PLANNING_HORIZON_DAYS - 1)}
    with pytest.raises(NoSendingDay):
        plan(dataclasses.replace(policy, skip_dates=one_more), 1)


def test_no_sending_day_names_days_without_window_time() -> None:
    # In Kiritimati the only unskipped Saturday, 1994-12-31, never happened.
    saturdays = frozenset(date(1994, 12, 24) + timedelta(weeks=n) for n in range(120)) - {
        date(1994, 12, 31)
    }
    policy = policy_for(
        "Pacific/Kiritimati",
        5,
        ["09:00-17:00"],
        datetime(1994, 12, 24),
        weekdays=frozenset({5}),
        skip_dates=saturdays,
    )
    with pytest.raises(NoSendingDay, match="no window time"):
        plan(policy, 1)


def test_per_day_summary_orders_the_repeated_hour_by_instant() -> None:
    # 02:45 CEST happens before 02:15 CET on 2026-10-25
    sends = [utc(2026, 10, 25, 1, 15), utc(2026, 10, 25, 0, 45), utc(2026, 10, 26, 8)]
    summary = per_day_summary(sends, "Europe/Berlin")
    berlin = ZoneInfo("Europe/Berlin")
    assert summary == [
        DaySummary(
            date(2026, 10, 25),
            2,
            utc(2026, 10, 25, 0, 45).astimezone(berlin),
            utc(2026, 10, 25, 1, 15).astimezone(berlin),
        ),
        DaySummary(
            date(2026, 10, 26),
            1,
            utc(2026, 10, 26, 8).astimezone(berlin),
            utc(2026, 10, 26, 8).astimezone(berlin),
        ),
    ]
    assert summary[0].first.isoformat() == "2026-10-25T02:45:00+02:00"
    assert summary[0].last.isoformat() == "2026-10-25T02:15:00+01:00"


def test_per_day_summary_refuses_naive_times_and_unknown_zones() -> None:
    with pytest.raises(InvalidField) as err:
        per_day_summary([datetime(2026, 1, 1)], "UTC")
    assert err.value.field == "sends"
    with pytest.raises(InvalidField) as err:
        per_day_summary([], "Mars/Olympus")
    assert err.value.field == "timezone"
    assert per_day_summary([], "UTC") == []
