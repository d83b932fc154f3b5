"""Provisioning: idempotent, checkpointed, bounded, resumable after a crash or a deadline."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta

import pytest
from pydantic import ValidationError

from sendqueue.bootstrap import Container
from sendqueue.domain.errors import Conflict, IllegalTransition, InvalidField
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import CONTROL_GROUP, expected_schedule_name, schedule_group
from sendqueue.ports import Schedule
from sendqueue.services.scheduling.provisioning import ProvisionProgress
from sendqueue.settings import Settings
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.scheduler import FakeScheduler
from sendqueue.testing.store import InMemoryTaskStore
from tests.support.app import T0, csv_bytes, fake_app, open_policy
from tests.support.faults import CrashAfter, FlakyScheduler, StoreCrash

# The apps here provision in chunks of 500 (provision_chunk=500): the figures below (progress,
# checkpoints, crashes after so many inserts) are worked out for that size.


def _create(app: Container, count: int) -> str:
    return app.campaign_import.create(
        name="p", recipients=csv_bytes(count), policy=open_policy()
    ).campaign.id


def _schedule_objects(app: Container, cid: str) -> list[Schedule]:
    found: list[Schedule] = []
    after = None
    while True:
        page = app.scheduler.list(schedule_group(cid), after=after, limit=1000)
        found += page
        if len(page) < 1000:
            return found
        after = page[-1].name


def _schedules(app: Container, cid: str) -> list[str]:
    return [s.name for s in _schedule_objects(app, cid)]


def _assert_exactly_one_each(app: Container, cid: str, count: int) -> None:
    tasks = app.store.list_tasks(cid, limit=count + 10)
    assert len(tasks) == count
    assert [t.position for t in tasks] == list(range(count))
    names = _schedules(app, cid)
    assert Counter(names) == Counter(expected_schedule_name(t) for t in tasks)
    # Each schedule carries its task's stored token: one with another token would be skipped
    # as stale by the worker, and that task never sent.
    tokens = {s.name: s.payload["token"] for s in _schedule_objects(app, cid)}
    assert all(tokens[expected_schedule_name(t)] == t.token for t in tasks)


def test_provision_creates_one_task_and_one_schedule_per_recipient() -> None:
    app = fake_app(provision_chunk=500)
    cid = _create(app, 1234)
    report = app.provisioner.provision(cid)
    assert (report.status, report.tasks_created, report.schedules_created) == ("done", 1234, 1234)
    _assert_exactly_one_each(app, cid, 1234)
    campaign = app.store.get_campaign(cid)
    assert campaign.state is CampaignState.ACTIVE
    assert campaign.checkpoint and campaign.checkpoint["phase"] == "done"
    sends = [t.send_at for t in app.store.list_tasks(cid, limit=2000)]
    assert sends == sorted(sends) and len(set(sends)) == len(sends)


def test_provisioning_twice_creates_nothing_twice() -> None:
    app = fake_app(provision_chunk=500)
    cid = _create(app, 50)
    app.provisioner.provision(cid)
    again = app.provisioner.provision(cid)
    assert (again.status, again.tasks_created, again.schedules_created) == ("done", 0, 0)
    _assert_exactly_one_each(app, cid, 50)


def test_progress_goes_to_the_change_log_and_the_callback() -> None:
    app = fake_app(provision_chunk=500)
    cid = _create(app, 1200)
    seen: list[tuple[str, int]] = []
    app.provisioner.provision(cid, progress=lambda p: seen.append((p.phase, p.done)))
    assert seen[-1] == ("schedules", 1200)
    assert ("tasks", 500) in seen
    notes = [
        e.note
        for e in app.store.changes_after(0, campaign_id=cid, limit=10_000)
        if e.to_state == "progress"
    ]
    # each chunk's schedules are created with its tasks: one checkpoint, one note per chunk
    assert "tasks 500/1200, schedules 500/1200" in notes
    assert "tasks 1200/1200, schedules 1200/1200" in notes and "provisioned 1200 emails" in notes


def test_at_most_ten_scheduler_calls_in_flight() -> None:
    clock = FakeClock(T0)
    flaky = FlakyScheduler(FakeScheduler(clock))
    app = fake_app(provision_chunk=500, clock=clock, scheduler=flaky)
    cid = _create(app, 600)
    app.provisioner.provision(cid)
    assert 2 <= flaky.max_in_flight <= 10
    _assert_exactly_one_each(app, cid, 600)


def test_throttling_is_retried_with_backoff() -> None:
    clock = FakeClock(T0)
    flaky = FlakyScheduler(FakeScheduler(clock), throttle=0.3)
    app = fake_app(provision_chunk=500, clock=clock, scheduler=flaky)
    cid = _create(app, 300)
    report = app.provisioner.provision(cid)
    assert report.status == "done"
    assert report.throttled == flaky.throttles > 0
    _assert_exactly_one_each(app, cid, 300)


@pytest.mark.parametrize(
    ("target", "method", "n"),
    [
        ("store", "insert_tasks", 2),
        ("store", "save_checkpoint", 3),
        ("store", "save_checkpoint", 5),
        ("store", "set_campaign_state", 2),
        # A fresh run reads tasks back once: the schedules phase confirming that every chunk
        # got its schedules with its tasks. Crashing there leaves all of them in place.
        ("store", "list_tasks", 1),
        # In the second chunk's schedules, after its tasks were stored: the rerun finds them
        # stored, with the first run's tokens, and must schedule those (read back), not its own.
        ("scheduler", "create", 777),
        ("scheduler", "create", 501),
    ],
)
def test_crash_anywhere_then_rerun_finishes_with_exactly_one_of_each(
    target: str, method: str, n: int
) -> None:
    clock = FakeClock(T0)
    store = InMemoryTaskStore()
    scheduler = FakeScheduler(clock)
    crashing = fake_app(
        provision_chunk=500,
        clock=clock,
        store=CrashAfter(store, method, n) if target == "store" else store,
        scheduler=CrashAfter(scheduler, method, n) if target == "scheduler" else scheduler,
    )
    cid = _create(crashing, 1500)
    with pytest.raises(StoreCrash):
        crashing.provisioner.provision(cid)
    # a new process: same store and scheduler, no memory of the crashed run
    clock.advance(seconds=61)  # the crashed run's provisioning lease (60 s) expires
    fresh = fake_app(provision_chunk=500, clock=clock, store=store, scheduler=scheduler)
    report = fresh.provisioner.provision(cid)
    assert report.status == "done"
    assert fresh.store.get_campaign(cid).state is CampaignState.ACTIVE
    _assert_exactly_one_each(fresh, cid, 1500)


def test_resumed_checkpoint_without_schedules_for_its_tasks_gets_them() -> None:
    # A checkpoint as a run that made the schedules only after all tasks left it (an earlier
    # version, stopped in its tasks phase): tasks up to "after", no "scheduled", no schedules.
    clock = FakeClock(T0)
    store = InMemoryTaskStore()
    scheduler = FakeScheduler(clock)
    first = fake_app(
        provision_chunk=500,
        clock=clock,
        store=CrashAfter(store, "insert_tasks", 3),
        scheduler=scheduler,
    )
    cid = _create(first, 1500)
    with pytest.raises(StoreCrash):
        first.provisioner.provision(cid)
    checkpoint = dict(store.get_campaign(cid).checkpoint or {})
    assert (checkpoint["phase"], checkpoint["after"], checkpoint.pop("scheduled")) == (
        "tasks", 999, 999
    )  # fmt: skip
    for name in _schedules(first, cid):
        scheduler.delete(name)
    store.save_checkpoint(cid, checkpoint, at=clock.now())
    clock.advance(seconds=61)
    fresh = fake_app(provision_chunk=500, clock=clock, store=store, scheduler=scheduler)
    report = fresh.provisioner.provision(cid)
    assert (report.status, report.tasks_created, report.schedules_created) == ("done", 500, 1500)
    _assert_exactly_one_each(fresh, cid, 1500)


def test_the_lease_is_renewed_after_a_third_of_it_and_a_lost_lease_stops_the_run() -> None:
    clock = FakeClock(T0)
    store = InMemoryTaskStore()
    calls: list[tuple[str, object]] = []
    real_acquire = store.acquire_lease

    def acquire(name: str, owner: str, *, ttl_seconds: float, at: datetime) -> bool:
        calls.append((owner, at))
        return real_acquire(name, owner, ttl_seconds=ttl_seconds, at=at)

    store.acquire_lease = acquire  # type: ignore[method-assign]
    app = fake_app(provision_chunk=500, clock=clock, store=store)
    cid = _create(app, 2000)

    def tick(p: ProvisionProgress) -> None:
        if p.phase == "tasks":
            clock.advance(seconds=25)

    # 25 s per chunk (the lease is 60 s): renewed at every tick after the first (the 4 chunks,
    # then the tick that finds no more recipients)
    app.provisioner.provision(cid, progress=tick)
    assert [at for _, at in calls] == [T0 + timedelta(seconds=25 * n) for n in range(5)]

    calls.clear()
    cid = _create(app, 2000)
    app.provisioner.provision(cid)  # the clock stands still: taken once, never renewed
    assert len(calls) == 1

    cid = _create(app, 2000)

    def stall(p: ProvisionProgress) -> None:
        if p.phase == "tasks" and p.done == 500:
            clock.advance(seconds=61)  # this run stalls past its lease; another process takes it
            assert store.acquire_lease(f"provision:{cid}", "other", ttl_seconds=60, at=clock.now())

    with pytest.raises(Conflict, match="lost the provisioning lease"):
        app.provisioner.provision(cid, progress=stall)
    assert store.count_tasks(cid)[TaskState.PENDING] == 500


def test_resumed_run_keeps_the_send_times_of_the_first_plan() -> None:
    clock = FakeClock(T0)
    store = InMemoryTaskStore()
    scheduler = FakeScheduler(clock)
    first = fake_app(
        provision_chunk=500,
        clock=clock,
        store=CrashAfter(store, "insert_tasks", 2),
        scheduler=scheduler,
    )
    cid = _create(first, 1200)
    with pytest.raises(StoreCrash):
        first.provisioner.provision(cid)
    before = {t.id: t.send_at for t in store.list_tasks(cid, limit=2000)}
    clock.advance(hours=3)
    fake_app(
        provision_chunk=500, clock=clock, store=store, scheduler=scheduler
    ).provisioner.provision(cid)
    after = {t.id: t.send_at for t in store.list_tasks(cid, limit=2000)}
    assert all(after[k] == v for k, v in before.items())
    assert list(after.values()) == sorted(after.values())


def test_time_budget_stops_saves_the_checkpoint_and_schedules_a_continuation() -> None:
    clock = FakeClock(T0)
    app = fake_app(provision_chunk=500, clock=clock)
    cid = _create(app, 2000)
    with pytest.raises(InvalidField, match="time_budget"):
        app.provisioner.provision(cid, time_budget=30, safety_margin=90)
    # a budget that is spent at once: the first tick stops
    report = app.provisioner.provision(cid, time_budget=1e-9, safety_margin=0)
    assert report.status == "continued"
    campaign = app.store.get_campaign(cid)
    assert campaign.state is CampaignState.PROVISIONING
    continuation = app.scheduler.list(CONTROL_GROUP)
    assert len(continuation) == 1
    assert continuation[0].payload == {"kind": "provision", "campaign_id": cid}
    # the worker process picks it up: fire it through the container's target
    scheduler = app.scheduler
    assert isinstance(scheduler, FakeScheduler)
    scheduler.fire_due(app.invoke)
    assert app.store.get_campaign(cid).state is CampaignState.ACTIVE
    _assert_exactly_one_each(app, cid, 2000)
    assert app.scheduler.list(CONTROL_GROUP) == []


def test_failed_scheduler_calls_stop_with_checkpoint_and_rerun_completes() -> None:
    clock = FakeClock(T0)
    inner = FakeScheduler(clock)
    flaky = FlakyScheduler(inner, fail=0.05)
    app = fake_app(provision_chunk=500, clock=clock, scheduler=flaky)
    cid = _create(app, 800)
    report = app.provisioner.provision(cid)
    assert report.status == "stopped" and report.errors
    assert app.store.get_campaign(cid).state is CampaignState.PROVISIONING
    flaky.fail = 0.0
    assert app.provisioner.provision(cid).status == "done"
    _assert_exactly_one_each(app, cid, 800)


def test_only_drafts_can_be_provisioned() -> None:
    app = fake_app(provision_chunk=500)
    cid = _create(app, 3)
    app.campaign_controls.cancel(cid)
    with pytest.raises(IllegalTransition):
        app.provisioner.provision(cid)
    assert app.store.count_tasks(cid)[TaskState.PENDING] == 0


def test_the_chunk_is_a_setting_that_names_itself_when_out_of_range() -> None:
    app = fake_app(provision_chunk=200)
    assert app.config.provision_chunk == 200
    cid = _create(app, 450)
    seen: list[tuple[str, int]] = []
    app.provisioner.provision(cid, progress=lambda p: seen.append((p.phase, p.done)))
    assert [done for phase, done in seen if phase == "tasks"] == [200, 400, 450]
    with pytest.raises(ValidationError, match="provision_chunk"):
        Settings(_env_file=None, provision_chunk=5)
