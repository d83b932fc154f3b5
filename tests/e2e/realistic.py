"""Realistic data for the layout tests and the screenshots: what a user meets in the first hour.

:func:`seed` fills a running app (``sendqueue serve --no-worker``) through its API and, where
a worker or the feedback poller would have written, through its store's own files:

- two senders, one with a long display name and address;
- a local-time campaign with both senders, recipients in five zones with long names,
  addresses and subjects, its emails Pending, Running, Finished (accepted, bounced, replied),
  Failed (a long SMTP error), Cancelled (suppressed) and moved by a retry;
- a completed campaign, every email sent; a draft;
- suppressed addresses (one from a bounce, with its email) and dead letters;
- two webhooks: one with a long URL and filters, its deliveries (answered, refused with a long
  error, timed out, redelivered) written in the store as the worker would; one disabled.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, cast

from sendqueue.adapters.sql import open_store
from sendqueue.domain.lifecycle import CampaignState, TaskOutcome, TaskState
from sendqueue.domain.models import TaskChanges
from sendqueue.domain.suppression import Suppression, SuppressionReason
from sendqueue.domain.webhooks import DeliveryRecord
from sendqueue.ports.webhooks import WebhookStore
from tests.e2e.conftest import Sendqueue, api, provision
from tests.e2e.test_pages import _dead_letters

if TYPE_CHECKING:
    from playwright.sync_api import Page

__all__ = ["Seeded", "seed"]

LONG_SUBJECT = (
    "Your personalised winter product update: new features, simpler pricing and an invitation "
    "to our live webinar"
)
# name, address, zone (None: the campaign's), subject (None: the template's)
RECIPIENTS: list[tuple[str, str, str | None, str | None]] = [
    ("Ada Lovelace", "ada.lovelace@analytical-engines.example.co.uk", "Europe/London", None),
    (
        "Maximiliane Alexandra von Hohenzollern-Sigmaringen",
        "maximiliane.alexandra.von.hohenzollern-sigmaringen@subdomain.example-university.edu",
        None,
        LONG_SUBJECT,
    ),
    ("Grace Brewster Murray Hopper", "grace.hopper@navy.example.mil", "America/New_York", None),
    ("Kenji Watanabe", "kenji.watanabe@example.jp", "Asia/Tokyo", LONG_SUBJECT),
    ("Bartholomew Featherstonehaugh-Cholmondeley", "bart@example.org", "Australia/Sydney", None),
    ("Priya Raghunathan", "priya.raghunathan@example.in", "Asia/Kolkata", None),
    ("João Guimarães Rosa", "joao.rosa@example.com.br", "America/Sao_Paulo", LONG_SUBJECT),
    ("Linus", "linus@example.fi", None, None),
    ("Hedy Lamarr", "hedy@example.at", "Europe/Vienna", None),
    ("Alan Mathison Turing", "alan.turing@bletchley.example.uk", "Europe/London", None),
    ("Katherine Johnson", "katherine.johnson@example.gov", "America/Los_Angeles", None),
    ("Margaret Hamilton", "margaret.hamilton@apollo.example.com", "America/Chicago", None),
]
BOUNCE = "5.1.1 smtp; 550 5.1.1 <bart@example.org>: Recipient address rejected: User unknown"
SMTP_ERROR = (
    "permanent: 554 5.7.1 Service unavailable; Client host [203.0.113.54] blocked using "
    "zen.spamhaus.example; https://www.spamhaus.example/query/ip/203.0.113.54"
)


@dataclass(frozen=True)
class Seeded:
    """What :func:`seed` made."""

    local: str
    """The local-time campaign with senders, emails in every state."""
    completed: str
    """A campaign whose every email is sent."""
    draft: str
    """A campaign not provisioned."""
    senders: tuple[str, ...]
    webhook: str
    """The webhook with filters and a delivery log."""

    @property
    def email(self) -> str:
        """A bounced email of the local-time campaign (the richest details page)."""
        return f"{self.local}-4"


def _sender(page: Page, app: Sendqueue, **body: object) -> str:
    return str(api(page, "POST", f"{app.url}/api/senders", data=body)["id"])


def _campaign(page: Page, app: Sendqueue, body: dict[str, object]) -> str:
    return str(api(page, "POST", f"{app.url}/api/campaigns", data=body)["id"])


def seed(page: Page, app: Sendqueue) -> Seeded:
    """Fill ``app`` with the data above (``page`` must have loaded one of its pages)."""
    senders = (
        _sender(
            page, app, email="newsletter@mail.example-company.com",
            name="Example Company Newsletter Team", daily_cap=40, timezone="Europe/Berlin",
        ),
        _sender(page, app, email="hello@example.org", name="Ada from Example", daily_cap=25),
    )  # fmt: skip
    start = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%dT09:00")
    local = _campaign(
        page, app,
        {
            "name": "Winter product update for customers in Europe, the Americas and Asia-Pacific",
            "recipients": [
                {"email": email, "name": name, **({"timezone": zone} if zone else {}),
                 **({"subject": subject} if subject else {})}
                for name, email, zone, subject in RECIPIENTS
            ],
            "templates": {
                "subject": "What is new this winter, {{ name }}",
                "body": "Hello {{ name }},\n\nhere is what changed this winter.\n\n"
                "Best regards,\nThe Example team",
            },
            "policy": {"timezone": "Europe/Berlin", "per_day": 20, "start": start,
                       "windows": ["09:00-12:00", "14:00-17:00"]},
            "senders": list(senders),
            "local_time": True,
        },
    )  # fmt: skip
    provision(page, app.url, local)
    completed = _campaign(
        page, app,
        {
            "name": "Autumn webinar follow-up",
            "recipients": [{"email": f"attendee{i}@example.net", "name": f"Attendee {i}"}
                           for i in range(5)],
            "templates": {"subject": "Thank you for joining, {{ name }}", "body": "Thanks!"},
            "policy": {"timezone": "America/New_York", "start": start},
        },
    )  # fmt: skip
    provision(page, app.url, completed)
    draft = _campaign(
        page, app,
        {
            "name": "Spring announcement (draft)",
            "recipients": [{"email": f"reader{i}@example.com"} for i in range(30)],
            "templates": {"subject": "Spring is coming", "body": "Soon."},
            "policy": {"timezone": "Asia/Tokyo", "per_day": 10, "start": start},
        },
    )  # fmt: skip
    _as_a_worker(app, local, completed)
    api(page, "POST", f"{app.url}/api/suppressions", data={"email": "No.More.Mail@Example.com"})
    api(
        page,
        "POST",
        f"{app.url}/api/suppressions",
        data={
            "email": "a.very.long.address.that.does.not.want.mail@subdomain.example-company.com",
            "reason": "unsubscribed",
        },
    )
    _dead_letters(
        app.env["SENDQUEUE_SCHEDULER_URL"],
        2,
        error="StoreUnavailable: connection to server at 10.0.3.17 port 5432 failed: "
        "Connection timed out; is the server running on that host and accepting connections?",
    )
    webhook = _webhooks(page, app, local)
    return Seeded(local=local, completed=completed, draft=draft, senders=senders, webhook=webhook)


WEBHOOK_ERROR = (
    "HTTP 503 from hooks.crm.example-company.com: the endpoint answered with a server error "
    "(Service Unavailable)"
)


def _webhooks(page: Page, app: Sendqueue, campaign: str) -> str:
    """Two endpoints; the first one's deliveries in its log. Its id."""
    url = f"{app.url}/api/webhooks"
    hook = api(
        page, "POST", url,
        data={
            "url": "https://hooks.crm.example-company.com/integrations/sendqueue/events?"
            "account=example-company-europe",
            "events": ["email.sent", "email.bounced", "email.replied", "email.unsubscribed"],
            "campaigns": [campaign],
        },
    )["id"]  # fmt: skip
    other = api(page, "POST", url, data={"url": "https://example.org/hook"})["id"]
    api(page, "PATCH", f"{url}/{other}", data={"enabled": False})
    now = datetime.now(UTC)
    records = [
        DeliveryRecord(hook, "evt_101", "email.sent", now - timedelta(hours=3), 1, 143, 200),
        DeliveryRecord(hook, "evt_102", "email.bounced", now - timedelta(hours=2), 1, 2310, 503,
                       WEBHOOK_ERROR),
        DeliveryRecord(hook, "evt_102", "email.bounced", now - timedelta(hours=1), 2, 10000,
                       None, "timed out after 10 s"),
        DeliveryRecord(hook, "evt_102", "email.bounced", now, 1, 88, 204, redelivery=True),
    ]  # fmt: skip
    store = open_store(app.database_url)
    try:
        cast(WebhookStore, store).record_deliveries(records)
    finally:
        store.close()
    return str(hook)


def _as_a_worker(app: Sendqueue, local: str, completed: str) -> None:
    """What workers and the feedback poller would have written: sends, outcomes, a failure,
    a retry that moved an email, a suppression from a bounce."""
    now = datetime.now(UTC).replace(microsecond=0)
    store = open_store(app.database_url)
    pending, running = TaskState.PENDING, TaskState.RUNNING
    finished, failed = TaskState.FINISHED, TaskState.FAILED
    try:

        def send(task_id: str, *, late: bool = False, **more: object) -> None:
            # sent a week before its planned slot: the same weekday and wall-clock time, so
            # inside the windows, and in the past
            task = store.get_task(task_id)
            assert task is not None
            at = task.send_at - timedelta(days=7)
            sent_at = at + (timedelta(hours=1) if late else timedelta(seconds=14))
            assert store.transition(task_id, pending, running, at=at)
            sent: TaskChanges = {
                "send_at": at, "sent_at": sent_at,
                "message_id": f"<{task_id}.k3v9q2@mail.example-company.com>",
                "outcome": TaskOutcome.ACCEPTED, "outcome_at": sent_at, "attempts": 1,
            }  # fmt: skip
            sent.update(more)  # type: ignore[typeddict-item]
            assert store.transition(task_id, running, finished, at=at, changes=sent)

        send(f"{local}-0")
        send(f"{local}-1", late=True)
        send(f"{local}-2", outcome=TaskOutcome.REPLIED, outcome_detail="Re: What is new")
        send(f"{local}-4", outcome=TaskOutcome.BOUNCED, outcome_detail=BOUNCE)
        assert store.transition(f"{local}-3", pending, running, at=now)
        assert store.transition(f"{local}-5", pending, running, at=now)
        assert store.transition(
            f"{local}-5", running, failed, at=now, changes={"error": SMTP_ERROR, "attempts": 3}
        )
        task = store.get_task(f"{local}-6")
        assert task is not None
        assert store.transition(f"{local}-6", pending, running, at=now)
        retry: TaskChanges = {
            "send_at": task.send_at + timedelta(hours=2), "attempts": 1, "moves": 1,
            "moved_reason": "transient: 421 4.7.0 Try again later, closing connection",
        }  # fmt: skip
        assert store.transition(f"{local}-6", running, pending, at=now, changes=retry)
        store.suppress(
            [Suppression("bart@example.org", SuppressionReason.BOUNCED, f"{local}-4", now)]
        )
        assert store.transition(
            f"{local}-7", pending, TaskState.CANCELLED, at=now,
            changes={"reason": "suppressed: unsubscribed"},
        )  # fmt: skip
        for position in range(5):
            send(f"{completed}-{position}")
        assert store.set_campaign_state(
            completed, {CampaignState.ACTIVE}, CampaignState.COMPLETED, at=now
        )
    finally:
        store.close()
    # the sent emails were planned for when they went out (the store keeps the first plan of
    # an email; these were planned and sent in the past, before this test began)
    with sqlite3.connect(app.database_url.removeprefix("sqlite:///")) as db:
        db.execute(
            "UPDATE tasks SET planned_at = send_at WHERE state = 'Finished' AND campaign_id IN "
            "(?, ?)",
            (local, completed),
        )
