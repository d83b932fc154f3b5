"""Every webhook event type from real mail: a ``sendqueue worker`` process sends campaigns
through a private Postfix, reads the feedback back from a private Dovecot over IMAP (its own
poll, every second), and delivers the events to a receiver process that verifies each
signature with the ``standardwebhooks`` library.

- ``news`` (from a sender, news@sender.example), sent at once:

  - ``x@bad.example``: Postfix accepts it (``email.sent``), then bounces it with a real DSN to
    the task's VERP address (``email.bounced``);
  - ``r@sink.example`` replies through Postfix, citing the email (``email.replied``);
  - ``c@sink.example``'s provider mails an ARF abuse report through Postfix
    (``email.complained``);
  - ``u@sink.example`` unsubscribes with the one-click POST to its ``/u/<token>`` link
    (``email.unsubscribed``);
  - ``d@sink.example``: its send finds the store unavailable on every try (the worker's
    ``--unreadable`` fault), so the execution layer dead-letters it (``dead_letter``); the user
    then cancels it (``email.cancelled``, "cancelled by the user") and the campaign, with
    nothing left to send, completes (``campaign.completed``).

- ``later`` (the same sender, due tomorrow) to x, r, c and u: the feedback cancels each
  (``email.cancelled``: "suppressed: bounced", "replied", "suppressed: complained",
  "suppressed: unsubscribed").
- ``refused`` (its own From): Postfix refuses two recipients at RCPT with 550 5.1.1
  (``email.failed``), and the worker pauses the campaign after those two failures in a row
  (SENDQUEUE_AUTO_PAUSE_AFTER=2: ``campaign.paused``), holding its third email back.

``sequence.stopped`` is not among them: sequences do not exist yet (``domain/webhooks.py``).
The receiver must have verified every delivery, seen every type, got the fields
docs/webhooks.md promises in each ``data``, and got the events in the order they were made.
"""

from __future__ import annotations

import secrets
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*install `httpx2`")
    from fastapi.testclient import TestClient

from sendqueue.bootstrap import Container
from sendqueue.domain.lifecycle import CampaignState, TaskOutcome, TaskState
from sendqueue.domain.models import ChangeLogEntry, Task
from sendqueue.domain.senders import Sender
from sendqueue.domain.webhooks import EventType, change_id_of, event_id
from sendqueue.services.campaigns.demo import demo_policy
from sendqueue.services.templates.render import Templates
from sendqueue.web.app import create_app
from tests.support import worker_proc
from tests.support.app import open_policy
from tests.support.feedback_mail import arf_report, message
from tests.support.mailservers import BOUNCE_DOMAIN, Dovecot, Postfix
from tests.support.real import real_app, wait_until
from tests.support.webhook_e2e import Receiver, expected_events, first_arrivals, worker_env

pytestmark = pytest.mark.slow

SECRET = secrets.token_hex(20)
PUBLIC_URL = "https://mail.example.com"
FEEDBACK = f"bounces@{BOUNCE_DOMAIN}"
SENDER = Sender(id="s0000000news1", email="news@sender.example", name="News", min_gap_seconds=1)
FROM = f"News <{SENDER.email}>"
BOUNCER, REPLIER, COMPLAINER, LEAVER, DOOMED = (
    "x@bad.example",
    "r@sink.example",
    "c@sink.example",
    "u@sink.example",
    "d@sink.example",
)
#: Sent, then each answers in its way.
ANSWERING = [BOUNCER, REPLIER, COMPLAINER, LEAVER]
REFUSED = ["f1@reject.example", "f2@reject.example", "z@sink.example"]
#: docs/webhooks.md, "Events": each type's ``state`` and ``outcome``.
DOCUMENTED = {
    "email.sent": ("Finished", "accepted"),
    "email.failed": ("Failed", None),
    "email.bounced": ("Finished", "bounced"),
    "email.complained": ("Finished", "complained"),
    "email.replied": ("Finished", "replied"),
    "email.unsubscribed": ("Finished", "unsubscribed"),
    "email.cancelled": ("Cancelled", None),
    "campaign.completed": ("completed", None),
    "campaign.paused": ("paused", None),
    "dead_letter": ("dead_letter", None),
}
CANCEL_REASONS = {
    "cancelled by the user",
    "suppressed: bounced",
    "replied",
    "suppressed: complained",
    "suppressed: unsubscribed",
}


def _campaign(
    app: Container, name: str, emails: list[str], *, tomorrow: bool = False, own_from: bool = False
) -> str:
    """A provisioned campaign to ``emails``, one a second from a few seconds on (or from
    tomorrow on), from the sender (or from its own From)."""
    rows = "email,name\n" + "".join(f"{e},\n" for e in emails)
    now = app.clock.now()
    cid = app.campaign_import.create(
        name=name,
        recipients=rows.encode(),
        policy=open_policy(now + timedelta(days=1)) if tomorrow else demo_policy(now, "UTC", 8, 1),
        from_addr="Alerts <alerts@example.com>" if own_from else None,
        senders=() if own_from else [SENDER.id],
        templates=Templates(subject="Hello", body="Hi {{ email }}"),
    ).campaign.id
    assert app.provisioner.provision(cid).status == "done"
    return cid


def _task(app: Container, campaign_id: str, address: str) -> Task:
    [task] = [t for t in app.store.list_tasks(campaign_id, limit=100) if t.email == address]
    return task


def test_a_campaign_through_postfix_and_dovecot_makes_every_event_type(
    postfix: Postfix, dovecot: Dovecot, tmp_path: Path
) -> None:
    started = time.monotonic()
    links = {"secret_key": SECRET, "bounce_address": FEEDBACK, "public_url": PUBLIC_URL}
    mailer = f"smtp://127.0.0.1:{postfix.port}?security=none"
    app = real_app(tmp_path, mailer, **links)
    app.sender_store.add_sender(SENDER)
    made = app.webhooks.add("http://127.0.0.1:1/hook")  # the port is set once it listens
    receiver = Receiver(tmp_path, made.secret)
    receiver.start()
    app.webhooks.update(made.endpoint.id, url=receiver.url)
    start = app.webhooks.get(made.endpoint.id).cursor
    news = _campaign(app, "news", [*ANSWERING, DOOMED])
    later = _campaign(app, "later", ANSWERING, tomorrow=True)
    refused = _campaign(app, "refused", REFUSED, own_from=True)
    doomed = _task(app, news, DOOMED)
    env = worker_env(
        tmp_path,
        mailer,
        SENDQUEUE_SECRET_KEY=SECRET,
        SENDQUEUE_BOUNCE_ADDRESS=FEEDBACK,
        SENDQUEUE_PUBLIC_URL=PUBLIC_URL,
        SENDQUEUE_FEEDBACK_IMAP=dovecot.url,
        SENDQUEUE_FEEDBACK_INTERVAL="1",
        SENDQUEUE_AUTO_PAUSE_AFTER="2",
        SENDQUEUE_SCHEDULER_RETRY_BACKOFF="0.2",
    )
    worker = worker_proc.start(env, "--unreadable", doomed.id)
    try:
        _make_the_events(app, postfix, news, doomed)
        wait_until(lambda: _settled(app, news, later, refused), 60, "every outcome and cancel")
        expected = expected_events(app, start)
        wait_until(lambda: set(expected) <= set(receiver.ids()), 60, "every event delivered")
    finally:
        receiver.kill()
        worker_proc.stop(worker)
    _check_the_deliveries(app, receiver, start, expected)
    assert _task(app, refused, REFUSED[2]).state is TaskState.PENDING  # held back by the pause
    print(f"\nevery webhook event type through Postfix+Dovecot: {time.monotonic() - started:.1f}s")
    app.close()


def _make_the_events(app: Container, postfix: Postfix, news: str, doomed: Task) -> None:
    """Wait for ``news``'s sends and its dead letter, then cancel the dead-lettered email and
    answer the others as their recipients would."""

    def sent_and_dead_lettered() -> bool:
        states = {t.email: t.state for t in app.store.list_tasks(news, limit=100)}
        finished = all(states[a] is TaskState.FINISHED for a in ANSWERING)
        return finished and len(app.scheduler.dead_letters()) == 1

    wait_until(sent_and_dead_lettered, 60, "news's sends and the dead letter")
    [letter] = app.scheduler.dead_letters()
    assert letter.payload["task_id"] == doomed.id
    app.campaign_controls.cancel_task(doomed.id)  # its schedule is gone: nothing else would end it
    replier, complainer, leaver = (_task(app, news, a) for a in (REPLIER, COMPLAINER, LEAVER))
    assert replier.message_id is not None and complainer.message_id is not None
    reply = message(
        {
            "From": f"R <{REPLIER}>",
            "To": FEEDBACK,
            "Subject": "Re: Hello",
            "Message-ID": "<reply-1@sink.example>",
            "In-Reply-To": replier.message_id,
            "References": replier.message_id,
        },
        "Thanks, but no.",
    )
    postfix.submit(reply, mail_from=REPLIER, to=FEEDBACK)
    report = arf_report(COMPLAINER, complainer.message_id, sender=FROM, to=FEEDBACK)
    postfix.submit(report, mail_from="fbl@isp.example", to=FEEDBACK)
    links = app.config.unsubscribe
    assert links is not None
    with TestClient(create_app(app), base_url="http://testserver") as client:
        path = urlsplit(links.url(leaver.id)).path
        answer = client.post(path, data={"List-Unsubscribe": "One-Click"})
    assert answer.status_code == 200, answer.text


def _settled(app: Container, news: str, later: str, refused: str) -> bool:
    """Every outcome applied, ``later`` cancelled whole, ``news`` completed, ``refused``
    paused."""
    outcomes = {t.email: t.outcome for t in app.store.list_tasks(news, limit=100)}
    states = {t.state for t in app.store.list_tasks(later, limit=100)}
    return (
        outcomes
        == {
            BOUNCER: TaskOutcome.BOUNCED,
            REPLIER: TaskOutcome.REPLIED,
            COMPLAINER: TaskOutcome.COMPLAINED,
            LEAVER: TaskOutcome.UNSUBSCRIBED,
            DOOMED: None,
        }
        and states == {TaskState.CANCELLED}
        and app.store.get_campaign(news).state is CampaignState.COMPLETED
        and app.store.get_campaign(refused).state is CampaignState.PAUSED
    )


def _check_the_deliveries(
    app: Container, receiver: Receiver, start: int, expected: list[str]
) -> None:
    records = receiver.records()
    assert records and all(r.get("ok") for r in records), [r for r in records if not r["ok"]]
    # in order: each event first arrived after every event made before it
    wanted = set(expected)
    arrived = [i for i in first_arrivals(receiver.ids()) if i in wanted]
    assert arrived == expected
    assert [change_id_of(i) for i in arrived] == sorted(change_id_of(i) for i in arrived)
    assert {r["type"] for r in records} == {t.value for t in EventType}
    changes = {event_id(e.id): e for e in app.store.changes_after(start, limit=10_000)}
    cancels: set[str] = set()
    for record in records:
        change = changes[record["id"]]
        data = record["data"]
        assert set(data) == {
            "campaign_id",
            "task_id",
            "step",
            "sender",
            "recipient",
            "state",
            "outcome",
            "reason",
            "message_id",
        }
        assert (data["state"], data["outcome"]) == DOCUMENTED[record["type"]], record
        _check_reason(record["type"], data["reason"], change)
        if record["type"] == "email.cancelled":
            cancels.add(data["reason"])
        _check_subject(app, data, change)
    assert cancels == CANCEL_REASONS


def _check_reason(kind: str, reason: Any, change: ChangeLogEntry) -> None:
    """The ``reason`` docs/webhooks.md gives each type, as the change made it."""
    assert reason == change.note
    if kind == "email.sent":
        assert reason is None
    elif kind in ("email.bounced", "email.complained", "email.replied", "email.unsubscribed"):
        assert reason == f"outcome: {kind.removeprefix('email.')}"
    elif kind == "email.failed":
        assert "550 5.1.1" in reason, reason
    elif kind == "email.cancelled":
        assert reason in CANCEL_REASONS, reason
    elif kind == "campaign.completed":
        assert reason == "every email reached a final state"
    elif kind == "campaign.paused":
        assert reason.startswith("auto-paused after 2 failed sends in a row"), reason
    elif kind == "dead_letter":
        assert "store did not answer" in reason, reason


def _check_subject(app: Container, data: dict[str, Any], change: ChangeLogEntry) -> None:
    """The campaign and task fields: the task's own (null for a campaign event)."""
    assert data["campaign_id"] == change.campaign_id
    if change.task_id is None:
        assert data["task_id"] is data["step"] is data["sender"] is None
        assert data["recipient"] is data["message_id"] is None
        return
    task = app.store.get_task(change.task_id)
    assert task is not None
    assert (data["task_id"], data["step"], data["recipient"]) == (task.id, 1, task.email)
    assert data["message_id"] == task.message_id
    assert (data["message_id"] is not None) is (task.sent_at is not None)
    campaign = app.store.get_campaign(task.campaign_id)
    assert data["sender"] == (SENDER.email if campaign.sender_ids else None)
