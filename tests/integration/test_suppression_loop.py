"""A suppressed address is never sent to, end to end on real parts: the store (SQLite, and
PostgreSQL), the embedded scheduler and dispatcher, SMTP to a real aiosmtpd server. Listed
before provisioning: its email is created Cancelled and never scheduled. Listed after: the
worker cancels it at its send time."""

from __future__ import annotations

from pathlib import Path

import pytest

from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import schedule_group
from sendqueue.services.campaigns.demo import demo_csv, demo_policy
from sendqueue.services.importing.recipients import Templates
from tests.support.real import all_final, real_app, running_worker, wait_until
from tests.support.smtp import SmtpSink


@pytest.mark.parametrize("store", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_suppressed_address_is_never_sent(
    tmp_path: Path, smtp_sink: SmtpSink, request: pytest.FixtureRequest, store: str
) -> None:
    overrides = {}
    if store == "postgres":
        overrides["database_url"] = request.getfixturevalue("postgres_url")
    app = real_app(tmp_path, smtp_sink.url(), **overrides)
    # before provisioning, in another case than the recipient list's
    app.suppression.add("DEMO003@example.com", "bounced")
    app.suppression.add("demo007@EXAMPLE.com", "unsubscribed")
    cid = app.campaign_import.create(
        name="suppressed",
        recipients=demo_csv(10),
        policy=demo_policy(app.clock.now(), "UTC", 10, 0.3),
        from_addr="news@example.com",
        templates=Templates(subject="Hello {{ name }}", body="Hi\n"),
    ).campaign.id
    report = app.provisioner.provision(cid)
    assert (report.status, report.suppressed, report.schedules_created) == ("done", 2, 8)
    assert len(app.scheduler.list(schedule_group(cid))) == 8
    # after provisioning, before its send time: the worker catches it
    app.suppression.add("demo009@example.com", "complained")

    with running_worker(app):
        wait_until(lambda: all_final(app, cid), 60, "all tasks final")
        wait_until(lambda: app.store.get_campaign(cid).state is CampaignState.COMPLETED, 10)

    sent = sorted(m.rcpt_tos[0] for m in smtp_sink.messages)
    assert sent == [f"demo{i:03d}@example.com" for i in (1, 2, 4, 5, 6, 8, 10)]
    tasks = {t.email: t for t in app.store.list_tasks(cid)}
    assert {
        e: (t.state, t.reason) for e, t in tasks.items() if t.state is not TaskState.FINISHED
    } == {
        "demo003@example.com": (TaskState.CANCELLED, "suppressed: bounced"),
        "demo007@example.com": (TaskState.CANCELLED, "suppressed: unsubscribed"),
        "demo009@example.com": (TaskState.CANCELLED, "suppressed: complained"),
    }
    assert tasks["demo009@example.com"].attempts == 0  # never claimed
    assert app.suppressions.count_suppressed_tasks(cid) == 3
    app.close()
