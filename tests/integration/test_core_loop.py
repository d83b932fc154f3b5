"""The core loop end to end on real parts: SQLite store, embedded scheduler and dispatcher,
SMTP to a real aiosmtpd server."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

from sendqueue.bootstrap import Container
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import expected_schedule_name, schedule_group
from sendqueue.services.campaigns.demo import demo_csv, demo_policy
from sendqueue.services.importing.recipients import Templates
from sendqueue.services.scheduling.schedules import send_payload
from tests.support.faults import FlakyScheduler
from tests.support.real import all_final, real_app, running_worker, wait_until
from tests.support.smtp import SmtpSink


def _campaign(app: Container, count: int, interval: float = 0.1) -> str:
    created = app.campaign_import.create(
        name="e2e",
        recipients=demo_csv(count),
        policy=demo_policy(app.clock.now(), "Europe/Berlin", count, interval),
        from_addr="Newsroom <news@example.com>",
        reply_to="replies@example.com",
        templates=Templates(subject="Hello {{ name }} in {{ city }}", body="Hi {{ name }}!\n"),
    )
    return created.campaign.id


def test_every_email_delivered_exactly_once_with_the_right_headers(
    tmp_path: Path, smtp_sink: SmtpSink
) -> None:
    app = real_app(tmp_path, smtp_sink.url())
    cid = _campaign(app, 25)
    assert app.provisioner.provision(cid).status == "done"
    assert len(app.scheduler.list(schedule_group(cid))) == 25
    with running_worker(app):
        wait_until(lambda: all_final(app, cid), 60, "all tasks final")
        wait_until(lambda: app.store.get_campaign(cid).state is CampaignState.COMPLETED, 10)
    received = smtp_sink.messages
    assert len(received) == 25
    assert Counter(tuple(m.rcpt_tos) for m in received) == Counter(
        (f"demo{i:03d}@example.com",) for i in range(1, 26)
    )
    tasks = {t.email: t for t in app.store.list_tasks(cid, limit=100)}
    for mail in received:
        task = tasks[mail.rcpt_tos[0]]
        assert mail["From"] == "Newsroom <news@example.com>"
        assert mail["Reply-To"] == "replies@example.com"
        assert mail["To"] == f"{task.name} <{task.email}>"
        assert mail["Subject"] == task.subject and task.subject.startswith("Hello Demo Recipient")
        assert mail["Message-ID"] == task.message_id == f"<{task.id}@example.com>"
        assert mail["Date"]
        assert task.state is TaskState.FINISHED and task.sent_at is not None
        assert task.sent_at >= task.send_at
    assert app.scheduler.list(schedule_group(cid)) == []
    app.close()


def test_451_then_550_drive_the_transient_and_permanent_paths(
    tmp_path: Path, smtp_sink: SmtpSink
) -> None:
    app = real_app(tmp_path, smtp_sink.url(), retry_backoff=0.3, auto_pause_after=0)
    cid = _campaign(app, 1)
    smtp_sink.reply_next("451 4.3.0 Try again later", "550 5.1.1 No such user")
    app.provisioner.provision(cid)
    with running_worker(app):
        wait_until(lambda: all_final(app, cid), 30, "the task to end")
    (task,) = app.store.list_tasks(cid)
    assert task.state is TaskState.FAILED
    assert task.attempts == 2
    assert "550" in (task.error or "") and "No such user" in (task.error or "")
    changes = [
        (e.from_state, e.to_state) for e in app.store.changes_after(0, campaign_id=cid) if e.task_id
    ]
    assert changes == [
        (None, "Pending"),
        ("Pending", "Running"),
        ("Running", "Pending"),  # 451: transient, retried after back-off
        ("Pending", "Running"),
        ("Running", "Failed"),  # 550: permanent
    ]
    assert smtp_sink.messages == []
    assert app.scheduler.list(schedule_group(cid)) == []
    app.close()


def test_the_same_schedule_fired_twice_at_once_sends_one_email(
    tmp_path: Path, smtp_sink: SmtpSink
) -> None:
    app = real_app(tmp_path, smtp_sink.url())
    cid = app.campaign_import.create(
        name="dup",
        recipients=demo_csv(5),
        policy=demo_policy(app.clock.now(), "UTC", 5, 0.1),
        templates=Templates(subject="s", body="b"),
    ).campaign.id
    app.provisioner.provision(cid)
    tasks = app.store.list_tasks(cid)
    # due, but no dispatcher runs: the test fires each schedule itself, twice at once
    wait_until(lambda: app.clock.now() >= max(t.send_at for t in tasks), 10, "send times")
    barrier = threading.Barrier(10)

    def fire(payload: dict[str, str]) -> None:
        barrier.wait(5)
        app.invoke(payload)

    threads = [
        threading.Thread(target=fire, args=(send_payload(t),)) for t in tasks for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(smtp_sink.messages) == 5
    assert Counter(m.rcpt_tos[0] for m in smtp_sink.messages).most_common(1)[0][1] == 1
    assert app.store.count_tasks(cid)[TaskState.FINISHED] == 5
    app.close()


def test_faulty_scheduler_during_provisioning_then_one_reconcile(
    tmp_path: Path, smtp_sink: SmtpSink
) -> None:
    app = real_app(tmp_path, smtp_sink.url())
    flaky = FlakyScheduler(app.scheduler, fail=0.15, throttle=0.25, seed=3)
    app.__dict__["scheduler"] = flaky  # the container's cached adapter, wrapped
    cid = app.campaign_import.create(
        name="faulty",
        recipients=demo_csv(400),
        policy=demo_policy(app.clock.now(), "UTC", 400, 30),
        templates=Templates(subject="s", body="b"),
    ).campaign.id
    report = app.provisioner.provision(cid)
    assert report.status == "stopped" and flaky.failures > 0 and flaky.throttles > 0
    assert flaky.max_in_flight <= 10
    flaky.fail = 0.0  # the outage is over; throttling goes on
    result = app.reconciler.run()
    assert result.provisioning_resumed == 1
    pending = app.store.list_tasks(cid, state=TaskState.PENDING, limit=1000)
    names = Counter(s.name for s in flaky.inner.list(schedule_group(cid), limit=1000))
    assert len(pending) == 400
    assert names == Counter(expected_schedule_name(t) for t in pending)
    app.close()
