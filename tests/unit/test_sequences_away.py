"""Out-of-office notices on fakes and a fake clock: an auto-reply never stops a sequence, and
the return date it names holds the recipient's next step back until then, whether that step
was made already (it moves) or not yet (it is made no earlier)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from sendqueue.bootstrap import Container
from sendqueue.domain.feedback import Feedback, FeedbackKind, Proof
from sendqueue.domain.lifecycle import CampaignState, TaskOutcome, TaskState
from sendqueue.domain.models import Task, task_id
from sendqueue.domain.policy import SendingPolicy, Window
from sendqueue.domain.reports import parse_feedback
from sendqueue.domain.steps import Step, parse_delay
from sendqueue.services.sequences.away import away_reason
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.scheduler import FakeScheduler
from tests.support.app import T0, fake_app

ROWS = b"email,name\na@example.com,Ann\nb@example.com,Ben\n"
STEPS = (
    Step(1, "Hello {{ name }}", "Dear {{ name }}\n", None, None),
    Step(2, None, "Any thoughts?\n", None, parse_delay("1d")),
    Step(3, None, "Last note\n", None, parse_delay("1d")),
)
#: Mon-Fri, 09:00-17:00 UTC.
POLICY = SendingPolicy(
    timezone="UTC", per_day=50, weekdays=frozenset(range(5)), windows=(Window(540, 1020),)
)
#: The first window on or after 14 December 2026 (a Monday).
BACK = datetime(2026, 12, 14, 9, 0, tzinfo=UTC)
SECRET = "away-tests-secret-0123456789abcdef0123"


def _app(clock: FakeClock, *, with_sender: bool = False) -> tuple[Container, str]:
    app = fake_app(clock=clock, secret_key=SECRET)
    senders = [app.senders.add(email="s@example.com", daily_cap=20).id] if with_sender else []
    cid = app.campaign_import.create(
        name="seq", recipients=ROWS, policy=POLICY, from_addr="n@example.com", steps=STEPS,
        senders=senders,
    ).campaign.id  # fmt: skip
    assert app.provisioner.provision(cid).status == "done"
    return app, cid


def _fire(app: Container, clock: FakeClock, hours: int) -> None:
    scheduler = app.scheduler
    assert isinstance(scheduler, FakeScheduler)
    for _ in range(hours * 12):
        clock.advance(minutes=5)
        scheduler.fire_due(app.invoke)


def _task(app: Container, cid: str, position: int, step: int) -> Task:
    task = app.store.get_task(task_id(cid, position, step))
    assert task is not None
    return task


def _out_of_office(task: Task, body: str) -> bytes:
    """An Exchange-style notice answering ``task``'s email (its signed Message-ID)."""
    return (
        f"From: Ann <{task.email}>\r\nTo: n@example.com\r\n"
        f"Subject: Automatic reply: {task.subject}\r\nAuto-Submitted: auto-replied\r\n"
        f"X-Auto-Response-Suppress: All\r\nReturn-Path: <>\r\n"
        f"In-Reply-To: {task.message_id}\r\nReferences: {task.message_id}\r\n"
        f"Message-ID: <oof.1@example.com>\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n"
        f"{body}\r\n"
    ).encode()


@pytest.mark.parametrize("with_sender", [False, True])
def test_an_out_of_office_reply_moves_the_next_step_to_the_return_date_and_stops_nothing(
    with_sender: bool,
) -> None:
    clock = FakeClock(T0)  # Tuesday 1 December, 08:00
    app, cid = _app(clock, with_sender=with_sender)
    _fire(app, clock, 4)
    first = _task(app, cid, 0, 1)
    assert first.state is TaskState.FINISHED and first.message_id
    before = _task(app, cid, 0, 2)
    assert before.state is TaskState.PENDING and before.send_at < BACK

    raw = _out_of_office(first, "I am out of the office until Monday 14.12.2026.")
    (item,) = parse_feedback(raw, received_at=clock.now(), secret=SECRET)
    assert (item.kind, item.detail, item.proof) == (
        FeedbackKind.AUTO_REPLY,
        "2026-12-14",
        Proof.SIGNED,
    )
    applied = app.feedback.apply(item)
    assert applied.ignored is None and applied.cancelled == ()
    assert applied.moved == (before.id,)

    second = _task(app, cid, 0, 2)
    assert second.state is TaskState.PENDING
    assert BACK <= second.send_at < BACK.replace(hour=17)
    assert second.moved_reason == away_reason(BACK.date())
    if with_sender:  # its booking moved with it
        booking = app.stores.senders.booking_of(second.id)
        assert booking is not None and booking.at == second.send_at
    first = _task(app, cid, 0, 1)
    assert first.outcome is TaskOutcome.ACCEPTED  # not "replied": the sequence goes on
    assert _task(app, cid, 1, 2).send_at < BACK  # Ben's sequence is his own

    _fire(app, clock, 24 * 14)
    second = _task(app, cid, 0, 2)
    assert second.state is TaskState.FINISHED and second.sent_at is not None
    assert second.sent_at >= BACK
    third = _task(app, cid, 0, 3)
    assert third.state is TaskState.FINISHED  # and the sequence went on to its end
    assert app.store.get_campaign(cid).state is CampaignState.COMPLETED


def test_a_step_not_made_yet_is_made_no_earlier_than_the_return_date() -> None:
    clock = FakeClock(T0)
    app, cid = _app(clock)
    first = _task(app, cid, 0, 1)
    assert first.state is TaskState.PENDING
    # a notice already known when step 1 goes out (an auto-reply to an earlier campaign's
    # email of the same recipient, applied by a caller as trusted)
    notice = Feedback(FeedbackKind.AUTO_REPLY, clock.now(), first.id, first.email, "2026-12-14")
    applied = app.feedback.apply(notice)
    assert applied.ignored is None and applied.moved == ()
    assert app.store.away_until(cid, 0) == BACK.date()

    _fire(app, clock, 4)
    second = _task(app, cid, 0, 2)
    assert second.state is TaskState.PENDING
    assert BACK <= second.send_at < BACK.replace(hour=17)
    assert _task(app, cid, 1, 2).send_at < BACK


def test_an_out_of_office_reply_without_a_date_changes_nothing() -> None:
    clock = FakeClock(T0)
    app, cid = _app(clock)
    _fire(app, clock, 4)
    first = _task(app, cid, 0, 1)
    raw = _out_of_office(first, "I am out of the office with limited access to email.")
    assert parse_feedback(raw, received_at=clock.now(), secret=SECRET) == []
    assert app.store.away_until(cid, 0) is None


def test_an_auto_reply_that_proves_nothing_moves_nothing() -> None:
    clock = FakeClock(T0)
    app, cid = _app(clock)
    _fire(app, clock, 4)
    second = _task(app, cid, 0, 2)
    forged = Feedback(
        FeedbackKind.AUTO_REPLY, clock.now(), None, "a@example.com", "2026-12-14",
        proof=Proof.NONE,
    )  # fmt: skip
    applied = app.feedback.apply(forged)
    assert applied.ignored is not None and applied.moved == ()
    assert _task(app, cid, 0, 2).send_at == second.send_at
    assert app.store.away_until(cid, 0) is None
