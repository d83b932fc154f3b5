"""The feedback loop end to end through real mail servers: a campaign's email goes out through
Postfix with its VERP envelope sender, Postfix bounces it (5.1.1) with a real DSN delivered into
a Maildir, and ``feedback poll`` reads that Maildir over IMAP from Dovecot.

Figures (printed; run with ``-s``): the time from the send to the poll that applied the bounce,
and the bounces and replies seen.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

from sendqueue.adapters.mail.smtp import SmtpMailer
from sendqueue.adapters.sql import SqlTaskStore, open_store
from sendqueue.bootstrap import Container, bootstrap
from sendqueue.domain.lifecycle import TaskOutcome, TaskState
from sendqueue.domain.suppression import SuppressionReason
from sendqueue.services.feedback.poll import PollReport
from sendqueue.settings import Settings
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.scheduler import FakeScheduler
from tests.support.app import LENIENT_LATENESS, T0, open_policy
from tests.support.feedback_mail import message
from tests.support.mailservers import BOUNCE_DOMAIN, Dovecot, Postfix

SECRET = secrets.token_hex(20)
SENDER = "News <news@sender.example>"


def _app(
    clock: FakeClock, store: SqlTaskStore, scheduler: FakeScheduler, port: int, url: str
) -> Container:
    settings = Settings(
        _env_file=None,
        bounce_address=f"bounces@{BOUNCE_DOMAIN}",
        secret_key=SECRET,
        feedback_imap=url,
        max_lateness=LENIENT_LATENESS,
        space_late_sends=False,
    )
    mailer = SmtpMailer("127.0.0.1", port, security="none", timeout=10)
    return bootstrap(settings, clock=clock, store=store, scheduler=scheduler, mailer=mailer)


def _campaign(app: Container, emails: list[str], days: int) -> str:
    rows = "email,name,subject,body\n" + "".join(f"{e},,Hello,Body for {e}\n" for e in emails)
    cid = app.campaign_import.create(
        name=f"c{days}",
        recipients=rows.encode(),
        policy=open_policy(T0 + timedelta(days=days)),
        from_addr=SENDER,
    ).campaign.id
    app.provisioner.provision(cid)
    return cid


def _poll_until(app: Container, done: Any, timeout: float = 30.0) -> PollReport:
    """Poll until ``done(total)`` holds, adding up the passes' counts."""
    total = PollReport()
    deadline = time.monotonic() + timeout
    while True:
        report = app.feedback_poller.poll()
        assert report.errors == []
        for key in ("messages", "bounces", "replies", "not_feedback", "ignored"):
            setattr(total, key, getattr(total, key) + getattr(report, key))
        if done(total) or time.monotonic() > deadline:
            return total
        time.sleep(0.05)


def _poll_in_a_new_process(tmp_path: Path, dovecot: Dovecot) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDQUEUE_")}
    env.update(
        SENDQUEUE_DATABASE_URL=f"sqlite:///{tmp_path / 'store.db'}",
        SENDQUEUE_SCHEDULER_URL=f"sqlite:///{tmp_path / 'scheduler.db'}",
        SENDQUEUE_MAILER=f"maildir:{tmp_path / 'outbox'}",
        SENDQUEUE_BOUNCE_ADDRESS=f"bounces@{BOUNCE_DOMAIN}",
        SENDQUEUE_SECRET_KEY=SECRET,
        SENDQUEUE_FEEDBACK_IMAP=dovecot.url,
    )
    done = subprocess.run(
        [sys.executable, "-m", "sendqueue.cli", "feedback", "poll", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert dovecot.password not in done.stdout + done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _flags(dovecot: Dovecot) -> dict[int, tuple[bytes, ...]]:
    client = cast(Any, dovecot.client())
    try:
        client.select_folder("INBOX", readonly=True)
        fetched = client.fetch("1:*", ["FLAGS"])
        return {uid: tuple(sorted(data[b"FLAGS"])) for uid, data in fetched.items()}
    finally:
        client.logout()


def _append(dovecot: Dovecot, raw: bytes) -> None:
    client = cast(Any, dovecot.client())
    try:
        client.append("INBOX", raw)
    finally:
        client.logout()


def test_a_real_bounce_and_a_reply_reach_their_tasks_through_postfix_and_dovecot(
    postfix: Postfix, dovecot: Dovecot, tmp_path: Path
) -> None:
    clock = FakeClock(T0)
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    scheduler = FakeScheduler(clock, seed=1)
    app = _app(clock, store, scheduler, postfix.port, dovecot.url)
    try:
        _scenario(app, clock, store, scheduler, postfix, dovecot, tmp_path)
    finally:
        app.close()


def _scenario(
    app: Container,
    clock: FakeClock,
    store: SqlTaskStore,
    scheduler: FakeScheduler,
    postfix: Postfix,
    dovecot: Dovecot,
    tmp_path: Path,
) -> None:
    sent_now = _campaign(app, ["x@bad.example", "r@sink.example"], days=0)
    later = _campaign(app, ["r@sink.example", "x@bad.example", "o@sink.example"], days=30)
    clock.advance(days=1)

    started = time.monotonic()
    assert scheduler.fire_due(app.invoke) == 2
    bounced, replier = (store.get_task(f"{sent_now}-{i}") for i in (0, 1))
    assert bounced is not None and replier is not None
    assert bounced.state is TaskState.FINISHED and replier.state is TaskState.FINISHED

    report = _poll_until(app, lambda total: total.bounces >= 1)
    bounce_seconds = time.monotonic() - started
    assert (report.messages, report.bounces, report.not_feedback) == (1, 1, 0)
    # The DSN went to the task's VERP address, which Postfix took from MAIL FROM.
    delivered = next((dovecot.maildir / "new").iterdir()).read_text()
    assert f"Delivered-To: bounces+{bounced.id}." in delivered
    task = store.get_task(bounced.id)
    assert task is not None
    assert task.outcome is TaskOutcome.BOUNCED
    assert task.outcome_detail is not None and "5.1.1" in task.outcome_detail
    entry = store.suppressed(["x@bad.example"]).get("x@bad.example")
    assert entry is not None and entry.reason is SuppressionReason.BOUNCED
    assert entry.task_id == bounced.id
    other = store.get_task(f"{later}-1")
    assert other is not None
    assert (other.state, other.reason) == (TaskState.CANCELLED, "suppressed: bounced")

    # The cursor: nothing again, in this poller and in a new process (`feedback poll`).
    assert app.feedback_poller.poll().messages == 0
    assert _poll_in_a_new_process(tmp_path, dovecot)["messages"] == 0
    restarted = _app(clock, store, scheduler, postfix.port, dovecot.url)
    try:
        assert restarted.feedback_poller.poll().messages == 0
        _replies(restarted, store, dovecot, sent_now, later)
    finally:
        restarted.close()
    print(
        f"\nfeedback through Postfix+Dovecot: bounces seen 1/1, "
        f"send->bounce applied {bounce_seconds:.2f}s"
    )


def _replies(
    restarted: Container, store: SqlTaskStore, dovecot: Dovecot, sent_now: str, later: str
) -> None:
    replier = store.get_task(f"{sent_now}-1")
    assert replier is not None

    # A reply to the email r@sink.example got stops r's other emails of the same sender.
    assert replier.message_id is not None
    _append(
        dovecot,
        message(
            {
                "From": "R <r@sink.example>",
                "To": SENDER,
                "Subject": "Re: Hello",
                "Message-ID": "<reply-1@sink.example>",
                "In-Reply-To": replier.message_id,
                "References": replier.message_id,
            },
            "Thanks, but please stop.",
        ),
    )
    started = time.monotonic()
    report = _poll_until(restarted, lambda total: total.messages >= 1)
    reply_seconds = time.monotonic() - started
    assert (report.messages, report.replies) == (1, 1)
    replied = store.get_task(replier.id)
    assert replied is not None and replied.outcome is TaskOutcome.REPLIED
    stopped = store.get_task(f"{later}-0")
    assert stopped is not None
    assert (stopped.state, stopped.reason) == (TaskState.CANCELLED, "replied")
    untouched = store.get_task(f"{later}-2")
    assert untouched is not None and untouched.state is TaskState.PENDING

    # An out-of-office from o (who has a Pending email) and a newsletter: left alone.
    _append(
        dovecot,
        message(
            {
                "From": "O <o@sink.example>",
                "To": SENDER,
                "Subject": "Out of office: Hello",
                "Auto-Submitted": "auto-replied",
                "In-Reply-To": replier.message_id,
                "Message-ID": "<ooo-1@sink.example>",
            },
            "I am away until Monday.",
        ),
    )
    _append(
        dovecot,
        message(
            {
                "From": "Shop <deals@shop.example>",
                "To": "bounces@bounce.example",
                "Subject": "50% off everything",
                "Precedence": "bulk",
                "List-Id": "<deals.shop.example>",
                "Message-ID": "<deal-1@shop.example>",
            },
            "Buy now.",
        ),
    )
    before = _flags(dovecot)
    report = restarted.feedback_poller.poll()
    assert (report.messages, report.not_feedback, report.replies) == (2, 2, 0)
    assert _flags(dovecot) == before
    assert all(b"\\Seen" not in flags for flags in before.values())
    untouched = store.get_task(f"{later}-2")
    assert untouched is not None and untouched.state is TaskState.PENDING
    print(f"\nreplies seen 1/1, reply appended->applied {reply_seconds:.2f}s")


def test_two_pollers_on_one_mailbox_read_each_message_once(
    dovecot: Dovecot, tmp_path: Path
) -> None:
    client = cast(Any, dovecot.client())
    try:
        for n in range(60):
            client.append(
                "INBOX",
                message(
                    {"From": f"shop{n}@shop.example", "Subject": f"deal {n}", "Precedence": "bulk"},
                    "Buy now.",
                ),
            )
    finally:
        client.logout()
    url = f"sqlite:///{tmp_path / 'store.db'}"
    stores = [open_store(url), open_store(url)]
    apps = [
        bootstrap(
            Settings(
                _env_file=None,
                feedback_imap=dovecot.url,
                secret_key=SECRET,
                mailer="maildir:" + str(tmp_path),
            ),
            store=store,
        )
        for store in stores
    ]
    for app in apps:
        app.feedback_poller._batch = 7  # many batches, so the passes would interleave
    reports: list[PollReport] = []
    threads = [
        threading.Thread(target=lambda a=app: reports.append(a.feedback_poller.poll()))
        for app in apps
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        while sum(r.messages for r in reports) < 60 and len(reports) < 10:
            reports.append(apps[len(reports) % 2].feedback_poller.poll())  # the busy one, later
        assert sum(r.messages for r in reports) == 60
        assert sum(r.not_feedback for r in reports) == 60
        cursor = stores[0].feedback_cursor(apps[0].feedback_sources[0].name)
        assert cursor is not None and cursor[1] == 60
    finally:
        for app in apps:
            app.close()


def test_every_bounce_of_a_batch_reaches_its_task(
    postfix: Postfix, dovecot: Dovecot, tmp_path: Path
) -> None:
    clock = FakeClock(T0)
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    scheduler = FakeScheduler(clock, seed=1)
    app = _app(clock, store, scheduler, postfix.port, dovecot.url)
    try:
        bad = [f"x{n}@bad.example" for n in range(20)]
        good = [f"ok{n}@sink.example" for n in range(5)]
        cid = _campaign(app, bad + good, days=0)
        clock.advance(days=2)
        started = time.monotonic()
        assert scheduler.fire_due(app.invoke) == 25
        sent = time.monotonic()
        report = _poll_until(app, lambda total: total.bounces >= 20)
        applied = time.monotonic()
        assert (report.messages, report.bounces, report.ignored) == (20, 20, 0)
        outcomes = {t.email: t.outcome for t in store.list_tasks(cid, limit=100)}
        assert {e for e, o in outcomes.items() if o is TaskOutcome.BOUNCED} == set(bad)
        assert {outcomes[e] for e in good} == {TaskOutcome.ACCEPTED}
        assert set(store.suppressed(bad + good)) == set(bad)
        print(
            f"\nbatch through Postfix+Dovecot: bounces seen {report.bounces}/{len(bad)}, "
            f"25 sends {sent - started:.2f}s, last send->all bounces applied "
            f"{applied - sent:.2f}s"
        )
    finally:
        app.close()
