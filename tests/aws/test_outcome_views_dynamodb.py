"""Issue 14's views on the DynamoDB task store (moto server): a campaign's stop-on-reply and
footer options read back as created, and its outcome counts come from the store's own
``count_outcomes``, as the API and ``campaign show --json`` print them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sendqueue.adapters.dynamodb.store import DynamoDbTaskStore
from sendqueue.domain.feedback import Feedback, FeedbackKind
from sendqueue.services.feedback.effects import FeedbackService
from sendqueue.services.reading.views import campaign_dict, task_dict
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.scheduler import FakeScheduler
from tests.support.app import T0, csv_bytes, fake_app, open_policy
from tests.support.aws import client, dynamodb_url, reset


@pytest.fixture
def store() -> Iterator[DynamoDbTaskStore]:
    reset()
    made = DynamoDbTaskStore(client("dynamodb", url=dynamodb_url()), "sqt", create_table=True)
    yield made
    made.close()


def test_options_and_outcome_counts_read_back_from_dynamodb(store: DynamoDbTaskStore) -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock, store=store)
    cid = app.campaign_import.create(
        name="t",
        recipients=csv_bytes(3),
        policy=open_policy(),
        from_addr="n@example.com",
        stop_on_reply="off",
        unsubscribe_footer=True,
    ).campaign.id
    assert app.provisioner.provision(cid).status == "done"
    clock.advance(60)
    scheduler = app.scheduler
    assert isinstance(scheduler, FakeScheduler)
    assert scheduler.fire_due(app.invoke) == 3
    bounced = f"{cid}-0"
    feedback: Any = store  # the task store is also the FeedbackStore and the SuppressionList
    service = FeedbackService(store, feedback, feedback, clock, senders=feedback)
    assert service.apply(
        Feedback(FeedbackKind.HARD_BOUNCE, clock.now(), task_id=bounced, detail="5.1.1")
    ).outcome_set

    view = campaign_dict(store, store.get_campaign(cid))
    assert (view["stop_on_reply"], view["unsubscribe_footer"]) == ("off", True)
    assert view["outcomes"] == {
        "accepted": 2, "bounced": 1, "complained": 0, "replied": 0, "unsubscribed": 0,
    }  # fmt: skip
    row = task_dict(store.get_task(bounced))  # type: ignore[arg-type]
    assert (row["state"], row["outcome"], row["outcome_detail"]) == ("Finished", "bounced", "5.1.1")
