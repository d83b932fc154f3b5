"""The procrastinate execution layer on real parts: PostgreSQL, ``sendqueue worker`` processes
(SENDQUEUE_EXECUTION=procrastinate) sharing one database, SMTP into aiosmtpd sinks.

- a burst of 2,000 overdue emails through three workers: each delivered exactly once;
- a worker SIGKILLed while it sends: its stalled jobs are recovered and the emails end as the
  stale policy promises (``retry``: none lost; ``fail``: none sent twice);
- a campaign provisioned here and cancelled from another process while the workers run: no
  email of a cancelled task goes out;
- the reconciler periodic task runs once per tick although three workers defer it;
- ``sendqueue db migrate-to`` moves a half-sent SQLite deployment to PostgreSQL, where it
  completes; it refuses while a task is Running;
- settings refuse procrastinate without PostgreSQL; ``db upgrade`` installs the schema.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiosmtpd.smtp import SMTP, Envelope, Session
from pydantic import ValidationError

from sendqueue.adapters.clock import SystemClock
from sendqueue.adapters.procrastinate.jobs import FIRE_TASK
from sendqueue.adapters.procrastinate.scheduler import ProcrastinateScheduler
from sendqueue.adapters.procrastinate.schema import (
    conninfo_from_url,
    schema_version,
    upgrade_schema,
)
from sendqueue.adapters.procrastinate.worker import cron_every
from sendqueue.bootstrap import Container, bootstrap
from sendqueue.domain.errors import Conflict, SchedulerError
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import schedule_group
from sendqueue.services.campaigns.demo import demo_csv, demo_policy
from sendqueue.services.importing.recipients import Templates
from sendqueue.settings import Settings
from sendqueue.testing.clock import FakeClock
from tests.support.real import all_final, real_app, running_worker, wait_until
from tests.support.smtp import SmtpSink

ROOT = Path(__file__).resolve().parents[2]

# Three worker processes each hold a dozen or more PostgreSQL connections (procrastinate's
# pools, the store's); the bench smoke run is as greedy. Under `-n 2` the two must not run at
# once on a server that allows a hundred connections in all (CI saw "too many clients").
pytestmark = [pytest.mark.postgres, pytest.mark.xdist_group("many-connections")]


# --------------------------------------------------------------------------- helpers
def _settings(url: str, mailer: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "_env_file": None,
        "database_url": url,
        "execution": "procrastinate",
        "mailer": mailer,
    }
    values.update(overrides)
    return Settings(**values)


def _app(url: str, mailer: str, *, overdue: bool = False, **overrides: Any) -> Container:
    """The test process's container. ``overdue``: its clock runs a minute behind, so what it
    plans with :func:`_campaign` (at most 2,000 sends, 24 ms apart) is overdue for the workers:
    a burst. The sending window still lasts a few minutes past the real now, so sends that
    the reconciler recovers go out at once rather than in tomorrow's window."""
    clock = FakeClock(SystemClock().now() - timedelta(seconds=60)) if overdue else None
    return bootstrap(_settings(url, mailer, **overrides), clock=clock)


def _campaign(app: Container, count: int, interval: float) -> str:
    return app.campaign_import.create(
        name="fleet",
        recipients=demo_csv(count),
        policy=demo_policy(app.clock.now(), "UTC", count, interval),
        templates=Templates(subject="Hello {{ name }}", body="Hi {{ name }}\n"),
    ).campaign.id


def _env(url: str, mailer: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDQUEUE_")}
    env.update(
        SENDQUEUE_DATABASE_URL=url,
        SENDQUEUE_EXECUTION="procrastinate",
        SENDQUEUE_MAILER=mailer,
        # the code under test first (a worktree), then the tests package
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        COLUMNS="200",
    )
    env.update(extra)
    return env


def _cli(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sendqueue.cli", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _query(url: str, sql: str, *params: object) -> list[tuple[Any, ...]]:
    with psycopg.connect(conninfo_from_url(url)) as conn:
        return conn.execute(sql, params).fetchall()


class _Workers:
    """``sendqueue worker`` processes; their stderr goes to files, for the logs."""

    def __init__(self, tmp: Path, url: str) -> None:
        self.tmp = tmp
        self.url = url
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, env: dict[str, str]) -> subprocess.Popen[bytes]:
        index = len(self.procs)
        with open(self.tmp / f"worker-{index}.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "sendqueue.cli", "worker"],
                env=env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        self.procs.append(proc)
        return proc

    def wait_registered(self, count: int) -> None:
        """Until ``count`` procrastinate workers are registered (they fetch from then on)."""

        def registered() -> bool:
            assert all(p.poll() is None for p in self.procs), self.logs()
            return _registered(self.url) >= count

        wait_until(registered, 60, f"{count} registered workers")

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.tmp.glob("worker-*")))

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(45)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@contextmanager
def _fleet(tmp: Path, url: str, envs: list[dict[str, str]]) -> Iterator[_Workers]:
    upgrade_schema(url)  # once, before the workers start (each would, one at a time)
    workers = _Workers(tmp, url)
    try:
        for env in envs:
            workers.start(env)
        workers.wait_registered(len(envs))
        yield workers
    finally:
        workers.stop()


def _received(*sinks: SmtpSink) -> Counter[str]:
    return Counter(m.rcpt_tos[0] for sink in sinks for m in sink.messages)


#: Worker rows a dispatching process registers: its fire loop's and its periodic worker's.
_ROWS_PER_PROCESS = 2


def _registered(url: str) -> int:
    """How many procrastinate worker rows are registered (running, or dead and not pruned)."""
    return int(_query(url, "SELECT count(*) FROM procrastinate_workers")[0][0])


def _busy_backends(url: str) -> int:
    """Statements still running in the test's database, other than this query's: a killed
    worker's last statement (a claim, say) still runs to its commit after the kill."""
    rows = _query(
        url,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND state <> 'idle' AND pid <> pg_backend_pid() AND backend_type = %s",
        "client backend",
    )
    return int(rows[0][0])


def _live_fire_jobs(url: str) -> int:
    rows = _query(
        url,
        "SELECT count(*) FROM procrastinate_jobs WHERE task_name = %s "
        "AND status IN ('todo', 'doing')",
        FIRE_TASK,
    )
    return int(rows[0][0])


class SlowSink(SmtpSink):
    """An SMTP sink that takes ``delay`` seconds to answer DATA; ``in_data`` is set as soon as
    a message is being received, so a test can kill the sender mid-send."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay
        self.in_data = threading.Event()

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        self.in_data.set()
        await asyncio.sleep(self.delay)
        return await super().handle_DATA(server, session, envelope)


# --------------------------------------------------------------------------- burst
@pytest.mark.slow
def test_three_workers_deliver_a_burst_of_2000_exactly_once(
    tmp_path: Path, postgres_url: str, smtp_sink: SmtpSink
) -> None:
    count = 2000
    app = _app(postgres_url, smtp_sink.url(), overdue=True)
    cid = _campaign(app, count, 0.001)
    assert app.provisioner.provision(cid).status == "done"
    assert _live_fire_jobs(postgres_url) == count
    # a burst on purpose (delivery exactly once under load): the late sends are not spaced out
    env = _env(
        postgres_url,
        smtp_sink.url(),
        SENDQUEUE_WORKER_CONCURRENCY="4",
        SENDQUEUE_SPACE_LATE_SENDS="false",
    )
    with _fleet(tmp_path, postgres_url, [env] * 3) as workers:
        wait_until(lambda: all_final(app, cid), 170, "2000 emails sent")
        wait_until(lambda: _live_fire_jobs(postgres_url) == 0, 30, "every job done")
        logs = workers.logs()
    received = _received(smtp_sink)
    assert len(received) == count, "an email was lost"
    assert max(received.values()) == 1, "an email was sent twice"
    counts = app.store.count_tasks(cid)
    assert counts[TaskState.FINISHED] == count
    # successful jobs are deleted; nothing failed
    left = _query(
        postgres_url, "SELECT count(*) FROM procrastinate_jobs WHERE task_name = %s", FIRE_TASK
    )
    assert left == [(0,)]
    assert app.scheduler.dead_letters() == []
    assert "Traceback" not in logs
    app.close()


# --------------------------------------------------------------------------- SIGKILL
@pytest.mark.slow
@pytest.mark.parametrize("policy", ["retry", "fail"])
def test_a_killed_workers_stalled_work_completes_under_the_stale_policy(
    tmp_path: Path, postgres_url: str, smtp_sink: SmtpSink, policy: str
) -> None:
    count = 150
    timing = {
        "SENDQUEUE_STALE_POLICY": policy,
        # well above a send's time on a loaded machine: only the victim's sends go stale
        "SENDQUEUE_STALE_AFTER": "10",
        "SENDQUEUE_RECONCILE_INTERVAL": "2",
        "SENDQUEUE_RECONCILE_LEASE": "3",
        "SENDQUEUE_SCHEDULER_LEASE": "4",
        "SENDQUEUE_RETRY_BACKOFF": "0.5",
        # a burst on purpose, as above: spaced out, late sends 1 ms apart kept moving each
        # other (each saw the other's claim), and the victim could go 60 s without a send
        "SENDQUEUE_SPACE_LATE_SENDS": "false",
    }
    app = _app(postgres_url, smtp_sink.url(), overdue=True, stale_policy=policy)
    cid = _campaign(app, count, 0.001)
    assert app.provisioner.provision(cid).status == "done"
    with SlowSink(delay=3.0) as slow:
        # The victim sends through the slow sink alone and dies mid-DATA of its first send
        # (a send lasts 3 s, the kill follows at once); the other two start after it died.
        with _fleet(tmp_path, postgres_url, [_env(postgres_url, slow.url(), **timing)]) as workers:
            assert slow.in_data.wait(60), "the victim never started a send"
            victim = workers.procs[0]
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait(10)
            # its claims that were under way land first: then Running is what it had in flight
            wait_until(lambda: _busy_backends(postgres_url) == 0, 30, "the victim's statements")
            in_flight = {
                t.id for t in app.store.list_tasks(cid, state=TaskState.RUNNING, limit=1000)
            }
            assert in_flight, "the victim had nothing in flight"
            for _ in range(2):
                workers.start(_env(postgres_url, smtp_sink.url(), **timing))
            wait_until(lambda: all_final(app, cid), 120, "every task final")
            # The victim's jobs were 'doing' forever; the periodic recovery fires them again.
            wait_until(lambda: _live_fire_jobs(postgres_url) == 0, 180, "stalled jobs recovered")
        received = _received(smtp_sink, slow)
    tasks = {t.id: t for t in app.store.list_tasks(cid, limit=1000)}
    by_email = {t.email: t for t in tasks.values()}
    stale = [
        e
        for e in app.store.changes_after(0, campaign_id=cid, limit=10_000)
        if (e.note or "").startswith("stale")
    ]
    assert stale, "the stale policy never had to act"
    assert {e.task_id for e in stale} <= in_flight
    if policy == "retry":
        assert set(received) == set(by_email), "an email was lost"
        assert all(t.state is TaskState.FINISHED for t in tasks.values())
        duplicated = {e for e, n in received.items() if n > 1}
        assert duplicated <= {tasks[i].email for i in in_flight}
    else:
        assert max(received.values()) == 1, "an email was sent twice"
        failed = {i for i, t in tasks.items() if t.state is TaskState.FAILED}
        assert failed and failed <= in_flight
        assert all("outcome unknown" in (tasks[i].error or "") for i in failed)
        assert all(t.state is TaskState.FINISHED for i, t in tasks.items() if i not in in_flight)
    app.close()


# --------------------------------------------------------------------------- cancel
def test_a_cancel_from_another_process_stops_every_send_of_cancelled_tasks(
    tmp_path: Path, postgres_url: str, smtp_sink: SmtpSink
) -> None:
    count = 300
    app = _app(postgres_url, smtp_sink.url())
    env = _env(postgres_url, smtp_sink.url())
    with _fleet(tmp_path, postgres_url, [env] * 3):
        cid = _campaign(app, count, 0.1)  # 30 s of sends, starting 2 s from now
        assert app.provisioner.provision(cid).status == "done"
        smtp_sink.wait_for(5, timeout=60)
        cancelled = _cli(env, "campaign", "cancel", cid)
        assert cancelled.returncode == 0, cancelled.stderr
        wait_until(lambda: all_final(app, cid), 180, "every task final")
        wait_until(lambda: _live_fire_jobs(postgres_url) == 0, 30, "no schedule left")
        time.sleep(1.5)  # a schedule that still fired now would be seen in the sink
    received = _received(smtp_sink)
    tasks = app.store.list_tasks(cid, limit=1000)
    finished = {t.email for t in tasks if t.state is TaskState.FINISHED}
    cancelled_emails = {t.email for t in tasks if t.state is TaskState.CANCELLED}
    assert finished and cancelled_emails
    assert not cancelled_emails & set(received), "a cancelled email was sent"
    assert set(received) == finished
    assert max(received.values()) == 1
    assert app.store.get_campaign(cid).state is CampaignState.CANCELLED
    app.close()


# --------------------------------------------------------------------------- reconciler
_TICK = re.compile(r"reconciler pass for tick (\d+) in process (\d+)")


def test_the_reconciler_runs_once_per_tick_across_three_workers(
    tmp_path: Path, postgres_url: str, smtp_sink: SmtpSink
) -> None:
    env = _env(postgres_url, smtp_sink.url(), SENDQUEUE_RECONCILE_INTERVAL="1")
    with _fleet(tmp_path, postgres_url, [env] * 3) as workers:
        time.sleep(6)
        logs = workers.logs()
    passes = _TICK.findall(logs)
    ticks = Counter(tick for tick, _ in passes)
    assert len(ticks) >= 4, logs
    assert set(ticks.values()) == {1}, f"a tick ran more than once: {ticks}"


def test_cron_every_rounds_to_steps_every_worker_agrees_on() -> None:
    assert cron_every(1) == "* * * * * */1"
    assert cron_every(2) == "* * * * * */2"
    assert cron_every(45) == "* * * * * */30"
    assert cron_every(1800) == "*/30 * * * *"
    assert cron_every(25 * 60) == "*/20 * * * *"
    assert cron_every(6 * 3600) == "0 */6 * * *"
    assert cron_every(3 * 86400) == "0 0 * * *"
    with pytest.raises(ValueError, match="positive"):
        cron_every(0)


# --------------------------------------------------------------------------- migrate-to
def _sqlite_env(tmp: Path, mailer: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDQUEUE_")}
    env.update(
        SENDQUEUE_DATABASE_URL=f"sqlite:///{tmp / 'store.db'}",
        SENDQUEUE_SCHEDULER_URL=f"sqlite:///{tmp / 'scheduler.db'}",
        SENDQUEUE_MAILER=mailer,
        # the code under test first (a worktree), then the tests package
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        COLUMNS="200",
    )
    return env


@pytest.mark.slow
def test_migrate_to_moves_a_half_sent_campaign_which_completes_on_postgres(
    tmp_path: Path, postgres_url: str, smtp_sink: SmtpSink
) -> None:
    count = 30
    source = real_app(tmp_path, smtp_sink.url())
    cid = source.campaign_import.create(
        name="moving",
        recipients=demo_csv(count),
        policy=demo_policy(source.clock.now(), "UTC", count, 0.3),
        templates=Templates(subject="s {{ name }}", body="b"),
    ).campaign.id
    assert source.provisioner.provision(cid).status == "done"
    with running_worker(source):
        wait_until(
            lambda: source.store.count_tasks(cid)[TaskState.FINISHED] >= count // 2, 60, "half"
        )
    sent_before = _received(smtp_sink)
    last_change = source.store.last_change_id()
    source.close()

    moved = _cli(_sqlite_env(tmp_path, smtp_sink.url()), "db", "migrate-to", postgres_url)
    assert moved.returncode == 0, moved.stderr + moved.stdout
    assert f"paused in the old database: {cid}" in moved.stdout

    target = _app(postgres_url, smtp_sink.url())
    assert target.store.get_campaign(cid).state is CampaignState.ACTIVE
    assert target.store.last_change_id() == last_change  # the live stream resumes by id
    pending = target.store.count_tasks(cid)[TaskState.PENDING]
    assert 0 < pending <= count - len(sent_before)
    assert _live_fire_jobs(postgres_url) == pending
    old = real_app(tmp_path, smtp_sink.url())
    assert old.store.get_campaign(cid).state is CampaignState.PAUSED
    assert "migrate-to" in (old.store.get_campaign(cid).state_reason or "")
    assert old.scheduler.list(schedule_group(cid)) == []
    old.close()

    with _fleet(tmp_path, postgres_url, [_env(postgres_url, smtp_sink.url())]):
        wait_until(lambda: all_final(target, cid), 180, "the rest sent from PostgreSQL")
        wait_until(
            lambda: target.store.get_campaign(cid).state is CampaignState.COMPLETED, 30, "done"
        )
    received = _received(smtp_sink)
    assert len(received) == count, "an email was lost"
    assert max(received.values()) == 1, "an email was sent twice"
    assert target.store.count_tasks(cid)[TaskState.FINISHED] == count
    target.close()


def test_migrate_to_refuses_while_a_task_is_running_and_changes_nothing(
    tmp_path: Path, postgres_url: str, smtp_sink: SmtpSink
) -> None:
    source = real_app(tmp_path, smtp_sink.url())
    cid = source.campaign_import.create(
        name="busy",
        recipients=demo_csv(3),
        policy=demo_policy(source.clock.now(), "UTC", 3, 60),
        templates=Templates(subject="s", body="b"),
    ).campaign.id
    source.provisioner.provision(cid)
    task = source.store.list_tasks(cid, limit=1)[0]
    now = source.clock.now()
    assert source.store.transition(
        task.id, TaskState.PENDING, TaskState.RUNNING, at=now, changes={"claimed_at": now}
    )
    source.close()
    refused = _cli(_sqlite_env(tmp_path, smtp_sink.url()), "db", "migrate-to", postgres_url)
    assert refused.returncode == 1
    assert "Running" in refused.stderr and "sendqueue reconcile" in refused.stderr
    target = _app(postgres_url, smtp_sink.url())
    assert target.store.list_campaigns() == []
    target.close()
    old = real_app(tmp_path, smtp_sink.url())
    assert old.store.get_campaign(cid).state is CampaignState.ACTIVE
    old.close()


def test_migrate_to_needs_an_empty_target(
    tmp_path: Path, postgres_url: str, smtp_sink: SmtpSink
) -> None:
    env = _sqlite_env(tmp_path, smtp_sink.url())
    source = real_app(tmp_path, smtp_sink.url())
    source.campaign_import.create(
        name="one",
        recipients=demo_csv(2),
        policy=demo_policy(source.clock.now(), "UTC", 2, 60),
        templates=Templates(subject="s", body="b"),
    )
    source.close()
    assert _cli(env, "db", "migrate-to", postgres_url).returncode == 0
    again = _cli(env, "db", "migrate-to", postgres_url)
    assert again.returncode == 1
    assert "empty" in again.stderr


# --------------------------------------------------------------------------- settings, schema
def test_procrastinate_refuses_a_sqlite_task_store() -> None:
    with pytest.raises(ValidationError, match="SENDQUEUE_EXECUTION=procrastinate") as info:
        Settings(_env_file=None, execution="procrastinate", database_url="sqlite:///x.db")
    assert "SENDQUEUE_DATABASE_URL" in str(info.value)


def test_db_upgrade_installs_procrastinates_schema_and_is_idempotent(
    postgres_url: str, smtp_sink: SmtpSink
) -> None:
    env = _env(postgres_url, smtp_sink.url())
    first = _cli(env, "db", "upgrade")
    assert first.returncode == 0, first.stderr
    assert "procrastinate schema at" in first.stdout
    version = schema_version(postgres_url)
    assert version is not None
    assert upgrade_schema(postgres_url) == version
    tables = {
        r[0]
        for r in _query(postgres_url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    }
    assert {"procrastinate_jobs", "sendqueue_dead_letters", "tasks", "change_log"} <= tables


def test_a_newer_schema_than_the_installed_procrastinate_is_refused(postgres_url: str) -> None:
    upgrade_schema(postgres_url)
    with psycopg.connect(conninfo_from_url(postgres_url)) as conn:
        conn.execute("UPDATE sendqueue_procrastinate_schema SET version = '99.0.0'")
    with pytest.raises(SchedulerError, match=r"99\.0\.0"):
        upgrade_schema(postgres_url)


def test_a_schedule_is_conflicting_across_processes_sharing_the_database(
    postgres_url: str,
) -> None:
    # Two adapters (two processes' worth of pools) on one database see one namespace of names.
    one = ProcrastinateScheduler(postgres_url)
    two = ProcrastinateScheduler(postgres_url, upgrade=False)
    at = SystemClock().now().replace(tzinfo=None) + timedelta(hours=1)
    made = one.create("sq-x", "g", at, "UTC", {"task_id": "x"}, "tok")
    assert two.create("sq-x", "g", at, "UTC", {"task_id": "x"}, "tok") == made
    with pytest.raises(Conflict):
        two.create("sq-x", "g", at, "UTC", {"task_id": "x"}, "other")
    two.delete("sq-x")
    assert one.get("sq-x") is None
    one.close()
    two.close()


def test_the_dispatcher_fires_reconnects_after_losing_postgres_and_stops(
    postgres_url: str,
) -> None:
    scheduler = ProcrastinateScheduler(postgres_url, poll_interval=0.2, reconcile_interval=None)
    fired: list[str] = []
    stop = threading.Event()
    thread = threading.Thread(
        target=scheduler.run, args=(lambda p: fired.append(p["task_id"]), stop), daemon=True
    )
    thread.start()

    def due_now(name: str) -> None:
        at = SystemClock().now().replace(tzinfo=None)
        scheduler.create(name, "g", at, "UTC", {"task_id": name}, "tok")

    try:
        wait_until(lambda: _registered(postgres_url) == _ROWS_PER_PROCESS, 30, "the worker")
        due_now("sq-before")
        wait_until(lambda: fired == ["sq-before"], 10, "the first schedule")
        # What a PostgreSQL restart does to every connection of the process.
        _query(
            postgres_url,
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        wait_until(lambda: _try_create(due_now, "sq-after"), 30, "the database back")
        wait_until(lambda: "sq-after" in fired, 30, "the schedule after the outage")
        assert fired.count("sq-after") == 1
    finally:
        stop.set()
        thread.join(30)
        scheduler.close()
    assert not thread.is_alive(), "the dispatcher did not stop"


def _try_create(create: Callable[[str], None], name: str) -> bool:
    try:
        create(name)
    except SchedulerError:
        return False
    return True


def test_far_schedules_are_parked_then_promoted_when_within_the_horizon(
    postgres_url: str,
) -> None:
    clock = FakeClock(SystemClock().now())
    scheduler = ProcrastinateScheduler(
        postgres_url, clock=clock, horizon=300, reconcile_interval=None
    )

    def local(seconds: float) -> datetime:
        return (clock.now() + timedelta(seconds=seconds)).replace(tzinfo=None)

    def jobs() -> list[str]:
        rows = _query(postgres_url, "SELECT queueing_lock FROM procrastinate_jobs ORDER BY 1")
        return [r[0] for r in rows]

    near = scheduler.create("sq-near", "g", local(60), "UTC", {"task_id": "near"}, "t")
    far = scheduler.create("sq-far", "g", local(3600), "UTC", {"task_id": "far"}, "t")
    gone = scheduler.create("sq-gone", "g", local(7200), "UTC", {"task_id": "gone"}, "t")
    assert jobs() == ["sq-near"]  # the others wait outside procrastinate's queue
    assert scheduler.get("sq-far") == far
    assert scheduler.list("g") == [far, gone, near]
    assert [s.name for s in scheduler.list("g", after="sq-far", limit=1)] == ["sq-gone"]
    assert scheduler.create("sq-far", "g", local(3600), "UTC", {"task_id": "far"}, "t") == far
    with pytest.raises(Conflict):
        scheduler.create("sq-far", "g", local(3600), "UTC", {"task_id": "far"}, "other")
    scheduler.delete("sq-gone")
    assert scheduler.get("sq-gone") is None

    clock.advance(3600 - 301)
    assert scheduler.promote() == 0
    clock.advance(2)
    assert scheduler.promote() == 1
    assert jobs() == ["sq-far", "sq-near"]
    assert scheduler.get("sq-far") == far  # the same schedule, now a job
    fired: list[str] = []
    clock.set(far.due_at)
    assert scheduler.fire_due(lambda p: fired.append(p["task_id"])) == 2
    assert fired == ["near", "far"]
    assert scheduler.list("g") == []
    scheduler.close()


def test_promotion_defers_parked_schedules_in_batches_each_as_its_own_job(
    postgres_url: str,
) -> None:
    clock = FakeClock(SystemClock().now())
    scheduler = ProcrastinateScheduler(
        postgres_url, clock=clock, horizon=300, reconcile_interval=None
    )
    base = (clock.now() + timedelta(hours=1)).replace(tzinfo=None)
    created = [
        scheduler.create(
            f"sq-{i}", "g", base - timedelta(seconds=i), "UTC", {"task_id": f"{i}"}, "t"
        )
        for i in range(7)
    ]
    assert _query(postgres_url, "SELECT count(*) FROM procrastinate_jobs") == [(0,)]

    clock.advance(3600)
    assert scheduler.promote(batch=3) == 7  # three batches: 3, 3, 1
    rows = _query(
        postgres_url,
        "SELECT queueing_lock, queue_name, scheduled_at, priority, status FROM procrastinate_jobs "
        "ORDER BY priority DESC, id",
    )
    # Each its own waiting job, due at its own time, the earliest due first by priority.
    assert [(r[0], r[1], r[2], r[4]) for r in rows] == [
        (s.name, "g", s.due_at, "todo") for s in reversed(created)
    ]
    assert len({r[3] for r in rows}) == 7
    assert _query(postgres_url, "SELECT count(*) FROM sendqueue_parked_schedules") == [(0,)]
    assert [scheduler.get(s.name) for s in created] == created
    assert scheduler.promote() == 0
    fired: list[str] = []
    assert scheduler.fire_due(lambda p: fired.append(p["task_id"])) == 7
    assert fired == ["6", "5", "4", "3", "2", "1", "0"]
    scheduler.close()
