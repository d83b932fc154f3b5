"""ProcrastinateScheduler.create_many on real PostgreSQL: provisioning's bulk write.

- each item lands where ``create`` puts it (a job due within the horizon, else a parked row),
  with the same columns;
- two adapters (two processes' pools) racing batches with overlapping names leave one live
  schedule per name, in one place;
- a provisioning process SIGKILLed mid-run on procrastinate, then run again: one schedule per
  task, carrying the task's stored token.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sendqueue.adapters.clock import SystemClock
from sendqueue.adapters.procrastinate.jobs import priority
from sendqueue.adapters.procrastinate.scheduler import ProcrastinateScheduler
from sendqueue.adapters.procrastinate.schema import conninfo_from_url
from sendqueue.bootstrap import bootstrap
from sendqueue.domain.errors import Conflict, SchedulerError
from sendqueue.domain.lifecycle import CampaignState
from sendqueue.domain.models import expected_schedule_name, schedule_group
from sendqueue.ports import CreateArgs, DueArgs, Schedule
from sendqueue.services.campaigns.demo import demo_csv, demo_policy
from sendqueue.services.importing.recipients import Templates
from sendqueue.services.scheduling.schedules import ScheduleWriter
from sendqueue.settings import Settings
from sendqueue.testing import bare_task
from sendqueue.testing.clock import FakeClock

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.postgres


def _query(url: str, sql: str, *params: object) -> list[tuple[Any, ...]]:
    with psycopg.connect(conninfo_from_url(url)) as conn:
        return conn.execute(sql, params).fetchall()


def _places(url: str) -> Counter[str]:
    """How many live jobs and parked rows each name has."""
    rows = _query(
        url,
        "SELECT queueing_lock FROM procrastinate_jobs WHERE status IN ('todo', 'doing') "
        "UNION ALL SELECT name FROM sendqueue_parked_schedules",
    )
    return Counter(r[0] for r in rows)


def test_each_item_is_written_where_and_as_create_writes_it(postgres_url: str) -> None:
    clock = FakeClock(SystemClock().now().replace(microsecond=0))
    scheduler = ProcrastinateScheduler(postgres_url, clock=clock, reconcile_interval=None)

    def args(name: str, seconds: float) -> CreateArgs:
        at = (clock.now() + timedelta(seconds=seconds)).replace(tzinfo=None)
        return (f"{name}", "g", at, "UTC", {"task_id": name[2:]}, "tok", 3)

    def due(args: CreateArgs) -> DueArgs:  # the bulk item: the instant, not the wall time
        return (args[0], args[1], args[2].replace(tzinfo=UTC), *args[3:])

    items = [args("b-near", 60), args("b-far", 3600), args("b-edge", 300)]
    made = scheduler.create_many([due(item) for item in items])
    for name, seconds in (("c-near", 60), ("c-far", 3600), ("c-edge", 300)):
        scheduler.create(*args(name, seconds))
    jobs = _query(
        postgres_url,
        "SELECT queueing_lock, queue_name, task_name, priority, scheduled_at, status, lock, "
        "args - 'name' - 'created_at' - 'payload' FROM procrastinate_jobs ORDER BY 1",
    )
    parked = _query(
        postgres_url,
        "SELECT name, grp, due_at, args - 'name' - 'created_at' - 'payload' "
        "FROM sendqueue_parked_schedules ORDER BY 1",
    )
    # Within the horizon (300 s, its edge included) a waiting job, beyond it a parked row;
    # the bulk rows are the created ones, column for column.
    assert [r[0] for r in jobs] == ["b-edge", "b-near", "c-edge", "c-near"]
    assert [r[0] for r in parked] == ["b-far", "c-far"]
    assert [r[1:] for r in jobs[:2]] == [r[1:] for r in jobs[2:]]
    assert parked[0][1:] == parked[1][1:]
    assert made == [None, None, None]
    near = scheduler.get("b-near")
    assert near is not None and near.client_token == "tok"
    assert jobs[1][1:6] == ("g", "sendqueue.fire", priority(near.due_at), near.due_at, "todo")
    assert [scheduler.create(*item) for item in items] == [
        scheduler.get(name) for name in ("b-near", "b-far", "b-edge")
    ]  # the same name and token: create answers with the schedule the batch stored
    scheduler.close()


def test_a_clash_procrastinate_finds_for_the_whole_batch_is_a_scheduler_error(
    postgres_url: str,
) -> None:
    """A waiting job of another task holds a name's queueing lock: the lookup of existing
    schedules does not see it, and procrastinate's batch defer refuses the whole batch without
    naming the item. That is not a Conflict in a slot; per the port the batch raises
    SchedulerError (the schedule writer then writes item by item) and writes nothing."""
    clock = FakeClock(SystemClock().now().replace(microsecond=0))
    scheduler = ProcrastinateScheduler(postgres_url, clock=clock, reconcile_interval=None)
    at = (clock.now() + timedelta(seconds=60)).replace(tzinfo=None)
    items: list[CreateArgs] = [
        (name, "g", at, "UTC", {"task_id": name}, "tok", 3) for name in ("x-1", "x-2", "x-3")
    ]
    bulk: list[DueArgs] = [(*item[:2], at.replace(tzinfo=UTC), *item[3:]) for item in items]
    _query(
        postgres_url,
        "INSERT INTO procrastinate_jobs (queue_name, task_name, queueing_lock, args) "
        "VALUES ('other', 'other.task', 'x-2', '{}') RETURNING id",
    )
    with pytest.raises(SchedulerError, match="x-2") as raised:
        scheduler.create_many(bulk)
    assert not isinstance(raised.value, Conflict)
    assert _places(postgres_url) == Counter({"x-2": 1}), "the failed batch wrote something"
    # One by one, as the schedule writer goes on: the clash is create's own Conflict.
    assert isinstance(scheduler.create(*items[0]), Schedule)
    with pytest.raises(Conflict, match="x-2"):
        scheduler.create(*items[1])
    assert isinstance(scheduler.create(*items[2]), Schedule)
    scheduler.close()


def test_a_name_held_by_a_foreign_job_fails_alone_in_the_schedule_writer(
    postgres_url: str,
) -> None:
    """The batch-level clash above, through the schedule writer: the batch is written one by
    one, the held name cannot be replaced (delete sees only fire jobs), so that task is
    reported failed and the others are created; nothing is raised."""
    scheduler = ProcrastinateScheduler(postgres_url, reconcile_interval=None)
    at = SystemClock().now() + timedelta(seconds=60)
    tasks = [bare_task("c1", i, at) for i in range(3)]
    _query(
        postgres_url,
        "INSERT INTO procrastinate_jobs (queue_name, task_name, queueing_lock, args) "
        "VALUES ('other', 'other.task', %s, '{}') RETURNING id",
        expected_schedule_name(tasks[1]),
    )
    writer = ScheduleWriter(scheduler, lambda _cid: "UTC", sleep=lambda _s: None)
    report = writer.ensure_many(tasks)
    assert report.created == 2
    assert [task_id for task_id, _ in report.failed] == [tasks[1].id]
    assert "stays held" in report.failed[0][1]
    scheduler.close()


def test_two_processes_racing_overlapping_batches_leave_one_schedule_per_name(
    postgres_url: str,
) -> None:
    clock = FakeClock(SystemClock().now())
    one = ProcrastinateScheduler(postgres_url, clock=clock, reconcile_interval=None)
    two = ProcrastinateScheduler(postgres_url, clock=clock, reconcile_interval=None, upgrade=False)
    errors: list[BaseException] = []
    results: dict[int, list[Conflict | None]] = {}
    barrier = threading.Barrier(2)

    def run(k: int, scheduler: ProcrastinateScheduler) -> None:
        # 300 names each, 200 shared; for a shared name one side defers it, the other parks it.
        items: list[DueArgs] = []
        for i in range(k * 100, k * 100 + 300):
            seconds = 60 if (i + k) % 2 else 7200
            at = clock.now() + timedelta(seconds=seconds)
            items.append((f"n-{i:04}", "g", at, "UTC", {"task_id": str(i)}, f"t{k}", 2))
        barrier.wait()
        try:
            for start in range(0, 300, 60):  # in batches, so the two interleave
                out = scheduler.create_many(items[start : start + 60])
                results.setdefault(k, []).extend(out)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k, s)) for k, s in ((0, one), (1, two))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert _places(postgres_url) == Counter(f"n-{i:04}" for i in range(400))
    conflicts = sum(isinstance(r, Conflict) for out in results.values() for r in out)
    assert conflicts == 200  # each shared name: one side made it, the other was refused
    one.close()
    two.close()


def _settings(url: str, **overrides: Any) -> Settings:
    return Settings(_env_file=None, database_url=url, execution="procrastinate", **overrides)


@pytest.mark.slow
def test_provisioning_killed_mid_run_resumes_with_one_schedule_per_task(
    postgres_url: str,
) -> None:
    count = 20_000
    app = bootstrap(_settings(postgres_url))
    cid = app.campaign_import.create(
        name="bulk",
        recipients=demo_csv(count),
        policy=demo_policy(app.clock.now(), "UTC", count, 1.0),
        templates=Templates(subject="Hello {{ name }}", body="Hi {{ name }}\n"),
    ).campaign.id
    _ = app.scheduler  # procrastinate's schema, before the child starts
    app.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDQUEUE_")}
    env.update(
        SENDQUEUE_DATABASE_URL=postgres_url,
        SENDQUEUE_EXECUTION="procrastinate",
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "sendqueue.cli", "campaign", "provision", cid],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while sum(_places(postgres_url).values()) < 2_000:
            assert proc.poll() is None and time.monotonic() < deadline, "no schedules came"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    halfway = sum(_places(postgres_url).values())
    assert 2_000 <= halfway < count  # killed mid-run, with schedules written

    # A new process, after the killed run's provisioning lease (60 s) expired.
    later = FakeClock(datetime.now().astimezone() + timedelta(seconds=61))
    again = bootstrap(_settings(postgres_url), clock=later)
    try:
        campaign = again.store.get_campaign(cid)
        assert campaign.state is CampaignState.PROVISIONING
        report = again.provisioner.provision(cid)
        assert report.status == "done", report
        tasks = again.store.list_tasks(cid, limit=count + 1)
        assert len(tasks) == count
        schedules: list[Schedule] = []
        after: str | None = None
        while page := again.scheduler.list(schedule_group(cid), after=after, limit=1000):
            schedules.extend(page)
            after = page[-1].name
        assert Counter(s.name for s in schedules) == Counter(
            expected_schedule_name(t) for t in tasks
        )
        tokens = {s.name: s.payload["token"] for s in schedules}
        assert all(tokens[expected_schedule_name(t)] == t.token for t in tasks)
        assert max(_places(postgres_url).values()) == 1
    finally:
        again.close()


def test_a_batch_holds_at_most_one_lock_per_name_bucket(postgres_url: str) -> None:
    """A batch of 500 names takes its names' buckets (at most NAME_LOCK_BUCKETS advisory
    locks), not a lock per name: PostgreSQL's shared lock table would run out with a dozen
    batches at once."""
    from sendqueue.adapters.procrastinate.jobs import NAME_LOCK_BUCKETS, NAME_LOCK_SPACE, Jobs

    names = [f"sq-bucket-{i}" for i in range(500)]
    with psycopg.connect(conninfo_from_url(postgres_url)) as conn, conn.transaction():
        Jobs.lock_names(conn, names)
        held = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s "
            "AND pid = pg_backend_pid()",
            (NAME_LOCK_SPACE,),
        ).fetchone()
        assert held is not None and 0 < held[0] <= NAME_LOCK_BUCKETS
        # another transaction cannot take the bucket of any of these names meanwhile
        with psycopg.connect(conninfo_from_url(postgres_url), autocommit=True) as other:
            other.execute("SET lock_timeout = '200ms'")
            with pytest.raises(psycopg.errors.LockNotAvailable), other.transaction():
                Jobs.lock_name(other, names[123])
