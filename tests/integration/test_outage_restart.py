"""A quiet, truthful restart after ``kill -9``, on real worker processes (the first hour).

Two campaigns send every 2 s (SQLite store and embedded scheduler files on disk). A
``sendqueue worker`` sends a few emails of each and is SIGKILLed; the files stay; a second one
starts after a real gap of some seconds. Before, its log had one WARNING per moved email's
schedule ("exists with another token; replacing it") and every moved email said "late: would
come within 0s of another send". Now:

- the log has exactly one line per campaign, ``campaign C: moved N emails: worker down
  A-B UTC`` (an en dash), and no line about any one schedule or task;
- every moved email's ``moved_reason`` is that reason: A is the first send the dead worker
  missed (over both campaigns), B the restart;
- after the restart, at most one email a campaign goes out at once (late), the moved ones on
  their new time, and no email moved twice.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sendqueue.bootstrap import Container
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.outages import utc_span
from sendqueue.domain.policy import SendingPolicy, Window
from sendqueue.services.importing.recipients import Templates
from sendqueue.services.planning.replanning import FIRING_SLACK
from tests.support.app import csv_bytes
from tests.support.outage import WorkerProcess, worker_env
from tests.support.real import real_app, wait_until
from tests.support.smtp import SmtpSink

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

RECIPIENTS = 30
#: Seconds between two sends of a campaign: 9,000 a day in a five-hour window.
SPACING = 2
GAP = 6.0
SUMMARY = re.compile(r"campaign (\S+): moved (\d+) emails?: (.+)$")
WINDOW = re.compile(
    r"worker down (?:(\S+) )?(\d\d:\d\d(?::\d\d)?)\u2013(?:(\S+) )?(\d\d:\d\d(?::\d\d)?) UTC$"
)


def _campaigns(app: Container, start: datetime) -> list[str]:
    """Two campaigns sending from ``start``, in a zone where it is midday (10:00-15:00 local:
    the windows hold the test whatever the time of day; the reasons are in UTC anyway)."""
    offset = 12 - start.hour  # Etc/GMT-N is N hours ahead of UTC
    policy = SendingPolicy(
        timezone=f"Etc/GMT{-offset:+d}" if offset else "UTC",
        per_day=300 * 60 // SPACING,
        weekdays=frozenset(range(7)),
        windows=(Window(10 * 60, 15 * 60),),
        start=start,
    )
    cids = []
    for n in range(2):
        cid = app.campaign_import.create(
            name=f"restart {n}",
            recipients=csv_bytes(RECIPIENTS, prefix=f"c{n}-"),
            policy=policy,
            templates=Templates(subject="Hello {{ name }}", body="Hi {{ name }}\n"),
        ).campaign.id
        assert app.provisioner.provision(cid).status == "done"
        cids.append(cid)
    return cids


def _until(reason: str, since: datetime) -> tuple[datetime, timedelta]:
    """The end of a ``worker down A-B UTC`` window as written, and what it is written to (its
    minute or its second)."""
    match = WINDOW.match(reason)
    assert match, reason
    day = match.group(3) or since.date().isoformat()
    text = match.group(4)
    until = datetime.fromisoformat(f"{day}T{text}").replace(tzinfo=UTC)
    return until, timedelta(seconds=1 if len(text) == 8 else 60)


def _summaries(log: str) -> list[re.Match[str]]:
    return [m for line in log.splitlines() if (m := SUMMARY.search(line.rstrip()))]


def test_a_restart_after_kill_9_logs_one_line_per_campaign_naming_the_outage(
    tmp_path: Path, smtp_sink: SmtpSink
) -> None:
    app = real_app(tmp_path, smtp_sink.url())
    now = datetime.now(UTC)
    start = now.replace(microsecond=0) + timedelta(seconds=8 - now.second % SPACING)
    cids = _campaigns(app, start)
    env = worker_env(
        database_url=f"sqlite:///{tmp_path / 'store.db'}",
        scheduler_url=f"sqlite:///{tmp_path / 'scheduler.db'}",
        mailer=smtp_sink.url(),
        reconcile_interval="60",
    )
    first = WorkerProcess(env, tmp_path / "worker-1.log")
    second: WorkerProcess | None = None
    try:

        def three_each() -> bool:
            assert first.alive(), first.text()
            counts = [app.store.count_tasks(cid) for cid in cids]
            return all(c[TaskState.FINISHED] >= 3 and c[TaskState.RUNNING] == 0 for c in counts)

        wait_until(three_each, 60, "three sends of each campaign")
        first.kill()
        pending = [
            t for cid in cids for t in app.store.list_tasks(cid, limit=1000)
            if t.state is TaskState.PENDING
        ]  # fmt: skip
        first_missed = min(t.send_at for t in pending)
        sent_before = {
            t.id for cid in cids for t in app.store.list_tasks(cid, state=TaskState.FINISHED)
        }
        time.sleep(GAP)
        restarted = datetime.now(UTC)
        second = WorkerProcess(env, tmp_path / "worker-2.log")

        def caught_up() -> bool:
            # every send missed is moved (the log is read once sends go out again)
            assert second is not None and second.alive(), second and second.text()
            tasks = [t for cid in cids for t in app.store.list_tasks(cid, state=TaskState.PENDING)]
            return all(t.send_at > restarted for t in tasks)

        wait_until(caught_up, 60, "the missed sends re-planned")
        seen = datetime.now(UTC)
        wait_until(
            lambda: (
                sum(app.store.count_tasks(c)[TaskState.FINISHED] for c in cids)
                >= len(sent_before) + 4
            ),
            30,
            "sends after the restart",
        )
        assert second.stop() == 0, second.text()
        log = second.text()
    finally:
        for proc in (first, second):
            if proc is not None and proc.alive():
                proc.stop()

    try:
        lines = _summaries(log)
        # one line per campaign, each a WARNING, all naming one window
        assert sorted(m.group(1) for m in lines) == sorted(cids), log
        assert all(" WARNING " in m.string for m in lines), log
        reasons = {m.group(3) for m in lines}
        assert len(reasons) == 1, log
        [reason] = reasons
        # A: the first send the dead worker missed; B: the restart, as this test saw it
        until, resolution = _until(reason, first_missed)
        assert reason == f"worker down {utc_span(first_missed, until)}", (reason, first_missed)
        assert restarted - resolution < until <= seen, (reason, restarted, seen)
        # nothing about any one schedule or task: no clash warnings, no per-task lines
        assert "exists with another token" not in log, log
        assert "would come within" not in log and "is late at" not in log, log
        assert " sq-" not in log, log
        tasks = [t for cid in cids for t in app.store.list_tasks(cid, limit=1000)]
        for m in lines:  # the count in each line is what moved
            moved = [t for t in tasks if t.campaign_id == m.group(1) and t.moves]
            assert int(m.group(2)) == len(moved) >= 1
        moved = [t for t in tasks if t.moves]
        assert {t.moved_reason for t in moved} == {reason}
        assert max(t.moves for t in tasks) == 1
        # after the restart: at most one email a campaign went out at once (kept by the
        # re-plan, late), the moved ones on their new time; nothing moved twice
        after = [t for t in tasks if t.state is TaskState.FINISHED and t.id not in sent_before]
        assert len(after) >= 4
        kept = [t for t in after if not t.moves]
        assert len({t.campaign_id for t in kept}) == len(kept)
        for t in after:
            assert t.sent_at is not None
            if t.moves:
                assert t.sent_at - t.send_at <= FIRING_SLACK, t
            else:
                assert restarted <= t.sent_at <= seen + FIRING_SLACK, t
    finally:
        app.close()
