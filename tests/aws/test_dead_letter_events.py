"""``dead_letter`` events on AWS (moto: DynamoDB, EventBridge Scheduler played, SQS): no process
sees a send fail for good there, so the webhooks function relays the SQS dead-letter queue
into the change log each run, once per letter, and a redrive relays a letter before it
deletes its message."""

from __future__ import annotations

from typing import Any

import pytest

from sendqueue import lambda_handlers
from sendqueue.bootstrap import Container, bootstrap
from sendqueue.bootstrap import webhooks as bootstrap_webhooks
from sendqueue.domain.models import expected_schedule_name
from sendqueue.domain.webhooks import DEAD_LETTER
from tests.aws.test_lambda import PROVISION_ARN, Aws, _fire_until_done, aws
from tests.support.eventbridge_player import FakeContext
from tests.unit.test_webhooks import Receiver

__all__ = ["aws"]  # the fixture: the app on moto, its clock and the played EventBridge


def _dead_letter_events(receiver: Receiver) -> list[tuple[str, Any]]:
    return [
        (h["webhook-id"], b["data"]["task_id"])  # type: ignore[index]
        for _, h, b in receiver.got
        if b["type"] == "dead_letter"
    ]


def _run_webhooks() -> dict[str, Any]:
    # 15.2 s left: it relays, then delivers for 0.2 s (15 s are kept for the rest)
    return lambda_handlers.webhooks_handler({}, FakeContext(PROVISION_ARN, 15_200))


def _entries(app: Container) -> list[str | None]:
    return [
        e.task_id for e in app.store.changes_after(0, limit=10_000) if e.to_state == DEAD_LETTER
    ]


def test_the_webhooks_function_makes_one_dead_letter_event_per_letter_and_redrives_keep_it(
    aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = Receiver()
    monkeypatch.setattr(bootstrap_webhooks, "webhook_transport", lambda _c: receiver)
    aws.app.webhooks.add("https://hooks.example.com/in")
    cid = aws.create_campaign(3)
    lambda_handlers.provision_handler({"campaignId": cid}, FakeContext(PROVISION_ARN, 900_000))
    tasks = aws.app.store.list_tasks(cid, limit=10)
    doomed = {expected_schedule_name(tasks[0]), expected_schedule_name(tasks[2])}
    # the Scheduler cannot hand these two to Lambda: after its retries, the SQS queue
    player = aws.player(handoff_fails=lambda name, attempt: name in doomed)
    reports = _fire_until_done(aws, player, minutes=3)
    assert sorted(n for r in reports for n in r.dead_lettered) == sorted(doomed)
    letters = {d.payload["task_id"]: d for d in aws.app.scheduler.dead_letters()}
    assert set(letters) == {tasks[0].id, tasks[2].id}

    # A redrive of a letter no webhooks run has met yet relays it before deleting it.
    aws.app.dead_letter_queue.redrive(letters[tasks[2].id].id)
    assert _entries(aws.app) == [tasks[2].id]

    assert _run_webhooks()["status"] == "handled"
    got = _dead_letter_events(receiver)
    assert sorted(task for _, task in got) == sorted([tasks[0].id, tasks[2].id])
    # the letter still waiting in the queue is left there
    assert [d.id for d in aws.app.scheduler.dead_letters()] == [letters[tasks[0].id].id]

    # Later runs, a cold start (a new container: nothing remembered) and a redrive of the
    # relayed letter add no second event.
    _run_webhooks()
    lambda_handlers.use(_fresh(aws), invoke=lambda **kw: None)
    _run_webhooks()
    lambda_handlers.container().dead_letter_queue.redrive(letters[tasks[0].id].id)
    _run_webhooks()
    assert _dead_letter_events(receiver) == got
    assert sorted(_entries(aws.app), key=str) == sorted([tasks[0].id, tasks[2].id])
    body = next(b for _, _, b in receiver.got if b["type"] == "dead_letter")
    assert body["data"]["state"] == DEAD_LETTER  # type: ignore[index]
    assert "TooManyRequestsException" in body["data"]["reason"]  # type: ignore[index]


def _fresh(aws: Aws) -> Container:
    """A second container on the same table, queue and clock, as a cold start builds one: its
    relay remembers nothing."""
    return bootstrap(
        aws.app.settings,
        clock=aws.clock,
        store=aws.app.store,
        scheduler=aws.app.scheduler,
        mailer=aws.app.mailer,
    )
