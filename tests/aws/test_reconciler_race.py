"""The reconciler racing a sending worker (issue 16) on AWS: DynamoDB and EventBridge Scheduler
on moto, fired by :class:`~tests.support.eventbridge_player.EventBridgePlayer` at the send
handler. The same scenarios as the fakes, the embedded layer and procrastinate."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from sendqueue import lambda_handlers
from sendqueue.adapters.dynamodb.store import DynamoDbTaskStore
from sendqueue.bootstrap import bootstrap
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from tests.aws.test_lambda import TABLE, _settings
from tests.support.app import LENIENT_LATENESS, T0
from tests.support.aws import SCHEDULE_GROUP, client, dynamodb_url, eventbridge, world
from tests.support.eventbridge_player import EventBridgePlayer, FakeContext
from tests.support.faults import Meanwhile
from tests.support.reconciler_race import Build, Layer, RaceScenarios


@pytest.fixture
def build() -> Iterator[Build]:
    opened: list[Layer] = []

    def make(**settings: Any) -> Layer:
        made = world()
        clock = FakeClock(T0)
        # moto's one-request-at-a-time endpoint: concurrent claims are atomic, as on DynamoDB
        store = Meanwhile(
            DynamoDbTaskStore(client("dynamodb", url=dynamodb_url()), TABLE, create_table=True)
        )
        mailer = RecordingMailer()
        app = bootstrap(
            _settings(made, max_lateness=LENIENT_LATENESS, space_late_sends=False, **settings),
            clock=clock,
            store=store,
            scheduler=eventbridge(clock, made),
            mailer=mailer,
        )
        lambda_handlers.use(app, invoke=lambda **kw: None)

        def fire() -> list[str]:
            invoked: list[str] = []

            def handler(event: Mapping[str, Any], context: Any) -> object:
                invoked.append(str(event["taskId"]))
                return lambda_handlers.send_handler(event, context)

            EventBridgePlayer(
                client("scheduler"),
                client("sqs"),
                group=SCHEDULE_GROUP,
                dead_letter_url=made.dlq_url,
                handler=handler,
                clock=clock,
                context=lambda: FakeContext(made.send_arn, 300_000),
                early=lambda name: False,  # at its time: the scenario fires three of six
            ).fire_due()
            return invoked

        layer = Layer(app, store, clock, mailer, fire)
        opened.append(layer)
        return layer

    yield make
    lambda_handlers.use()
    for layer in opened:
        layer.app.close()


class TestRacesOnAws(RaceScenarios):
    """The scenarios of tests/support/reconciler_race.py on DynamoDB and EventBridge."""
