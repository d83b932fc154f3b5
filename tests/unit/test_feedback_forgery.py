"""Red team (issue 14): feedback an outsider can forge. The bounce address is public (every
email's Return-Path), and a recipient reads its own task id in its email's Message-ID
(``<c...-N@domain>``), so the ids of the other recipients of the campaign are known too. With
SENDQUEUE_BOUNCE_ADDRESS set, a genuine DSN reaches the mailbox through the signed VERP
address; one that names no genuine VERP address must not suppress anybody."""

from __future__ import annotations

from datetime import timedelta

from sendqueue.domain.addresses import message_id_for
from sendqueue.domain.lifecycle import TaskOutcome, TaskState
from sendqueue.domain.reports import parse_feedback
from sendqueue.services.templates import Templates
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.testing.scheduler import FakeScheduler
from tests.support.app import fake_app, open_policy

SECRET = "forgery-test-secret-key-0123456789abcdef"
BOUNCES = "bounces@mail.example.com"


def _forged_dsn(victim_task: str, victim: str) -> bytes:
    """A Postfix-shaped DSN, mailed by anyone to the bare bounce address (no VERP token)."""
    return (
        "From: MAILER-DAEMON@evil.example\r\n"
        f"To: {BOUNCES}\r\n"
        "Subject: Undelivered Mail Returned to Sender\r\n"
        "MIME-Version: 1.0\r\n"
        'Content-Type: multipart/report; report-type=delivery-status; boundary="b"\r\n\r\n'
        "--b\r\nContent-Type: text/plain\r\n\r\nYour message could not be delivered.\r\n"
        "--b\r\nContent-Type: message/delivery-status\r\n\r\n"
        "Reporting-MTA: dns; mx.evil.example\r\n\r\n"
        f"Final-Recipient: rfc822; {victim}\r\nAction: failed\r\nStatus: 5.1.1\r\n"
        "Diagnostic-Code: smtp; 550 5.1.1 user unknown\r\n"
        "--b\r\nContent-Type: text/rfc822-headers\r\n\r\n"
        f"X-Sendqueue-Task: {victim_task}\r\nMessage-ID: <{victim_task}@example.com>\r\n"
        "--b--\r\n"
    ).encode()


def test_a_dsn_without_a_genuine_verp_address_suppresses_nobody_when_verp_is_set() -> None:
    mailer = RecordingMailer()
    app = fake_app(
        mailer=mailer,
        bounce_address=BOUNCES,
        secret_key=SECRET,
        public_url="https://mail.example.com",
    )
    created = app.campaigns.create(
        name="t",
        recipients=b"email,name,subject\nattacker@example.org,A,Hi\nvictim@example.org,V,Hi\n",
        policy=open_policy(),
        from_addr="News <news@example.com>",
        templates=Templates(body="Hello"),
    )
    cid = created.campaign.id
    assert app.provisioner.provision(cid).status == "done"
    clock, scheduler = app.clock, app.scheduler
    assert isinstance(clock, FakeClock) and isinstance(scheduler, FakeScheduler)
    clock.advance(hours=1)
    scheduler.fire_due(app.invoke)
    # what the attacker reads: its own signed Message-ID; the others' ids it can only guess
    assert mailer.sent[0].message_id == message_id_for(f"{cid}-0", "example.com", SECRET)
    # The victim's follow-up in a second campaign of the same list, still Pending.
    follow_up = app.campaigns.create(
        name="follow-up",
        recipients=b"email,name,subject\nvictim@example.org,V,Again\n",
        policy=open_policy(clock.now() + timedelta(days=3)),
        from_addr="News <news@example.com>",
        templates=Templates(body="Hello again"),
    )
    assert app.provisioner.provision(follow_up.campaign.id).status == "done"

    items = parse_feedback(
        _forged_dsn(f"{cid}-1", "victim@example.org"),
        received_at=clock.now(),
        key="inbox:1:1",
        bounce_address=BOUNCES,
        secret=SECRET,
    )
    for item in items:
        app.feedback.apply(item)

    victim = app.store.get_task(f"{cid}-1")
    assert victim is not None
    assert victim.outcome is TaskOutcome.ACCEPTED
    assert app.suppressions.suppressed(["victim@example.org"]) == {}
    [pending] = app.store.list_tasks(follow_up.campaign.id, limit=10)
    assert pending.state is TaskState.PENDING
