"""What a moved email says about why it moved, and what a recovery logs (the first hour).

A new user's restart after ``kill -9`` and two minutes down printed one WARNING per schedule
("exists with another token; replacing it") and wrote "late: would come within 0s of another
send" on every moved email. Here: the reason's text (:mod:`sendqueue.domain.outages`), the
window each cause is given (:class:`sendqueue.services.planning.recovery.OutageWatch`), and, on a
fake
clock, one line per campaign for a worker's start after an outage, a store outage, a lost
schedule and a clash no move explains. The real-process version is
tests/integration/test_outage_restart.py.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from sendqueue.adapters.embedded.scheduler import EmbeddedScheduler
from sendqueue.bootstrap import Container
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import Task, expected_schedule_name, new_token
from sendqueue.domain.outages import Outage, OutageCause, utc_span
from sendqueue.domain.wording import plural
from sendqueue.services.planning.recovery import OutageWatch
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.scheduler import FakeScheduler
from sendqueue.testing.store import InMemoryTaskStore
from tests.support.app import T0, csv_bytes, fake_app, open_policy
from tests.web.conftest import FlakyStore

DASH = "\u2013"


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


# -- the text --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("since", "until", "text"),
    [
        ("2026-12-01T23:41:30", "2026-12-01T23:43:10", f"23:41{DASH}23:43 UTC"),
        ("2026-12-01T16:50:05", "2026-12-01T16:50:47", f"16:50:05{DASH}16:50:47 UTC"),
        ("2026-12-01T23:58", "2026-12-02T00:03", f"2026-12-01 23:58{DASH}2026-12-02 00:03 UTC"),
        ("2026-12-01T10:00", "2026-12-01T09:00", f"10:00:00{DASH}10:00:00 UTC"),
    ],
    ids=["minutes", "one-minute", "two-days", "end-before-start"],
)
def test_a_span_reads_in_minutes_seconds_within_one_minute_and_dates_across_days(
    since: str, until: str, text: str
) -> None:
    assert utc_span(at(since), at(until)) == text


def test_a_span_is_in_utc_whatever_the_zone_of_its_ends() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    since = datetime(2026, 12, 1, 17, 50, tzinfo=berlin)  # 16:50 UTC
    until = datetime(2026, 12, 1, 18, 48, tzinfo=berlin)
    assert utc_span(since, until) == f"16:50{DASH}17:48 UTC"


@pytest.mark.parametrize(
    ("cause", "text"),
    [
        (OutageCause.WORKER_DOWN, f"worker down 16:50{DASH}17:48 UTC"),
        (OutageCause.STORE_UNREACHABLE, f"store unreachable 16:50{DASH}17:48 UTC"),
        (OutageCause.FIRED_LATE, f"fired late 16:50{DASH}17:48 UTC"),
        (OutageCause.NOT_FIRED, f"not fired 16:50{DASH}17:48 UTC"),
        (OutageCause.PAUSED, f"paused 16:50{DASH}17:48 UTC"),
    ],
)
def test_the_reason_names_the_cause_and_the_window(cause: OutageCause, text: str) -> None:
    reason = Outage(cause, at("2026-12-01T16:50"), at("2026-12-01T17:48")).reason
    assert reason == text
    assert "within" not in reason and len(reason) <= 60


# -- the window of each cause ------------------------------------------------------------------


def test_a_send_due_before_the_worker_started_was_missed_by_a_worker_down_until_its_start() -> None:
    clock = FakeClock(at("2026-12-01T23:43:10"))
    watch = OutageWatch(clock)
    watch.start(clock.now())
    # the first send missed (over all campaigns) starts the window; the start ends it
    first = watch.worker_down(at("2026-12-01T23:41:30"))
    assert first == Outage(OutageCause.WORKER_DOWN, at("2026-12-01T23:41:30"), clock.now())
    assert first.reason == f"worker down 23:41{DASH}23:43 UTC"
    clock.advance(seconds=30)
    # a later send missed in the same outage: the same window, not its own
    later = watch.explain(at("2026-12-01T23:42:40"), fired=True)
    assert later == first
    # an earlier one (a campaign the start did not see) widens it
    earlier = watch.explain(at("2026-12-01T23:40:00"), fired=False)
    assert (earlier.since, earlier.until) == (at("2026-12-01T23:40:00"), first.until)
    # a send due after the start fired late: the worker ran
    due = at("2026-12-01T23:43:20")
    assert watch.explain(due, fired=True) == Outage(OutageCause.FIRED_LATE, due, clock.now())
    assert watch.explain(due, fired=False) == Outage(OutageCause.NOT_FIRED, due, clock.now())


def test_a_send_that_waited_while_the_store_failed_names_the_store_from_failure_to_answer() -> None:
    clock = FakeClock(at("2026-12-01T10:00"))
    watch = OutageWatch(clock)
    watch.start(clock.now())
    clock.set(at("2026-12-01T10:20"))
    watch.store_failed()
    clock.advance(seconds=90)
    watch.store_failed()  # the window starts at the first failure
    # still failing: the window runs to now
    open_ = watch.explain(at("2026-12-01T10:19:50"), fired=True)
    assert open_ == Outage(OutageCause.STORE_UNREACHABLE, at("2026-12-01T10:20"), clock.now())
    clock.set(at("2026-12-01T10:48"))
    watch.store_answered()
    watch.store_answered()  # nothing more: the window is closed once
    clock.set(at("2026-12-01T11:30"))
    for missed in (at("2026-12-01T10:05"), at("2026-12-01T10:30"), at("2026-12-01T10:48")):
        outage = watch.explain(missed, fired=True)
        assert outage.reason == f"store unreachable 10:20{DASH}10:48 UTC", missed
    # due after the store answered again: not the store's doing
    assert watch.explain(at("2026-12-01T11:00"), fired=True).cause is OutageCause.FIRED_LATE
    # due before the worker started: the worker was down, whatever the store did since
    assert watch.explain(at("2026-12-01T09:59"), fired=True).cause is OutageCause.WORKER_DOWN


def test_without_a_start_seen_a_late_send_fired_late_from_its_send_time_to_now() -> None:
    clock = FakeClock(at("2026-12-01T17:48"))
    watch = OutageWatch(clock)
    outage = watch.explain(at("2026-12-01T16:50"), fired=True)
    assert outage.reason == f"fired late 16:50{DASH}17:48 UTC"


# -- a worker starting after an outage (fake clock) --------------------------------------------


def _campaigns(app: Container, count: int = 2, recipients: int = 30) -> list[str]:
    """Campaigns sending every 60 s (per_day 1440) from T0."""
    cids = []
    for n in range(count):
        cid = app.campaign_import.create(
            name=f"c{n}", recipients=csv_bytes(recipients), policy=open_policy(per_day=1440)
        ).campaign.id
        assert app.provisioner.provision(cid).status == "done"
        cids.append(cid)
    return cids


def _fake(app: Container) -> FakeScheduler:
    assert isinstance(app.scheduler, FakeScheduler)
    return app.scheduler


def _tasks(app: Container, cids: list[str]) -> list[Task]:
    return [t for cid in cids for t in app.store.list_tasks(cid, limit=1000)]


def _moved_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "sendqueue.services.planning.replanning"]


def test_a_worker_starting_after_an_outage_logs_one_line_per_campaign_and_names_the_window(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock(T0 - timedelta(minutes=1))
    app = fake_app(clock=clock, max_lateness=300, space_late_sends=True)
    cids = _campaigns(app)
    _fake(app).run_until(clock, app.invoke, T0 + timedelta(minutes=4, seconds=30))
    sent_before = {t.id for t in _tasks(app, cids) if t.state is TaskState.FINISHED}
    # killed at T0+4:30, back two minutes later: 08:05 and 08:06 were missed (neither
    # overdue by max_lateness); nothing fired meanwhile
    clock.set(T0 + timedelta(minutes=6, seconds=30))
    started = clock.now()
    with caplog.at_level(logging.DEBUG, logger="sendqueue"):
        moved = app.recovery.after_start()
        again = app.recovery.catch_up_overdue()  # the reconciler's pass at start
    assert again == 0
    lines = _moved_lines(caplog)
    window = f"worker down 08:05{DASH}08:06 UTC"
    per_campaign = {cid: sum(1 for t in _tasks(app, [cid]) if t.moves) for cid in cids}
    assert sorted(r.getMessage() for r in lines) == sorted(
        f"campaign {cid}: moved {plural(n, 'email')}: {window}" for cid, n in per_campaign.items()
    )
    assert all(r.levelno == logging.WARNING for r in lines)
    # the schedules of the moved emails were replaced quietly
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING and r not in lines]
    assert loud == [], [r.getMessage() for r in loud]
    assert any("old schedule replaced" in r.getMessage() for r in caplog.records)
    tasks = _tasks(app, cids)
    moved_tasks = [t for t in tasks if t.moves]
    # of 25 unsent a campaign, 08:05's is kept to go out at once (as in any catch-up)
    assert len(sent_before) == 2 * 5
    assert len(moved_tasks) == moved == 2 * 24
    assert {t.moved_reason for t in moved_tasks} == {window}
    kept = [t for t in tasks if t.state is TaskState.PENDING and not t.moves]
    assert [t.send_at for t in kept] == [T0 + timedelta(minutes=5)] * 2
    # the moved ones keep half the spacing (30 s) from the kept one's fire, which comes once
    # the dispatcher starts, up to the firing slack later: 08:07 is too near, 08:08 is first
    assert min(t.send_at for t in moved_tasks) == T0 + timedelta(minutes=8)
    clock.advance(seconds=1.5)
    _fake(app).run_until(clock, app.invoke, started + timedelta(minutes=10))
    sent = [
        t for t in _tasks(app, cids) if t.state is TaskState.FINISHED and t.id not in sent_before
    ]
    assert sorted(t.id for t in sent if not t.moves) == sorted(t.id for t in kept)
    assert all(t.sent_at == started + timedelta(seconds=1.5) for t in sent if not t.moves)
    assert all(t.sent_at == t.send_at for t in sent if t.moves)  # the rest on their new time
    assert max(t.moves for t in _tasks(app, cids)) == 1  # one re-plan, nothing moved twice


def test_a_worker_starting_with_nothing_missed_moves_nothing_and_logs_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock(T0 - timedelta(minutes=1))
    app = fake_app(clock=clock, max_lateness=300, space_late_sends=True)
    cids = _campaigns(app, count=1)
    _fake(app).run_until(clock, app.invoke, T0 + timedelta(minutes=2, seconds=1))
    with caplog.at_level(logging.INFO, logger="sendqueue"):
        assert app.recovery.after_start() == 0
    assert _moved_lines(caplog) == []
    assert not any(t.moves for t in _tasks(app, cids))


def test_without_spacing_a_backlog_within_max_lateness_is_left_to_go_out_at_once() -> None:
    # SENDQUEUE_SPACE_LATE_SENDS=false promises a backlog sent as fast as the worker can: at
    # start only what is more than max_lateness late moves (here nothing; 2 minutes missed)
    clock = FakeClock(T0 - timedelta(minutes=1))
    app = fake_app(clock=clock, max_lateness=300, space_late_sends=False)
    cids = _campaigns(app, count=1)
    _fake(app).run_until(clock, app.invoke, T0 + timedelta(minutes=4, seconds=30))
    clock.set(T0 + timedelta(minutes=6, seconds=30))
    assert app.recovery.after_start() == 0
    assert not any(t.moves for t in _tasks(app, cids))
    clock.set(T0 + timedelta(minutes=20))  # now 08:05 is more than max_lateness late
    assert app.recovery.after_start() > 0


# -- other causes, from the worker and the reconciler ------------------------------------------


def test_a_send_dead_lettered_while_the_store_was_down_names_the_store_when_it_moves() -> None:
    clock = FakeClock(T0 - timedelta(minutes=1))
    store = FlakyStore(InMemoryTaskStore())
    app = fake_app(clock=clock, store=store, max_lateness=300, space_late_sends=True)
    [cid] = _campaigns(app, count=1, recipients=5)
    clock.set(T0)
    store.down = True
    for _ in range(6):  # the first fire at 08:00, two retries, then the dead letter
        _fake(app).fire_due(app.invoke)
        clock.advance(seconds=60)
    store.down = False
    letters = app.scheduler.dead_letters()
    assert letters
    clock.set(T0 + timedelta(minutes=20))
    for letter in letters:
        app.scheduler.redrive(letter.id)
    _fake(app).fire_due(app.invoke)  # overdue when redriven: moved, not sent
    moved = [t for t in app.store.list_tasks(cid) if t.moves]
    assert moved
    # from the first failure (08:00) to the first answer (the redriven fire, 08:20)
    assert {t.moved_reason for t in moved} == {f"store unreachable 08:00{DASH}08:20 UTC"}


def test_a_lost_schedule_found_overdue_by_the_reconciler_was_not_fired() -> None:
    clock = FakeClock(T0 - timedelta(minutes=1))
    app = fake_app(clock=clock, max_lateness=300, space_late_sends=True)
    [cid] = _campaigns(app, count=1, recipients=5)
    first = app.store.list_tasks(cid)[0]
    assert _fake(app).lose(expected_schedule_name(first))
    _fake(app).run_until(clock, app.invoke, T0 + timedelta(minutes=10))
    report = app.reconciler.run()
    assert report.overdue_moved == 1
    task = app.store.get_task(first.id)
    assert task is not None and task.moved_reason == f"not fired 08:00{DASH}08:10 UTC"


def _records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The schedule writer's own records: another test in the same process may have left a
    ``sendqueue`` logger at INFO, whose records the capture would hold too."""
    return [r for r in caplog.records if r.name == "sendqueue.services.scheduling.schedules"]


def test_only_a_clash_no_move_explains_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    app = fake_app()
    [cid] = _campaigns(app, count=1, recipients=2)
    task = app.store.list_tasks(cid)[0]
    name = expected_schedule_name(task)
    with caplog.at_level(logging.DEBUG, logger="sendqueue.services.scheduling.schedules"):
        moved = replace(task, token=new_token())
        report = app.writer.ensure_many([moved], moved={task.id})
        assert report.created == 1 and not report.failed
        assert [r.levelno for r in _records(caplog)] == [logging.DEBUG]
        caplog.clear()
        app.writer.ensure(replace(task, token=new_token()))  # a clash nothing explains
        assert [(r.levelno, r.getMessage()) for r in _records(caplog)] == [
            (logging.WARNING, f"schedule {name} exists with another token; replacing it")
        ]


def test_moved_tasks_written_in_bulk_are_no_warning_either(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """The same rule where schedules go in bulk (the embedded layer's create_many): each moved
    task's clash is repaired one by one, and expected."""
    clock = FakeClock(T0)
    layer = EmbeddedScheduler(f"sqlite:///{tmp_path / 's.db'}", clock=clock)
    app = fake_app(clock=clock, scheduler=layer)
    [cid] = _campaigns(app, count=1, recipients=3)
    tasks = [replace(t, token=new_token()) for t in app.store.list_tasks(cid)]
    with caplog.at_level(logging.DEBUG, logger="sendqueue.services.scheduling.schedules"):
        report = app.writer.ensure_many(tasks, moved={t.id for t in tasks})
    layer.close()
    assert report.created == 3 and not report.failed
    assert [r.levelno for r in _records(caplog)] == [logging.DEBUG] * 3
