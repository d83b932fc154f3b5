"""Capacity planning against the rules with long gaps, warm-ups, zones and bookings made off
the current grid (the red-team pass found a slot given the wrong instant when a sender's next
slot fell past its window's end; these are its cases, kept)."""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from datetime import UTC, date, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sendqueue.domain.capacity import SenderBook, assign_senders, plan_with_senders
from sendqueue.domain.errors import InvalidField, NoSendingDay
from sendqueue.domain.policy import SendingPolicy, Window
from sendqueue.domain.senders import Sender, SenderDay
from tests.unit.test_capacity import ZONES, check_plan, instants, policies

GAPS = [1, 7, 61, 599, 3600, 5400, 7200, 86399, 86400]
RAMP_DAYS = [date(2026, 3, 1), date(2026, 10, 24), date(2026, 12, 3)]


@st.composite
def senders(draw: st.DrawFn, n: int) -> list[Sender]:
    out = []
    for i in range(n):
        cap = draw(st.integers(1, 25))
        ramp = draw(st.booleans())
        out.append(
            Sender(
                id=f"s{i}", email=f"b{i}@example.com", daily_cap=cap,
                min_gap_seconds=draw(st.sampled_from(GAPS)),
                timezone=draw(st.sampled_from(ZONES)),
                warmup_start=draw(st.integers(1, cap)) if ramp else None,
                warmup_step=draw(st.integers(1, cap)) if ramp else None,
                warmup_from=draw(st.sampled_from(RAMP_DAYS)) if ramp else None,
            )
        )  # fmt: skip
    return out


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    data=st.data(),
    n=st.integers(1, 4),
    now=instants,
    existing=st.lists(st.tuples(st.integers(0, 4 * 86_400_000), st.integers(0, 3)), max_size=25),
)
def test_long_gaps_ramps_zones_and_old_bookings_keep_every_rule(
    data: st.DataObject, n: int, now: datetime, existing: list[tuple[int, int]]
) -> None:
    pool = data.draw(senders(n))
    # bookings at any millisecond (made under another gap), within the cap of their day
    times: dict[str, list[datetime]] = defaultdict(list)
    for off, k in existing:
        s = pool[k % n]
        at = now - timedelta(hours=20) + timedelta(milliseconds=off)
        at = at.replace(microsecond=(at.microsecond // 1000) * 1000)
        day = at.astimezone(s.zone).date()
        on_day = sum(1 for t in times[s.id] if t.astimezone(s.zone).date() == day)
        held = sorted({t.astimezone(s.zone).date() for t in times[s.id]})
        if at not in times[s.id] and on_day < s.cap_on(day, held):
            times[s.id].append(at)
    books = {}
    for s in pool:
        days = Counter(t.astimezone(s.zone).date() for t in times[s.id])
        usage = [SenderDay(d, c, 0) for d, c in sorted(days.items())]
        books[s.id] = SenderBook.load(s, sorted(times[s.id]), usage)
    policy = data.draw(policies(now))
    count = data.draw(st.integers(1, 40))
    used = data.draw(st.lists(st.sampled_from([s.id for s in pool]), min_size=1, unique=True))
    assigned: list[str | None] = list(
        assign_senders([f"r{i}@x.com" for i in range(count)], used, {})
    )
    zones = None
    if data.draw(st.booleans()):
        zones = [data.draw(st.sampled_from([None, *ZONES])) for _ in range(count)]
    try:
        planned = plan_with_senders(policy, assigned, books, now=now, zones=zones)
    except (NoSendingDay, InvalidField):
        return
    check_plan(policy, planned, assigned, zones, now=now, per_day=Counter())
    for s in pool:
        new = [at for at, sid in zip(planned, assigned, strict=True) if sid == s.id]
        every = sorted(times[s.id] + new)
        per_day = Counter(t.astimezone(s.zone).date() for t in every)
        for day, sends in per_day.items():
            assert sends <= s.cap_on(day, sorted(per_day)), (s, day, sends)
        for a, b in itertools.pairwise(every):
            if a in new or b in new:
                assert (b - a).total_seconds() >= s.min_gap_seconds, (s.id, a, b)


def test_a_slot_past_its_window_end_does_not_hand_on_its_instant() -> None:
    # Hourly slots, windows 09:00-09:30 and 10:00-12:00: 09:00, then 10:00 and 11:00.
    now = datetime(2026, 12, 1, 7, 0, tzinfo=UTC)  # Tue 08:00 in Berlin
    sender = Sender(id="s0", email="a@example.com", min_gap_seconds=3600)
    policy = SendingPolicy(
        timezone="Europe/Berlin", per_day=10, weekdays=frozenset(range(7)),
        windows=(Window(9 * 60, 9 * 60 + 30), Window(10 * 60, 12 * 60)),
    )  # fmt: skip
    book = SenderBook(sender)
    out = plan_with_senders(policy, ["s0"] * 3, {"s0": book}, now=now)
    assert [o.astimezone(sender.zone).strftime("%H:%M") for o in out] == [
        "09:00", "10:00", "11:00",
    ]  # fmt: skip
    assert sorted(book.slots) == sorted(int(o.timestamp() * 1000) for o in out)


def test_a_day_long_gap_never_plans_before_now() -> None:
    sender = Sender(id="s0", email="a@example.com", daily_cap=1, min_gap_seconds=86_400)
    policy = SendingPolicy(
        timezone="UTC", per_day=20, weekdays=frozenset({0, 1}), windows=(Window(0, 1381),)
    )
    now = datetime(2026, 3, 9, 7, 0, tzinfo=UTC)  # a Monday
    out = plan_with_senders(policy, ["s0"] * 2, {"s0": SenderBook(sender)}, now=now)
    assert all(o >= now for o in out)
    assert out[1] - out[0] >= timedelta(days=1)
