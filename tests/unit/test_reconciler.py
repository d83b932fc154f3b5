"""The reconciler repairs every kind of drift between the store and the execution layer."""

from __future__ import annotations

import threading
from collections.abc import Collection
from datetime import timedelta

import pytest

from sendqueue.bootstrap import Container
from sendqueue.domain.errors import SchedulerError, Throttled
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import Task, expected_schedule_name, schedule_group
from sendqueue.ports import Schedule
from sendqueue.services.scheduling.schedules import ScheduleWriter
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.testing.scheduler import FakeScheduler
from sendqueue.testing.store import InMemoryTaskStore
from tests.support.app import T0, csv_bytes, fake_app, open_policy
from tests.support.faults import FlakyScheduler, Meanwhile
from tests.support.reconciler_race import Build, Layer, RaceScenarios, fired_through


def _active(app: Container, count: int, start_hours: float = 24) -> str:
    cid = app.campaign_import.create(
        name="r",
        recipients=csv_bytes(count),
        policy=open_policy(start=T0 + timedelta(hours=start_hours)),
    ).campaign.id
    assert app.provisioner.provision(cid).status == "done"
    return cid


def _fake(app: Container) -> FakeScheduler:
    scheduler = app.scheduler
    assert isinstance(scheduler, FakeScheduler)
    return scheduler


def _every_pending_has_exactly_one_schedule(app: Container, cid: str) -> None:
    pending = app.store.list_tasks(cid, state=TaskState.PENDING, limit=100_000)
    names = sorted(s.name for s in app.scheduler.list(schedule_group(cid), limit=100_000))
    assert names == sorted(expected_schedule_name(t) for t in pending)


def test_clean_state_needs_no_repair() -> None:
    app = fake_app()
    _active(app, 20)
    report = app.reconciler.run()
    assert report.ran and report.repairs == 0 and report.schedules_checked == 20


def test_missing_schedules_are_recreated_with_the_stored_token() -> None:
    app = fake_app()
    cid = _active(app, 30)
    lost = app.store.list_tasks(cid, limit=100)[::3]
    for t in lost:
        assert _fake(app).lose(expected_schedule_name(t))
    report = app.reconciler.run()
    assert report.missing_schedules_created == len(lost)
    for t in lost:
        schedule = app.scheduler.get(expected_schedule_name(t))
        assert schedule is not None and schedule.client_token == t.token
    _every_pending_has_exactly_one_schedule(app, cid)
    assert app.reconciler.run().repairs == 0


def test_overdue_missing_schedule_fires_as_soon_as_possible() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _active(app, 1, start_hours=1)
    (task,) = app.store.list_tasks(cid)
    _fake(app).lose(expected_schedule_name(task))
    clock.advance(hours=5)  # long past its send time
    app.reconciler.run()
    assert _fake(app).fire_due(app.invoke) == 1
    assert app.store.get_task(task.id).state is TaskState.FINISHED  # type: ignore[union-attr]


def test_orphan_schedules_are_deleted() -> None:
    app = fake_app()
    cid = _active(app, 10)
    tasks = app.store.list_tasks(cid)
    # a task cancelled behind the scheduler's back, and a schedule for a task that is gone
    app.store.transition(tasks[0].id, TaskState.PENDING, TaskState.CANCELLED, at=T0)
    app.scheduler.create(
        "sq-ghost-1.0", schedule_group(cid), (T0 + timedelta(days=2)).replace(tzinfo=None), "UTC",
        {"kind": "send", "task_id": "ghost-1", "token": "t"}, "tok",
    )  # fmt: skip
    report = app.reconciler.run()
    assert report.orphan_schedules_deleted == 2
    _every_pending_has_exactly_one_schedule(app, cid)


@pytest.mark.parametrize("policy", ["retry", "fail"])
def test_stale_running_is_recovered_under_the_policy(policy: str) -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock, stale_policy=policy, stale_after=900)
    cid = _active(app, 2, start_hours=0)
    first, second = app.store.list_tasks(cid)
    # a worker claimed the first and died; the second was claimed only recently
    app.store.transition(first.id, TaskState.PENDING, TaskState.RUNNING, at=clock.now(),
                         changes={"claimed_at": clock.now(), "attempts": 1})  # fmt: skip
    clock.advance(seconds=901)
    app.store.transition(second.id, TaskState.PENDING, TaskState.RUNNING, at=clock.now(),
                         changes={"claimed_at": clock.now(), "attempts": 1})  # fmt: skip
    report = app.reconciler.run()
    recovered = app.store.get_task(first.id)
    assert recovered is not None
    assert app.store.get_task(second.id).state is TaskState.RUNNING  # type: ignore[union-attr]
    if policy == "retry":
        assert report.stale_retried == 1
        assert recovered.state is TaskState.PENDING
        assert app.scheduler.get(expected_schedule_name(recovered)) is not None
        # a free slot of the grid from now on (every 8.64 s under open_policy), half a
        # spacing away from the second task's claim at now: the second slot
        assert clock.now() + timedelta(seconds=4.32) <= recovered.send_at
        assert recovered.send_at < clock.now() + timedelta(seconds=18)
        assert (recovered.moves, recovered.moved_reason) == (1, "stale: no outcome within 900 s")
        _fake(app).run_until(clock, app.invoke, clock.now() + timedelta(seconds=18))
        assert app.store.get_task(first.id).state is TaskState.FINISHED  # type: ignore[union-attr]
    else:
        assert report.stale_failed == 1
        assert recovered.state is TaskState.FAILED
        assert "outcome unknown" in (recovered.error or "")


def test_stale_retry_with_attempts_exhausted_fails() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock, max_attempts=2)
    cid = _active(app, 1, start_hours=0)
    (task,) = app.store.list_tasks(cid)
    app.store.transition(task.id, TaskState.PENDING, TaskState.RUNNING, at=clock.now(),
                         changes={"claimed_at": clock.now(), "attempts": 2})  # fmt: skip
    clock.advance(seconds=1000)
    assert app.reconciler.run().stale_failed == 1
    assert "2 attempts used" in (app.store.get_task(task.id).error or "")  # type: ignore[union-attr]


def test_stopped_provisioning_is_resumed() -> None:
    clock = FakeClock(T0)
    flaky = FlakyScheduler(FakeScheduler(clock), fail=0.2)
    app = fake_app(clock=clock, scheduler=flaky)
    cid = app.campaign_import.create(
        name="x", recipients=csv_bytes(300), policy=open_policy()
    ).campaign.id
    assert app.provisioner.provision(cid).status == "stopped"
    flaky.fail = 0.0
    report = app.reconciler.run()
    assert report.provisioning_resumed == 1
    assert app.store.get_campaign(cid).state is CampaignState.ACTIVE
    _every_pending_has_exactly_one_schedule(app, cid)


def test_interrupted_cancel_is_finished_and_campaigns_complete() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cancelled = _active(app, 5)
    app.store.set_campaign_state(cancelled, {CampaignState.ACTIVE}, CampaignState.CANCELLED, at=T0)
    done = _active(app, 2, start_hours=0)
    clock.advance(hours=1)
    for t in app.store.list_tasks(done):
        app.store.transition(t.id, TaskState.PENDING, TaskState.CANCELLED, at=clock.now())
    report = app.reconciler.run()
    assert report.cancels_finished == 1
    assert app.store.count_tasks(cancelled)[TaskState.CANCELLED] == 5
    assert app.scheduler.list(schedule_group(cancelled)) == []
    assert report.campaigns_completed == 1
    assert app.store.get_campaign(done).state is CampaignState.COMPLETED


def test_paused_campaign_schedules_are_orphans() -> None:
    app = fake_app()
    cid = _active(app, 4)
    app.store.set_campaign_state(cid, {CampaignState.ACTIVE}, CampaignState.PAUSED, at=T0)
    assert app.reconciler.run().orphan_schedules_deleted == 4
    assert app.store.count_tasks(cid)[TaskState.PENDING] == 4


def test_only_one_pass_at_a_time() -> None:
    store = InMemoryTaskStore()
    app = fake_app(store=store)
    assert store.acquire_lease("reconciler", "someone-else", ttl_seconds=600, at=T0)
    assert app.reconciler.run().ran is False


def test_flaky_provisioning_then_one_reconcile_gives_exactly_one_schedule_each() -> None:
    clock = FakeClock(T0)
    flaky = FlakyScheduler(FakeScheduler(clock), fail=0.1, throttle=0.2)
    app = fake_app(clock=clock, scheduler=flaky)
    cid = app.campaign_import.create(
        name="f", recipients=csv_bytes(500), policy=open_policy(start=T0 + timedelta(days=1))
    ).campaign.id
    app.provisioner.provision(cid)
    # lose a few that did get created, too
    for t in app.store.list_tasks(cid, limit=40)[::7]:
        flaky.inner.lose(expected_schedule_name(t))  # type: ignore[attr-defined]
    flaky.fail = 0.0  # the outage ends; throttling goes on
    app.reconciler.run()
    assert app.store.get_campaign(cid).state is CampaignState.ACTIVE
    _every_pending_has_exactly_one_schedule(app, cid)


def test_campaign_completed_too_early_is_reopened_and_its_email_sent() -> None:
    """A store with lagging queries completed the campaign while one task was still Pending."""
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _active(app, 3, start_hours=1)
    (early, *_rest) = app.store.list_tasks(cid)
    _fake(app).lose(expected_schedule_name(early))  # its schedule fired, was skipped, is gone
    app.store.set_campaign_state(cid, {CampaignState.ACTIVE}, CampaignState.COMPLETED, at=T0)
    report = app.reconciler.run()
    assert report.campaigns_reopened == 1 and report.missing_schedules_created == 1
    assert app.store.get_campaign(cid).state is CampaignState.ACTIVE
    _every_pending_has_exactly_one_schedule(app, cid)
    clock.advance(hours=2)
    assert _fake(app).fire_due(app.invoke) == 3
    assert app.store.count_tasks(cid)[TaskState.FINISHED] == 3
    assert app.store.get_campaign(cid).state is CampaignState.COMPLETED
    assert app.reconciler.run().repairs == 0


def _racing_fake_layer(**settings: object) -> Layer:
    clock = FakeClock(T0)
    store = Meanwhile(InMemoryTaskStore())
    scheduler = FakeScheduler(clock, seed=1)
    mailer = RecordingMailer()
    app = fake_app(clock=clock, store=store, scheduler=scheduler, mailer=mailer, **settings)
    return Layer(app, store, clock, mailer, fired_through(app, scheduler.fire_due))


@pytest.fixture
def build() -> Build:
    return _racing_fake_layer


class TestRacesOnTheFakes(RaceScenarios):
    """Issue 16: what the pass read changes before it acts (tests/support/reconciler_race.py)."""


class _ThrottledGets(FakeScheduler):
    """Throttles the first ``get`` of each name; fails for good on names starting ``sq-down``."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.gets: list[str] = []
        self._guard = threading.Lock()

    def get(self, name: str) -> Schedule | None:
        with self._guard:
            first = name not in self.gets
            self.gets.append(name)
        if name.startswith("sq-down"):
            raise SchedulerError("injected: scheduler unavailable")
        if first:
            raise Throttled("injected: rate exceeded")
        return super().get(name)


@pytest.mark.parametrize("concurrency", [1, 4])
def test_the_recheck_reads_schedules_through_throttling(concurrency: int) -> None:
    clock = FakeClock(T0)
    scheduler = _ThrottledGets(clock)
    at = (T0 + timedelta(hours=1)).replace(tzinfo=None)
    for name in ("sq-a.0", "sq-c.0"):
        scheduler.create(name, "sq-g", at, "UTC", {"kind": "send", "task_id": name}, "t")
    sleeps: list[float] = []
    writer = ScheduleWriter(
        scheduler, lambda _cid: "UTC", concurrency=concurrency, sleep=sleeps.append
    )
    assert writer.missing(["sq-a.0", "sq-b.0", "sq-c.0", "sq-d.0"]) == {"sq-b.0", "sq-d.0"}
    assert len(sleeps) == 4 and len(scheduler.gets) == 8  # each throttled once, then read
    with pytest.raises(SchedulerError, match="unavailable"):
        writer.missing(["sq-a.0", "sq-down.0"])


def test_a_long_recreate_keeps_the_pass_lease() -> None:
    """The re-check reads each candidate's schedule one at a time, so a mass repair (a
    scheduler file lost) takes long; the pass renews its lease chunk by chunk, as it does
    campaign by campaign, or a second pass could start beside it."""
    clock = FakeClock(T0)
    ttl = 120.0
    app = fake_app(clock=clock, reconcile_lease_seconds=ttl)
    cid = _active(app, 2500)  # three chunks of candidates
    scheduler = _fake(app)
    for task in app.store.list_tasks(cid, limit=5000):
        scheduler.lose(expected_schedule_name(task))
    reads = 0
    taken_over: list[bool] = []
    counting = threading.Lock()  # the re-check may read from several threads

    def slow_get(name: str) -> Schedule | None:
        nonlocal reads
        with counting:
            reads += 1
            last = reads == 2500
        clock.advance(seconds=ttl * 0.7 / 1000)  # a chunk's reads take 0.7 of the lease
        if last:  # the last read: 1.75 leases since the pass took its lease
            taken_over.append(
                app.store.acquire_lease("reconciler", "another-pass", ttl_seconds=ttl,
                                        at=clock.now())
            )  # fmt: skip
        return FakeScheduler.get(scheduler, name)

    scheduler.get = slow_get  # type: ignore[method-assign]
    report = app.reconciler.run()
    assert reads == 2500, "the re-check did not read each candidate's schedule once"
    assert taken_over == [False], "another pass took the lease during this one"
    assert report.missing_schedules_created == 2500, report.as_dict()


def test_the_recheck_reads_a_chunk_of_tasks_in_one_call() -> None:
    """The re-check reads its candidates' tasks a chunk at a time (``get_tasks``), not one
    round trip each."""
    store = InMemoryTaskStore()
    app = fake_app(store=store)
    cid = _active(app, 1500)  # two chunks of candidates
    tasks = app.store.list_tasks(cid, limit=5000)
    for task in tasks[1:]:  # the first keeps its schedule: not a candidate
        _fake(app).lose(expected_schedule_name(task))
    batches: list[int] = []
    singles: list[str] = []

    def get_tasks(task_ids: Collection[str]) -> dict[str, Task]:
        batches.append(len(task_ids))
        return InMemoryTaskStore.get_tasks(store, task_ids)

    def get_task(task_id: str) -> Task | None:
        singles.append(task_id)
        return InMemoryTaskStore.get_task(store, task_id)

    store.get_tasks = get_tasks  # type: ignore[method-assign]
    store.get_task = get_task  # type: ignore[method-assign]
    report = app.reconciler.run()
    assert report.missing_schedules_created == 1499, report.as_dict()
    assert batches == [1000, 499] and singles == []
