"""What EventBridgeScheduler creates in AWS, and how it reads AWS's answers (moto server)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from botocore.config import Config

from sendqueue.adapters.eventbridge.scheduler import EventBridgeScheduler
from sendqueue.domain.errors import NotFound, SchedulerError, Throttled
from sendqueue.testing.clock import FakeClock
from tests.support.aws import SCHEDULE_GROUP, AwsWorld, client, eventbridge, world

START = datetime(2026, 3, 20, 8, 0, tzinfo=UTC)


@pytest.fixture
def made() -> AwsWorld:
    return world()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def scheduler(clock: FakeClock, made: AwsWorld) -> Iterator[EventBridgeScheduler]:
    built = eventbridge(clock, made)
    yield built
    built.close()


def test_the_schedule_is_the_production_shape(
    scheduler: EventBridgeScheduler, made: AwsWorld
) -> None:
    payload = {"kind": "send", "task_id": "c1-7", "token": "tok7"}
    scheduler.create("sq-c1-7.0", "sq-c1", datetime(2026, 3, 20, 10, 30, 15), "Europe/Berlin",
                     payload, "tok7", 2)  # fmt: skip

    raw = client("scheduler").get_schedule(Name="sq-c1-7.0", GroupName=SCHEDULE_GROUP)
    assert raw["ScheduleExpression"] == "at(2026-03-20T10:30:15)"
    assert raw["ScheduleExpressionTimezone"] == "Europe/Berlin"
    assert raw["FlexibleTimeWindow"] == {"Mode": "OFF"}
    assert raw["ActionAfterCompletion"] == "DELETE"
    target = raw["Target"]
    assert target["Arn"] == made.send_arn
    assert target["RoleArn"] == made.role_arn
    assert target["RetryPolicy"]["MaximumRetryAttempts"] == 2
    assert target["DeadLetterConfig"] == {"Arn": made.dlq_arn}
    data = json.loads(target["Input"])
    assert data["taskId"] == "c1-7"
    assert data["token"] == "tok7"
    assert data["sendqueue"] == {"schedule": "sq-c1-7.0", "group": "sq-c1", "tz": "Europe/Berlin"}


def test_list_finds_a_campaign_group_among_others(
    scheduler: EventBridgeScheduler, clock: FakeClock
) -> None:
    at = datetime(2026, 3, 20, 10)
    for position in (3, 1, 2):
        scheduler.create(f"sq-c1-{position}.0", "sq-c1", at, "UTC", {}, f"t{position}")
    scheduler.create("sq-c11-1.0", "sq-c11", at, "UTC", {}, "other")
    scheduler.create("sq-provision-c1-ab", "sq-control", at, "UTC", {}, "ctl")

    assert [s.name for s in scheduler.list("sq-c1")] == ["sq-c1-1.0", "sq-c1-2.0", "sq-c1-3.0"]
    assert [s.name for s in scheduler.list("sq-c1", after="sq-c1-1.0", limit=1)] == ["sq-c1-2.0"]
    assert [s.name for s in scheduler.list("sq-control")] == ["sq-provision-c1-ab"]


def _send_letter(made: AwsWorld, body: dict[str, object], **attrs: str) -> str:
    message = client("sqs").send_message(
        QueueUrl=made.dlq_url,
        MessageBody=json.dumps(body),
        MessageAttributes={k: {"DataType": "String", "StringValue": v} for k, v in attrs.items()},
    )
    return str(message["MessageId"])


def test_dead_letters_of_both_kinds_are_read_and_redriven(
    scheduler: EventBridgeScheduler, made: AwsWorld, clock: FakeClock
) -> None:
    meta = {"schedule": "sq-c1-0.0", "group": "sq-c1", "tz": "Europe/Berlin"}
    from_scheduler = _send_letter(
        made,
        {"kind": "send", "taskId": "c1-0", "sendqueue": meta},
        ERROR_CODE="AWS.Lambda.ServiceException",
        ERROR_MESSAGE="rate exceeded",
        RETRY_ATTEMPTS="2",
    )
    from_lambda = _send_letter(
        made,
        {
            "requestContext": {"condition": "RetriesExhausted", "approximateInvokeCount": 3},
            "requestPayload": {"kind": "send", "taskId": "c1-1", "sendqueue": {
                "schedule": "sq-c1-1.0", "group": "sq-c1", "tz": "UTC"}},
            "responsePayload": {"errorType": "StoreUnavailable", "errorMessage": "down"},
        },
    )  # fmt: skip

    letters = {letter.id: letter for letter in scheduler.dead_letters()}
    assert set(letters) == {from_scheduler, from_lambda}
    first, second = letters[from_scheduler], letters[from_lambda]
    assert (first.schedule_name, first.group, first.attempts) == ("sq-c1-0.0", "sq-c1", 3)
    assert dict(first.payload) == {"kind": "send", "task_id": "c1-0"}
    assert first.error == "AWS.Lambda.ServiceException: rate exceeded"
    assert (second.schedule_name, second.attempts) == ("sq-c1-1.0", 3)
    assert second.error == "StoreUnavailable: down"
    # Reading leaves the letters in the queue, one at a time too.
    assert scheduler.dead_letter(from_lambda) == second
    assert scheduler.dead_letter("no-such-message") is None
    assert len(scheduler.dead_letters()) == 2

    redriven = scheduler.redrive(from_scheduler)
    assert (redriven.name, redriven.group, redriven.timezone) == ("sq-c1-0.0", "sq-c1", BERLIN)
    assert redriven.due_at == clock.now()
    assert dict(redriven.payload) == {"kind": "send", "task_id": "c1-0"}
    assert scheduler.get("sq-c1-0.0") == redriven
    assert [letter.id for letter in scheduler.dead_letters()] == [from_lambda]
    assert scheduler.dead_letter(from_scheduler) is None
    with pytest.raises(NotFound):
        scheduler.redrive(from_scheduler)


BERLIN = "Europe/Berlin"


class _Throttling(BaseHTTPRequestHandler):
    """An endpoint that answers every call as a throttled AWS service does."""

    def do_POST(self) -> None:
        self._answer()

    def do_GET(self) -> None:
        self._answer()

    def do_DELETE(self) -> None:
        self._answer()

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        body = json.dumps({"message": "Rate exceeded"}).encode()
        self.send_response(400)
        self.send_header("x-amzn-ErrorType", "ThrottlingException")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def throttling_url() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Throttling)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


def test_throttling_raises_throttled_and_other_failures_scheduler_error(
    made: AwsWorld, clock: FakeClock, throttling_url: str
) -> None:
    def build(url: str) -> EventBridgeScheduler:
        no_retries = Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=1)
        return EventBridgeScheduler(
            client("scheduler", url=url, config=no_retries),
            client("sqs", url=url, config=no_retries),
            physical_group=SCHEDULE_GROUP,
            target_arn=made.send_arn,
            role_arn=made.role_arn,
            dead_letter_url=made.dlq_url,
            dead_letter_arn=made.dlq_arn,
            clock=clock,
        )

    throttled = build(throttling_url)
    at = datetime(2026, 3, 20, 10)
    with pytest.raises(Throttled):
        throttled.create("sq-a", "g", at, "UTC", {}, "tok")
    with pytest.raises(Throttled):
        throttled.delete("sq-a")
    with pytest.raises(Throttled):
        throttled.get("sq-a")
    throttled.close()

    # Nothing listens on port 1: a connection error, wrapped.
    unreachable = build("http://127.0.0.1:1")
    with pytest.raises(SchedulerError) as info:
        unreachable.get("sq-a")
    assert not isinstance(info.value, Throttled)
    unreachable.close()
