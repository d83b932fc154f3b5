"""The warm-up's ramp per sending day, end to end on the in-memory fakes and a fake clock: its
first day is the sender's first day with an email, weekends and idle days do not move it on,
and no day ever passes its ramp, whatever campaigns, cancellations, pauses and sends came
between."""

from __future__ import annotations

from collections import Counter
from contextlib import suppress
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from typing import cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sendqueue.bootstrap import Container
from sendqueue.domain.capacity import SenderBook, plan_with_senders
from sendqueue.domain.errors import DomainError, InvalidField
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.policy import SendingPolicy, Window
from sendqueue.domain.senders import Sender
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.scheduler import FakeScheduler
from sendqueue.testing.senders import InMemorySenders
from tests.support.app import csv_bytes, fake_app
from tests.unit.test_capacity import instants, policies, senders

THURSDAY = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
MONDAY = date(2026, 12, 7)
WEEKDAYS = SendingPolicy(
    timezone="Europe/Berlin",
    per_day=100,
    weekdays=frozenset(range(5)),
    windows=(Window(9 * 60, 17 * 60),),
)
#: Sends counted against a sender's day (a Cancelled or Failed one gave its booking back).
_HOLDING = {TaskState.PENDING, TaskState.RUNNING, TaskState.FINISHED}


def _campaign(
    app: Container, count: int, senders: list[str], policy: SendingPolicy, prefix: str = "user"
) -> str:
    made = app.campaign_import.create(
        name="c", recipients=csv_bytes(count, prefix=prefix), policy=policy, senders=senders
    )
    assert app.provisioner.provision(made.campaign.id).status == "done"
    return made.campaign.id


def _per_day(app: Container, sender: Sender) -> Counter[date]:
    """The sender's emails per local day, counted from the tasks (not the store's counts)."""
    counts: Counter[date] = Counter()
    for campaign in app.store.list_campaigns():
        for t in app.store.list_tasks(campaign.id, limit=10_000):
            if t.sender_id == sender.id and t.state in _HOLDING:
                counts[t.send_at.astimezone(sender.zone).date()] += 1
    return counts


def _books(app: Container) -> InMemorySenders:
    return cast(InMemorySenders, app.store)


def test_a_sender_added_on_thursday_starts_its_ramp_on_mondays_first_email() -> None:
    app = fake_app(clock=FakeClock(THURSDAY))
    anna = app.senders.add(email="anna@example.com", daily_cap=50, warmup_start=2, warmup_step=2)
    policy = replace(WEEKDAYS, start=datetime(2026, 12, 7, 8, tzinfo=UTC))
    _campaign(app, 20, [anna.id], policy)
    counts = _per_day(app, anna)
    monday = [MONDAY + timedelta(days=n) for n in range(4)]
    assert [counts[d] for d in monday] == [2, 4, 6, 8]
    caps = {u.date: u.cap for u in app.senders.usage(anna.id, days=14)}
    # Thursday to Sunday hold nothing, so Monday is the first sending day; the next Monday
    # follows Thursday's 8 (the weekend between does not count)
    assert [caps[d] for d in monday] == [2, 4, 6, 8]
    assert caps[date(2026, 12, 3)] == 2  # today, before any sending day
    assert caps[date(2026, 12, 13)] == 10  # Sunday: after the four sending days
    assert caps[date(2026, 12, 14)] == 10


def test_a_sender_idle_for_ten_days_still_starts_at_warmup_start() -> None:
    clock = FakeClock(THURSDAY)
    app = fake_app(clock=clock)
    anna = app.senders.add(email="anna@example.com", daily_cap=50, warmup_start=3, warmup_step=5)
    clock.set(THURSDAY + timedelta(days=10))
    _campaign(app, 4, [anna.id], WEEKDAYS)
    counts = _per_day(app, anna)
    first = min(counts)
    assert first == date(2026, 12, 14) and counts[first] == 3


def test_a_ramp_left_idle_goes_on_from_its_last_sending_day() -> None:
    clock = FakeClock(THURSDAY)
    app = fake_app(clock=clock)
    anna = app.senders.add(email="anna@example.com", daily_cap=50, warmup_start=3, warmup_step=5)
    _campaign(app, 11, [anna.id], WEEKDAYS)  # Thursday 3, Friday 8
    scheduler = app.scheduler
    assert isinstance(scheduler, FakeScheduler)
    scheduler.run_until(clock, app.invoke, THURSDAY + timedelta(days=2))
    clock.set(THURSDAY + timedelta(days=14))
    _campaign(app, 40, [anna.id], WEEKDAYS, prefix="later")
    counts = _per_day(app, anna)
    assert [counts[date(2026, 12, d)] for d in (3, 4, 17, 18)] == [3, 8, 13, 18]


def test_a_cancelled_day_still_counts_so_later_days_keep_their_room() -> None:
    app = fake_app(clock=FakeClock(THURSDAY))
    anna = app.senders.add(email="anna@example.com", daily_cap=50, warmup_start=2, warmup_step=2)
    policy = replace(WEEKDAYS, weekdays=frozenset({0}), start=datetime(2026, 12, 7, 8, tzinfo=UTC))
    first = _campaign(app, 2, [anna.id], policy)  # Monday 7th
    second = _campaign(app, 4, [anna.id], replace(policy, weekdays=frozenset({1})), "b")
    assert _per_day(app, anna) == {MONDAY: 2, date(2026, 12, 8): 4}
    app.campaign_controls.cancel(first)
    # Monday held bookings: it stays a sending day, so Tuesday's 4 stay within its ramp
    caps = {u.date: u.cap for u in app.senders.usage(anna.id)}
    assert caps[MONDAY] == 2 and caps[date(2026, 12, 8)] == 4
    assert _books(app).sending_days(anna.id, since=MONDAY) == [MONDAY, date(2026, 12, 8)]
    assert app.store.get_campaign(second).sender_ids == (anna.id,)


def test_restarting_the_warm_up_counts_sending_days_from_the_restart() -> None:
    clock = FakeClock(THURSDAY)
    app = fake_app(clock=clock)
    anna = app.senders.add(email="anna@example.com", daily_cap=50, warmup_start=2, warmup_step=2)
    _campaign(app, 6, [anna.id], WEEKDAYS)  # Thursday 2, Friday 4
    clock.set(THURSDAY + timedelta(hours=8))  # still Thursday
    with pytest.raises(InvalidField) as caught:
        app.senders.update(anna.id, {"warmup_start": 1})  # Thursday's 2 would pass 1
    assert caught.value.field == "warmup_start"
    assert app.senders.update(anna.id, {"warmup_start": 2, "warmup_step": 3}).warmup_step == 3
    caps = {u.date: u.cap for u in app.senders.usage(anna.id)}
    assert [caps[date(2026, 12, d)] for d in (3, 4, 7)] == [2, 5, 8]


# --- the properties ----------------------------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pool=senders(2), now=instants, data=st.data())
def test_plans_and_releases_on_shared_books_keep_every_day_within_its_ramp(
    pool: list[Sender], now: datetime, data: st.DataObject
) -> None:
    """The planner alone: several plans over the same books, days apart, with bookings taken
    out between them (cancelled or moved), judged by the sending days the books end with."""
    pool = [
        s
        if s.warmup_start is not None
        else replace(s, warmup_start=1, warmup_step=1, warmup_from=date(2026, 3, 1))
        for s in pool
    ]
    books = {s.id: SenderBook(s) for s in pool}
    held: dict[str, list[datetime]] = {s.id: [] for s in pool}
    for _ in range(data.draw(st.integers(1, 4))):
        now += timedelta(days=data.draw(st.integers(0, 9)), hours=data.draw(st.integers(0, 23)))
        policy = data.draw(policies(now))
        count = data.draw(st.integers(1, 30))
        assigned: list[str | None] = [
            data.draw(st.sampled_from([s.id for s in pool])) for _ in range(count)
        ]
        try:
            sends = plan_with_senders(policy, assigned, books, now=now)
        except DomainError:
            continue  # no sending day in reach: the books are as they were
        for sid, at in zip(assigned, sends, strict=True):
            assert sid is not None
            held[sid].append(at)
        for sid, ats in held.items():
            gone = data.draw(st.sets(st.integers(0, max(0, len(ats) - 1)), max_size=len(ats)))
            for i in sorted(gone, reverse=True):
                books[sid].remove(ats.pop(i))
    for sender in pool:
        assert sender.warmup_start is not None and sender.warmup_from is not None
        book = books[sender.id]
        counts = Counter(at.astimezone(sender.zone).date() for at in held[sender.id])
        assert set(counts) <= set(book.sending)
        for day, n in counts.items():
            assert n <= sender.cap_on(day, book.sending), (sender, day, n, book.sending)
        ramp = [d for d in book.sending if d >= sender.warmup_from]
        if ramp:
            assert counts[ramp[0]] <= sender.warmup_start


_ACTIONS = ("campaign", "campaign", "cancel_some", "cancel", "cancel", "pause_resume", "wait")


@st.composite
def _policies(draw: st.DrawFn, today: date) -> SendingPolicy:
    weekdays = draw(st.sets(st.integers(0, 6), min_size=1))
    skips = draw(st.sets(st.integers(0, 30), max_size=6))
    start = draw(st.integers(0, 12))
    return replace(
        WEEKDAYS,
        per_day=draw(st.integers(1, 30)),
        weekdays=frozenset(weekdays),
        skip_dates=frozenset(today + timedelta(days=n) for n in skips),
        start=datetime.combine(today + timedelta(days=start), datetime.min.time(), tzinfo=UTC),
    )


def _act(
    app: Container, clock: FakeClock, data: st.DataObject, pool: list[Sender], campaigns: list[str]
) -> None:
    """One step of a user's: a campaign, a cancellation, a pause and resume, or time passing
    (the due emails sent). ``campaigns``: those made so far, in order (their ids are random)."""
    action = data.draw(st.sampled_from(_ACTIONS))
    if action == "campaign" or not campaigns:
        senders = data.draw(st.lists(st.sampled_from(pool), min_size=1, unique_by=lambda s: s.id))
        policy = data.draw(_policies(clock.now().date()))
        count = data.draw(st.integers(1, 40))
        prefix = f"c{len(campaigns)}x"
        # a plan with no sending day (every weekday skipped) is refused: nothing booked
        with suppress(DomainError):
            campaigns.append(_campaign(app, count, [s.id for s in senders], policy, prefix))
        return
    cid = data.draw(st.sampled_from(campaigns))
    try:
        if action == "cancel":
            app.campaign_controls.cancel(cid)
        elif action == "cancel_some":
            tasks = app.store.list_tasks(cid, limit=10_000)
            pending = sorted(t.id for t in tasks if t.state is TaskState.PENDING)
            for task_id in data.draw(st.lists(st.sampled_from(pending))) if pending else []:
                app.campaign_controls.cancel_task(task_id)
        elif action == "pause_resume":
            app.campaign_controls.pause(cid)
            clock.set(clock.now() + timedelta(days=data.draw(st.integers(0, 4))))
            app.campaign_controls.resume(cid)
    except DomainError:
        pass  # not in a state that allows it (done, cancelled): nothing changes
    if action == "wait":
        scheduler = app.scheduler
        assert isinstance(scheduler, FakeScheduler)
        days = data.draw(st.integers(1, 12))
        scheduler.run_until(clock, app.invoke, clock.now() + timedelta(days=days))


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_no_day_ever_passes_its_ramp_and_the_first_sending_day_gets_the_start(
    data: st.DataObject,
) -> None:
    clock = FakeClock(THURSDAY)
    app = fake_app(clock=clock)
    pool = []
    for n in range(data.draw(st.integers(1, 2))):
        cap = data.draw(st.integers(5, 40))
        pool.append(
            app.senders.add(
                email=f"s{n}@example.com",
                daily_cap=cap,
                warmup_start=data.draw(st.integers(1, 4)),
                warmup_step=data.draw(st.integers(1, 4)),
            )
        )
    campaigns: list[str] = []
    for _ in range(data.draw(st.integers(1, 8))):
        _act(app, clock, data, pool, campaigns)
    books = _books(app)
    for sender in pool:
        assert sender.warmup_from is not None and sender.warmup_start is not None
        sending = books.sending_days(sender.id, since=date.min)
        counts = _per_day(app, sender)
        stored = {
            u.day: u.planned + u.sent
            for u in books.sender_usage(sender.id, since=date.min, until=date.max)
        }
        assert stored == +counts  # the store's counts are the tasks'
        assert set(counts) <= set(sending)
        for day, n in counts.items():
            assert n <= sender.cap_on(day, sending), (sender.id, day, n, sending)
        if sending:
            assert counts[sending[0]] <= sender.warmup_start
