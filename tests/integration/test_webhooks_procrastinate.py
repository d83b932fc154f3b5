"""Webhooks on the procrastinate layer: two ``sendqueue worker`` processes on PostgreSQL share
one endpoint (its store lease) and deliver a campaign's events to a receiver process, each
verified, every one in the order made."""

from __future__ import annotations

from pathlib import Path

import pytest

from sendqueue.domain.lifecycle import CampaignState
from tests.integration.test_procrastinate import _app, _campaign, _env, _fleet
from tests.integration.test_webhooks_e2e import Receiver, _expected, _first_arrivals
from tests.support.real import all_final, wait_until
from tests.support.smtp import SmtpSink

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.xdist_group("many-connections")]


def test_two_procrastinate_workers_deliver_every_event_once_in_order(
    tmp_path: Path, postgres_url: str, smtp_sink: SmtpSink
) -> None:
    app = _app(postgres_url, smtp_sink.url())
    made = app.webhooks.add("http://127.0.0.1:1/hook")
    receiver = Receiver(tmp_path, made.secret)
    receiver.start()
    app.webhooks.update(made.endpoint.id, url=receiver.url)
    start = app.webhooks.get(made.endpoint.id).cursor
    env = _env(
        postgres_url,
        smtp_sink.url(),
        SENDQUEUE_WEBHOOK_ALLOW_HOSTS="127.0.0.1",
        SENDQUEUE_WEBHOOK_POLL_INTERVAL="0.1",
    )
    try:
        with _fleet(tmp_path, postgres_url, [env, env]):
            cid = _campaign(app, 20, 0.3)
            assert app.provisioner.provision(cid).status == "done"
            # the completion is logged after the last send: wait for it, so it is among the
            # events read below (faster deliveries could otherwise end the wait before it)
            wait_until(
                lambda: (
                    all_final(app, cid) and app.store.campaign_state(cid) is CampaignState.COMPLETED
                ),
                90,
                "every task final and the campaign completed",
            )
            expected = _expected(app, start)
            wait_until(lambda: set(expected) <= set(receiver.ids()), 60, "every event")
    finally:
        receiver.kill()
        app.close()
    records = receiver.records()
    assert all(r.get("ok") for r in records)
    # an event made after ``expected`` was read (a late change) may arrive too: the ones read
    # all arrive, once each first, in the order they were made
    wanted = set(expected)
    assert [i for i in _first_arrivals(receiver.ids()) if i in wanted] == expected
    assert {r["type"] for r in records} >= {"email.sent", "campaign.completed"}
