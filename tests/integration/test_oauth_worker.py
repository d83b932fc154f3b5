"""The worker sends a sender's emails with OAuth 2.0 sign-in (XOAUTH2), wired by the
composition root: the configured mailer's SMTP server, the sender's grant, a real token
endpoint and aiosmtpd on loopback; a revoked grant fails the sends for good."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from sendqueue.bootstrap import bootstrap
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.policy import SendingPolicy, Window
from sendqueue.domain.senders import OAuthGrant
from sendqueue.settings import Settings
from sendqueue.testing import InMemoryTaskStore
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.scheduler import FakeScheduler
from tests.support.app import csv_bytes
from tests.support.oauth import CLIENT_ID, CLIENT_SECRET, TokenEndpoint, XOAuth2Smtp

START = datetime(2026, 12, 1, 7, 0, tzinfo=UTC)
POLICY = SendingPolicy(
    timezone="UTC", per_day=100, weekdays=frozenset(range(7)), windows=(Window(0, 1440),)
)


def test_the_worker_signs_in_with_the_senders_token_and_fails_on_a_revoked_grant(
    token_endpoint: TokenEndpoint, xoauth2_smtp: XOAuth2Smtp
) -> None:
    clock = FakeClock(START)
    scheduler = FakeScheduler(clock, seed=1)
    settings = Settings(
        mailer=xoauth2_smtp.url(),  # no user: each sender signs in as itself
        max_lateness=30 * 86400,
        space_late_sends=False,
        _env_file=None,
    )
    app = bootstrap(settings, clock=clock, store=InMemoryTaskStore(), scheduler=scheduler)
    try:
        sender = app.senders.add(email="news@example.com", name="News")
        grant = OAuthGrant(
            token_endpoint.url, CLIENT_ID, "rt-1", CLIENT_SECRET, token_endpoint.scope
        )
        app.sender_store.update_sender(replace(app.sender_store.get_sender(sender.id), oauth=grant))

        def campaign(prefix: str) -> str:
            made = app.campaign_import.create(
                name=prefix, recipients=csv_bytes(2, prefix=prefix), policy=POLICY,
                senders=[sender.id],
            )  # fmt: skip
            assert app.provisioner.provision(made.campaign.id).status == "done"
            return made.campaign.id

        campaign("first")
        scheduler.run_until(clock, app.invoke, clock.now() + timedelta(hours=1))
        assert len(xoauth2_smtp.messages) == 2
        assert xoauth2_smtp.attempts == ["ok"]  # one connection, one sign-in

        app.sender_mailers.close()  # the next send signs in again...
        clock.advance(hours=2)  # ...and needs a new token, which the revoked grant cannot get
        token_endpoint.fail_next(400, "invalid_grant", "Token has been expired or revoked.")
        calls = token_endpoint.calls
        second = campaign("second")
        scheduler.run_until(clock, app.invoke, clock.now() + timedelta(hours=1))

        tasks = app.store.list_tasks(second, limit=10)
        assert {t.state for t in tasks} == {TaskState.FAILED}  # permanent: not retried
        error = tasks[0].error or ""
        assert "sender news@example.com: oauth" in error and "invalid_grant" in error
        assert "rt-1" not in error and CLIENT_SECRET not in error
        assert len(xoauth2_smtp.messages) == 2
        assert token_endpoint.calls == calls + 1  # the refusal is remembered for the grant
    finally:
        app.close()
