"""Sender books from the store's reads, taking a booking out for a re-plan, and a sender whose
minimum gap changed after it booked (issue 13)."""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from datetime import UTC, date, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sendqueue.domain.capacity import SenderBook, plan_with_senders, slot_index, slot_start
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.policy import SendingPolicy, Window
from sendqueue.domain.senders import Sender, SenderDay
from tests.unit.test_capacity import ZONES, check_books, check_plan, instants, policies, senders

NOW = datetime(2026, 12, 7, 6, tzinfo=UTC)


@settings(max_examples=150, deadline=None)
@given(
    sender=senders(1).map(lambda pool: pool[0]),
    offsets=st.lists(st.integers(0, 20_000), max_size=40, unique=True),
    sent=st.integers(0, 40),
    data=st.data(),
)
def test_a_loaded_book_is_the_book_of_its_bookings_and_remove_undoes_add(
    sender: Sender, offsets: list[int], sent: int, data: st.DataObject
) -> None:
    gap = sender.min_gap_seconds
    times = [slot_start(slot_index(NOW, gap) + k, gap) for k in offsets]
    added = SenderBook(sender)
    for at in times:
        added.add(at)
    days = Counter(added.day_of(at) for at in times)
    usage = []
    for day, n in sorted(days.items()):  # the store splits a day into planned and sent
        done = min(n, sent)
        usage.append(SenderDay(day, n - done, done))
    assert SenderBook.load(sender, times, usage) == added
    for at in data.draw(st.permutations(times)):
        added.remove(at)
    # empty again, but for its days: they held bookings, so they stay sending days
    assert added == SenderBook(sender, sending=sorted(days))


def test_removing_what_is_not_booked_is_refused() -> None:
    book = SenderBook(Sender(id="s1", email="a@example.com"))
    book.add(NOW)
    with pytest.raises(InvalidField) as caught:
        book.remove(NOW + timedelta(minutes=1))
    assert caught.value.field == "at"
    assert book.per_day == {NOW.date(): 1}


@settings(max_examples=100, deadline=None)
@given(
    old_gap=st.sampled_from([1, 7, 60, 90]),
    new_gap=st.sampled_from([45, 60, 600]),
    offsets=st.lists(st.integers(0, 3000), max_size=30, unique=True),
    count=st.integers(1, 40),
    now=instants,
)
def test_bookings_made_under_an_older_gap_are_kept_a_new_gap_away(
    old_gap: int, new_gap: int, offsets: list[int], count: int, now: datetime
) -> None:
    """``booked_times`` gives instants; the book holds them as slots of the sender's current
    gap (and the next slot too where one is not a slot start), so a new send is never closer
    than the current gap to an old one."""
    sender = Sender(
        id="s1", email="a@example.com", daily_cap=200, min_gap_seconds=new_gap, timezone="UTC"
    )
    times = [now + timedelta(seconds=old_gap * k) for k in offsets]
    days = Counter(at.date() for at in times)
    book = SenderBook.load(sender, times, [SenderDay(d, n, 0) for d, n in days.items()])
    policy = SendingPolicy(timezone="UTC", per_day=300, weekdays=frozenset(range(7)))
    planned = plan_with_senders(policy, ["s1"] * count, {"s1": book}, now=now)
    every = sorted([*times, *planned])
    for a, b in itertools.pairwise(every):
        if a in planned or b in planned:
            assert (b - a).total_seconds() >= new_gap, (a, b)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), now=instants, count=st.integers(2, 40))
def test_a_re_plan_frees_the_slots_of_what_it_moves_then_plans_them_again(
    data: st.DataObject, now: datetime, count: int
) -> None:
    pool = data.draw(senders(3))
    books = {s.id: SenderBook(s) for s in pool}
    policy = data.draw(policies(now))
    assigned: list[str | None] = [
        data.draw(st.sampled_from([*(s.id for s in pool), None])) for _ in range(count)
    ]
    zones = [data.draw(st.sampled_from([None, *ZONES])) for _ in range(count)]
    first = plan_with_senders(policy, assigned, books, now=now, zones=zones)
    moved = sorted(data.draw(st.sets(st.integers(0, count - 1), min_size=1)))
    for i in moved:
        sender_id = assigned[i]
        if sender_id is not None:
            books[sender_id].remove(first[i])
    kept = [at for i, at in enumerate(first) if i not in moved]
    later = now + timedelta(hours=data.draw(st.integers(0, 72)))
    per_day = Counter(at.astimezone(policy.zone).date() for at in kept)
    again = plan_with_senders(
        policy,
        [assigned[i] for i in moved],
        books,
        now=later,
        zones=[zones[i] for i in moved],
        campaign_per_day=dict(per_day),
        campaign_booked=kept,
    )
    check_plan(
        policy,
        again,
        [assigned[i] for i in moved],
        [zones[i] for i in moved],
        now=later,
        per_day=per_day,
    )
    sends: dict[str, list[datetime]] = defaultdict(list)
    final = list(first)
    for i, at in zip(moved, again, strict=True):
        final[i] = at
    for sender_id, at in zip(assigned, final, strict=True):
        if sender_id is not None:
            sends[sender_id].append(at)
    check_books(pool, books, sends)


def test_a_sender_with_two_zones_of_recipients_keeps_one_cap() -> None:
    box = Sender(id="s1", email="a@example.com", daily_cap=3, timezone="Europe/Berlin")
    policy = SendingPolicy(timezone="Europe/Berlin", per_day=50, weekdays=frozenset(range(7)))
    zones: list[str | None] = ["Asia/Tokyo", "America/New_York", None] * 4
    books = {"s1": SenderBook(box)}
    planned = plan_with_senders(policy, ["s1"] * 12, books, now=NOW, zones=zones)
    per_day = Counter(at.astimezone(box.zone).date() for at in planned)
    assert max(per_day.values()) <= 3
    assert books["s1"].per_day == dict(per_day)
    assert sum(per_day.values()) == 12
    assert date(2026, 12, 7) in per_day


def test_the_windows_are_each_recipients_own() -> None:
    policy = SendingPolicy(timezone="UTC", per_day=10, windows=(Window(9 * 60, 10 * 60),))
    zones: list[str | None] = ["Asia/Kolkata", "Pacific/Chatham", "America/New_York"]
    planned = plan_with_senders(policy, [None] * 3, {}, now=NOW, zones=zones)
    from zoneinfo import ZoneInfo

    for at, zone in zip(planned, zones, strict=True):
        assert at.astimezone(ZoneInfo(str(zone))).hour == 9
