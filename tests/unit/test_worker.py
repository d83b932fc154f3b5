"""The send worker's rules (its module docstring), on fakes and a fake clock."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from sendqueue.bootstrap import Container
from sendqueue.domain.errors import PermanentMailError, StoreUnavailable, TransientMailError
from sendqueue.domain.lifecycle import CampaignState, TaskOutcome, TaskState
from sendqueue.domain.models import Task, expected_schedule_name, schedule_group
from sendqueue.domain.policy import SendingPolicy
from sendqueue.domain.tokens import verp_address, verp_task
from sendqueue.services.scheduling.schedules import send_payload
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.testing.scheduler import FakeScheduler
from sendqueue.testing.store import InMemoryTaskStore
from tests.support.app import T0, csv_bytes, fake_app, open_policy


def _provisioned(app: Container, count: int = 3) -> str:
    created = app.campaign_import.create(
        name="t",
        recipients=csv_bytes(count),
        policy=open_policy(),
        from_addr="News <n@example.com>",
    )
    report = app.provisioner.provision(created.campaign.id)
    assert report.status == "done"
    return created.campaign.id


def _tasks(app: Container, cid: str) -> list[Task]:
    return app.store.list_tasks(cid, limit=1000)


def _fire_all(app: Container) -> int:
    scheduler = app.scheduler
    assert isinstance(scheduler, FakeScheduler)
    return scheduler.fire_due(app.invoke)


def test_due_tasks_are_sent_once_and_finished_with_sent_at_and_message_id() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _provisioned(app)
    clock.advance(hours=1)
    assert _fire_all(app) == 3
    mailer = app.mailer
    assert isinstance(mailer, RecordingMailer)
    assert sorted(m.to_addr for m in mailer.sent) == [f"user{i}@example.com" for i in range(3)]
    for task in _tasks(app, cid):
        assert task.state is TaskState.FINISHED
        assert task.sent_at == clock.now()
        assert task.message_id == f"<{task.id}@example.com>"
        assert task.attempts == 1
        # Sent means accepted, as of the send, until feedback says otherwise.
        assert (task.outcome, task.outcome_detail) == (TaskOutcome.ACCEPTED, None)
        assert task.outcome_at == task.sent_at
    assert app.store.get_campaign(cid).state is CampaignState.COMPLETED
    finished = [e for e in app.store.changes_after(0, limit=1000) if e.to_state == "Finished"]
    # One entry per send: the outcome rides on the Finished transition, not a second write.
    assert len(finished) == 3
    store = app.store
    assert isinstance(store, InMemoryTaskStore)
    assert store.count_outcomes(cid) == {TaskOutcome.ACCEPTED: 3}
    assert app.scheduler.list(schedule_group(cid)) == []


def test_message_carries_campaign_sender_and_snapshot() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _provisioned(app, 1)
    clock.advance(hours=1)
    _fire_all(app)
    (message,) = app.mailer.sent  # type: ignore[attr-defined]
    task = _tasks(app, cid)[0]
    assert (message.from_name, message.from_addr) == ("News", "n@example.com")
    assert (message.to_addr, message.to_name, message.subject, message.text) == (
        "user0@example.com",
        "User 0",
        "Hello 0",
        "Body 0",
    )
    assert message.message_id == task.message_id


def test_with_a_bounce_address_each_email_has_its_task_s_verp_envelope_sender() -> None:
    clock = FakeClock(T0)
    secret = "s" * 16 + "0123456789abcdef"
    app = fake_app(clock=clock, bounce_address="bounces@mail.example.com", secret_key=secret)
    cid = _provisioned(app, 2)
    clock.advance(hours=1)
    _fire_all(app)
    sent = sorted(app.mailer.sent, key=lambda m: m.to_addr)  # type: ignore[attr-defined]
    for message, task in zip(sent, _tasks(app, cid), strict=True):
        assert message.envelope_from == verp_address("bounces@mail.example.com", task.id, secret)
        assert verp_task(message.envelope_from, "bounces@mail.example.com", secret) == task.id
        assert (message.from_name, message.from_addr) == ("News", "n@example.com")
    # without one, the From is the envelope sender
    plain = fake_app(clock=clock)
    _provisioned(plain, 1)
    clock.advance(hours=1)
    _fire_all(plain)
    assert [m.envelope_from for m in plain.mailer.sent] == [None]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "final", [TaskState.FINISHED, TaskState.CANCELLED, TaskState.FAILED, TaskState.RUNNING]
)
def test_tasks_not_pending_are_skipped_without_raising(final: TaskState) -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _provisioned(app, 1)
    task = _tasks(app, cid)[0]
    path = {
        TaskState.RUNNING: [TaskState.RUNNING],
        TaskState.FINISHED: [TaskState.RUNNING, TaskState.FINISHED],
        TaskState.FAILED: [TaskState.RUNNING, TaskState.FAILED],
        TaskState.CANCELLED: [TaskState.CANCELLED],
    }[final]
    current = TaskState.PENDING
    for nxt in path:
        assert app.store.transition(task.id, current, nxt, at=clock.now())
        current = nxt
    app.worker.send(send_payload(task))  # must not raise
    assert app.mailer.sent == []  # type: ignore[attr-defined]
    assert app.store.get_task(task.id).state is final  # type: ignore[union-attr]


def test_an_invocation_before_the_send_time_is_skipped() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _provisioned(app, 1)
    task = _tasks(app, cid)[0]
    app.worker.send(send_payload(task))  # a stray fire, well before send_at
    assert app.mailer.sent == []  # type: ignore[attr-defined]
    assert app.scheduler.get(expected_schedule_name(task)) is not None
    clock.set(task.send_at - timedelta(milliseconds=500))  # within the clock-skew tolerance
    app.worker.send(send_payload(task))
    assert len(app.mailer.sent) == 1  # type: ignore[attr-defined]


def test_stale_token_and_unknown_task_are_skipped() -> None:
    app = fake_app()
    cid = _provisioned(app, 1)
    task = _tasks(app, cid)[0]
    app.worker.send({"kind": "send", "task_id": task.id, "token": "not-the-token"})
    app.worker.send({"kind": "send", "task_id": "nope-1", "token": "x"})
    assert app.mailer.sent == []  # type: ignore[attr-defined]
    assert app.store.get_task(task.id).state is TaskState.PENDING  # type: ignore[union-attr]


def test_two_concurrent_invocations_send_one_email() -> None:
    gate = threading.Event()

    def hold(_m: object) -> None:
        gate.wait(5)

    mailer = RecordingMailer(on_send=hold)
    clock = FakeClock(T0)
    app = fake_app(clock=clock, mailer=mailer)
    cid = _provisioned(app, 1)
    task = _tasks(app, cid)[0]
    clock.advance(hours=1)
    threads = [
        threading.Thread(target=app.worker.send, args=(send_payload(task),)) for _ in range(2)
    ]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join(10)
    assert len(mailer.sent) == 1
    assert app.store.get_task(task.id).state is TaskState.FINISHED  # type: ignore[union-attr]


def test_permanent_error_fails_the_task_with_the_error() -> None:
    clock = FakeClock(T0)
    mailer = RecordingMailer()
    app = fake_app(clock=clock, mailer=mailer)
    cid = _provisioned(app, 1)
    mailer.fail_next(PermanentMailError("550 5.1.1 no such user"))
    clock.advance(hours=1)
    _fire_all(app)
    task = _tasks(app, cid)[0]
    assert task.state is TaskState.FAILED
    assert "550 5.1.1 no such user" in (task.error or "")
    assert app.store.get_campaign(cid).state is CampaignState.COMPLETED


def test_transient_error_retries_with_backoff_then_fails_after_max_attempts() -> None:
    clock = FakeClock(T0)
    mailer = RecordingMailer()
    app = fake_app(clock=clock, mailer=mailer, max_attempts=3, retry_backoff=60)
    cid = _provisioned(app, 1)
    mailer.fail_next(*[TransientMailError("451 4.3.0 try later")] * 3)
    clock.advance(hours=1)
    _fire_all(app)
    task = _tasks(app, cid)[0]
    assert (task.state, task.attempts) == (TaskState.PENDING, 1)
    # the first free slot of the grid (every 8.64 s under open_policy) after the back-off
    spacing = timedelta(seconds=8.64)
    assert (
        clock.now() + timedelta(seconds=60)
        <= task.send_at
        < clock.now() + timedelta(seconds=60) + spacing
    )
    assert (task.moves, task.moved_reason) == (1, "transient: 451 4.3.0 try later")
    assert "451" in (task.error or "")
    # the retry has its own schedule, named for the next attempt
    assert app.scheduler.get(expected_schedule_name(task)) is not None
    clock.set(task.send_at - timedelta(milliseconds=1))
    assert _fire_all(app) == 0
    clock.set(task.send_at)
    assert _fire_all(app) == 1
    task = _tasks(app, cid)[0]
    assert (task.state, task.attempts) == (TaskState.PENDING, 2)
    after = clock.now() + timedelta(seconds=120)  # doubled
    assert after <= task.send_at < after + spacing
    clock.set(task.send_at)
    _fire_all(app)
    task = _tasks(app, cid)[0]
    assert (task.state, task.attempts) == (TaskState.FAILED, 3)
    assert "gave up after 3 attempts" in (task.error or "")
    assert mailer.sent == []
    assert app.scheduler.list(schedule_group(cid)) == []


def test_transient_then_success() -> None:
    clock = FakeClock(T0)
    mailer = RecordingMailer()
    app = fake_app(clock=clock, mailer=mailer)
    cid = _provisioned(app, 1)
    mailer.fail_next(TransientMailError("421 busy"))
    clock.advance(hours=1)
    _fire_all(app)
    clock.advance(minutes=5)
    _fire_all(app)
    task = _tasks(app, cid)[0]
    assert (task.state, task.attempts, task.error) == (TaskState.FINISHED, 2, None)
    assert len(mailer.sent) == 1


def test_auto_pause_after_failures_in_a_row() -> None:
    clock = FakeClock(T0)
    mailer = RecordingMailer()
    app = fake_app(clock=clock, mailer=mailer, auto_pause_after=5)
    cid = _provisioned(app, 8)
    mailer.fail_next(*[PermanentMailError("550 rejected")] * 8)
    clock.advance(hours=1)
    _fire_all(app)
    campaign = app.store.get_campaign(cid)
    assert campaign.state is CampaignState.PAUSED
    assert "auto-paused after 5" in (campaign.state_reason or "")
    counts = app.store.count_tasks(cid)
    assert counts[TaskState.FAILED] == 5
    assert counts[TaskState.PENDING] == 3
    assert app.scheduler.list(schedule_group(cid)) == []


def test_paused_campaign_is_not_sent_and_store_outage_raises() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _provisioned(app, 1)
    task = _tasks(app, cid)[0]
    app.store.set_campaign_state(cid, {CampaignState.ACTIVE}, CampaignState.PAUSED, at=clock.now())
    app.worker.send(send_payload(task))
    assert app.store.get_task(task.id).state is TaskState.PENDING  # type: ignore[union-attr]

    class DownStore:
        def get_task(self, _task_id: str) -> Task:
            raise StoreUnavailable("database is down")

        def task_and_suppression(self, _task_id: str) -> Task:
            raise StoreUnavailable("database is down")

        def claim_for_send(self, _task_id: str, **_kw: object) -> Task:
            raise StoreUnavailable("database is down")

    broken = fake_app(clock=clock, store=DownStore())  # type: ignore[arg-type]
    with pytest.raises(StoreUnavailable):
        broken.worker.send(send_payload(task))


def test_a_retry_due_after_the_window_waits_for_the_next_sending_day() -> None:
    # Berlin 09:00-17:00 Mon-Fri; the only send is at 16:59:30 on Friday 2026-12-04
    start = datetime(2026, 12, 4, 15, 59, 30, tzinfo=UTC)
    clock = FakeClock(start)
    mailer = RecordingMailer()
    app = fake_app(clock=clock, mailer=mailer, retry_backoff=60)
    cid = app.campaign_import.create(
        name="late", recipients=csv_bytes(1), policy=SendingPolicy(per_day=1, start=start)
    ).campaign.id
    app.provisioner.provision(cid)
    mailer.fail_next(TransientMailError("451 busy"))
    _fire_all(app)
    (task,) = app.store.list_tasks(cid)
    assert task.state is TaskState.PENDING
    # not 17:00:30 on Friday: 09:00 on Monday, Berlin time
    assert task.send_at == datetime(2026, 12, 7, 8, 0, tzinfo=UTC)


def test_a_claim_racing_a_cancel_ends_cancelled_not_pending() -> None:
    clock = FakeClock(T0)
    mailer = RecordingMailer()
    app = fake_app(clock=clock, mailer=mailer)
    cid = _provisioned(app, 1)
    (task,) = _tasks(app, cid)
    clock.advance(hours=1)
    real_claim = app.store.claim_for_send

    def cancel_missing_the_task(task_id: str, **kw):  # type: ignore[no-untyped-def]
        # The cancel lands as the claim is written, and its sweep of Pending tasks missed this
        # one (it was Running then, for an earlier attempt given back since): the campaign's
        # state is Cancelled, the task still Pending.
        app.store.set_campaign_state(
            cid, {CampaignState.ACTIVE}, CampaignState.CANCELLED, at=clock.now()
        )
        return real_claim(task_id, **kw)

    app.store.claim_for_send = cancel_missing_the_task  # type: ignore[method-assign]
    app.worker.send(send_payload(task))
    assert mailer.sent == []
    assert app.store.get_task(task.id).state is TaskState.CANCELLED  # type: ignore[union-attr]


def test_the_worker_keeps_nothing_for_campaigns_that_are_done() -> None:
    # A worker process lives through many campaigns: what it caches per campaign (the campaign
    # read, the failure streak) must go when the campaign has nothing left to send.
    clock = FakeClock(T0)
    mailer = RecordingMailer()
    app = fake_app(clock=clock, mailer=mailer, auto_pause_after=5)
    app.ZONES_CACHED = 5  # the container's timezone cache, made small
    cids = [_provisioned(app, 2) for _ in range(20)]
    # half the sends fail for good: some campaigns end on a failure streak (under the limit)
    mailer.fail_next(*[PermanentMailError("550 rejected")] * 20)
    clock.advance(hours=1)
    _fire_all(app)
    for cid in cids:
        assert app.store.get_campaign(cid).state is CampaignState.COMPLETED
    worker = app.worker
    assert worker._campaigns_seen == {}
    assert worker._failures_in_a_row == {}
    assert len(app._zones) == 5
    assert app.timezone_of(cids[0]) == "UTC"  # dropped from the cache, read again
