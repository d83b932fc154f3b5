"""The alarm topic reaches a person on AWS: AlarmEmail is subscribed to it, and with
AlarmWebhook a small function subscribed to it POSTs every notification to the webhook.

The template is transformed offline as in test_template.py. The relay runs for real against
moto in server mode: moto's SNS delivers a published CloudWatch-alarm notification to an HTTP
subscriber (moto does not invoke Lambda from SNS), the test hands that same notification to
``alarm_handler`` in the record shape Lambda gives it, and the handler POSTs to a webhook on
127.0.0.1.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from sendqueue import lambda_handlers
from sendqueue.bootstrap import bootstrap
from sendqueue.domain.alarms import AUTO_PAUSE_PREFIX, auto_pause_reason
from sendqueue.settings import LambdaControlSettings
from tests.aws.test_template import (
    PARAMETERS,
    Resolver,
    _environment,
    _function_role,
    _grants,
    _of_type,
    _statements,
    _transform,
    cold_start_settings,
    sam,  # noqa: F401 - the module-scoped fixture
)
from tests.support.aws import REGION, client, reset
from tests.support.eventbridge_player import FakeContext

WEBHOOK = "https://hooks.example.com/sendqueue/secret"
RELAY_ARN = f"arn:aws:lambda:{REGION}:123456789012:function:sq-test-alarm"
BOTH = {**PARAMETERS, "AlarmEmail": "ops@example.com", "AlarmWebhook": WEBHOOK}


# -- the template ---------------------------------------------------------------------------------
def test_without_a_webhook_there_is_no_relay(sam: dict[str, Any]) -> None:  # noqa: F811
    out = _transform(sam, PARAMETERS)
    resolve = Resolver(out, PARAMETERS)
    assert not resolve.condition("HasAlarmWebhook")
    for name in ("AlarmWebhookFunction", "AlarmLogGroup"):
        assert out["Resources"][name]["Condition"] == "HasAlarmWebhook"


def test_email_and_webhook_are_both_subscribed_to_the_alarm_topic(sam: dict[str, Any]) -> None:  # noqa: F811
    out = _transform(sam, BOTH)
    resolve = Resolver(out, BOTH)
    assert resolve.condition("HasAlarmEmail") and resolve.condition("HasAlarmWebhook")
    topic = resolve.ref("AlarmTopic")
    function_arn = resolve.get_att("AlarmWebhookFunction", "Arn")
    subscriptions = {
        resolve(s["Properties"]["Protocol"]): (s.get("Condition"), resolve(s["Properties"]))
        for s in _of_type(out, "AWS::SNS::Subscription").values()
        if resolve(s["Properties"]["TopicArn"]) == topic  # not the feedback topic's queue
    }
    assert subscriptions == {
        "email": (
            "HasAlarmEmail",
            {"TopicArn": topic, "Protocol": "email", "Endpoint": "ops@example.com"},
        ),
        "lambda": (
            "HasAlarmWebhook",
            {"TopicArn": topic, "Protocol": "lambda", "Endpoint": function_arn},
        ),
    }
    # SNS may invoke the relay, for this topic only.
    (permission,) = [
        p
        for p in _of_type(out, "AWS::Lambda::Permission").values()
        if resolve(p["Properties"]["Principal"]) == "sns.amazonaws.com"
    ]
    assert permission["Condition"] == "HasAlarmWebhook"
    props = resolve(permission["Properties"])
    assert (props["FunctionName"], props["SourceArn"]) == ("sq-test-alarm", topic)
    # Every alarm goes to the topic: dead letters, failing functions, auto-pauses.
    alarms = _of_type(out, "AWS::CloudWatch::Alarm")
    assert set(alarms) == {
        "DeadLetterAlarm",
        "ProvisionErrorsAlarm",
        "ReconcileErrorsAlarm",
        "AutoPauseAlarm",
        "FeedbackDeadLetterAlarm",
        "WebhooksDeadLetterAlarm",
    }
    for alarm in alarms.values():
        assert resolve(alarm["Properties"]["AlarmActions"]) == [topic]


def test_the_relay_runs_the_alarm_handler_and_may_do_nothing_else(sam: dict[str, Any]) -> None:  # noqa: F811
    out = _transform(sam, BOTH)
    resolve = Resolver(out, BOTH)
    function = out["Resources"]["AlarmWebhookFunction"]["Properties"]
    assert function["Handler"] == "sendqueue.lambda_handlers.alarm_handler"
    assert callable(lambda_handlers.alarm_handler)
    role = _function_role(out, "AlarmWebhookFunction")
    assert role["Properties"]["ManagedPolicyArns"] == [
        "arn:aws:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"  # logs only
    ]
    assert _grants(_statements(role, resolve)) == set()
    env = _environment(out, "AlarmWebhookFunction", BOTH)
    assert env["SENDQUEUE_ALARM_WEBHOOK"] == WEBHOOK


def test_a_cold_start_of_the_relay_accepts_its_environment(
    sam: dict[str, Any],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = _transform(sam, BOTH)
    env = _environment(out, "AlarmWebhookFunction", BOTH)
    settings = cold_start_settings(out, "AlarmWebhookFunction", env, monkeypatch)
    assert settings.alarm_webhook == WEBHOOK
    assert type(settings) is LambdaControlSettings  # it sends no email: no links, no key


def test_auto_pauses_reach_the_topic_through_the_send_log(sam: dict[str, Any]) -> None:  # noqa: F811
    out = _transform(sam, PARAMETERS)
    resolve = Resolver(out, PARAMETERS)
    (metric_filter,) = _of_type(out, "AWS::Logs::MetricFilter").values()
    props = resolve(metric_filter["Properties"])
    assert props["LogGroupName"] == resolve.ref("SendLogGroup")
    # The filter matches the line the send worker logs (its reason begins with the prefix).
    assert props["FilterPattern"] == f'"{AUTO_PAUSE_PREFIX.strip()}"'
    assert auto_pause_reason(5, "550").startswith(AUTO_PAUSE_PREFIX)
    (transform,) = props["MetricTransformations"]
    alarm = resolve(out["Resources"]["AutoPauseAlarm"]["Properties"])
    assert (alarm["Namespace"], alarm["MetricName"]) == (
        transform["MetricNamespace"],
        transform["MetricName"],
    )
    assert alarm["Threshold"] == 1 and alarm["Statistic"] == "Sum"


# -- the relay, on moto ------------------------------------------------------------------------
class _Receiver:
    """An HTTP server on 127.0.0.1 keeping the JSON bodies POSTed to it."""

    def __init__(self, status: int = 204) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.arrived = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                self.send_response(status)
                self.end_headers()
                with receiver.arrived:
                    receiver.bodies.append(body)
                    receiver.arrived.notify_all()

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook/secret"

    def wait(self, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.bodies) >= count, timeout)
            return list(self.bodies)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receivers() -> Iterator[list[_Receiver]]:
    made: list[_Receiver] = []
    yield made
    for receiver in made:
        receiver.close()


def _relay_with(webhook: str | None) -> None:
    settings = LambdaControlSettings(
        _env_file=None,
        database_url="dynamodb://unused",
        mailer=f"ses:{REGION}",
        alarm_webhook=webhook,
    )
    lambda_handlers.use(bootstrap(settings))


CLOUDWATCH_ALARM = {
    "AlarmName": "sq-test-DeadLetterAlarm-ABC",
    "AlarmDescription": "An email's invocation was dead-lettered.",
    "NewStateValue": "ALARM",
    "OldStateValue": "OK",
    "NewStateReason": "Threshold Crossed: 1 datapoint [1.0] >= 1.0",
    "StateChangeTime": "2026-12-01T08:01:00.000+0000",
}


def _published_notification(sns_receiver: _Receiver) -> dict[str, Any]:
    """Publish a CloudWatch alarm's message to a moto topic; what SNS delivered."""
    reset()
    sns = client("sns")
    topic = sns.create_topic(Name="sq-test-AlarmTopic")["TopicArn"]
    sns.subscribe(TopicArn=topic, Protocol="http", Endpoint=sns_receiver.url)
    sns.publish(
        TopicArn=topic,
        Subject='ALARM: "sq-test-DeadLetterAlarm-ABC" in EU (Frankfurt)',
        Message=json.dumps(CLOUDWATCH_ALARM),
    )
    notifications = [b for b in sns_receiver.wait(1) if b.get("Type") == "Notification"]
    assert len(notifications) == 1, sns_receiver.bodies
    return notifications[0]


def test_a_published_alarm_is_posted_to_the_webhook(receivers: list[_Receiver]) -> None:
    sns_receiver, webhook = _Receiver(), _Receiver()
    receivers += [sns_receiver, webhook]
    notification = _published_notification(sns_receiver)
    _relay_with(webhook.url)
    try:
        event = {"Records": [{"EventSource": "aws:sns", "Sns": notification}]}
        result = lambda_handlers.alarm_handler(event, FakeContext(RELAY_ARN, 30_000))
    finally:
        lambda_handlers.use()
    assert result == {"status": "handled", "posted": 1}
    [posted] = webhook.wait(1)
    assert posted["event"] == "aws_alarm"
    assert posted["id"] == notification["MessageId"]
    assert posted["topic"].endswith(":sq-test-AlarmTopic")
    assert posted["subject"].startswith('ALARM: "sq-test-DeadLetterAlarm-ABC"')
    assert posted["alarm"] == {
        "name": "sq-test-DeadLetterAlarm-ABC",
        "state": "ALARM",
        "previous_state": "OK",
        "reason": "Threshold Crossed: 1 datapoint [1.0] >= 1.0",
        "description": "An email's invocation was dead-lettered.",
        "changed_at": "2026-12-01T08:01:00.000+0000",
    }
    assert json.loads(posted["message"]) == CLOUDWATCH_ALARM


def test_a_webhook_that_fails_raises_so_lambda_retries(receivers: list[_Receiver]) -> None:
    failing = _Receiver(status=500)
    receivers.append(failing)
    _relay_with(failing.url)
    event = {"Records": [{"Sns": {"MessageId": "m-1", "Message": "plain text alarm"}}]}
    try:
        with pytest.raises(OSError, match="500"):
            lambda_handlers.alarm_handler(event, FakeContext(RELAY_ARN, 30_000))
    finally:
        lambda_handlers.use()
    [posted] = failing.wait(1)
    assert posted["alarm"] is None and posted["message"] == "plain text alarm"


def test_without_a_webhook_the_relay_logs_and_drops(caplog: pytest.LogCaptureFixture) -> None:
    _relay_with(None)
    event = {"Records": [{"Sns": {"MessageId": "m-2", "Message": "{}"}}]}
    try:
        with caplog.at_level(logging.ERROR, logger="sendqueue"):
            result = lambda_handlers.alarm_handler(event, FakeContext(RELAY_ARN, 30_000))
    finally:
        lambda_handlers.use()
    assert result == {"status": "handled", "posted": 0}
    assert any("SENDQUEUE_ALARM_WEBHOOK is not set" in r.getMessage() for r in caplog.records)
