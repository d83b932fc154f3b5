"""Senders end to end on the in-memory fakes and a fake clock (issue 13): campaigns sharing a
sender never pass its cap or gap, the worker sends from the sender, and cancel, pause, resume,
retries and failures release and re-book slots."""

from __future__ import annotations

import itertools
from collections import Counter
from datetime import UTC, date, datetime, timedelta
from typing import cast

import pytest

from sendqueue.bootstrap import Container
from sendqueue.domain.errors import InvalidField, PermanentMailError, TransientMailError
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import Task
from sendqueue.domain.policy import SendingPolicy, Window
from sendqueue.domain.senders import Booking
from sendqueue.domain.slots import in_policy
from sendqueue.ports import SenderStore
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.testing.scheduler import FakeScheduler
from tests.support.app import csv_bytes, fake_app

BERLIN_POLICY = SendingPolicy(
    timezone="Europe/Berlin",
    per_day=20,
    weekdays=frozenset(range(7)),
    windows=(Window(9 * 60, 17 * 60),),
)
START = datetime(2026, 12, 1, 7, 0, tzinfo=UTC)  # 08:00 in Berlin, a Tuesday


def _app(clock: FakeClock, mailer: RecordingMailer | None = None) -> Container:
    return fake_app(clock=clock, mailer=mailer or RecordingMailer())


def _store(app: Container) -> SenderStore:
    return cast(SenderStore, app.store)


def _tasks(app: Container, cid: str) -> list[Task]:
    return app.store.list_tasks(cid, limit=10_000)


def _campaign(app: Container, count: int, senders: list[str], prefix: str = "user") -> str:
    made = app.campaign_import.create(
        name="c", recipients=csv_bytes(count, prefix=prefix), policy=BERLIN_POLICY,
        senders=senders,
    )  # fmt: skip
    assert app.provisioner.provision(made.campaign.id).status == "done"
    return made.campaign.id


def _per_sender_day(app: Container, *cids: str) -> Counter[tuple[str, date]]:
    counts: Counter[tuple[str, date]] = Counter()
    for cid in cids:
        for t in _tasks(app, cid):
            if t.sender_id and t.state in {TaskState.PENDING, TaskState.FINISHED}:
                sender = app.senders.get(t.sender_id)
                counts[(t.sender_id, t.send_at.astimezone(sender.zone).date())] += 1
    return counts


def test_two_campaigns_on_one_sender_share_its_cap_and_gap() -> None:
    clock = FakeClock(START)
    app = _app(clock)
    anna = app.senders.add(email="anna@example.com", name="Anna", daily_cap=12, min_gap_seconds=600)
    first = _campaign(app, 30, [anna.email])
    second = _campaign(app, 30, [anna.id], prefix="other")
    counts = _per_sender_day(app, first, second)
    assert counts and max(counts.values()) <= 12
    times = sorted(t.send_at for cid in (first, second) for t in _tasks(app, cid))
    assert all(b - a >= timedelta(seconds=600) for a, b in itertools.pairwise(times))
    assert all(in_policy(BERLIN_POLICY, at) for at in times)
    usage = {d.date: d for d in app.senders.usage(anna.id)}
    assert sum(d.planned for d in usage.values()) == 60
    assert all(d.planned + d.sent <= d.cap for d in usage.values())
    task = _tasks(app, first)[0]
    assert (task.sender_id, task.sender) == (anna.id, "anna@example.com")


def test_recipients_are_spread_across_senders_and_stay_with_theirs() -> None:
    clock = FakeClock(START)
    app = _app(clock)
    a = app.senders.add(email="a@example.com", daily_cap=50)
    b = app.senders.add(email="b@example.com", daily_cap=50)
    first = _campaign(app, 10, [a.id, b.id])
    by_sender = Counter(t.sender_id for t in _tasks(app, first))
    assert by_sender == {a.id: 5, b.id: 5}
    # The same recipients again, with the senders named the other way round: sticky.
    second = _campaign(app, 10, [b.id, a.id])
    before = {t.email: t.sender_id for t in _tasks(app, first)}
    assert {t.email: t.sender_id for t in _tasks(app, second)} == before


def test_the_worker_sends_from_the_sender_and_counts_what_it_sent() -> None:
    clock = FakeClock(START)
    mailer = RecordingMailer()
    app = _app(clock, mailer)
    anna = app.senders.add(
        email="anna@example.com", name="Anna Example", reply_to="replies@example.com",
        daily_cap=5,
    )  # fmt: skip
    cid = _campaign(app, 8, [anna.id])
    scheduler = app.scheduler
    assert isinstance(scheduler, FakeScheduler)
    scheduler.run_until(clock, app.invoke, START + timedelta(hours=12))
    assert len(mailer.sent) == 5  # the first day's cap
    assert {(m.from_name, m.from_addr) for m in mailer.sent} == {
        ("Anna Example", "anna@example.com")
    }
    assert {m.reply_to for m in mailer.sent} == {"replies@example.com"}
    today = app.senders.usage(anna.id)[0]
    assert (today.planned, today.sent, today.cap) == (0, 5, 5)
    scheduler.run_until(clock, app.invoke, START + timedelta(days=2))
    assert len(mailer.sent) == 8
    assert app.store.get_campaign(cid).state is CampaignState.COMPLETED


def test_cancel_releases_the_slots_for_another_campaign() -> None:
    clock = FakeClock(START)
    app = _app(clock)
    anna = app.senders.add(email="anna@example.com", daily_cap=10)
    first = _campaign(app, 10, [anna.id])
    day = _tasks(app, first)[0].send_at.date()
    second = _campaign(app, 10, [anna.id], prefix="later")
    assert all(t.send_at.date() > day for t in _tasks(app, second))
    app.campaign_controls.cancel(first)
    assert app.senders.usage(anna.id)[0].planned == 0
    third = _campaign(app, 10, [anna.id], prefix="third")
    assert all(t.send_at.date() == day for t in _tasks(app, third))


def test_pause_frees_the_capacity_and_resume_books_it_again() -> None:
    clock = FakeClock(START)
    app = _app(clock)
    anna = app.senders.add(email="anna@example.com", daily_cap=10)
    cid = _campaign(app, 15, [anna.id])
    app.campaign_controls.pause(cid)
    assert sum(d.planned for d in app.senders.usage(anna.id)) == 0
    app.campaign_controls.resume(cid)
    usage = app.senders.usage(anna.id)
    assert sum(d.planned for d in usage) == 15
    assert all(d.planned <= d.cap for d in usage)
    for task in _tasks(app, cid):
        booking = _store(app).booking_of(task.id)
        assert booking is not None and booking.at == task.send_at


def test_a_transient_failure_re_books_and_a_permanent_one_releases() -> None:
    clock = FakeClock(START)
    mailer = RecordingMailer()
    app = _app(clock, mailer)
    anna = app.senders.add(email="anna@example.com", daily_cap=10)
    cid = _campaign(app, 2, [anna.id])
    first, second = _tasks(app, cid)
    mailer.fail_next(TransientMailError("421 try later"))
    mailer.fail_next(PermanentMailError("550 no such user"))
    scheduler = app.scheduler
    assert isinstance(scheduler, FakeScheduler)
    scheduler.run_until(clock, app.invoke, second.send_at)
    retried = app.store.get_task(first.id)
    failed = app.store.get_task(second.id)
    assert retried is not None and retried.state is TaskState.PENDING
    assert retried.send_at > first.send_at
    booking = _store(app).booking_of(first.id)
    assert booking is not None and booking.at == retried.send_at
    assert failed is not None and failed.state is TaskState.FAILED
    assert _store(app).booking_of(second.id) is None
    # retry-failed books it again
    assert app.campaign_controls.retry_failed(cid) == 1
    again = app.store.get_task(second.id)
    booking = _store(app).booking_of(second.id)
    assert again is not None and booking is not None and booking.at == again.send_at


def test_a_send_whose_slot_was_taken_is_given_back_and_planned_again() -> None:
    clock = FakeClock(START)
    mailer = RecordingMailer()
    app = _app(clock, mailer)
    anna = app.senders.add(email="anna@example.com", daily_cap=1)
    cid = _campaign(app, 1, [anna.id])
    [task] = _tasks(app, cid)
    # The booking is lost (say, a crash between a release and a re-booking) and another
    # campaign's task takes the day meanwhile.
    _store(app).release([task.id])
    _store(app).book(
        [
            Booking(
                sender_id=anna.id, at=task.send_at + timedelta(hours=1),
                day=task.send_at.astimezone(anna.zone).date(), task_id="cother-0",
                campaign_id="cother", recipient="x@example.com", cap=1,
            )
        ]
    )  # fmt: skip
    scheduler = app.scheduler
    assert isinstance(scheduler, FakeScheduler)
    scheduler.run_until(clock, app.invoke, task.send_at + timedelta(minutes=1))
    assert mailer.sent == []
    moved = app.store.get_task(task.id)
    assert moved is not None and moved.state is TaskState.PENDING
    assert moved.send_at.astimezone(anna.zone).date() > task.send_at.astimezone(anna.zone).date()
    booking = _store(app).booking_of(task.id)
    assert booking is not None and booking.at == moved.send_at


def test_a_campaign_without_senders_books_nothing() -> None:
    clock = FakeClock(START)
    app = _app(clock)
    made = app.campaign_import.create(name="c", recipients=csv_bytes(3), policy=BERLIN_POLICY)
    app.provisioner.provision(made.campaign.id)
    tasks = _tasks(app, made.campaign.id)
    assert {t.sender_id for t in tasks} == {None}
    assert all(_store(app).booking_of(t.id) is None for t in tasks)


def test_the_preview_of_a_draft_plans_over_the_senders_books() -> None:
    clock = FakeClock(START)
    app = _app(clock)
    anna = app.senders.add(email="anna@example.com", daily_cap=4)
    first = _campaign(app, 4, [anna.id])  # takes the whole first day
    day = _tasks(app, first)[0].send_at.astimezone(anna.zone).date()
    draft = app.campaign_import.create(
        name="d", recipients=csv_bytes(6, prefix="d"), policy=BERLIN_POLICY, senders=[anna.id]
    ).campaign.id
    summary = app.campaign_previews.preview_summary(draft)
    assert summary.count == 6
    per_day = {d.day: d.count for d in summary.days}
    assert day not in per_day and max(per_day.values()) <= 4
    assert sum(d.planned for d in app.senders.usage(anna.id)) == 4  # nothing booked


def test_a_change_that_planned_sends_would_break_is_refused() -> None:
    clock = FakeClock(START)
    app = _app(clock)
    anna = app.senders.add(email="anna@example.com", daily_cap=10)
    cid = _campaign(app, 10, [anna.id])
    refused: list[tuple[dict[str, object], str]] = [
        ({"daily_cap": 3}, "daily_cap"),
        ({"warmup_start": 2, "warmup_step": 1}, "warmup_start"),
        ({"min_gap_seconds": 600}, "min_gap_seconds"),
        ({"timezone": "Asia/Tokyo"}, "timezone"),
    ]
    for changes, field in refused:
        with pytest.raises(InvalidField) as caught:
            app.senders.update(anna.id, changes)
        assert caught.value.field == field
    assert app.senders.get(anna.id) == anna  # nothing changed
    assert app.senders.update(anna.id, {"daily_cap": 20}).daily_cap == 20
    app.campaign_controls.pause(cid)  # frees the planned sends: now the gap may change
    assert app.senders.update(anna.id, {"min_gap_seconds": 600}).min_gap_seconds == 600


def test_a_re_plan_that_loses_to_a_send_leaves_the_booking_where_the_email_went() -> None:
    clock = FakeClock(START)
    mailer = RecordingMailer()
    app = _app(clock, mailer)
    anna = app.senders.add(email="anna@example.com", daily_cap=3)
    cid = _campaign(app, 3, [anna.id])
    campaign = app.store.get_campaign(cid)
    task = _tasks(app, cid)[0]
    send = mailer.send

    def send_while_replanning(message: object) -> str:
        # The re-plan read the task as Pending and books it a new slot while it is being sent.
        mailer.send = send  # type: ignore[method-assign]
        out = send(message)  # type: ignore[arg-type]
        app.capacity.place(campaign, [task], not_before=clock.now() + timedelta(hours=3), fixed=[])
        return out

    mailer.send = send_while_replanning  # type: ignore[method-assign]
    clock.set(task.send_at)
    app.invoke({"kind": "send", "task_id": task.id, "token": task.token})
    sent = app.store.get_task(task.id)
    booking = _store(app).booking_of(task.id)
    assert sent is not None and sent.state is TaskState.FINISHED
    assert booking is not None and booking.at == sent.send_at
    today = app.senders.usage(anna.id)[0]
    assert (today.planned, today.sent) == (2, 1)


def test_the_preview_names_each_sends_planned_sender() -> None:
    clock = FakeClock(START)
    app = _app(clock)
    anna = app.senders.add(email="anna@example.com", name="Doe, Anna", daily_cap=50)
    ben = app.senders.add(email="ben@example.com", daily_cap=50)
    draft = app.campaign_import.create(
        name="d", recipients=csv_bytes(4, prefix="d"), policy=BERLIN_POLICY,
        senders=[anna.id, ben.id], from_addr="Sales <sales@example.com>",
    ).campaign.id  # fmt: skip
    plain = app.campaign_import.create(
        name="p", recipients=csv_bytes(2, prefix="p"), policy=BERLIN_POLICY,
        from_addr="Sales <sales@example.com>",
    ).campaign.id  # fmt: skip

    summary = app.campaign_previews.preview_summary(draft)

    assert Counter(summary.first_senders) == {
        "Doe, Anna <anna@example.com>": 2,
        "ben@example.com": 2,
    }
    assert app.provisioner.provision(draft).status == "done"
    planned = {t.email: t.sender for t in _tasks(app, draft)}
    for email, sender in zip(summary.emails, summary.first_senders, strict=True):
        assert sender.endswith(f"{planned[email]}>") or sender == planned[email]
    assert (
        app.campaign_previews.preview_summary(plain).first_senders
        == ("Sales <sales@example.com>",) * 2
    )
