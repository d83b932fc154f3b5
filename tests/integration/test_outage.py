"""Business hours that hold through an outage (issue 12), on real worker processes.

The campaign's day has two one-minute windows a minute apart, A = [T, T+1) and
B = [T+2, T+3), 12 sends a day (one every 10 s), 26 recipients (two days and a bit):

- embedded layer (SQLite, embedded scheduler): a worker sends the first emails of window A and
  is SIGKILLed; a new one starts after A has closed. The emails A still owed are re-planned
  into B or onto the next day, not sent late outside the window, not bunched, within the cap;
- procrastinate layer (PostgreSQL): the worker starts 55 s after the first send time: the six
  overdue emails are not sent in a burst, as they were. Once with SENDQUEUE_MAX_LATENESS=20
  (the oldest four are overdue by it), once with its default (300 s: none is), the issue's
  own case.

Each test prints an ``OUTAGE-FIGURES`` line (``pytest -s``) for the issue's note. The checks
themselves are in :func:`tests.support.outage.check_outage`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sendqueue.adapters.procrastinate.schema import upgrade_schema
from sendqueue.bootstrap import Container, bootstrap
from sendqueue.domain.lifecycle import TaskState
from sendqueue.services.campaigns.demo import demo_csv
from sendqueue.services.importing.recipients import Templates
from sendqueue.settings import Settings
from tests.support.outage import (
    ARRIVAL_SLACK,
    TwoWindows,
    WorkerProcess,
    check_outage,
    sleep_until,
    two_windows,
    worker_env,
)
from tests.support.real import real_app, wait_until
from tests.support.smtp import SmtpSink

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]

RECIPIENTS = 26
MAX_LATENESS = 20


def _campaign(app: Container, day: TwoWindows) -> tuple[str, dict[str, datetime]]:
    """The campaign, provisioned; each task's send_at as first planned."""
    cid = app.campaign_import.create(
        name="outage",
        recipients=demo_csv(RECIPIENTS),
        policy=day.policy,
        templates=Templates(subject="Hello {{ name }}", body="Hi {{ name }}\n"),
    ).campaign.id
    assert app.provisioner.provision(cid).status == "done"
    original = {t.id: t.send_at for t in app.store.list_tasks(cid, limit=1000)}
    in_a = [at for at in original.values() if day.in_window(at, "A")]
    in_b = [at for at in original.values() if day.in_window(at, "B")]
    assert len(in_a) == len(in_b) == day.policy.per_day // 2, sorted(original.values())
    return cid, original


def _at(day: TwoWindows, seconds: float) -> datetime:
    return day.start + timedelta(seconds=seconds)


def _wait_through_window_b(app: Container, cid: str, day: TwoWindows) -> None:
    """Until window B has closed and its last send has been recorded."""
    sleep_until(_at(day, 180 + ARRIVAL_SLACK + 1))
    wait_until(lambda: app.store.count_tasks(cid)[TaskState.RUNNING] == 0, 30, "no task Running")


def test_a_worker_killed_in_window_a_leaves_the_rest_to_window_b_and_the_next_day(
    tmp_path: Path, smtp_sink: SmtpSink
) -> None:
    app = real_app(tmp_path, smtp_sink.url())
    day = two_windows(datetime.now(UTC))
    cid, original = _campaign(app, day)
    env = worker_env(
        database_url=f"sqlite:///{tmp_path / 'store.db'}",
        scheduler_url=f"sqlite:///{tmp_path / 'scheduler.db'}",
        mailer=smtp_sink.url(),
        max_lateness=str(MAX_LATENESS),
        reconcile_interval="5",
        reconcile_lease="3",
        scheduler_lease="5",
        retry_backoff="1",
    )
    first = WorkerProcess(env, tmp_path / "worker-1.log")
    second: WorkerProcess | None = None
    try:
        # Window A: three sends (T, T+10 s, T+20 s), then the worker dies between two sends
        # (never mid-send: that would be the crash test's duplicate, not this one's subject).
        def three_sent() -> bool:
            assert first.alive(), first.text()
            counts = app.store.count_tasks(cid)
            late = datetime.now(UTC) >= _at(day, 25)
            return counts[TaskState.RUNNING] == 0 and (counts[TaskState.FINISHED] >= 3 or late)

        wait_until(three_sent, (_at(day, 28) - datetime.now(UTC)).total_seconds(), "3 sends")
        first.kill()
        sent_before = {
            t.id for t in app.store.list_tasks(cid, state=TaskState.FINISHED, limit=1000)
        }
        assert sent_before, "no send before the outage: the machine is too slow for this test"
        assert len(smtp_sink.messages) == len(sent_before)

        # Back after window A closed (between A and B): the rest of A is overdue.
        sleep_until(_at(day, 65))
        second = WorkerProcess(env, tmp_path / "worker-2.log")
        _wait_through_window_b(app, cid, day)
        assert second.alive(), second.text()
        assert second.stop() == 0, second.text()
        figures = check_outage(
            app,
            cid,
            smtp_sink,
            day,
            original,
            sent_before=sent_before,
            max_lateness=MAX_LATENESS,
        )
        assert "Traceback" not in first.text() + second.text()
    finally:
        for proc in (first, second):
            if proc is not None and proc.alive():
                proc.stop()
        app.close()
    assert figures.moved_from_a >= 1 and figures.sent_after >= 1
    # one outage, one re-plan: the reconciler's passes and the worker's checks since moved
    # nothing again (the re-plan is idempotent)
    assert figures.max_moves == 1
    print("\n" + figures.line("embedded"))


@pytest.mark.postgres
@pytest.mark.parametrize("max_lateness", [MAX_LATENESS, None], ids=["lateness-20s", "default"])
def test_a_procrastinate_worker_started_late_sends_no_burst(
    tmp_path: Path, postgres_url: str, smtp_sink: SmtpSink, max_lateness: int | None
) -> None:
    """``max_lateness=None``: SENDQUEUE_MAX_LATENESS left at its default (300 s), as in the
    issue's report, where no email is overdue by that rule when the worker comes."""
    upgrade_schema(postgres_url)
    settings = Settings(
        _env_file=None,
        database_url=postgres_url,
        execution="procrastinate",
        mailer=smtp_sink.url(),
    )
    app = bootstrap(settings)
    day = two_windows(datetime.now(UTC))
    worker: WorkerProcess | None = None
    try:
        cid, original = _campaign(app, day)
        env = worker_env(
            database_url=postgres_url,
            execution="procrastinate",
            mailer=smtp_sink.url(),
            reconcile_interval="5",
            poll_interval="0.2",
            retry_backoff="1",
        )
        if max_lateness is not None:
            env["SENDQUEUE_MAX_LATENESS"] = str(max_lateness)
        lateness = settings.max_lateness if max_lateness is None else max_lateness
        # Nobody runs the jobs until 55 s after the first send time: six emails are due, the
        # oldest 55 s late (more than MAX_LATENESS), window A closes 5 s later.
        sleep_until(_at(day, 55))
        assert smtp_sink.messages == []
        worker = WorkerProcess(env, tmp_path / "worker.log")
        _wait_through_window_b(app, cid, day)
        assert worker.alive(), worker.text()
        assert worker.stop() == 0, worker.text()
        figures = check_outage(
            app, cid, smtp_sink, day, original, sent_before=set(), max_lateness=lateness
        )
        assert "Traceback" not in worker.text()
    finally:
        if worker is not None and worker.alive():
            worker.stop()
        app.close()
    if max_lateness is not None:
        # the four oldest were more than max_lateness late when the worker came: re-planned
        assert figures.moved_from_a >= 4
        assert figures.max_moves == 1  # one late start, one re-plan
    assert figures.sent_after >= 1
    print("\n" + figures.line(f"procrastinate max_lateness={lateness:g}s"))
