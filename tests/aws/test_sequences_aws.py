"""A 3-step sequence on the DynamoDB store and the EventBridge Scheduler layer (moto, played).

The send handler marks each recipient's next step in its finish and makes it right after (on
this layer always inline); the reconcile handler makes a marked step the send could not make.
Every step goes out exactly once, from step 1's thread.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest

from sendqueue import lambda_handlers
from sendqueue.domain.errors import StoreUnavailable
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import schedule_group, task_id
from sendqueue.domain.steps import Step, parse_delay
from tests.aws.test_lambda import (
    PROVISION_ARN,
    Aws,
    _fire_until_done,
    _messages_by_task,
    aws,
)
from tests.support.app import open_policy
from tests.support.eventbridge_player import FakeContext

__all__ = ["aws"]  # the fixture: the app on moto, its clock and the played EventBridge

COUNT = 4
ROWS = ("email,name\n" + "".join(f"user{i}@example.com,User {i}\n" for i in range(COUNT))).encode()
STEPS = (
    Step(1, "Hello {{ name }}", "Hi {{ name }}\n", None, None),
    Step(2, None, "Any news, {{ name }}?\n", None, parse_delay("1m")),
    Step(3, "Last note", "Bye {{ name }}\n", None, parse_delay("1m")),
)


def _sequence(aws: Aws) -> str:
    cid = aws.app.campaign_import.create(
        name="seq",
        recipients=ROWS,
        policy=open_policy(aws.clock.now()),
        from_addr="news@example.com",
        steps=STEPS,
    ).campaign.id
    summary = lambda_handlers.provision_handler(
        {"campaignId": cid}, FakeContext(PROVISION_ARN, 900_000)
    )
    assert (summary["status"], summary["tasksCreated"]) == ("done", COUNT)
    return cid


def _by_step(aws: Aws, cid: str) -> Counter[tuple[int, TaskState]]:
    return Counter((t.step, t.state) for t in aws.app.store.list_tasks(cid, limit=100))


def _all_sent_once(aws: Aws, cid: str) -> None:
    tasks = aws.app.store.list_tasks(cid, limit=100)
    assert _by_step(aws, cid) == {(k, TaskState.FINISHED): COUNT for k in (1, 2, 3)}
    assert _messages_by_task() == Counter({t.id: 1 for t in tasks})
    for position in range(COUNT):
        first, second, third = (
            aws.app.store.get_task(task_id(cid, position, k)) for k in (1, 2, 3)
        )
        assert first is not None and second is not None and third is not None
        assert first.sent_at and second.sent_at and third.sent_at
        assert second.sent_at >= first.sent_at + timedelta(minutes=1) - timedelta(seconds=59)
        assert third.sent_at >= second.sent_at + timedelta(minutes=1) - timedelta(seconds=59)
        assert second.subject == f"Re: Hello User {position}"
    assert aws.app.store.get_campaign(cid).state is CampaignState.COMPLETED
    assert aws.raw_schedules() == {}


def test_the_send_handler_makes_each_next_step_and_every_step_goes_out_once(aws: Aws) -> None:
    cid = _sequence(aws)
    player = aws.player()
    _fire_until_done(aws, player, minutes=2)
    assert _by_step(aws, cid)[(1, TaskState.FINISHED)] == COUNT
    assert (
        _by_step(aws, cid)[(2, TaskState.PENDING)] + _by_step(aws, cid)[(2, TaskState.FINISHED)]
        == COUNT
    )
    _fire_until_done(aws, player, minutes=6)
    _all_sent_once(aws, cid)


def test_the_reconcile_handler_makes_a_step_the_send_could_not(
    aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    cid = _sequence(aws)

    def down(*args: object, **kwargs: object) -> None:
        raise StoreUnavailable("the store went away")

    with monkeypatch.context() as patched:
        patched.setattr(aws.app.followups, "make_due", down)
        _fire_until_done(aws, aws.player(), minutes=2)
    assert _by_step(aws, cid) == {(1, TaskState.FINISHED): COUNT}
    assert len(aws.app.store.follow_ups_due(cid)) == COUNT  # marked in each finish
    assert aws.app.store.get_campaign(cid).state is CampaignState.ACTIVE
    assert aws.app.scheduler.list(schedule_group(cid)) == []

    aws.clock.advance(minutes=6)  # the marks are no longer fresh: a dead send's, not a live one's
    report = lambda_handlers.reconcile_handler({}, FakeContext(PROVISION_ARN, 900_000))

    assert report["ran"] is True and report["follow_ups_made"] == COUNT
    assert aws.app.store.follow_ups_due(cid) == []
    assert _by_step(aws, cid)[(2, TaskState.PENDING)] == COUNT
    assert len(aws.app.scheduler.list(schedule_group(cid))) == COUNT
    assert (
        lambda_handlers.reconcile_handler({}, FakeContext(PROVISION_ARN, 900_000))[
            "follow_ups_made"
        ]
        == 0
    )
    _fire_until_done(aws, aws.player(), minutes=6)
    _all_sent_once(aws, cid)
