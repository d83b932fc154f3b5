"""SES bounces and complaints on AWS, end to end on moto (server mode): SES-shaped events are
published to an SNS topic, SNS delivers them to SQS queues (raw message delivery on and off),
the messages received from SQS are handed to ``feedback_handler`` in the record shape Lambda
gives it, and the task outcomes, the suppression list, the Pending emails and their schedules
change as the feedback service says.

The emails are sent for real through moto's SES by the send handler; each event's ``mail``
object is made from the raw message SES accepted, as SES makes it (moto does not publish SES
events itself, nor invoke Lambda from SQS).
"""

from __future__ import annotations

import email
import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from botocore.config import Config

from sendqueue import lambda_handlers
from sendqueue.adapters.dynamodb.store import DynamoDbTaskStore
from sendqueue.adapters.eventbridge.scheduler import EventBridgeScheduler
from sendqueue.adapters.mail.ses import SesMailer
from sendqueue.bootstrap import Container, bootstrap
from sendqueue.domain.errors import InvalidField, StoreUnavailable
from sendqueue.domain.lifecycle import TaskOutcome, TaskState
from sendqueue.domain.models import Task, expected_schedule_name
from sendqueue.ports import StoreBackend
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.store import InMemoryTaskStore
from tests.aws.test_lambda import TABLE, _settings
from tests.aws.test_ses_mailer import sent_messages
from tests.support.app import T0, csv_bytes, open_policy
from tests.support.aws import REGION, SCHEDULE_GROUP, client, dynamodb_url, eventbridge, world
from tests.support.eventbridge_player import FakeContext

FEEDBACK_ARN = f"arn:aws:lambda:{REGION}:123456789012:function:sendqueue-feedback"
RECIPIENTS = 3  # user0 hard-bounces, user1 complains, user2 bounces softly


class RecordingScheduler:
    """The EventBridge adapter, recording the names of the methods called on it."""

    def __init__(self, inner: EventBridgeScheduler) -> None:
        self._inner = inner
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._inner, name)
        if not callable(found):
            return found

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return found(*args, **kwargs)

        return call


#: What every task store is, and what these tests read.
Store = StoreBackend


@dataclass
class Feedback:
    """A sent campaign, a later one to the same people, and the feedback path in moto."""

    app: Container
    store: Store
    down: Callable[[], AbstractContextManager[None]]  # the store unreachable, within
    scheduler: RecordingScheduler
    sent: dict[str, Task]  # by address: the Finished task of the first campaign
    later: str  # the campaign whose tasks are still Pending
    topic: str
    queues: dict[str, str]  # "raw" and "envelope": queue URL by delivery

    def publish(self, document: dict[str, Any]) -> None:
        client("sns").publish(TopicArn=self.topic, Message=json.dumps(document))

    def receive(self, delivery: str) -> dict[str, Any]:
        """Everything waiting in one queue, as the SQS event Lambda's poller would hand over."""
        sqs = client("sqs")
        url = self.queues[delivery]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        messages: list[dict[str, Any]] = []
        while batch := sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"]
        ).get("Messages", []):
            messages += batch
        return {
            "Records": [
                {
                    "messageId": m["MessageId"],
                    "receiptHandle": m["ReceiptHandle"],
                    "body": m["Body"],
                    "attributes": m.get("Attributes", {}),
                    "messageAttributes": {},
                    "md5OfBody": m["MD5OfBody"],
                    "eventSource": "aws:sqs",
                    "eventSourceARN": arn,
                    "awsRegion": REGION,
                }
                for m in messages
            ]
        }

    def later_task(self, address: str) -> Task:
        [task] = [t for t in self.store.list_tasks(self.later, limit=100) if t.email == address]
        return task

    def schedules(self) -> set[str]:
        page = client("scheduler").list_schedules(GroupName=SCHEDULE_GROUP, MaxResults=100)
        return {s["Name"] for s in page["Schedules"]}


#: The stores the function is run on: the template's (DynamoDB on moto) and the fake.
STORES = ["dynamodb", "memory"]


def _store(kind: str) -> tuple[Store, Callable[[], AbstractContextManager[Store]]]:
    """A fresh store of ``kind``, and an outage of it: within, the store to use fails."""
    if kind == "dynamodb":
        # moto's one-request-at-a-time endpoint: conditional writes are atomic, as on DynamoDB
        table = DynamoDbTaskStore(client("dynamodb", url=dynamodb_url()), TABLE, create_table=True)

        @contextmanager
        def unreachable() -> Iterator[Store]:
            # The same table behind a closed port, without botocore's retries.
            no_retries = Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=1)
            closed = client("dynamodb", url="http://127.0.0.1:1", config=no_retries)
            broken = DynamoDbTaskStore(closed, TABLE)
            try:
                yield broken
            finally:
                broken.close()

        return table, unreachable
    store = InMemoryTaskStore()

    @contextmanager
    def unavailable() -> Iterator[Store]:
        store.set_available(False)
        try:
            yield store
        finally:
            store.set_available(True)

    return store, unavailable


def _handle(event: dict[str, Any]) -> dict[str, Any]:
    return lambda_handlers.feedback_handler(event, FakeContext(FEEDBACK_ARN, 60_000))


@pytest.fixture(params=STORES)
def fb(request: pytest.FixtureRequest) -> Iterator[Feedback]:
    made = world()
    client("sesv2").create_email_identity(EmailIdentity="example.com")
    clock = FakeClock(T0)
    store, outage = _store(request.param)
    scheduler = RecordingScheduler(eventbridge(clock, made))

    def container(on: Store) -> Container:
        return bootstrap(
            _settings(made),
            clock=clock,
            store=on,
            scheduler=scheduler,
            mailer=SesMailer(client("sesv2")),
        )

    app = container(store)
    lambda_handlers.use(app)

    @contextmanager
    def down() -> Iterator[None]:
        """The function's container on the store in its outage (a cold start during it)."""
        with outage() as failing:
            lambda_handlers.use(container(failing))
            try:
                yield
            finally:
                lambda_handlers.use(app)

    first = app.campaign_import.create(
        name="first", recipients=csv_bytes(RECIPIENTS), policy=open_policy()
    ).campaign.id
    later = app.campaign_import.create(
        name="later", recipients=csv_bytes(RECIPIENTS), policy=open_policy(T0 + timedelta(days=2))
    ).campaign.id
    for cid in (first, later):
        assert app.provisioner.provision(cid).status == "done"
    tasks = store.list_tasks(first, limit=100)
    clock.set(max(t.send_at for t in tasks) + timedelta(seconds=1))
    send = FakeContext(made.send_arn, 300_000)
    for task in tasks:
        lambda_handlers.send_handler({"taskId": task.id}, send)
    sent = {t.email: t for t in store.list_tasks(first, limit=100)}
    assert {t.state for t in sent.values()} == {TaskState.FINISHED}

    sns, sqs = client("sns"), client("sqs")
    topic = sns.create_topic(Name="sendqueue-feedback")["TopicArn"]
    queues = {}
    for delivery in ("raw", "envelope"):
        url = sqs.create_queue(QueueName=f"sendqueue-feedback-{delivery}")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        sns.subscribe(
            TopicArn=topic,
            Protocol="sqs",
            Endpoint=arn,
            Attributes={"RawMessageDelivery": "true" if delivery == "raw" else "false"},
        )
        queues[delivery] = url
    scheduler.calls.clear()
    yield Feedback(app, store, down, scheduler, sent, later, topic, queues)
    lambda_handlers.use()
    app.close()


# -- SES's documents, from what SES accepted -------------------------------------------------------
def _mail(task: Task) -> dict[str, Any]:
    """The ``mail`` object SES puts in an event about the email ``task`` sent."""
    [raw] = [
        m["raw_data"]
        for m in sent_messages()
        if f"X-Sendqueue-Task: {task.id}\n" in str(m["raw_data"]).replace("\r\n", "\n")
    ]
    message = email.message_from_string(str(raw))
    return {
        "timestamp": task.sent_at.isoformat() if task.sent_at else None,
        "source": "news@example.com",
        "messageId": "0107018c1f4a5b6c-ses-id-000000",
        "destination": [task.email],
        "headersTruncated": False,
        "headers": [{"name": k, "value": str(v)} for k, v in message.items()],
        "commonHeaders": {
            "from": [message["From"]],
            "to": [message["To"]],
            "messageId": message["Message-ID"],
            "subject": message["Subject"],
        },
    }


def _bounce(task: Task, bounce_type: str, feedback_id: str) -> dict[str, Any]:
    permanent = bounce_type == "Permanent"
    return {
        "eventType": "Bounce",
        "bounce": {
            "bounceType": bounce_type,
            "bounceSubType": "General" if permanent else "MailboxFull",
            "bouncedRecipients": [
                {
                    "emailAddress": task.email,
                    "action": "failed",
                    "status": "5.1.1" if permanent else "4.2.2",
                    "diagnosticCode": "smtp; 550 5.1.1 user unknown"
                    if permanent
                    else "smtp; 452 4.2.2 mailbox full",
                }
            ],
            "timestamp": "2026-12-01T09:00:00.000Z",
            "feedbackId": feedback_id,
        },
        "mail": _mail(task),
    }


def _complaint(task: Task) -> dict[str, Any]:
    return {
        "eventType": "Complaint",
        "complaint": {
            "feedbackId": "complaint-user1",
            "complainedRecipients": [{"emailAddress": task.email}],
            "timestamp": "2026-12-01T09:30:00.000Z",
            "complaintFeedbackType": "abuse",
            "userAgent": "Yahoo!-Mail-Feedback/2.0",
        },
        "mail": _mail(task),
    }


# -- the tests ---------------------------------------------------------------------------------
@pytest.mark.parametrize("delivery", ["raw", "envelope"])
def test_bounces_and_complaints_through_sns_and_sqs(fb: Feedback, delivery: str) -> None:
    ann, bob, cat = (fb.sent[f"user{i}@example.com"] for i in range(RECIPIENTS))
    pending_before = fb.schedules()
    fb.publish(_bounce(ann, "Permanent", "hard-user0"))
    fb.publish(_complaint(bob))
    fb.publish(_bounce(cat, "Transient", "soft-user2"))
    event = fb.receive(delivery)
    assert len(event["Records"]) == 3
    if delivery == "envelope":
        assert {json.loads(r["body"])["Type"] for r in event["Records"]} == {"Notification"}

    assert _handle(event) == {"batchItemFailures": []}

    bounced, complained, soft = (fb.store.get_task(t.id) for t in (ann, bob, cat))
    assert bounced is not None and complained is not None and soft is not None
    assert (bounced.outcome, bounced.outcome_detail) == (
        TaskOutcome.BOUNCED, "5.1.1 smtp; 550 5.1.1 user unknown",
    )  # fmt: skip
    assert (complained.outcome, complained.outcome_detail) == (TaskOutcome.COMPLAINED, "abuse")
    # A transient bounce alone changes nothing (the outcome stays what the send left).
    assert (soft.outcome, soft.outcome_detail) == (cat.outcome, cat.outcome_detail)
    listed = fb.store.suppressed([ann.email, bob.email, cat.email])
    assert {a: (s.reason.value, s.task_id) for a, s in listed.items()} == {
        ann.email: ("bounced", ann.id),
        bob.email: ("complained", bob.id),
    }
    # The later campaign's emails to them are cancelled and their schedules deleted.
    for address, why in ((ann.email, "bounced"), (bob.email, "complained")):
        task = fb.later_task(address)
        assert (task.state, task.reason) == (TaskState.CANCELLED, f"suppressed: {why}")
    assert fb.later_task(cat.email).state is TaskState.PENDING
    assert pending_before - fb.schedules() == {
        expected_schedule_name(fb.later_task(a)) for a in (ann.email, bob.email)
    }
    # Deleting is all it asks of the Scheduler (its role may do nothing else there).
    assert fb.scheduler.calls == ["delete", "delete"]


def test_the_same_record_twice_has_the_effect_of_once(fb: Feedback) -> None:
    ann, cat = fb.sent["user0@example.com"], fb.sent["user2@example.com"]
    fb.publish(_bounce(ann, "Permanent", "hard-user0"))
    fb.publish(_bounce(cat, "Transient", "soft-user2"))
    event = fb.receive("raw")
    assert _handle(event) == {"batchItemFailures": []}
    log_after_once = fb.store.last_change_id()
    listed_once = fb.store.suppressed([ann.email])

    # SQS delivers at least once: the same messages again, and again in one batch.
    twice = {"Records": event["Records"] * 2}
    assert _handle(event) == {"batchItemFailures": []}
    assert _handle(twice) == {"batchItemFailures": []}
    assert fb.store.last_change_id() == log_after_once
    assert fb.store.suppressed([ann.email]) == listed_once
    # The transient bounce was counted once, not three times: two more (other messages) are
    # needed to reach the limit of three within a week.
    for n in (2, 3):
        fb.publish(_bounce(cat, "Transient", f"soft-user2-{n}"))
        assert _handle(fb.receive("raw")) == {"batchItemFailures": []}
        assert (cat.email in fb.store.suppressed([cat.email])) is (n == 3)
    task = fb.later_task(cat.email)
    assert (task.state, task.reason) == (TaskState.CANCELLED, "suppressed: bounced")


def test_a_malformed_record_is_dropped_and_the_rest_applied(
    fb: Feedback, caplog: pytest.LogCaptureFixture
) -> None:
    ann = fb.sent["user0@example.com"]
    client("sns").publish(TopicArn=fb.topic, Message="Successfully validated SNS topic for SES")
    client("sns").publish(TopicArn=fb.topic, Message=json.dumps({"eventType": "Delivery"}))
    fb.publish(_bounce(ann, "Permanent", "hard-user0"))
    event = fb.receive("envelope")
    event["Records"].append({"messageId": "not-even-a-body"})
    assert len(event["Records"]) == 4

    assert _handle(event) == {"batchItemFailures": []}
    assert fb.store.get_task(ann.id).outcome is TaskOutcome.BOUNCED  # type: ignore[union-attr]
    dropped = [r for r in caplog.records if "no SES bounce or complaint, dropped" in r.message]
    assert len(dropped) == 3


def test_an_unreachable_store_names_the_records_to_deliver_again(fb: Feedback) -> None:
    ann, bob = fb.sent["user0@example.com"], fb.sent["user1@example.com"]
    fb.publish(_bounce(ann, "Permanent", "hard-user0"))
    fb.publish(_complaint(bob))
    client("sns").publish(TopicArn=fb.topic, Message="not feedback")
    event = fb.receive("raw")
    feedback_ids = {r["messageId"] for r in event["Records"] if r["body"].startswith("{")}
    assert len(feedback_ids) == 2

    with fb.down():
        result = _handle(event)
    # The two bounces and complaints come again; the one that is not feedback does not.
    assert {f["itemIdentifier"] for f in result["batchItemFailures"]} == feedback_ids
    assert fb.store.suppressed([ann.email, bob.email]) == {}

    again = {"Records": [r for r in event["Records"] if r["messageId"] in feedback_ids]}
    assert _handle(again) == {"batchItemFailures": []}
    assert set(fb.store.suppressed([ann.email, bob.email])) == {ann.email, bob.email}


def test_a_failed_record_without_an_id_fails_the_whole_batch(fb: Feedback) -> None:
    """SQS can only be told about a record by its id; without one, the batch comes again."""
    ann = fb.sent["user0@example.com"]
    fb.publish(_bounce(ann, "Permanent", "hard-user0"))
    [record] = fb.receive("raw")["Records"]
    del record["messageId"]
    with fb.down(), pytest.raises(StoreUnavailable):
        _handle({"Records": [record]})


def test_a_batch_that_is_not_an_sqs_event_is_refused(fb: Feedback) -> None:
    with pytest.raises(InvalidField, match="Records"):
        _handle({"detail": "not SQS"})
