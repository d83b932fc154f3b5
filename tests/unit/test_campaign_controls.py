"""Campaign controls: pause/resume/cancel/retry-failed, cancel one (creating a campaign:
test_campaign_import.py; its preview: test_campaign_previews.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sendqueue.bootstrap import Container
from sendqueue.domain.errors import IllegalTransition, NotFound, PermanentMailError
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import expected_schedule_name, schedule_group
from sendqueue.domain.policy import SendingPolicy
from sendqueue.ports import OutgoingMessage
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.testing.scheduler import FakeScheduler
from tests.support.app import T0, csv_bytes, fake_app, open_policy


def _active(app: Container, count: int = 6, per_day: int = 10_000) -> str:
    cid = app.campaign_import.create(
        name="c", recipients=csv_bytes(count), policy=open_policy(per_day=per_day)
    ).campaign.id
    app.provisioner.provision(cid)
    return cid


def _schedule_names(app: Container, cid: str) -> set[str]:
    return {s.name for s in app.scheduler.list(schedule_group(cid))}


def test_pause_deletes_schedules_and_resume_replans_from_now() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _active(app, 6)
    app.campaign_controls.pause(cid)
    assert app.store.get_campaign(cid).state is CampaignState.PAUSED
    assert _schedule_names(app, cid) == set()
    clock.advance(days=3)
    assert isinstance(app.scheduler, FakeScheduler)
    assert app.scheduler.fire_due(app.invoke) == 0
    app.campaign_controls.resume(cid)
    tasks = app.store.list_tasks(cid)
    assert all(t.state is TaskState.PENDING and t.send_at >= clock.now() for t in tasks)
    assert _schedule_names(app, cid) == {expected_schedule_name(t) for t in tasks}
    app.scheduler.run_until(clock, app.invoke, clock.now() + timedelta(hours=1))
    assert app.store.count_tasks(cid)[TaskState.FINISHED] == 6
    moved = app.store.list_tasks(cid)
    # the reason names the pause: from the pause (T0) to the resume, in UTC
    paused = "paused 2026-12-01 08:00\u20132026-12-04 08:00 UTC"
    assert {(t.moves, t.moved_reason) for t in moved} == {(1, paused)}
    assert all(t.planned_at is not None and t.planned_at < t.send_at for t in moved)


def test_stale_schedule_after_resume_is_skipped_by_token() -> None:
    clock = FakeClock(T0)
    mailer = RecordingMailer()
    app = fake_app(clock=clock, mailer=mailer)
    cid = _active(app, 1)
    (before,) = app.store.list_tasks(cid)
    app.campaign_controls.pause(cid)
    clock.advance(hours=2)
    app.campaign_controls.resume(cid)
    (after,) = app.store.list_tasks(cid)
    assert after.token != before.token
    assert after.send_at >= clock.now() > before.send_at
    app.worker.send({"kind": "send", "task_id": before.id, "token": before.token})
    assert mailer.sent == []


def test_cancel_cancels_pending_and_deletes_schedules() -> None:
    app = fake_app()
    cid = _active(app, 5)
    app.campaign_controls.cancel(cid)
    assert app.store.get_campaign(cid).state is CampaignState.CANCELLED
    assert app.store.count_tasks(cid)[TaskState.CANCELLED] == 5
    assert _schedule_names(app, cid) == set()
    with pytest.raises(IllegalTransition):
        app.campaign_controls.resume(cid)
    with pytest.raises(IllegalTransition):
        app.campaign_controls.cancel(cid)


def test_illegal_controls_are_refused_and_change_nothing() -> None:
    app = fake_app()
    cid = app.campaign_import.create(
        name="d", recipients=csv_bytes(2), policy=SendingPolicy()
    ).campaign.id
    with pytest.raises(IllegalTransition):
        app.campaign_controls.pause(cid)
    with pytest.raises(IllegalTransition):
        app.campaign_controls.resume(cid)
    with pytest.raises(IllegalTransition):
        app.campaign_controls.retry_failed(cid)
    with pytest.raises(NotFound):
        app.campaign_controls.pause("c000000000000")
    assert app.store.get_campaign(cid).state is CampaignState.DRAFT


def test_retry_failed_resends_only_failed_and_reactivates_a_completed_campaign() -> None:
    clock = FakeClock(T0)
    mailer = RecordingMailer()
    app = fake_app(clock=clock, mailer=mailer, auto_pause_after=0)
    cid = _active(app, 4)

    def refuse_user1(message: OutgoingMessage) -> None:
        if message.to_addr.startswith("user1"):
            raise PermanentMailError("550 no such user")

    mailer.on_send = refuse_user1
    clock.advance(hours=1)
    assert isinstance(app.scheduler, FakeScheduler)
    app.scheduler.fire_due(app.invoke)
    assert app.store.get_campaign(cid).state is CampaignState.COMPLETED
    assert app.store.count_tasks(cid)[TaskState.FAILED] == 1
    mailer.on_send = None
    assert app.campaign_controls.retry_failed(cid) == 1
    assert app.store.get_campaign(cid).state is CampaignState.ACTIVE
    (retried,) = app.store.list_tasks(cid, state=TaskState.PENDING)
    assert (retried.attempts, retried.error) == (0, None)
    assert retried.send_at >= clock.now()
    clock.advance(hours=1)
    app.scheduler.fire_due(app.invoke)
    assert app.store.count_tasks(cid)[TaskState.FINISHED] == 4
    assert len(mailer.sent) == 4
    assert app.store.get_campaign(cid).state is CampaignState.COMPLETED


def test_cancel_one_task() -> None:
    app = fake_app()
    cid = _active(app, 3)
    first = app.store.list_tasks(cid)[0]
    done = app.campaign_controls.cancel_task(first.id)
    assert done.state is TaskState.CANCELLED
    assert expected_schedule_name(first) not in _schedule_names(app, cid)
    with pytest.raises(IllegalTransition):
        app.campaign_controls.cancel_task(first.id)
    with pytest.raises(NotFound):
        app.campaign_controls.cancel_task("nope-0")


def test_per_day_is_respected_after_resume() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _active(app, 9, per_day=3)
    app.campaign_controls.pause(cid)
    clock.advance(days=1, hours=12)
    app.campaign_controls.resume(cid)
    days = [t.send_at.date() for t in app.store.list_tasks(cid)]
    assert max(days.count(d) for d in set(days)) <= 3
    assert min(t.send_at for t in app.store.list_tasks(cid)) >= clock.now() - timedelta(0)
