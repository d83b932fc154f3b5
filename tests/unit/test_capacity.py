"""Capacity-aware planning: across campaigns, a sender's day never holds more than its cap,
its sends keep its gap, and each campaign still keeps its policy (issue 13)."""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from datetime import UTC, date, datetime, timedelta

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

# Zones with DST changes (Berlin, New York, Lord Howe's half hour) and odd offsets (Kolkata).
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"]
# Around the spring and autumn changes of Europe and North America.
instants = st.sampled_from(
    [
        datetime(2026, 3, 6, 7, tzinfo=UTC),
        datetime(2026, 3, 27, 12, tzinfo=UTC),
        datetime(2026, 10, 23, 20, tzinfo=UTC),
        datetime(2026, 10, 30, 1, tzinfo=UTC),
        datetime(2026, 12, 2, 9, 17, 3, tzinfo=UTC),
    ]
)


@st.composite
def policies(draw: st.DrawFn) -> SendingPolicy:
    start = draw(st.integers(0, 22 * 60))
    end = draw(st.integers(start + 30, 1440))
    return SendingPolicy(
        timezone=draw(st.sampled_from(ZONES)),
        per_day=draw(st.integers(1, 40)),
        weekdays=frozenset(draw(st.sets(st.integers(0, 6), min_size=1))),
        windows=(Window(start, end),),
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


@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    n_senders=st.integers(1, 4),
    campaigns=st.lists(st.tuples(policies(), st.integers(1, 40)), min_size=1, max_size=3),
    now=instants,
    existing=st.lists(st.integers(0, 3000), max_size=20),
)
def test_caps_gaps_and_policies_hold_across_campaigns(
    data: st.DataObject,
    n_senders: int,
    campaigns: list[tuple[SendingPolicy, int]],
    now: datetime,
    existing: list[int],
) -> None:
    pool = data.draw(senders(n_senders))
    books = {s.id: SenderBook(s) for s in pool}
    sends: dict[str, list[datetime]] = defaultdict(list)
    for book in books.values():
        sends[book.sender.id].extend(_existing(book, now, existing))
    for policy, count in campaigns:
        used = data.draw(st.lists(st.sampled_from([s.id for s in pool]), min_size=1, unique=True))
        addresses = [f"r{data.draw(st.integers(0, 30))}@example.com" for _ in range(count)]
        assigned = assign_senders(addresses, used, {})
        planned = plan_with_senders(policy, assigned, books, now=now)

        assert len(planned) == count
        zone = policy.zone
        per_day = Counter(at.astimezone(zone).date() for at in planned)
        assert max(per_day.values()) <= policy.per_day
        for at in planned:
            assert at >= now
            assert in_policy(policy, at), at
        for sender_id, at in zip(assigned, planned, strict=True):
            sends[sender_id].append(at)
        # one address, one sender
        assert len({(a, s) for a, s in zip(addresses, assigned, strict=True)}) == len(
            set(addresses)
        )

    for sender in pool:
        mine = sorted(sends[sender.id])
        days = Counter(at.astimezone(sender.zone).date() for at in mine)
        for day, n in days.items():
            assert n <= sender.cap_on(day), (sender, day, n)
        for a, b in itertools.pairwise(mine):
            assert (b - a).total_seconds() >= sender.min_gap_seconds, (sender, a, b)


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


def test_a_re_plan_keeps_half_the_spacing_from_the_campaigns_own_sends() -> None:
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


def test_an_unknown_sender_and_a_naive_now_are_named() -> None:
    policy = SendingPolicy(timezone="UTC")
    with pytest.raises(InvalidField) as caught:
        plan_with_senders(policy, ["nope"], {}, now=datetime(2026, 12, 7, tzinfo=UTC))
    assert caught.value.field == "senders"
    with pytest.raises(InvalidField) as caught:
        plan_with_senders(policy, [], {}, now=datetime(2026, 12, 7))
    assert caught.value.field == "now"


def test_gaps_that_never_meet_the_windows_are_refused_not_looped() -> None:
    # hour slots start at :30 in Kolkata; a 09:00-09:10 window never holds one
    box = Sender(id="s1", email="a@example.com", min_gap_seconds=3600, timezone="Asia/Kolkata")
    policy = SendingPolicy(
        timezone="Asia/Kolkata", per_day=1, windows=(Window(9 * 60, 9 * 60 + 10),)
    )
    with pytest.raises(NoSendingDay, match="min_gap_seconds"):
        plan_with_senders(
            policy, ["s1"], {"s1": SenderBook(box)}, now=datetime(2026, 12, 7, tzinfo=UTC)
        )
