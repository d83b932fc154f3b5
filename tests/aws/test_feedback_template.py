"""The template's bounce and complaint path (issue 14): the configuration set every send names
publishes bounces and complaints to an SNS topic, the topic delivers to an SQS queue (with a
dead-letter queue and its alarm), and the queue is the event source of the feedback function,
each hop allowed by a policy that names the one before it and nothing wider.

Transformed offline and resolved as in test_template.py; the path itself runs on moto in
test_feedback_function.py. Each function's grants against the calls its code makes are checked
there too (FeedbackFunction is one of its HANDLERS).
"""

from __future__ import annotations

from typing import Any

import pytest

from sendqueue.adapters.mail.url import SesUrl, parse_mailer_url
from tests.aws.test_template import (
    ACCOUNT,
    MAILER,
    PARAMETERS,
    REGION,
    STACK,
    Resolver,
    _environment,
    _function_role,
    _of_type,
    _transform,
    sam,  # noqa: F401 - the module-scoped fixture
)

OWN_SET = {**PARAMETERS, "SesConfigurationSet": "tracking"}
ELSEWHERE = {**PARAMETERS, "SesRegion": "eu-west-1"}
FEEDBACK = [
    "FeedbackEventDestination",
    "FeedbackTopic",
    "FeedbackTopicPolicy",
    "FeedbackQueue",
    "FeedbackDeadLetterQueue",
    "FeedbackQueuePolicy",
    "FeedbackSubscription",
    "FeedbackFunction",
    "FeedbackEventSource",
    "FeedbackDeadLetterAlarm",
    "FeedbackLogGroup",
]


def _path(template: dict[str, Any], parameters: dict[str, str]) -> tuple[dict[str, Any], Resolver]:
    out = _transform(template, parameters)
    return out, Resolver(out, parameters)


def _configuration_set(env: dict[str, str]) -> str | None:
    parsed = parse_mailer_url(env["SENDQUEUE_MAILER"])
    assert isinstance(parsed, SesUrl)
    return parsed.configuration_set


@pytest.mark.parametrize(
    ("parameters", "made", "used"),
    [
        (PARAMETERS, True, f"{STACK}-FeedbackConfigurationSet"),
        (OWN_SET, False, "tracking"),
        ({**PARAMETERS, "SesRegion": REGION}, True, f"{STACK}-FeedbackConfigurationSet"),
    ],
    ids=["defaults", "own-set", "ses-region-is-the-stacks"],
)
def test_the_set_every_send_names_publishes_bounces_and_complaints_to_the_topic(
    sam: dict[str, Any],  # noqa: F811
    parameters: dict[str, str],
    made: bool,
    used: str,
) -> None:
    out, resolve = _path(sam, parameters)
    assert resolve.condition("HasFeedback")
    assert resolve.condition("MakesConfigurationSet") is made
    assert out["Resources"]["FeedbackConfigurationSet"]["Condition"] == "MakesConfigurationSet"
    for function in ("SendFunction", "FeedbackFunction"):
        assert _configuration_set(_environment(out, function, parameters)) == used
    destination = resolve(out["Resources"]["FeedbackEventDestination"]["Properties"])
    assert destination["ConfigurationSetName"] == used
    assert destination["EventDestination"]["Enabled"] is True
    assert sorted(destination["EventDestination"]["MatchingEventTypes"]) == [
        "bounce",
        "complaint",
    ]
    topic = resolve.ref("FeedbackTopic")
    assert destination["EventDestination"]["SnsDestination"] == {"TopicARN": topic}
    # SES may publish to the topic, for this account and this configuration set only.
    policy = resolve(out["Resources"]["FeedbackTopicPolicy"]["Properties"])
    assert policy["Topics"] == [topic]
    [statement] = policy["PolicyDocument"]["Statement"]
    assert statement == {
        "Sid": "SesPublishes",
        "Effect": "Allow",
        "Principal": {"Service": "ses.amazonaws.com"},
        "Action": "sns:Publish",
        "Resource": topic,
        "Condition": {
            "StringEquals": {"aws:SourceAccount": ACCOUNT},
            "ArnLike": {
                "aws:SourceArn": f"arn:aws:ses:{REGION}:{ACCOUNT}:configuration-set/{used}"
            },
        },
    }


def test_the_topic_delivers_to_the_queue_and_the_queue_to_the_function(
    sam: dict[str, Any],  # noqa: F811
) -> None:
    out, resolve = _path(sam, PARAMETERS)
    topic = resolve.ref("FeedbackTopic")
    queue = resolve.get_att("FeedbackQueue", "Arn")
    [subscription] = [
        resolve(s["Properties"])
        for s in _of_type(out, "AWS::SNS::Subscription").values()
        if resolve(s["Properties"]["TopicArn"]) == topic
    ]
    assert subscription == {
        "TopicArn": topic,
        "Protocol": "sqs",
        "Endpoint": queue,
        "RawMessageDelivery": True,  # the handler reads SNS's envelope too
    }
    # SNS may send to the queue, from this topic only.
    policy = resolve(out["Resources"]["FeedbackQueuePolicy"]["Properties"])
    assert policy["Queues"] == [resolve.ref("FeedbackQueue")]
    [statement] = policy["PolicyDocument"]["Statement"]
    assert (statement["Principal"], statement["Action"], statement["Resource"]) == (
        {"Service": "sns.amazonaws.com"}, "sqs:SendMessage", queue,
    )  # fmt: skip
    assert statement["Condition"] == {"ArnEquals": {"aws:SourceArn": topic}}

    # The queue is the function's event source, with partial batch responses.
    [mapping] = [
        resolve(m["Properties"])
        for m in _of_type(out, "AWS::Lambda::EventSourceMapping").values()
        if resolve(m["Properties"]["EventSourceArn"]) == queue
    ]
    assert mapping["FunctionName"] == resolve.ref("FeedbackFunction")
    assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert 1 <= mapping["BatchSize"] <= 10
    function = out["Resources"]["FeedbackFunction"]["Properties"]
    assert function["Handler"] == "sendqueue.lambda_handlers.feedback_handler"
    # A batch still running is not delivered again: SQS hides it longer than the function runs.
    props = out["Resources"]["FeedbackQueue"]["Properties"]
    assert props["VisibilityTimeout"] >= 6 * function["Timeout"]
    # Lambda's own SQS policy (every queue) is not attached; the role names this queue.
    role = _function_role(out, "FeedbackFunction")
    assert role["Properties"]["ManagedPolicyArns"] == [
        "arn:aws:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"
    ]


def test_records_that_keep_failing_go_to_an_alarmed_dead_letter_queue(
    sam: dict[str, Any],  # noqa: F811
) -> None:
    out, resolve = _path(sam, PARAMETERS)
    redrive = resolve(out["Resources"]["FeedbackQueue"]["Properties"]["RedrivePolicy"])
    assert redrive["deadLetterTargetArn"] == resolve.get_att("FeedbackDeadLetterQueue", "Arn")
    assert 1 < redrive["maxReceiveCount"] <= 10
    alarm = resolve(out["Resources"]["FeedbackDeadLetterAlarm"]["Properties"])
    assert alarm["Dimensions"] == [
        {"Name": "QueueName", "Value": resolve.get_att("FeedbackDeadLetterQueue", "QueueName")}
    ]
    assert alarm["MetricName"] == "ApproximateNumberOfMessagesVisible"
    assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (
        1, "GreaterThanOrEqualToThreshold",
    )  # fmt: skip
    assert alarm["AlarmActions"] == [resolve.ref("AlarmTopic")]
    for queue in ("FeedbackQueue", "FeedbackDeadLetterQueue"):
        assert out["Resources"][queue]["Properties"]["SqsManagedSseEnabled"] is True


@pytest.mark.parametrize(
    ("parameters", "mailer"),
    [
        (ELSEWHERE, "ses:eu-west-1"),
        (
            {**ELSEWHERE, "SesConfigurationSet": "tracking"},
            "ses:eu-west-1?configuration_set=tracking",
        ),
    ],
    ids=["no-set", "own-set"],
)
def test_ses_in_another_region_gets_no_feedback_path(
    sam: dict[str, Any],  # noqa: F811
    parameters: dict[str, str],
    mailer: str,
) -> None:
    """A configuration set lives in SES's region, the stack's topic in the stack's: with SES
    elsewhere the stack makes none of the path, and the mailer is as before."""
    out, resolve = _path(sam, parameters)
    assert not resolve.condition("HasFeedback")
    assert not resolve.condition("MakesConfigurationSet")
    for name in FEEDBACK:
        assert not resolve.condition(out["Resources"][name]["Condition"]), name
    assert _environment(out, "SendFunction", parameters)["SENDQUEUE_MAILER"] == mailer


def test_the_default_mailer_names_the_stacks_set() -> None:
    assert parse_mailer_url(MAILER) == SesUrl(REGION, f"{STACK}-FeedbackConfigurationSet")
