"""Capacity-aware planning: across campaigns, a sender's day never holds more than its cap,
its sends keep its gap, and each campaign still keeps its policy, read in each recipient's own
zone (issue 13)."""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sendqueue.domain.capacity import (
    SenderBook,
    assign_senders,
    plan_with_senders,
    slot_index,
    slot_start,
)
from sendqueue.domain.errors import InvalidField, NoSendingDay
from sendqueue.domain.policy import SendingPolicy, Window
from sendqueue.domain.senders import Sender
from sendqueue.domain.slots import in_policy, nominal_spacing

# Zones with DST changes (Berlin, New York, Lord Howe's half hour, Chatham's 12:45 offset) and
# an odd offset without one (Kolkata).
ZONES = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "Asia/Kolkata",
    "Pacific/Chatham",
]
# Around the changes of 2026: Europe 29 Mar and 25 Oct, North America 8 Mar and 1 Nov, Lord
# Howe and Chatham 5 Apr (back) and 27 Sep / 4 Oct (forward).
instants = st.sampled_from(
    [
        datetime(2026, 3, 6, 7, tzinfo=UTC),
        datetime(2026, 3, 27, 12, tzinfo=UTC),
        datetime(2026, 4, 3, 10, 30, tzinfo=UTC),
        datetime(2026, 9, 25, 18, tzinfo=UTC),
        datetime(2026, 10, 2, 9, tzinfo=UTC),
        datetime(2026, 10, 23, 20, tzinfo=UTC),
        datetime(2026, 10, 30, 1, tzinfo=UTC),
        datetime(2026, 12, 2, 9, 17, 3, tzinfo=UTC),
    ]
)


@st.composite
def policies(draw: st.DrawFn, now: datetime | None = None) -> SendingPolicy:
    start = draw(st.integers(0, 22 * 60))
    end = draw(st.integers(start + 30, 1440))
    windows = [Window(start, end)]
    if end <= 1380 and draw(st.booleans()):  # a second window later that day
        later = draw(st.integers(end, 1410))
        windows.append(Window(later, draw(st.integers(later + 30, 1440))))
    skips: frozenset[date] = frozenset()
    begin = None
    if now is not None:
        skips = frozenset(
            now.date() + timedelta(days=d) for d in draw(st.sets(st.integers(0, 9), max_size=3))
        )
        if draw(st.booleans()):
            begin = now + timedelta(minutes=draw(st.integers(0, 3 * 1440)))
    return SendingPolicy(
        timezone=draw(st.sampled_from(ZONES)),
        per_day=draw(st.integers(1, 40)),
        weekdays=frozenset(draw(st.sets(st.integers(0, 6), min_size=1))),
        windows=tuple(windows),
        start=begin,
        skip_dates=skips,
        jitter_seconds=draw(st.sampled_from([0, 0, 120])),
    )


@st.composite
def senders(draw: st.DrawFn, n: int) -> list[Sender]:
    out = []
    for i in range(n):
        cap = draw(st.integers(1, 25))
        ramp = draw(st.booleans())
        out.append(
            Sender(
                id=f"s{i}",
                email=f"box{i}@example.com",
                daily_cap=cap,
                min_gap_seconds=draw(st.sampled_from([1, 60, 90, 600])),  # a window holds one
                timezone=draw(st.sampled_from(ZONES)),
                warmup_start=draw(st.integers(1, cap)) if ramp else None,
                warmup_step=draw(st.integers(1, cap)) if ramp else None,
                warmup_from=date(2026, 3, 1) if ramp else None,
            )
        )
    return out


def _existing(book: SenderBook, now: datetime, offsets: list[int]) -> list[datetime]:
    """Bookings some other campaign already holds (slot starts, within the cap)."""
    held = []
    for seconds in offsets:
        at = slot_start(slot_index(now, book.sender.min_gap_seconds), book.sender.min_gap_seconds)
        at += timedelta(seconds=seconds * book.sender.min_gap_seconds)
        if book.has_room(at, book.day_of(at)):
            book.add(at)
            held.append(at)
    return held


def check_plan(
    policy: SendingPolicy,
    planned: list[datetime],
    assigned: list[str | None],
    zones: list[str | None] | None,
    *,
    now: datetime,
    per_day: Counter[date],
) -> None:
    """What every plan keeps, whatever its senders: the policy, read in each recipient's zone;
    the campaign's ``per_day`` (counting ``per_day``, updated) per day of its own zone; and,
    per zone and sender, the recipients' order."""
    assert len(planned) == len(assigned)
    assert all(at.tzinfo is UTC for at in planned)
    first = max(now, policy.start) if policy.start else now
    names = zones or [None] * len(planned)
    for at, zone in zip(planned, names, strict=True):
        assert at >= first
        assert in_policy(replace(policy, timezone=zone or policy.timezone), at), (at, zone)
    per_day.update(at.astimezone(policy.zone).date() for at in planned)
    assert max(per_day.values()) <= policy.per_day
    lanes: dict[tuple[str | None, str | None], list[datetime]] = defaultdict(list)
    for at, sender_id, zone in zip(planned, assigned, names, strict=True):
        lanes[zone, sender_id].append(at)
    for sends in lanes.values():
        assert sends == sorted(sends)
        assert len(set(sends)) == len(sends)


def check_books(
    pool: list[Sender], books: dict[str, SenderBook], sends: dict[str, list[datetime]]
) -> None:
    """Every sender's day within its cap and its sends a gap apart, books included, and the
    books holding exactly what was booked and planned."""
    for sender in pool:
        mine = sorted(sends[sender.id])
        days = Counter(at.astimezone(sender.zone).date() for at in mine)
        # the ramp counts the days that held a booking, those moved off by a re-plan too
        sending = books[sender.id].sending
        for day, n in days.items():
            assert n <= sender.cap_on(day, sending), (sender, day, n)
        for a, b in itertools.pairwise(mine):
            assert (b - a).total_seconds() >= sender.min_gap_seconds, (sender, a, b)
        gap = sender.min_gap_seconds
        assert all(at == slot_start(slot_index(at, gap), gap) for at in mine)
        book = books[sender.id]
        assert book.per_day == dict(days)
        assert set(days) <= set(book.sending), (sender, book.sending)
        assert set(book.slots) == {slot_index(at, gap) * gap * 1000 for at in mine}


@settings(max_examples=250, deadline=None)
@given(
    data=st.data(),
    n_senders=st.integers(1, 4),
    n_campaigns=st.integers(1, 3),
    now=instants,
    existing=st.lists(st.integers(0, 3000), max_size=20),
)
def test_caps_gaps_and_policies_hold_across_campaigns(
    data: st.DataObject, n_senders: int, n_campaigns: int, now: datetime, existing: list[int]
) -> None:
    """For any set of campaigns planned one after another over the same books (each updating
    them), with bookings already there, recipients in several zones and some without a
    sender: every rule holds."""
    pool = data.draw(senders(n_senders))
    books = {s.id: SenderBook(s) for s in pool}
    sends: dict[str, list[datetime]] = defaultdict(list)
    for book in books.values():
        sends[book.sender.id].extend(_existing(book, now, existing))
    for _ in range(n_campaigns):
        policy = data.draw(policies(now))
        count = data.draw(st.integers(1, 40))
        used = data.draw(st.lists(st.sampled_from([s.id for s in pool]), min_size=1, unique=True))
        addresses = [f"r{data.draw(st.integers(0, 30))}@example.com" for _ in range(count)]
        assigned: list[str | None] = list(assign_senders(addresses, used, {}))
        if data.draw(st.booleans()):  # some recipients go out from the campaign's own From
            assigned = [None if data.draw(st.booleans()) else s for s in assigned]
        zones = None
        if data.draw(st.booleans()):  # a local-time campaign
            zones = [data.draw(st.sampled_from([None, *ZONES])) for _ in range(count)]
        booked_days = data.draw(st.integers(0, policy.per_day - 1))
        before = Counter(
            {(max(now, policy.start or now)).astimezone(policy.zone).date(): booked_days}
        )
        planned = plan_with_senders(
            policy, assigned, books, now=now, zones=zones, campaign_per_day=dict(before)
        )
        check_plan(policy, planned, assigned, zones, now=now, per_day=before)
        for sender_id, at in zip(assigned, planned, strict=True):
            if sender_id is not None:
                sends[sender_id].append(at)
        # one address, one sender
        pairs = {
            (a, s) for a, s in zip(addresses, assign_senders(addresses, used, {}), strict=True)
        }
        assert len(pairs) == len(set(addresses))
    check_books(pool, books, sends)


@settings(max_examples=100, deadline=None)
@given(policy=policies(), now=instants, count=st.integers(1, 120), data=st.data())
def test_recipients_without_a_sender_get_the_plain_plan(
    policy: SendingPolicy, now: datetime, count: int, data: st.DataObject
) -> None:
    """No sender: no cap, no gap. One zone: exactly plan()'s grid (without jitter), so the
    spread is plan()'s; several zones: each zone's sends on that zone's grid, in order."""
    from sendqueue.domain.planner import plan

    grid = replace(policy, jitter_seconds=0)
    assert plan_with_senders(policy, [None] * count, {}, now=now) == plan(grid, count, now=now)
    zones = [data.draw(st.sampled_from(ZONES[:4])) for _ in range(count)]
    planned = plan_with_senders(policy, [None] * count, {}, now=now, zones=list(zones))
    check_plan(policy, planned, [None] * count, list(zones), now=now, per_day=Counter())
    for zone in set(zones):
        mine = [at for at, z in zip(planned, zones, strict=True) if z == zone]
        own = set(plan(replace(grid, timezone=zone), len(mine) + 400, now=now))
        assert set(mine) <= own


@settings(max_examples=100, deadline=None)
@given(data=st.data(), now=instants, count=st.integers(1, 30))
def test_a_re_plan_keeps_half_the_spacing_from_the_campaigns_own_sends(
    data: st.DataObject, now: datetime, count: int
) -> None:
    pool = data.draw(senders(2))
    policy = data.draw(policies())
    books = {s.id: SenderBook(s) for s in pool}
    fixed = plan_with_senders(policy, ["s0"] * data.draw(st.integers(1, 10)), books, now=now)
    per_day = Counter(at.astimezone(policy.zone).date() for at in fixed)
    assigned: list[str | None] = [
        data.draw(st.sampled_from(["s0", "s1", None])) for _ in range(count)
    ]
    planned = plan_with_senders(
        policy,
        assigned,
        books,
        now=now,
        campaign_per_day=dict(per_day),
        campaign_booked=fixed,
    )
    half = nominal_spacing(policy) / 2
    assert all(abs(at - b) >= half for at in planned for b in fixed)
    check_plan(policy, planned, assigned, None, now=now, per_day=per_day)


# The days of 2026 with an offset change in one of ZONES, from just before it.
DST_DAYS = st.sampled_from(
    [
        datetime(2026, 3, 7, 22, tzinfo=UTC),  # New York springs forward on 8 Mar
        datetime(2026, 3, 28, 20, tzinfo=UTC),  # Berlin, 29 Mar
        datetime(2026, 4, 4, 10, tzinfo=UTC),  # Lord Howe and Chatham fall back, 5 Apr
        datetime(2026, 9, 26, 10, tzinfo=UTC),  # Chatham springs forward, 27 Sep
        datetime(2026, 10, 3, 10, tzinfo=UTC),  # Lord Howe, 4 Oct (half an hour)
        datetime(2026, 10, 24, 20, tzinfo=UTC),  # Berlin falls back, 25 Oct
        datetime(2026, 10, 31, 22, tzinfo=UTC),  # New York, 1 Nov
    ]
)


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    now=DST_DAYS,
    start=st.integers(0, 4 * 60),
    length=st.integers(30, 5 * 60),
    count=st.integers(1, 60),
)
def test_dst_days_in_the_campaigns_senders_and_recipients_zones(
    data: st.DataObject, now: datetime, start: int, length: int, count: int
) -> None:
    """Windows across the small hours, where the changes are, on the day of a change in the
    campaign's, the senders' and the recipients' zones: no send at a wall time that does not
    exist (each is inside its windows), each day's counts within per_day and the caps."""
    policy = SendingPolicy(
        timezone=data.draw(st.sampled_from(ZONES)),
        per_day=data.draw(st.integers(1, 30)),
        weekdays=frozenset(range(7)),
        windows=(Window(start, min(1440, start + length)),),
    )
    pool = data.draw(senders(2))
    books = {s.id: SenderBook(s) for s in pool}
    assigned = [data.draw(st.sampled_from(["s0", "s1", None])) for _ in range(count)]
    zones = [data.draw(st.sampled_from([None, *ZONES])) for _ in range(count)]
    planned = plan_with_senders(policy, assigned, books, now=now, zones=zones)
    check_plan(policy, planned, assigned, zones, now=now, per_day=Counter())
    sends: dict[str, list[datetime]] = defaultdict(list)
    for sender_id, at in zip(assigned, planned, strict=True):
        if sender_id is not None:
            sends[sender_id].append(at)
    check_books(pool, books, sends)


def test_two_campaigns_on_one_sender_share_its_cap() -> None:
    box = Sender(id="s1", email="sales@example.com", daily_cap=10, timezone="Europe/Berlin")
    books = {"s1": SenderBook(box)}
    policy = SendingPolicy(timezone="Europe/Berlin", per_day=20)
    now = datetime(2026, 12, 7, 6, tzinfo=UTC)  # a Monday, before the window
    first = plan_with_senders(policy, ["s1"] * 10, books, now=now)
    second = plan_with_senders(policy, ["s1"] * 10, books, now=now)
    berlin = box.zone
    assert {at.astimezone(berlin).date() for at in first} == {date(2026, 12, 7)}
    # the mailbox is full on Monday: the second campaign starts on Tuesday
    assert {at.astimezone(berlin).date() for at in second} == {date(2026, 12, 8)}


def test_a_full_sender_does_not_hold_back_the_others() -> None:
    full = Sender(id="a", email="a@example.com", daily_cap=1, timezone="UTC")
    free = Sender(id="b", email="b@example.com", daily_cap=50, timezone="UTC")
    books = {"a": SenderBook(full), "b": SenderBook(free)}
    policy = SendingPolicy(timezone="UTC", per_day=20, weekdays=frozenset(range(7)))
    now = datetime(2026, 12, 7, 0, tzinfo=UTC)
    planned = plan_with_senders(policy, ["a", "a", "b", "b", "b"], books, now=now)
    days = [at.date() for at in planned]
    assert days[:2] == [date(2026, 12, 7), date(2026, 12, 8)]  # a: one a day
    assert set(days[2:]) == {date(2026, 12, 7)}  # b sends meanwhile


def test_the_warm_up_limits_the_first_days() -> None:
    box = Sender(
        id="s1",
        email="new@example.com",
        daily_cap=50,
        timezone="UTC",
        warmup_start=2,
        warmup_step=3,
        warmup_from=date(2026, 12, 7),
    )
    policy = SendingPolicy(timezone="UTC", per_day=100, weekdays=frozenset(range(7)))
    planned = plan_with_senders(
        policy, ["s1"] * 20, {"s1": SenderBook(box)}, now=datetime(2026, 12, 7, tzinfo=UTC)
    )
    per_day = Counter(at.date() for at in planned)
    assert [per_day[date(2026, 12, d)] for d in (7, 8, 9, 10)] == [2, 5, 8, 5]


def test_sends_are_slot_starts_and_keep_the_gap() -> None:
    box = Sender(id="s1", email="a@example.com", daily_cap=500, min_gap_seconds=600)
    policy = SendingPolicy(timezone="Europe/Berlin", per_day=200)  # grid: every 2.4 minutes
    planned = plan_with_senders(
        policy, ["s1"] * 100, {"s1": SenderBook(box)}, now=datetime(2026, 12, 7, tzinfo=UTC)
    )
    assert all(at == slot_start(slot_index(at, 600), 600) for at in planned)
    assert min(b - a for a, b in itertools.pairwise(planned)) >= timedelta(minutes=10)
    # 8 hours of window hold 48 ten-minute slots a day
    assert Counter(at.date() for at in planned)[date(2026, 12, 7)] == 48


def test_a_window_starting_one_gap_after_the_last_one_ends() -> None:
    # 60 s slots: 10:00 ends the first window; 10:01, one slot later, opens the second. The
    # grid (every 30 s) has 09:59:30, which snaps to 10:00, outside, and then 10:01:00.
    box = Sender(id="s1", email="a@example.com", daily_cap=500, timezone="UTC")
    policy = SendingPolicy(
        timezone="UTC",
        per_day=238,
        weekdays=frozenset(range(7)),
        windows=(Window(9 * 60, 10 * 60), Window(10 * 60 + 1, 11 * 60)),
    )
    books = {"s1": SenderBook(box)}
    planned = plan_with_senders(policy, ["s1"] * 100, books, now=datetime(2026, 12, 7, tzinfo=UTC))
    assert all(in_policy(policy, at) for at in planned)
    assert set(books["s1"].slots) == {slot_index(at, 60) * 60_000 for at in planned}


def test_a_re_plan_keeps_half_the_spacing_from_one_sent_email() -> None:
    box = Sender(id="s1", email="a@example.com", daily_cap=500, min_gap_seconds=1)
    policy = SendingPolicy(timezone="UTC", per_day=8, windows=(Window(9 * 60, 17 * 60),))
    now = datetime(2026, 12, 7, 9, tzinfo=UTC)
    sent = [now + timedelta(minutes=1)]
    planned = plan_with_senders(
        policy,
        ["s1"] * 3,
        {"s1": SenderBook(box)},
        now=now,
        campaign_per_day={date(2026, 12, 7): 1},
        campaign_booked=sent,
    )
    half = nominal_spacing(policy) / 2
    assert all(abs(at - sent[0]) >= half for at in planned)


def test_sticky_senders_and_rotation() -> None:
    assigned = assign_senders(
        ["a@x.org", "b@x.org", "c@x.org", "a@x.org", "d@x.org"],
        ["s1", "s2"],
        {"c@x.org": {"s9", "s2"}},
    )
    assert assigned == ["s1", "s2", "s2", "s1", "s1"]
    with pytest.raises(InvalidField) as caught:
        assign_senders(["a@x.org"], [], {})
    assert caught.value.field == "senders"


def test_a_sticky_sender_given_as_one_id_is_not_matched_by_a_prefix() -> None:
    # SenderStore.sticky_senders gives one id per address: "s1" is not "s12"
    assert assign_senders(["a@x.org"], ["s1", "s12"], {"a@x.org": "s12"}) == ["s12"]


def test_an_unknown_sender_bad_zones_and_a_naive_now_are_named() -> None:
    policy = SendingPolicy(timezone="UTC")
    now = datetime(2026, 12, 7, tzinfo=UTC)
    with pytest.raises(InvalidField) as caught:
        plan_with_senders(policy, ["nope", None], {}, now=now)
    assert caught.value.field == "senders"
    with pytest.raises(InvalidField) as caught:
        plan_with_senders(policy, [None, None], {}, now=now, zones=["UTC"])
    assert caught.value.field == "zones"
    with pytest.raises(InvalidField) as caught:
        plan_with_senders(policy, [None], {}, now=now, zones=["Mars/Olympus"])
    assert caught.value.field == "zones"
    with pytest.raises(InvalidField) as caught:
        plan_with_senders(policy, [], {}, now=datetime(2026, 12, 7))
    assert caught.value.field == "now"


def test_gaps_that_never_meet_the_windows_are_refused_not_looped() -> None:
    # hour slots start at :30 in Kolkata; a 09:00-09:10 window never holds one
    box = Sender(id="s1", email="a@example.com", min_gap_seconds=3600, timezone="Asia/Kolkata")
    policy = SendingPolicy(
        timezone="Asia/Kolkata", per_day=1, windows=(Window(9 * 60, 9 * 60 + 10),)
    )
    books = {"s1": SenderBook(box)}
    with pytest.raises(NoSendingDay, match="min_gap_seconds"):
        plan_with_senders(policy, [None, "s1"], books, now=datetime(2026, 12, 7, tzinfo=UTC))
    assert books["s1"] == SenderBook(box)  # a failed plan books nothing


def test_a_policy_without_a_sending_day_is_refused_and_books_nothing() -> None:
    box = Sender(id="s1", email="a@example.com", timezone="UTC")
    now = datetime(2026, 12, 7, tzinfo=UTC)
    policy = SendingPolicy(
        timezone="UTC",
        weekdays=frozenset({0}),
        skip_dates=frozenset(date(2026, 12, 7) + timedelta(weeks=w) for w in range(120)),
    )
    books = {"s1": SenderBook(box)}
    with pytest.raises(NoSendingDay, match="skip"):
        plan_with_senders(policy, ["s1"], books, now=now)
    assert books["s1"] == SenderBook(box)


def test_a_full_day_of_the_campaign_is_shared_by_all_its_zones() -> None:
    # per_day 3 in Berlin: recipients in Tokyo and New York share each Berlin day's three
    policy = SendingPolicy(timezone="Europe/Berlin", per_day=3, weekdays=frozenset(range(7)))
    zones: list[str | None] = ["Asia/Tokyo", "America/New_York"] * 6
    now = datetime(2026, 12, 7, tzinfo=UTC)
    planned = plan_with_senders(policy, [None] * 12, {}, now=now, zones=zones)
    berlin = ZoneInfo("Europe/Berlin")
    assert set(Counter(at.astimezone(berlin).date() for at in planned).values()) == {3}
    for at, zone in zip(planned, zones, strict=True):
        assert 9 <= at.astimezone(ZoneInfo(str(zone))).hour < 17
