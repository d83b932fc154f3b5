"""Webhooks end to end, with real processes: a receiver process on 127.0.0.1 (allowed through
SENDQUEUE_WEBHOOK_ALLOW_HOSTS) that verifies every signature with the ``standardwebhooks``
library and records the ids, and ``sendqueue worker`` processes sending a campaign to aiosmtpd.

- A campaign with a permanent failure, a cancel and a reply makes its events; the receiver is
  killed for 2 minutes in the middle (retries every 0.5 s doubling to 4 s, so many retries
  happen while the sends go on, undelayed) and comes back: nothing is lost, the order is kept,
  a duplicate carries its event's id.
- A worker SIGKILLed while a delivery is in flight: after a restart the event still arrives,
  with the same id.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import cast

import pytest

from sendqueue.bootstrap import Container
from sendqueue.domain.lifecycle import TaskOutcome, TaskState
from sendqueue.ports import FeedbackStore
from sendqueue.services.campaigns.demo import demo_csv, demo_policy
from sendqueue.services.importing.recipients import Templates
from tests.support import worker_proc
from tests.support.real import all_final, real_app, wait_until
from tests.support.smtp import SmtpSink
from tests.support.webhook_e2e import Receiver, expected_events, first_arrivals, worker_env

OUTAGE_SECONDS = 120.0

pytestmark = pytest.mark.slow


def _campaign(app: Container, count: int, interval: float) -> str:
    cid = app.campaign_import.create(
        name="hooks",
        recipients=demo_csv(count),
        policy=demo_policy(app.clock.now(), "UTC", count, interval),
        templates=Templates(subject="s {{ name }}", body="b"),
    ).campaign.id
    assert app.provisioner.provision(cid).status == "done"
    return cid


@pytest.mark.timeout(480)
def test_a_receiver_outage_loses_nothing_and_keeps_the_order(
    tmp_path: Path, smtp_sink: SmtpSink
) -> None:
    app = real_app(tmp_path, smtp_sink.url())
    made = app.webhooks.add("http://127.0.0.1:1/hook")  # the port is set once it listens
    receiver = Receiver(tmp_path, made.secret)
    receiver.start()
    endpoint = made.endpoint.id
    app.webhooks.update(endpoint, url=receiver.url)
    start = app.webhooks.get(endpoint).cursor
    smtp_sink.reply_next("550 5.1.1 no such user")  # the first send fails for good
    cid = _campaign(app, 16, 2.5)
    cancelled = app.campaign_controls.cancel_task(f"{cid}-15")
    assert cancelled.state is TaskState.CANCELLED
    worker = worker_proc.start(worker_env(tmp_path, smtp_sink.url()))
    try:
        wait_until(lambda: len(receiver.ids()) >= 3, 60, "the first events")
        receiver.kill()
        before = app.store.count_tasks(cid)
        time.sleep(OUTAGE_SECONDS)
        down = app.webhooks.get(endpoint)
        assert down.attempts >= 4, down  # several retries while it was down
        after = app.store.count_tasks(cid)
        # the sends went on while the endpoint failed (2.5 s apart: dozens in 2 minutes)
        assert after.get(TaskState.FINISHED, 0) >= before.get(TaskState.FINISHED, 0) + 10
        receiver.start()
        wait_until(lambda: all_final(app, cid), 120, "every task final")
        sent = app.store.list_tasks(cid, state=TaskState.FINISHED, limit=1)[0]
        feedback = cast(FeedbackStore, app.store)
        assert feedback.set_outcome(sent.id, TaskOutcome.REPLIED, detail="re", at=app.clock.now())
        expected = expected_events(app, start)
        wait_until(lambda: set(expected) <= set(receiver.ids()), 120, "every event")
    finally:
        worker_proc.stop(worker)
        receiver.kill()
    records = receiver.records()
    assert all(r.get("ok") for r in records), [r for r in records if not r.get("ok")]
    ids = receiver.ids()
    assert first_arrivals(ids) == expected  # nothing lost, nothing extra, in order
    types = {r["type"] for r in records}
    assert {
        "email.sent",
        "email.failed",
        "email.cancelled",
        "email.replied",
        "campaign.completed",
    } <= types
    failures = [d for d in app.webhooks.deliveries(endpoint, limit=1000).deliveries if not d.ok]
    assert failures and all(d.event_id in expected for d in failures)


def test_a_worker_killed_mid_delivery_delivers_the_event_after_its_restart(
    tmp_path: Path, smtp_sink: SmtpSink
) -> None:
    app = real_app(tmp_path, smtp_sink.url())
    made = app.webhooks.add("http://127.0.0.1:1/hook")
    receiver = Receiver(tmp_path, made.secret)
    receiver.start(hang_first=True)
    app.webhooks.update(made.endpoint.id, url=receiver.url)
    start = app.webhooks.get(made.endpoint.id).cursor
    env = worker_env(tmp_path, smtp_sink.url())
    cid = _campaign(app, 3, 1.0)
    worker = worker_proc.start(env)

    def hung() -> str | None:
        return next((r["hung"] for r in receiver.records() if "hung" in r), None)

    wait_until(lambda: hung() is not None, 60, "a delivery in flight")
    worker.kill()  # SIGKILL, while the receiver holds the request
    worker.wait(10)
    assert worker.returncode == -signal.SIGKILL
    if worker.stdout is not None:
        worker.stdout.close()
    worker = worker_proc.start(env)
    try:
        wait_until(lambda: all_final(app, cid), 60, "every task final")
        wait_until(lambda: hung() in receiver.ids(), 60, "the killed delivery again")
        expected = expected_events(app, start)
        wait_until(lambda: set(expected) <= set(receiver.ids()), 60, "every event")
    finally:
        worker_proc.stop(worker)
        receiver.kill()
    assert first_arrivals(receiver.ids()) == expected
    assert receiver.ids()[0] == hung()
