"""Where outcomes show (issue 14): a task's outcome fields, a campaign's counts per outcome,
and the campaign's stop-on-reply and unsubscribe-footer options, carried from creation to the
view the CLI and the API share. On fakes and a fake clock."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from sendqueue.bootstrap import Container
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.feedback import Feedback, FeedbackKind
from sendqueue.domain.lifecycle import StopOnReply, TaskOutcome, TaskState
from sendqueue.ports import FeedbackStore
from sendqueue.services.feedback.effects import FeedbackService
from sendqueue.services.reading.views import (
    TASK_LIST_KEYS,
    CampaignView,
    campaign_dict,
    task_dict,
    task_list_dict,
)
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.scheduler import FakeScheduler
from sendqueue.testing.store import InMemoryTaskStore
from tests.support.app import T0, csv_bytes, fake_app, open_policy


def _sent(app: Container, clock: FakeClock, count: int = 5) -> str:
    """A campaign whose ``count`` emails are all sent (Finished)."""
    cid = app.campaign_import.create(
        name="t", recipients=csv_bytes(count), policy=open_policy(), from_addr="n@example.com"
    ).campaign.id
    assert app.provisioner.provision(cid).status == "done"
    clock.advance(hours=1)
    scheduler = app.scheduler
    assert isinstance(scheduler, FakeScheduler)
    assert scheduler.fire_due(app.invoke) == count
    return cid


def _feedback(app: Container, clock: FakeClock) -> FeedbackService:
    # the in-memory task store is also the FeedbackStore and the SuppressionList
    store: Any = app.store
    return FeedbackService(store, store, store, clock, senders=store)


def test_campaign_view_counts_every_outcome_and_tasks_carry_theirs() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _sent(app, clock)
    tasks = app.store.list_tasks(cid)
    service = _feedback(app, clock)
    at = clock.now() + timedelta(minutes=5)
    service.apply(
        Feedback(FeedbackKind.HARD_BOUNCE, at, task_id=tasks[0].id, detail="5.1.1 user unknown")
    )
    service.apply(Feedback(FeedbackKind.REPLY, at, task_id=tasks[1].id, detail="Re: hello"))
    service.apply(Feedback(FeedbackKind.COMPLAINT, at, task_id=tasks[2].id, detail="abuse"))
    feedback_store: FeedbackStore = app.store
    # "accepted" never replaces another outcome (the worker wrote it with Finished)
    assert feedback_store.set_outcome(tasks[0].id, TaskOutcome.ACCEPTED, detail=None, at=at) is None

    view = campaign_dict(app.store, app.store.get_campaign(cid))
    assert view["outcomes"] == {
        "accepted": 2, "bounced": 1, "complained": 1, "replied": 1, "unsubscribed": 0,
    }  # fmt: skip
    assert list(view["outcomes"]) == [o.value for o in TaskOutcome]
    assert view["counts"]["Finished"] == 5  # an outcome never moves a task's state

    bounced = task_dict(app.store.get_task(tasks[0].id))  # type: ignore[arg-type]
    assert bounced["state"] == "Finished"
    assert bounced["outcome"] == "bounced"
    assert bounced["outcome_detail"] == "5.1.1 user unknown"
    assert bounced["outcome_at"] == "2026-12-01T09:05:00Z"
    accepted = task_list_dict(app.store.get_task(tasks[4].id))  # type: ignore[arg-type]
    assert list(accepted) == list(TASK_LIST_KEYS)
    assert (accepted["outcome"], accepted["outcome_detail"], accepted["outcome_at"]) == (
        "accepted", None, "2026-12-01T09:00:00Z",
    )  # fmt: skip


def test_a_campaign_with_nothing_sent_names_every_outcome_with_zero() -> None:
    app = fake_app()
    cid = app.campaign_import.create(
        name="t", recipients=csv_bytes(2), policy=open_policy(), from_addr="n@example.com"
    ).campaign.id
    assert app.provisioner.provision(cid).status == "done"
    view = CampaignView.read(app.store, app.store.get_campaign(cid))
    assert view.outcomes == {o.value: 0 for o in TaskOutcome}
    pending = task_dict(app.store.list_tasks(cid)[0])
    assert (pending["outcome"], pending["outcome_detail"], pending["outcome_at"]) == (
        None, None, None,
    )  # fmt: skip


def test_the_options_are_carried_into_the_campaign_and_its_view() -> None:
    app = fake_app()
    created = app.campaign_import.create(
        name="t",
        recipients=csv_bytes(2),
        policy=open_policy(),
        from_addr="n@example.com",
        stop_on_reply="Campaign",
        unsubscribe_footer=True,
    )
    stored = app.store.get_campaign(created.campaign.id)
    assert stored.stop_on_reply is StopOnReply.CAMPAIGN
    assert stored.unsubscribe_footer is True
    view = campaign_dict(app.store, stored)
    assert (view["stop_on_reply"], view["unsubscribe_footer"]) == ("campaign", True)

    rows = app.campaign_import.create_from_rows(
        name="rows",
        rows=[{"email": "a@example.com", "subject": "s", "body": "b"}],
        policy=open_policy(),
        stop_on_reply=StopOnReply.OFF,
    )
    assert rows.campaign.stop_on_reply is StopOnReply.OFF
    assert rows.campaign.unsubscribe_footer is False


def test_the_defaults_are_sender_and_no_footer() -> None:
    app = fake_app()
    campaign = app.campaign_import.create(
        name="t", recipients=csv_bytes(1), policy=open_policy(), from_addr="n@example.com"
    ).campaign
    assert (campaign.stop_on_reply, campaign.unsubscribe_footer) == (StopOnReply.SENDER, False)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"stop_on_reply": "always"}, "stop_on_reply"),
        ({"stop_on_reply": ""}, "stop_on_reply"),
        ({"unsubscribe_footer": "yes"}, "unsubscribe_footer"),
        ({"unsubscribe_footer": 1}, "unsubscribe_footer"),
    ],
)
def test_a_bad_option_names_its_field_and_creates_nothing(
    options: dict[str, object], field: str
) -> None:
    store = InMemoryTaskStore()
    app = fake_app(store=store)
    with pytest.raises(InvalidField) as caught:
        app.campaign_import.create(
            name="t",
            recipients=csv_bytes(2),
            policy=open_policy(),
            from_addr="n@example.com",
            **options,  # type: ignore[arg-type]
        )
    assert caught.value.field == field
    assert store.list_campaigns() == []


def test_outcomes_are_counted_per_campaign() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    first = _sent(app, clock, 2)
    second = _sent(app, clock, 2)
    service = _feedback(app, clock)
    task = app.store.list_tasks(first)[0]
    service.apply(Feedback(FeedbackKind.UNSUBSCRIBE, clock.now(), task_id=task.id))
    assert campaign_dict(app.store, app.store.get_campaign(first))["outcomes"] == {
        "accepted": 1, "bounced": 0, "complained": 0, "replied": 0, "unsubscribed": 1,
    }  # fmt: skip
    assert campaign_dict(app.store, app.store.get_campaign(second))["outcomes"] == {
        "accepted": 2, "bounced": 0, "complained": 0, "replied": 0, "unsubscribed": 0,
    }  # fmt: skip
    assert app.suppression.count() == 1  # the unsubscribe listed the address
    assert app.store.get_task(task.id).state is TaskState.FINISHED  # type: ignore[union-attr]
