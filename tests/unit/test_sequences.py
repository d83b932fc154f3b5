"""Sequences on fakes and a fake clock: later steps made when the step before is sent, due
after their delay, in the thread, from the same sender, stopped by any answer."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import pytest

from sendqueue.bootstrap import Container
from sendqueue.domain.errors import InvalidField, StoreUnavailable
from sendqueue.domain.feedback import Feedback, FeedbackKind
from sendqueue.domain.lifecycle import CampaignState, TaskOutcome, TaskState
from sendqueue.domain.models import Task, task_id
from sendqueue.domain.policy import SendingPolicy, Window
from sendqueue.domain.steps import Step, parse_delay
from sendqueue.ports import OutgoingMessage
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.testing.scheduler import FakeScheduler
from tests.support.app import T0, fake_app, open_policy

ROWS = b"email,name,city\na@example.com,Ann,Oslo\nb@example.com,Ben,Rome\n"

STEPS = (
    Step(1, "Hello {{ name }}", "Dear {{ name }}\n", None, None),
    Step(2, None, "Any thoughts, {{ name }}?\n", None, parse_delay("1d")),
    Step(3, "Last note from {{ city }}", "Bye\n", "<p>Bye</p>", parse_delay("2h")),
)


def _create(
    app: Container,
    steps: tuple[Step, ...] = STEPS,
    *,
    policy: SendingPolicy | None = None,
    senders: Sequence[str] = (),
) -> str:
    created = app.campaign_import.create(
        name="seq",
        recipients=ROWS,
        policy=policy or open_policy(),
        from_addr="n@example.com",
        steps=steps,
        senders=senders,
    )
    cid = created.campaign.id
    assert app.provisioner.provision(cid).status == "done"
    return cid


def _fire(app: Container) -> int:
    scheduler = app.scheduler
    assert isinstance(scheduler, FakeScheduler)
    return scheduler.fire_due(app.invoke)


def _task(app: Container, cid: str, position: int, step: int) -> Task | None:
    return app.store.get_task(task_id(cid, position, step))


def _sent(app: Container) -> list[OutgoingMessage]:
    mailer = app.mailer
    assert isinstance(mailer, RecordingMailer)
    return list(mailer.sent)


def test_a_three_step_sequence_goes_out_in_order_in_one_thread() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _create(app)
    assert app.store.get_campaign(cid).steps == STEPS
    assert _task(app, cid, 0, 2) is None  # later steps are made when the one before is sent

    clock.advance(hours=1)
    assert _fire(app) == 2
    first = _task(app, cid, 0, 1)
    second = _task(app, cid, 0, 2)
    assert first is not None and second is not None and first.sent_at is not None
    assert second.state is TaskState.PENDING and second.step == 2
    # "1d": the first window of the next sending day (every day, all day, in UTC)
    next_day = (first.sent_at + timedelta(days=1)).replace(hour=0, minute=0, second=0)
    assert second.send_at >= next_day.replace(microsecond=0)
    assert second.send_at < next_day + timedelta(hours=1)
    assert (second.subject, second.text) == ("Re: Hello Ann", "Any thoughts, Ann?\n")
    assert app.store.get_campaign(cid).state is CampaignState.ACTIVE

    clock.advance(days=1)
    assert _fire(app) == 2
    mail = [m for m in _sent(app) if m.to_addr == "a@example.com"]
    assert mail[1].headers["In-Reply-To"] == first.message_id
    assert mail[1].headers["References"] == first.message_id
    assert "In-Reply-To" not in mail[0].headers
    second = _task(app, cid, 0, 2)
    third = _task(app, cid, 0, 3)
    assert second is not None and third is not None and second.sent_at is not None
    assert third.send_at >= second.sent_at + timedelta(hours=2)
    assert (third.subject, third.html) == ("Last note from Oslo", "<p>Bye</p>")

    clock.advance(hours=3)
    assert _fire(app) == 2
    mail = [m for m in _sent(app) if m.to_addr == "a@example.com"]
    assert mail[2].headers["References"] == f"{first.message_id} {second.message_id}"
    assert mail[2].headers["In-Reply-To"] == second.message_id
    assert app.store.get_campaign(cid).state is CampaignState.COMPLETED
    assert app.store.count_tasks(cid)[TaskState.FINISHED] == 6


def test_a_step_that_starts_a_new_thread_carries_no_reply_headers() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    steps = (STEPS[0], Step(2, "Fresh start", "Hi\n", None, parse_delay("30m"), new_thread=True))
    _create(app, steps)
    clock.advance(hours=1)
    _fire(app)
    clock.advance(hours=1)
    assert _fire(app) == 2
    later = [m for m in _sent(app) if m.subject == "Fresh start"]
    assert len(later) == 2
    assert all("In-Reply-To" not in m.headers for m in later)


def test_a_reply_stops_only_that_recipients_later_steps() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _create(app)
    clock.advance(hours=1)
    _fire(app)
    first = _task(app, cid, 0, 1)
    assert first is not None
    app.feedback.apply(Feedback(FeedbackKind.REPLY, clock.now(), task_id=first.id, detail="hi"))

    second = _task(app, cid, 0, 2)
    assert second is not None and second.state is TaskState.CANCELLED
    clock.advance(days=2)
    _fire(app)
    clock.advance(days=1)
    _fire(app)
    assert _task(app, cid, 0, 3) is None  # nothing made after an answer
    to_ann = [m for m in _sent(app) if m.to_addr == "a@example.com"]
    assert len(to_ann) == 1
    ben = [_task(app, cid, 1, k) for k in (1, 2, 3)]
    assert [t.state if t else None for t in ben] == [TaskState.FINISHED] * 3
    assert app.store.get_campaign(cid).state is CampaignState.COMPLETED


def test_an_answer_seen_only_at_the_send_stops_the_step_then() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _create(app)
    clock.advance(hours=1)
    _fire(app)
    first = _task(app, cid, 0, 1)
    assert first is not None
    # an outcome written without the feedback loop's cancel (a race with the step being made)
    app.store.set_outcome(first.id, TaskOutcome.BOUNCED, detail="5.1.1", at=clock.now())

    clock.advance(days=1)
    assert _fire(app) == 2
    second = _task(app, cid, 0, 2)
    assert second is not None and second.state is TaskState.CANCELLED
    assert second.reason == "step 1 bounced: the sequence stopped"
    assert [m.to_addr for m in _sent(app)].count("a@example.com") == 1


def test_making_a_step_twice_stores_it_once() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _create(app)
    clock.advance(hours=1)
    _fire(app)
    campaign = app.store.get_campaign(cid)
    first = _task(app, cid, 0, 1)
    made = _task(app, cid, 0, 2)
    assert first is not None and first.sent_at is not None and made is not None

    again = app.followups.after_sent(campaign, first, sent_at=first.sent_at)

    assert again == made
    assert len([t for t in app.store.list_tasks(cid, limit=100) if t.step == 2]) == 2


def test_a_template_that_fails_for_one_recipient_cancels_that_step_with_the_reason() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    rows = b"email,name,n\na@example.com,Ann,2\nb@example.com,Ben,0\n"
    steps = (STEPS[0], Step(2, None, "{{ 10 // (n | int) }}\n", None, parse_delay("1h")))
    cid = app.campaign_import.create(
        name="s", recipients=rows, policy=open_policy(), steps=steps
    ).campaign.id
    app.provisioner.provision(cid)
    clock.advance(hours=1)
    _fire(app)

    ben = _task(app, cid, 1, 2)
    assert ben is not None and ben.state is TaskState.CANCELLED
    assert ben.reason is not None and ben.reason.startswith("step 2: template failed")
    ann = _task(app, cid, 0, 2)
    assert ann is not None and ann.state is TaskState.PENDING and ann.text == "5\n"


def test_a_sequence_with_senders_keeps_step_ones_sender() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    ids = [app.senders.add(email=f"s{n}@example.com", daily_cap=50).id for n in range(2)]
    policy = SendingPolicy(
        timezone="UTC", per_day=100, weekdays=frozenset(range(5)), windows=(Window(480, 1020),)
    )
    cid = _create(app, senders=ids, policy=policy)
    clock.advance(hours=1)
    assert _fire(app) == 2
    for position in (0, 1):
        first, second = _task(app, cid, position, 1), _task(app, cid, position, 2)
        assert first is not None and second is not None
        assert (second.sender_id, second.sender) == (first.sender_id, first.sender)
        # a Tuesday: "1d" is Wednesday, inside its 08:00-17:00 window
        assert second.send_at.date() == (T0 + timedelta(days=1)).date()
        assert 8 <= second.send_at.hour < 17


@pytest.mark.parametrize(
    ("steps", "templates", "field"),
    [
        (STEPS, {"subject": "x", "body": "y"}, "steps"),
        ((STEPS[0], Step(2, None, "{{ missing }}\n", None, parse_delay("1d"))), {}, "steps[2]"),
        ((STEPS[0], Step(2, "{{ 1 / 0 }}", "t\n", None, parse_delay("1d"))), {}, "steps[2]"),
        ((STEPS[1],), {}, "steps[1].number"),
    ],
)
def test_bad_steps_are_refused_naming_the_step_and_nothing_is_stored(
    steps: tuple[Step, ...], templates: dict[str, str], field: str
) -> None:
    from sendqueue.services.importing.recipients import Templates

    app = fake_app()
    with pytest.raises(InvalidField) as info:
        app.campaign_import.create(
            name="x",
            recipients=ROWS,
            policy=open_policy(),
            steps=steps,
            templates=Templates(**templates) if templates else None,
        )
    assert info.value.field == field
    assert app.store.list_campaigns() == []


def test_a_step_not_made_at_the_send_is_made_by_the_reconciler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _create(app)

    def down(*args: object, **kwargs: object) -> None:
        raise StoreUnavailable("the store went away")

    with monkeypatch.context() as patched:
        patched.setattr(app.followups, "make_due", down)
        clock.advance(hours=1)
        assert _fire(app) == 2
    assert _task(app, cid, 0, 2) is None
    assert len(app.store.follow_ups_due(cid)) == 2  # the sends' marks stay for a later pass
    # the sends are recorded, and the campaign is not done while its sequences are not
    assert app.store.count_tasks(cid)[TaskState.FINISHED] == 2
    assert app.store.get_campaign(cid).state is CampaignState.ACTIVE

    # the reconciler leaves a fresh mark to the worker making it; a later pass makes it
    assert app.reconciler.run().follow_ups_made == 0
    clock.advance(minutes=6)
    report = app.reconciler.run()

    assert report.follow_ups_made == 2
    made = _task(app, cid, 0, 2)
    first = _task(app, cid, 0, 1)
    assert made is not None and first is not None and first.sent_at is not None
    assert made.state is TaskState.PENDING and made.send_at >= first.sent_at + timedelta(hours=8)
    assert app.reconciler.run().follow_ups_made == 0  # made once
    clock.advance(days=1)
    assert _fire(app) == 2


def test_a_campaign_completed_without_a_next_step_is_reopened_with_it() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _create(app, (STEPS[0], STEPS[1]))
    campaign = app.store.get_campaign(cid)

    # as if both sends' next steps were lost without a mark (sent before marks existed) and
    # a completion check ran in between
    def lose(campaign_id: str, **kw: object) -> int:
        return app.store.follow_ups_made(campaign_id, [t.id for t in app.store.follow_ups_due(cid)])

    app.followups.make_due = lose  # type: ignore[method-assign]
    app.followups.after_sent = lambda *a, **k: None  # type: ignore[method-assign]
    clock.advance(hours=1)
    _fire(app)
    assert app.store.get_campaign(cid).state is CampaignState.COMPLETED
    del app.followups.after_sent, app.followups.make_due

    report = app.reconciler.run()

    assert report.follow_ups_made == 2 and report.campaigns_reopened == 1
    assert app.store.get_campaign(cid).state is CampaignState.ACTIVE
    assert campaign.steps == app.store.get_campaign(cid).steps


def test_a_later_steps_email_is_signed_like_step_ones() -> None:
    from sendqueue.domain.feedback import signed_task_of_message_id
    from sendqueue.domain.models import step_of
    from sendqueue.domain.tokens import TokenPurpose, verify_task, verp_task

    secret = "Zq8v2Lk9Wm4Tn7Rb1Xc6Yd3Fg5Hj0Ps8Ua2Ve"
    clock = FakeClock(T0)
    app = fake_app(
        clock=clock,
        secret_key=secret,
        bounce_address="bounces@example.com",
        public_url="https://q.example.com",
    )
    cid = _create(app, (STEPS[0], STEPS[1]))
    clock.advance(hours=1)
    _fire(app)
    clock.advance(days=1)
    _fire(app)
    later = [m for m in _sent(app) if m.subject.startswith("Re:")]
    assert len(later) == 2
    for message in later:
        tid = message.headers["X-Sendqueue-Task"]
        assert step_of(tid) == 2 and tid.startswith(f"{cid}-")
        assert message.envelope_from is not None
        assert verp_task(message.envelope_from, "bounces@example.com", secret) == tid
        assert signed_task_of_message_id(message.message_id, secret) == tid
        assert "List-Unsubscribe" in message.headers
        token = message.headers["List-Unsubscribe"].split("/")[-1].strip(">")
        assert verify_task(token, secret, TokenPurpose.UNSUBSCRIBE) == tid


def test_pause_resume_and_a_catch_up_never_bring_a_later_step_forward() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    rows = b"email,name\n" + b"".join(b"r%d@example.com,R%d\n" % (i, i) for i in range(6))
    cid = app.campaign_import.create(
        name="s",
        recipients=rows,
        policy=open_policy(per_day=4),  # 4 a day: some first steps wait for later days
        steps=(STEPS[0], STEPS[1]),
    ).campaign.id
    app.provisioner.provision(cid)
    clock.advance(hours=12)
    _fire(app)
    followups = [t for t in app.store.list_tasks(cid, limit=100) if t.step == 2]
    assert followups and all(t.state is TaskState.PENDING for t in followups)
    due = {t.id: t.send_at for t in followups}

    app.campaign_controls.pause(cid)
    clock.advance(hours=2)
    app.campaign_controls.resume(cid)
    app.recovery.catch_up(cid, since=T0)

    for task in app.store.get_tasks(list(due)).values():
        assert task.send_at == due[task.id]  # still ahead: kept where its delay put it
    names = {s.name for s in app.scheduler.list(f"sq-{cid}")}
    assert all(any(n.startswith(f"sq-{tid}.") for n in names) for tid in due)


def test_a_campaign_is_not_completed_while_a_lost_step_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _create(app, (STEPS[0], STEPS[1]))
    made = app.followups.make_due

    def lost_for_ben(campaign_id: str, *, now: datetime) -> int:
        if any(t.position == 1 for t in app.store.follow_ups_due(campaign_id)):
            raise StoreUnavailable("the store went away")
        return made(campaign_id, now=now)

    with monkeypatch.context() as patched:
        patched.setattr(app.followups, "make_due", lost_for_ben)
        clock.advance(hours=1)
        assert _fire(app) == 2
    assert _task(app, cid, 1, 2) is None

    # Ann's last step goes out with no reconciler pass in between: Ben's step is made then
    clock.advance(days=1)
    assert _fire(app) == 1
    assert app.store.get_campaign(cid).state is CampaignState.ACTIVE
    ben = _task(app, cid, 1, 2)
    assert ben is not None and ben.state is TaskState.PENDING
    clock.advance(days=1)
    assert _fire(app) == 1
    assert app.store.get_campaign(cid).state is CampaignState.COMPLETED
    assert len(_sent(app)) == 4


@pytest.mark.parametrize("senders", [0, 1])
def test_a_resume_keeps_a_later_step_waiting_for_its_delay(senders: int) -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    ids = [app.senders.add(email=f"s{n}@example.com", daily_cap=50).id for n in range(senders)]
    cid = _create(app, (STEPS[0], STEPS[1]), senders=ids)
    clock.advance(hours=1)
    assert _fire(app) == 2
    first = _task(app, cid, 0, 1)
    assert first is not None and first.sent_at is not None
    next_day = (first.sent_at + timedelta(days=1)).replace(hour=0, minute=0, second=0)

    app.campaign_controls.pause(cid)
    app.campaign_controls.resume(cid)  # re-plans the Pending emails from now

    for position in (0, 1):
        later = _task(app, cid, position, 2)
        assert later is not None and later.state is TaskState.PENDING
        assert later.send_at >= next_day.replace(microsecond=0)
    assert _fire(app) == 0
    clock.advance(days=1)
    assert _fire(app) == 2


def test_an_answer_does_not_complete_a_campaign_while_a_lost_step_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _create(app, (STEPS[0], STEPS[1]))
    made = app.followups.make_due

    def lost_for_ben(campaign_id: str, *, now: datetime) -> int:
        if any(t.position == 1 for t in app.store.follow_ups_due(campaign_id)):
            raise StoreUnavailable("the store went away")
        return made(campaign_id, now=now)

    with monkeypatch.context() as patched:
        patched.setattr(app.followups, "make_due", lost_for_ben)
        clock.advance(hours=1)
        assert _fire(app) == 2
    first = _task(app, cid, 0, 1)
    assert first is not None

    # Ann's reply cancels her last Pending email: Ben's mark keeps the campaign open, and the
    # reconciler's next pass makes his step
    app.feedback.apply(Feedback(FeedbackKind.REPLY, clock.now(), task_id=first.id, detail="hi"))

    assert app.store.get_campaign(cid).state is CampaignState.ACTIVE
    assert _task(app, cid, 1, 2) is None
    clock.advance(minutes=6)  # the reconciler's next pass: the mark is no longer fresh
    assert app.reconciler.run().follow_ups_made == 1
    ben = _task(app, cid, 1, 2)
    assert ben is not None and ben.state is TaskState.PENDING
    clock.advance(days=2)
    assert _fire(app) == 1
    assert app.store.get_campaign(cid).state is CampaignState.COMPLETED
