"""Settings for the AWS layer: every missing or malformed variable is named in the error."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from sendqueue.adapters.dynamodb.url import DynamoDbUrl, parse_dynamodb_url
from sendqueue.bootstrap import bootstrap
from sendqueue.domain.errors import InvalidField
from sendqueue.settings import Settings

ARNS: dict[str, str] = {
    "schedule_group": "sendqueue",
    "send_function_arn": "arn:aws:lambda:eu-central-1:123456789012:function:sendqueue-send",
    "scheduler_role_arn": "arn:aws:iam::123456789012:role/sendqueue-scheduler",
    "dead_letter_queue_url": "https://sqs.eu-central-1.amazonaws.com/123456789012/sendqueue-dlq",
    "dead_letter_queue_arn": "arn:aws:sqs:eu-central-1:123456789012:sendqueue-dlq",
}


def _settings(**values: Any) -> Settings:
    base: dict[str, Any] = {
        "_env_file": None,
        "execution": "eventbridge",
        "database_url": "dynamodb://sendqueue-tasks",
        **ARNS,
    }
    base.update(values)
    return Settings(**{k: v for k, v in base.items() if v is not None})


def test_complete_eventbridge_settings_are_accepted() -> None:
    settings = _settings(mailer="ses:eu-central-1?configuration_set=campaigns")
    assert settings.execution == "eventbridge"
    assert settings.send_function_arn == ARNS["send_function_arn"]
    assert settings.mailer == "ses:eu-central-1?configuration_set=campaigns"


@pytest.mark.parametrize("field", sorted(ARNS))
def test_each_missing_eventbridge_variable_is_named(field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        _settings(**{field: None})
    text = str(caught.value)
    assert f"SENDQUEUE_{field.upper()}" in text
    others = [f"SENDQUEUE_{f.upper()}" for f in ARNS if f != field]
    assert not any(other in text for other in others), text


def test_all_missing_are_named_at_once() -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(_env_file=None, execution="eventbridge", database_url="dynamodb://t-1")
    for field in ARNS:
        assert f"SENDQUEUE_{field.upper()}" in str(caught.value)


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("send_function_arn", "sendqueue-send", "Lambda function ARN"),
        ("send_function_arn", "arn:aws:sqs:eu-central-1:123456789012:q", "Lambda function ARN"),
        ("provision_function_arn", "sendqueue-provision", "Lambda function ARN"),
        ("scheduler_role_arn", "arn:aws:iam::123:role/x", "IAM role ARN"),
        ("dead_letter_queue_arn", "arn:aws:sqs:eu-central-1:123456789012:", "SQS queue ARN"),
        ("dead_letter_queue_url", "sqs/sendqueue-dlq", "SQS queue URL"),
        ("schedule_group", "no spaces please", "schedule group name"),
        ("schedule_group", "g" * 65, "schedule group name"),
    ],
)
def test_malformed_values_are_refused_with_the_field(field: str, value: str, says: str) -> None:
    with pytest.raises(ValidationError) as caught:
        _settings(**{field: value})
    assert field in str(caught.value)
    assert says in str(caught.value)


def test_eventbridge_refuses_a_sqlite_store() -> None:
    with pytest.raises(ValidationError, match="dynamodb://TABLE"):
        _settings(database_url="sqlite:///./sendqueue.db")


def test_the_dynamodb_url() -> None:
    assert parse_dynamodb_url("dynamodb://sendqueue-tasks") == DynamoDbUrl("sendqueue-tasks")
    assert parse_dynamodb_url(
        "dynamodb://Tasks.v2?region=eu-west-1&endpoint_url=http://127.0.0.1:8000"
    ) == DynamoDbUrl("Tasks.v2", "eu-west-1", "http://127.0.0.1:8000")
    for bad, says in [
        ("dynamodb://", "table name"),
        ("dynamodb://ab", "table name"),
        ("dynamodb://a b c", "table name"),
        ("dynamodb://tasks/x", "nothing else"),
        ("dynamodb://tasks?colour=blue", "unknown parameter 'colour'"),
        ("dynamodb://tasks?region=Mars", "AWS region"),
        ("dynamodb://tasks?endpoint_url=ftp://x", "endpoint_url"),
    ]:
        with pytest.raises(InvalidField, match=says) as caught:
            parse_dynamodb_url(bad)
        assert caught.value.field == "SENDQUEUE_DATABASE_URL"
        with pytest.raises(ValidationError, match="database_url"):
            Settings(_env_file=None, database_url=bad)
    # only the task store can be DynamoDB
    with pytest.raises(ValidationError, match="scheduler_url"):
        Settings(_env_file=None, scheduler_url="dynamodb://tasks")


def test_the_ses_mailer_url() -> None:
    assert Settings(_env_file=None, mailer="ses:").mailer == "ses:"
    for bad, says in [
        ("ses:Frankfurt", "expected ses:REGION"),
        ("ses:eu-west-1?colour=blue", "unknown ses: parameter 'colour'"),
    ]:
        with pytest.raises(ValidationError, match=says):
            Settings(_env_file=None, mailer=bad)


def test_the_eventbridge_layer_has_no_worker_process() -> None:
    app = bootstrap(_settings())
    with pytest.raises(InvalidField, match="serve --no-worker") as caught:
        app.dispatcher  # noqa: B018
    assert caught.value.field == "SENDQUEUE_EXECUTION"
