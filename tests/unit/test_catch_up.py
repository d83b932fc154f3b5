"""A send never leaves the policy: the catch-up re-plan after an outage, on a fake clock.

The issue's case: a window 16:00-17:00 (Berlin), 12 a day (one every 5 minutes), the worker
down 16:48-17:48.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sendqueue.bootstrap import Container
from sendqueue.domain.errors import PermanentMailError, TransientMailError
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import Task, expected_schedule_name, schedule_group
from sendqueue.domain.policy import SendingPolicy, Window
from sendqueue.domain.slots import in_policy, nominal_spacing
from sendqueue.runtime import run_worker
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.testing.scheduler import FakeScheduler
from tests.support.app import csv_bytes, fake_app

POLICY = SendingPolicy(
    timezone="Europe/Berlin", per_day=12, weekdays=frozenset(range(7)),
    windows=(Window(16 * 60, 17 * 60),),
)  # fmt: skip
BERLIN = POLICY.zone
START = datetime(2026, 12, 1, 9, 0, tzinfo=BERLIN)  # a Tuesday morning


def local(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=BERLIN)


def _app(clock: FakeClock, **settings: Any) -> Container:
    settings.setdefault("max_lateness", 300)
    settings.setdefault("space_late_sends", True)
    return fake_app(clock=clock, mailer=RecordingMailer(), **settings)


def _campaign(app: Container, count: int = 24, policy: SendingPolicy = POLICY) -> str:
    cid = app.campaign_import.create(
        name="c", recipients=csv_bytes(count), policy=policy
    ).campaign.id
    assert app.provisioner.provision(cid).status == "done"
    return cid


def _fake(app: Container) -> FakeScheduler:
    assert isinstance(app.scheduler, FakeScheduler)
    return app.scheduler


def _sent(app: Container) -> list[datetime]:
    mailer = app.mailer
    assert isinstance(mailer, RecordingMailer)
    return [m.date for m in mailer.sent]


def _tasks(app: Container, cid: str) -> list[Task]:
    return app.store.list_tasks(cid, limit=1000)


def _one_schedule_per_pending_task(app: Container, cid: str) -> None:
    pending = [t for t in _tasks(app, cid) if t.state is TaskState.PENDING]
    schedules = {s.name: s for s in app.scheduler.list(schedule_group(cid))}
    assert set(schedules) == {expected_schedule_name(t) for t in pending}
    for task in pending:
        assert schedules[expected_schedule_name(task)].client_token == task.token


def test_a_worker_down_across_the_end_of_a_window_moves_the_late_emails_within_the_cap() -> None:
    clock = FakeClock(START)
    app = _app(clock)
    cid = _campaign(app)
    _fake(app).run_until(clock, app.invoke, local("2026-12-01T16:48"))
    assert len(_sent(app)) == 10  # 16:00 ... 16:45

    # the schedules fire again at 17:48: the 16:50 and 16:55 ones fire now
    clock.set(local("2026-12-01T17:48"))
    _fake(app).fire_due(app.invoke)

    assert len(_sent(app)) == 10  # nothing sent outside the window
    assert app.metrics.value("sendqueue_sends_total", outcome="moved") == 1
    tasks = _tasks(app, cid)
    pending = [t for t in tasks if t.state is TaskState.PENDING]
    assert len(pending) == 14
    # the two late ones lead the next day's window; every Pending one moved by two slots
    assert [t.send_at.astimezone(BERLIN).strftime("%d %H:%M") for t in pending[:3]] == [
        "02 16:00",
        "02 16:05",
        "02 16:10",
    ]
    assert all(t.moves == 1 for t in pending)
    # No worker start was seen (that is test_a_worker_restart_...): the layer fired late. The
    # reason is in UTC (Berlin is UTC+1 in December).
    assert {t.moved_reason for t in pending} == {"fired late 15:50\u201316:48 UTC"}
    assert all(t.planned_at is not None and t.planned_at < t.send_at for t in pending)
    _one_schedule_per_pending_task(app, cid)
    notes = [e.note for e in app.store.changes_after(0, campaign_id=cid, limit=10_000)]
    assert notes.count("moved: fired late 15:50\u201316:48 UTC") == 14

    # run to the end: 12 a day, all inside the window, nothing lost or sent twice
    _fake(app).run_until(clock, app.invoke, local("2026-12-05T00:00"))
    sent = _sent(app)
    assert len(sent) == 24
    assert all(in_policy(POLICY, s) for s in sent)
    per_day = Counter(s.astimezone(BERLIN).date().isoformat() for s in sent)
    assert per_day == {"2026-12-01": 10, "2026-12-02": 12, "2026-12-03": 2}
    gaps = [b - a for a, b in zip(sorted(sent), sorted(sent)[1:], strict=False)]
    assert min(gaps) >= nominal_spacing(POLICY) / 2  # no burst
    mailer = app.mailer
    assert isinstance(mailer, RecordingMailer)
    assert len({m.to_addr for m in mailer.sent}) == 24
    assert app.store.get_campaign(cid).state is CampaignState.COMPLETED


def test_the_worker_back_the_next_morning_never_sends_over_the_days_cap() -> None:
    clock = FakeClock(START)
    app = _app(clock)
    cid = _campaign(app)
    _fake(app).run_until(clock, app.invoke, local("2026-12-01T16:48"))
    clock.set(local("2026-12-02T09:00"))  # the issue: 14 sent against a cap of 12
    _fake(app).fire_due(app.invoke)
    _fake(app).run_until(clock, app.invoke, local("2026-12-05T00:00"))
    per_day = Counter(s.astimezone(BERLIN).date().isoformat() for s in _sent(app))
    assert per_day == {"2026-12-01": 10, "2026-12-02": 12, "2026-12-03": 2}
    reasons = {t.moved_reason for t in _tasks(app, cid) if t.moves}
    assert reasons == {"fired late 2026-12-01 15:50\u20132026-12-02 08:00 UTC"}


def test_the_re_plan_is_idempotent() -> None:
    clock = FakeClock(START)
    app = _app(clock)
    cid = _campaign(app)
    clock.set(local("2026-12-01T16:32"))
    # 16:30's is due now and not late (its schedule fires now): it stays; the 16:00-16:25
    # ones (late) and the rest move to the free slots from 16:35 on
    assert app.recovery.catch_up(cid, since=local("2026-12-01T16:00")) == 23
    before = [(t.send_at, t.token) for t in _tasks(app, cid)]
    clock.advance(seconds=30)
    assert app.recovery.catch_up(cid, since=local("2026-12-01T16:00")) == 0
    assert [(t.send_at, t.token) for t in _tasks(app, cid)] == before
    days = Counter(t.send_at.astimezone(BERLIN).day for t in _tasks(app, cid))
    assert days == {1: 6, 2: 12, 3: 6}


def test_a_re_plan_held_by_another_process_moves_nothing_here() -> None:
    clock = FakeClock(START)
    app = _app(clock)
    cid = _campaign(app)
    before = [(t.send_at, t.token) for t in _tasks(app, cid)]
    clock.set(local("2026-12-01T16:30"))
    assert app.store.acquire_lease(f"replan:{cid}", "other", ttl_seconds=60, at=clock.now())
    assert app.recovery.catch_up(cid, since=local("2026-12-01T16:00")) == 0
    assert [(t.send_at, t.token) for t in _tasks(app, cid)] == before
    app.store.release_lease(f"replan:{cid}", "other")
    # 16:25's and 16:30's are both due now and not late: they would go out together, so only
    # 16:25's stays (it fires now) and 16:30's moves with the rest
    assert app.recovery.catch_up(cid, since=local("2026-12-01T16:00")) == 23


def test_two_processes_triggering_the_re_plan_at_once_move_each_email_once() -> None:
    clock = FakeClock(START)
    app = _app(clock)
    cid = _campaign(app)
    clock.set(local("2026-12-01T16:30"))
    barrier = threading.Barrier(2)
    moved: list[int] = []

    def trigger() -> None:
        barrier.wait()
        moved.append(app.recovery.catch_up(cid, since=local("2026-12-01T16:00")))

    threads = [threading.Thread(target=trigger) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(moved) == 23  # 16:25's stays (see the test above)
    assert Counter(t.moves for t in _tasks(app, cid)) == {0: 1, 1: 23}
    _one_schedule_per_pending_task(app, cid)


@pytest.mark.parametrize(("precision", "outcome"), [(0.0, "moved"), (60.0, "sent")])
def test_a_send_past_the_window_allows_the_layers_precision(precision: float, outcome: str) -> None:
    clock = FakeClock(START)
    app = _app(clock, max_lateness=600)
    _fake(app).firing_precision = precision
    cid = _campaign(app, 12)
    _fake(app).run_until(clock, app.invoke, local("2026-12-01T16:54"))
    clock.set(local("2026-12-01T17:00:30"))  # 16:55's, 5.5 minutes late, 30 s past the end
    _fake(app).fire_due(app.invoke)
    assert app.metrics.value("sendqueue_sends_total", outcome=outcome) >= 1
    last = _tasks(app, cid)[-1]
    if outcome == "moved":  # given back after its claim: no attempt, no claimed_at kept
        assert (last.state, last.attempts, last.claimed_at) == (TaskState.PENDING, 0, None)
        assert last.send_at == local("2026-12-02T16:00").astimezone(UTC)
    else:
        assert last.state is TaskState.FINISHED


def test_catch_up_overdue_moves_active_campaigns_only_and_the_reconciler_reports_it() -> None:
    clock = FakeClock(START)
    app = _app(clock)
    active = _campaign(app, 4)
    paused = _campaign(app, 4)
    app.campaign_controls.pause(paused)
    clock.set(local("2026-12-01T18:00"))
    report = app.reconciler.run()
    assert report.overdue_moved == 4
    assert {t.moves for t in _tasks(app, active)} == {1}
    assert {t.moves for t in _tasks(app, paused)} == {0}
    assert app.reconciler.run().overdue_moved == 0


class _StartupProbe(FakeScheduler):
    """A fake layer whose dispatcher records the tasks as they are when dispatching begins."""

    runs_reconciler = True

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock, seed=1)
        self.seen: list[Task] = []
        self.store: Any = None

    def run(self, target: Any, stop: threading.Event) -> None:
        self.seen = [t for c in self.store.list_campaigns() for t in self.store.list_tasks(c.id)]


def test_the_worker_re_plans_overdue_emails_at_start_before_dispatching() -> None:
    clock = FakeClock(START)
    probe = _StartupProbe(clock)
    app = fake_app(clock=clock, scheduler=probe, max_lateness=300)
    probe.store = app.store
    cid = _campaign(app, 6)
    clock.set(local("2026-12-01T18:00"))
    run_worker(app, threading.Event())
    assert len(probe.seen) == 6
    assert all(t.send_at > clock.now() and t.moves == 1 for t in probe.seen)
    _one_schedule_per_pending_task(app, cid)


def test_retry_failed_takes_free_slots_and_leaves_the_planned_ones_alone() -> None:
    clock = FakeClock(START)
    app = _app(clock, auto_pause_after=0)
    cid = _campaign(app, 24)
    mailer = app.mailer
    assert isinstance(mailer, RecordingMailer)
    mailer.fail_next(*[PermanentMailError("550 no")] * 2)
    _fake(app).run_until(clock, app.invoke, local("2026-12-01T16:07"))  # 16:00, 16:05 failed
    planned: Mapping[str, tuple[datetime, str]] = {
        t.id: (t.send_at, t.token) for t in _tasks(app, cid) if t.state is TaskState.PENDING
    }
    assert app.campaign_controls.retry_failed(cid) == 2
    tasks = _tasks(app, cid)
    assert {t.id: (t.send_at, t.token) for t in tasks if t.id in planned} == planned
    retried = [t for t in tasks if t.moved_reason == "retry-failed"]
    assert len(retried) == 2 and all(t.state is TaskState.PENDING for t in retried)
    # today's 10 planned + 2 failed were the day's 12; the retries take the first free slots
    # after the campaign's plan (the 3rd day has room)
    assert {t.send_at.astimezone(BERLIN).strftime("%d %H:%M") for t in retried} == {
        "03 16:00",
        "03 16:05",
    }
    _one_schedule_per_pending_task(app, cid)


def test_a_transient_retry_reuses_the_days_room_when_there_is_some() -> None:
    clock = FakeClock(START)
    app = _app(clock, retry_backoff=60)
    cid = _campaign(app, 6)  # only half the day's slots are planned: 16:00 ... 16:25
    mailer = app.mailer
    assert isinstance(mailer, RecordingMailer)
    mailer.fail_next(TransientMailError("421 busy"))
    _fake(app).run_until(clock, app.invoke, local("2026-12-01T16:01"))
    first = _tasks(app, cid)[0]
    assert first.state is TaskState.PENDING
    # the first free slot at least 60 s on, half a spacing from the others: 16:30
    assert first.send_at == local("2026-12-01T16:30").astimezone(UTC)
    assert (first.moves, first.moved_reason) == (1, "transient: 421 busy")
    _fake(app).run_until(clock, app.invoke, local("2026-12-02T00:00"))
    assert len(_sent(app)) == 6
    assert Counter(s.astimezone(BERLIN).day for s in _sent(app)) == {1: 6}


def test_the_days_before_are_not_counted_against_today() -> None:
    clock = FakeClock(START)
    app = _app(clock)
    cid = _campaign(app, 30)
    _fake(app).run_until(clock, app.invoke, local("2026-12-02T16:48"))
    assert len(_sent(app)) == 22
    clock.set(local("2026-12-02T16:52"))  # 16:50's, two minutes late: still sent
    _fake(app).fire_due(app.invoke)
    assert len(_sent(app)) == 23
    assert all(t.moves == 0 for t in _tasks(app, cid))
    assert timedelta(0) < max(_sent(app)) - local("2026-12-02T16:50") <= timedelta(minutes=2)


def test_two_transient_retries_at_once_take_two_different_slots() -> None:
    """Each retry chooses its slot and writes it under the campaign's lease: without it, both
    read the same booked sends and take the same free slot (one send over the spacing)."""
    clock = FakeClock(START)
    app = _app(clock, retry_backoff=60, max_lateness=600, space_late_sends=False)
    cid = _campaign(app, 6)  # 16:00 ... 16:25
    mailer = app.mailer
    assert isinstance(mailer, RecordingMailer)
    mailer.fail_next(TransientMailError("421 busy"), TransientMailError("421 busy"))
    first, second = _tasks(app, cid)[:2]
    payloads = [
        app.scheduler.get(expected_schedule_name(t)).payload  # type: ignore[union-attr]
        for t in (first, second)
    ]
    clock.set(local("2026-12-01T16:05"))
    in_booked = threading.Event()
    other_in_booked = threading.Event()
    booked = app.store.booked
    calls: list[str] = []

    def slow_booked(campaign_id: str, **kwargs: Any) -> Any:
        # each caller reads, then waits (a bounded time) for the other to have read too: without
        # the lease both read before either writes its retry
        found = booked(campaign_id, **kwargs)
        mine, other = (in_booked, other_in_booked)
        if threading.current_thread().name == "two":
            mine, other = other, mine
        calls.append(threading.current_thread().name)
        mine.set()
        other.wait(1.0)
        return found

    app.store.booked = slow_booked  # type: ignore[method-assign]
    one = threading.Thread(target=app.invoke, args=(dict(payloads[0]),), name="one")
    two = threading.Thread(target=app.invoke, args=(dict(payloads[1]),), name="two")
    one.start()
    assert in_booked.wait(5.0)
    two.start()
    one.join()
    two.join()
    retried = {t.id: t.send_at for t in _tasks(app, cid) if t.moved_reason}
    assert len(retried) == 2 and calls == ["one", "two"]
    # the first free slots 60 s on, half a spacing from the others: 16:30, then 16:35
    assert sorted(retried.values()) == [
        local("2026-12-01T16:30").astimezone(UTC),
        local("2026-12-01T16:35").astimezone(UTC),
    ]


def test_an_overdue_send_met_while_a_retry_holds_the_lease_is_still_re_planned() -> None:
    """A retry now holds the campaign's lease while it takes its slot. An overdue invocation
    meeting it must not give up its catch-up as it does against another re-plan (which moves
    its task too): nothing else would move the task, and its schedule goes with the invocation,
    so it would wait without one for the reconciler's next pass."""
    clock = FakeClock(START)
    app = _app(clock, space_late_sends=False)
    cid = _campaign(app, 6)  # 16:00 ... 16:25
    mailer = app.mailer
    assert isinstance(mailer, RecordingMailer)
    mailer.fail_next(TransientMailError("421 busy"))
    overdue, _, on_time = _tasks(app, cid)[:3]
    payloads = {
        t.id: dict(app.scheduler.get(expected_schedule_name(t)).payload)  # type: ignore[union-attr]
        for t in (overdue, on_time)
    }
    clock.set(local("2026-12-01T16:10"))  # 16:00's is 600 s late (max 300); 16:10's on time
    holding = threading.Event()  # the retry holds the campaign's lease
    contended = threading.Event()  # the overdue invocation met the retry's lease
    acquire, booked = app.store.acquire_lease, app.store.booked

    def acquire_lease(name: str, owner: str, **kwargs: Any) -> bool:
        taken = acquire(name, owner, **kwargs)
        if not taken and threading.current_thread().name == "overdue":
            contended.set()
        return taken

    def slow_booked(campaign_id: str, **kwargs: Any) -> Any:
        if threading.current_thread().name == "retry":
            holding.set()
            contended.wait(5.0)  # the retry holds the lease until the overdue one met it
        return booked(campaign_id, **kwargs)

    app.store.acquire_lease = acquire_lease  # type: ignore[method-assign]
    app.store.booked = slow_booked  # type: ignore[method-assign]

    def fire(task: Task) -> None:
        app.invoke(payloads[task.id])
        # the layer deletes the fired schedule once its invocation returned, unless replaced
        name = expected_schedule_name(task)
        current = app.scheduler.get(name)
        if current is not None and current.client_token == task.token:
            _fake(app).lose(name)

    retry = threading.Thread(target=fire, args=(on_time,), name="retry")
    retry.start()
    assert holding.wait(5.0)
    late = threading.Thread(target=fire, args=(overdue,), name="overdue")
    late.start()
    late.join()
    retry.join()
    assert contended.is_set(), "the overdue invocation did not meet the retry's lease"
    retried = app.store.get_task(on_time.id)
    assert retried is not None and retried.error == "transient: 421 busy"
    now = app.store.get_task(overdue.id)
    assert now is not None and now.state is TaskState.PENDING
    assert now.moves == 1, "the overdue email was not re-planned"
    _one_schedule_per_pending_task(app, cid)


def test_a_retry_slot_reads_only_the_bookings_that_can_count_against_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = _app(FakeClock(START))
    cid = _campaign(app, 24)  # 12 on the 1st, 12 on the 2nd: both days full
    campaign = app.store.get_campaign(cid)
    reads: list[datetime] = []
    booked = app.store.booked

    def spy(campaign_id: str, **kw: Any) -> Any:
        reads.append(kw["since"])
        return booked(campaign_id, **kw)

    monkeypatch.setattr(app.store, "booked", spy)
    for not_before in (local("2026-12-02T00:30"), local("2026-12-01T16:02")):
        [slot] = app.replanner.retry_slots(campaign, 1, not_before=not_before, exclude=())
        # the 2nd's sends counted against its day although read from its local midnight on
        assert slot.astimezone(BERLIN).strftime("%d %H:%M") == "03 16:00"
    # from the local midnight before not_before (less an hour for DST), not 26 h back
    assert reads[0] == local("2026-12-01T23:00")
    assert reads[-1] == local("2026-11-30T23:00")
