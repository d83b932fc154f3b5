"""free_slots and in_policy: moved sends keep the policy, the daily cap and the spacing."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sendqueue.domain.errors import InvalidField, NoSendingDay
from sendqueue.domain.planner import plan
from sendqueue.domain.policy import SendingPolicy, Window
from sendqueue.domain.slots import free_slots, in_policy, nominal_spacing

ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"]


@st.composite
def policies(draw: st.DrawFn) -> SendingPolicy:
    starts = sorted(draw(st.sets(st.integers(0, 1439), min_size=1, max_size=4)))
    windows: list[Window] = []
    for i in range(0, len(starts) - 1, 2):
        windows.append(Window(starts[i], starts[i + 1]))
    if not windows:
        windows.append(Window(starts[0], draw(st.integers(starts[0] + 1, 1440))))
    return SendingPolicy(
        timezone=draw(st.sampled_from(ZONES)),
        per_day=draw(st.integers(1, 60)),
        weekdays=frozenset(draw(st.sets(st.integers(0, 6), min_size=1))),
        windows=tuple(windows),
        jitter_seconds=draw(st.sampled_from([0, 0, 30, 600])),
        seed=draw(st.integers(0, 5)),
    )


instants = st.datetimes(
    min_value=datetime(2026, 3, 1), max_value=datetime(2026, 11, 30), timezones=st.just(UTC)
)


@settings(max_examples=300, deadline=None)
@given(
    policy=policies(),
    now=instants,
    count=st.integers(1, 40),
    booked_offsets=st.lists(st.integers(-2 * 86_400, 6 * 86_400), max_size=30),
    extra_counts=st.integers(0, 3),
)
def test_free_slots_keep_the_cap_the_windows_and_the_spacing(
    policy: SendingPolicy,
    now: datetime,
    count: int,
    booked_offsets: list[int],
    extra_counts: int,
) -> None:
    zone = policy.zone
    booked = [now + timedelta(seconds=s) for s in booked_offsets]
    per_day: Counter[date] = Counter(b.astimezone(zone).date() for b in booked)
    for day in list(per_day):
        per_day[day] += extra_counts  # sends counted on a day without an instant to avoid

    slots = free_slots(policy, count, now=now, booked_per_day=per_day, booked=booked)

    assert len(slots) == count
    assert slots == sorted(set(slots))  # strictly increasing
    assert all(s >= now for s in slots)
    assert all(s.tzinfo is UTC and s.microsecond % 1000 == 0 for s in slots)
    half = nominal_spacing(policy) / 2
    for a, b in itertools.pairwise(slots):
        assert b - a >= half
    for s in slots:
        assert in_policy(policy, s)
        assert all(abs(s - b) >= half for b in booked)
    taken: Counter[date] = Counter(s.astimezone(zone).date() for s in slots)
    for day, n in taken.items():
        assert per_day.get(day, 0) + n <= policy.per_day
    # deterministic
    assert free_slots(policy, count, now=now, booked_per_day=per_day, booked=booked) == slots


@settings(max_examples=100, deadline=None)
@given(policy=policies(), now=instants, count=st.integers(1, 30))
def test_with_nothing_booked_the_slots_are_the_plain_grid(
    policy: SendingPolicy, now: datetime, count: int
) -> None:
    # UTC: no DST change makes a day's grid denser than the nominal spacing (see slots.py)
    policy = replace(policy, timezone="UTC")
    slots = free_slots(policy, count, now=now, booked_per_day={}, booked=[])
    grid = plan(replace(policy, jitter_seconds=0), count, now=now)
    assert slots == grid


BERLIN_HOUR = SendingPolicy(
    timezone="Europe/Berlin", per_day=12, weekdays=frozenset(range(7)),
    windows=(Window(16 * 60, 17 * 60),),
)  # fmt: skip


def berlin(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=BERLIN_HOUR.zone).astimezone(UTC)


def test_the_issue_outage_moves_the_two_late_sends_to_the_next_window_within_the_cap() -> None:
    # 16:00-17:00, 12 a day (every 5 minutes); ten went out, the worker was down 16:48-17:48.
    sent = [berlin(f"2026-12-01T16:{m:02d}") for m in range(0, 50, 5)]
    slots = free_slots(
        BERLIN_HOUR,
        2 + 12,  # the two overdue ones and the next day's twelve
        now=berlin("2026-12-01T17:48"),
        booked_per_day={date(2026, 12, 1): 10},
        booked=sent,
    )
    local = [s.astimezone(BERLIN_HOUR.zone) for s in slots]
    assert [t.strftime("%d %H:%M") for t in local[:13]] == [
        f"02 16:{m:02d}" for m in range(0, 60, 5)
    ] + ["03 16:00"]
    assert Counter(t.date() for t in local)[date(2026, 12, 2)] == 12


def test_a_booked_slot_is_skipped_and_a_full_day_is_passed_over() -> None:
    now = berlin("2026-12-01T16:00")
    slots = free_slots(
        BERLIN_HOUR, 2, now=now, booked_per_day={date(2026, 12, 1): 11}, booked=[now]
    )
    # one left today, not at 16:00 (booked) but the next slot; then tomorrow
    assert slots == [berlin("2026-12-01T16:05"), berlin("2026-12-02T16:00")]
    full = free_slots(BERLIN_HOUR, 1, now=now, booked_per_day={date(2026, 12, 1): 12}, booked=[])
    assert full == [berlin("2026-12-02T16:00")]


def test_no_sending_day_and_bad_arguments() -> None:
    never = SendingPolicy(
        timezone="UTC", weekdays=frozenset({0}), skip_dates=frozenset(
            date(2026, 12, 7) + timedelta(weeks=w) for w in range(120)
        ),
    )  # fmt: skip
    with pytest.raises(NoSendingDay):
        free_slots(never, 1, now=datetime(2026, 12, 1, tzinfo=UTC), booked_per_day={}, booked=[])
    with pytest.raises(InvalidField, match="count"):
        free_slots(BERLIN_HOUR, -1, now=datetime(2026, 12, 1, tzinfo=UTC), booked_per_day={},
                   booked=[])  # fmt: skip
    with pytest.raises(InvalidField, match="now"):
        free_slots(BERLIN_HOUR, 1, now=datetime(2026, 12, 1), booked_per_day={}, booked=[])
    assert free_slots(BERLIN_HOUR, 0, now=datetime(2026, 12, 1, tzinfo=UTC),
                      booked_per_day={}, booked=[]) == []  # fmt: skip


def test_in_policy_allows_the_layers_precision_and_clock_skew() -> None:
    assert in_policy(BERLIN_HOUR, berlin("2026-12-01T16:30"))
    assert not in_policy(BERLIN_HOUR, berlin("2026-12-01T17:00"))  # the end is exclusive
    assert not in_policy(BERLIN_HOUR, berlin("2026-12-01T17:00:30"))
    assert in_policy(BERLIN_HOUR, berlin("2026-12-01T17:00:30"), late=timedelta(seconds=60))
    assert not in_policy(BERLIN_HOUR, berlin("2026-12-01T15:59:59"))
    assert in_policy(BERLIN_HOUR, berlin("2026-12-01T15:59:59"), early=timedelta(seconds=1))
    weekdays = SendingPolicy(timezone="Europe/Berlin", weekdays=frozenset(range(5)))
    assert not in_policy(weekdays, berlin("2026-12-05T10:00"))  # a Saturday
    skip = SendingPolicy(timezone="Europe/Berlin", skip_dates=frozenset({date(2026, 12, 24)}))
    assert not in_policy(skip, berlin("2026-12-24T10:00"))
    assert in_policy(skip, berlin("2026-12-23T10:00"))


def _window_bounds(policy: SendingPolicy, day: date) -> list[tuple[datetime, datetime]]:
    """The UTC ``[open, close)`` of each window on local ``day``; a window a DST change moves
    (a bound in a gap or a fold) is left out: not this property's subject."""
    zone = policy.zone
    midnight = datetime(day.year, day.month, day.day)
    out = []
    for w in policy.windows:
        walls = [midnight + timedelta(minutes=m) for m in (w.start_minute, w.end_minute)]
        opens, closes = (wall.replace(tzinfo=zone).astimezone(UTC) for wall in walls)
        exact = all(
            at.astimezone(zone).replace(tzinfo=None) == wall
            and at == wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
            for at, wall in ((opens, walls[0]), (closes, walls[1]))
            if wall.day == day.day  # 24:00 is the next midnight
        )
        if exact and closes - opens == walls[1] - walls[0]:
            out.append((opens, closes))
    return out


@settings(max_examples=300, deadline=None)
@given(
    policy=policies(),
    day=st.dates(min_value=date(2026, 1, 5), max_value=date(2026, 12, 20)),
    fraction=st.floats(0, 1, exclude_max=True),
    microseconds=st.integers(0, 999_999),
    late=st.sampled_from([0, 1, 60]),
    early=st.sampled_from([0, 1]),
    outside=st.floats(0.001, 3600),
)
def test_in_policy_of_any_instant_inside_or_outside_a_window(
    policy: SendingPolicy,
    day: date,
    fraction: float,
    microseconds: int,
    late: int,
    early: int,
    outside: float,
) -> None:
    """Any instant inside a window (whatever its microseconds) is in the policy; one outside
    every window by more than ``late`` (after) or ``early`` (before) is not."""
    sending = day.weekday() in policy.weekdays and day not in policy.skip_dates
    tolerance = {"late": timedelta(seconds=late), "early": timedelta(seconds=early)}
    for opens, closes in _window_bounds(policy, day):
        span = (closes - opens).total_seconds()
        inside = opens + timedelta(seconds=int(span * fraction), microseconds=microseconds)
        if inside >= closes:
            inside = closes - timedelta(microseconds=1)
        assert in_policy(policy, inside, **tolerance) is sending, inside
        after = closes + timedelta(seconds=late + outside)
        before = opens - timedelta(seconds=early + outside)
        for at in (after, before):
            if not any(o <= at + timedelta(seconds=early) and at - timedelta(seconds=late) < c
                       for d in (day - timedelta(days=1), day, day + timedelta(days=1))
                       for o, c in _window_bounds(policy, d)):  # fmt: skip
                assert not in_policy(policy, at, **tolerance), at
