"""The send function's emails carry the one-click unsubscribe link on AWS (issue 14), on moto.

The send function is cold-started from the environment the SAM template gives it (resolved as
in test_template.py, with ``SecretKeyArn`` naming a Secrets Manager secret on moto), on the
table, schedule group and SES configuration set the template would make, made in moto under
the same names. ``sendqueue serve`` is built from the stack's ``ServeEnvironment`` output: it
creates and provisions the campaign, the send function sends, and the raw message SES (moto)
accepted is read back. The serve process, which reads the same secret, honours the link.
"""

from __future__ import annotations

import email
import re
import secrets
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from email import policy
from email.message import EmailMessage
from typing import Any

import pytest
from pydantic import ValidationError

from sendqueue import lambda_handlers
from sendqueue.adapters import secretsmanager
from sendqueue.adapters.dynamodb.store import DynamoDbTaskStore
from sendqueue.adapters.mail.url import SesUrl, parse_mailer_url
from sendqueue.bootstrap import Container, bootstrap
from sendqueue.domain.errors import InvalidSettings, NotFound
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.policy import SendingPolicy, Window
from sendqueue.domain.tokens import TokenPurpose, verify_task
from sendqueue.settings import LambdaSettings, Settings, parse_dynamodb_url
from tests.aws.test_ses_mailer import sent_messages
from tests.aws.test_template import (
    PARAMETERS,
    PUBLIC_URL,
    Resolver,
    _environment,
    _transform,
    function_environment,
    sam,  # noqa: F401 - the module-scoped fixture
)
from tests.support.app import csv_bytes
from tests.support.aws import aws_environment, client, moto_secret
from tests.support.eventbridge_player import FakeContext


@dataclass
class Stack:
    """The template resolved for one secret, its resources made in moto."""

    key: str
    secret_arn: str
    send_env: dict[str, str]
    serve_values: dict[str, str]

    def send_context(self) -> FakeContext:
        return FakeContext(self.send_env["SENDQUEUE_SEND_FUNCTION_ARN"], 300_000)

    def serve(self) -> Container:
        """`sendqueue serve` as the ServeEnvironment line (and an API token) configure it."""
        values: dict[str, Any] = {
            name.removeprefix("SENDQUEUE_").lower(): value
            for name, value in self.serve_values.items()
            if name.startswith("SENDQUEUE_")
        }
        return bootstrap(Settings(_env_file=None, api_token=secrets.token_hex(16), **values))


@pytest.fixture
def stack(sam: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Stack:  # noqa: F811
    key = secrets.token_hex(32)
    arn = moto_secret(monkeypatch, key)  # a fresh moto; boto3's default chain points at it
    parameters = {**PARAMETERS, "SecretKeyArn": arn}
    out = _transform(sam, parameters)
    resolve = Resolver(out, parameters)
    env = _environment(out, "SendFunction", parameters)
    line = resolve(out["Outputs"]["ServeEnvironment"]["Value"])
    serve_values = dict(item.split("=", 1) for item in line.split(" "))
    # What the template makes, under the names the functions are given.
    table = parse_dynamodb_url(env["SENDQUEUE_DATABASE_URL"]).table
    DynamoDbTaskStore(client("dynamodb"), table, create_table=True).close()
    client("scheduler").create_schedule_group(Name=env["SENDQUEUE_SCHEDULE_GROUP"])
    mailer = parse_mailer_url(env["SENDQUEUE_MAILER"])
    assert isinstance(mailer, SesUrl) and mailer.configuration_set
    ses = client("sesv2")
    ses.create_configuration_set(ConfigurationSetName=mailer.configuration_set)
    ses.create_email_identity(EmailIdentity="example.com")
    return Stack(key, arn, env, serve_values)


@pytest.fixture
def cold() -> Iterator[None]:
    """The handlers build their container from the environment (a cold start), and forget it
    afterwards."""
    lambda_handlers.use()
    yield
    lambda_handlers.use()


def _due_now(now: datetime) -> SendingPolicy:
    """Sends 12 ms apart from ``now`` (a window of this minute and the next): the first is due
    at once, within the minute the send function accepts an invocation in (EventBridge's
    precision), wherever ``now`` falls in it."""
    minute = now.astimezone(UTC).hour * 60 + now.astimezone(UTC).minute
    window = Window(minute, min(minute + 2, 1440))
    return SendingPolicy(
        timezone="UTC",
        per_day=10_000,
        weekdays=frozenset(range(7)),
        windows=(window,),
        start=now,
    )


def _sent_to(task_id: str) -> EmailMessage:
    """The message SES (moto) accepted for ``task_id``, its headers unfolded."""
    [raw] = [
        str(m["raw_data"])
        for m in sent_messages()
        if re.search(rf"^X-Sendqueue-Task: {re.escape(task_id)}\r?$", str(m["raw_data"]), re.M)
    ]
    message = email.message_from_string(raw, policy=policy.default)
    assert isinstance(message, EmailMessage)
    return message


def test_the_send_functions_email_carries_a_link_that_serve_honours(
    stack: Stack, cold: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[str] = []
    original = secretsmanager.read_secret

    def counted(arn: str) -> str:
        reads.append(arn)
        return original(arn)

    monkeypatch.setattr(secretsmanager, "read_secret", counted)
    serve = stack.serve()  # reads the secret too (it checks the links)
    assert reads == [stack.secret_arn]
    function: Container | None = None
    try:
        cid = serve.campaign_import.create(
            name="aws", recipients=csv_bytes(2), policy=_due_now(serve.clock.now())
        ).campaign.id
        assert serve.provisioner.provision(cid).status == "done"
        first, second = serve.store.list_tasks(cid, limit=10)

        function_environment(stack.send_env, monkeypatch)
        answer = lambda_handlers.send_handler({"taskId": first.id}, stack.send_context())
        assert answer == {"status": "handled", "taskId": first.id}
        # A warm invocation (a duplicate delivery here) reads nothing again.
        lambda_handlers.send_handler({"taskId": first.id}, stack.send_context())
        assert reads == [stack.secret_arn] * 2
        function = lambda_handlers.container()
        assert type(function.settings) is LambdaSettings

        message = _sent_to(first.id)
        link = re.fullmatch(
            rf"<{re.escape(PUBLIC_URL)}/u/([A-Za-z0-9_.\-]+)>",
            str(message["List-Unsubscribe"]).strip(),
        )
        assert link, message["List-Unsubscribe"]
        assert str(message["List-Unsubscribe-Post"]).strip() == "List-Unsubscribe=One-Click"
        token = link.group(1)
        assert verify_task(token, stack.key, TokenPurpose.UNSUBSCRIBE) == first.id
        assert verify_task(token, secrets.token_hex(32), TokenPurpose.UNSUBSCRIBE) is None

        # The serve process, with the same secret, takes the one-click POST's token.
        with pytest.raises(NotFound):
            serve.unsubscribe.unsubscribe(token[:-2] + ("AA" if token[-2:] != "AA" else "BB"))
        assert serve.suppressions.suppressed([first.email]) == {}
        done = serve.unsubscribe.unsubscribe(token)
        assert (done.task_id, done.unsubscribed) == (first.id, True)
        assert set(serve.suppressions.suppressed([first.email])) == {first.email}
        task = serve.store.get_task(first.id)
        assert task is not None and task.state is TaskState.FINISHED
        assert task.outcome is not None and task.outcome.value == "unsubscribed"
        assert serve.suppressions.suppressed([second.email]) == {}
    finally:
        serve.close()
        if function is not None:
            function.close()


@pytest.mark.parametrize(
    ("missing", "says"),
    [
        ("SENDQUEUE_SECRET_KEY_ARN", "SENDQUEUE_SECRET_KEY required"),
        ("SENDQUEUE_PUBLIC_URL", "SENDQUEUE_PUBLIC_URL required"),
    ],
)
def test_a_send_function_without_the_links_settings_fails_at_its_cold_start(
    stack: Stack, cold: None, monkeypatch: pytest.MonkeyPatch, missing: str, says: str
) -> None:
    """Every invocation fails (Lambda retries, then the dead-letter queue): no email goes out
    without its unsubscribe link."""
    env = {k: v for k, v in stack.send_env.items() if k != missing}
    function_environment(env, monkeypatch)
    for _ in range(2):  # nothing half-built is kept: the next invocation fails the same way
        with pytest.raises(InvalidSettings, match=says) as caught:
            lambda_handlers.send_handler({"taskId": "c1-0"}, stack.send_context())
        assert "when SENDQUEUE_ENVIRONMENT=production" in str(caught.value)
        assert stack.key not in str(caught.value)
    assert sent_messages() == []


# -- the secret, read by the settings (any process) ------------------------------------------------
def _with_secret(arn: str | None = None, **values: Any) -> Settings:
    return Settings(_env_file=None, secret_key_arn=arn, **values)


def test_the_key_is_the_secrets_text(monkeypatch: pytest.MonkeyPatch) -> None:
    key = secrets.token_urlsafe(40)
    arn = moto_secret(monkeypatch, f"  {key}\n")  # as `echo` or a console paste leaves it
    settings = _with_secret(arn, public_url=PUBLIC_URL)
    assert settings.secret_key is not None and settings.secret_key.get_secret_value() == key
    assert settings.unsubscribe_links is not None
    assert key not in repr(settings) and key not in str(settings)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("too-short-0123456789", "(the secret's text): must be at least 32 characters"),
        ("ab" * 20, "(the secret's text): too easy to guess"),
    ],
)
def test_a_weak_secret_is_refused_without_echoing_it(
    monkeypatch: pytest.MonkeyPatch, text: str, says: str
) -> None:
    arn = moto_secret(monkeypatch, text)
    with pytest.raises(ValidationError) as caught:
        _with_secret(arn)
    assert f"SENDQUEUE_SECRET_KEY_ARN {says}" in str(caught.value)
    assert text not in str(caught.value)


def test_an_unreadable_secret_is_named_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    arn = moto_secret(monkeypatch, secrets.token_hex(32))
    sm = client("secretsmanager")
    binary = sm.create_secret(Name="binary-key", SecretBinary=secrets.token_bytes(32))["ARN"]
    sm.delete_secret(SecretId=arn, ForceDeleteWithoutRecovery=True)
    for which, says in [
        (arn, "Secrets Manager refused to read it (ResourceNotFoundException)"),
        (binary, "a binary secret; store the key as a secret string"),
    ]:
        with pytest.raises(ValidationError, match=re.escape(f"SENDQUEUE_SECRET_KEY_ARN: {says}")):
            _with_secret(which)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")  # nothing listens there
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with pytest.raises(
        ValidationError, match="SENDQUEUE_SECRET_KEY_ARN: Secrets Manager unreachable"
    ):
        _with_secret(binary)


def test_the_key_and_its_arn_together_or_a_malformed_arn_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    aws_environment(monkeypatch)
    arn = "arn:aws:secretsmanager:eu-central-1:123456789012:secret:sendqueue/key-AbC123"
    with pytest.raises(ValidationError, match="SENDQUEUE_SECRET_KEY or SENDQUEUE_SECRET_KEY_ARN"):
        _with_secret(arn, secret_key=secrets.token_hex(32))
    for bad in ("sendqueue/key", "arn:aws:ssm:eu-central-1:123456789012:parameter/key"):
        with pytest.raises(ValidationError, match="expected a Secrets Manager secret ARN"):
            _with_secret(bad)
    assert _with_secret("").secret_key is None  # empty is unset, as for every setting


def test_without_boto3_the_arn_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sendqueue.adapters.secretsmanager", None)  # ImportError
    arn = "arn:aws:secretsmanager:eu-central-1:123456789012:secret:sendqueue/key-AbC123"
    with pytest.raises(
        ValidationError, match=re.escape("needs boto3: pip install 'sendqueue[aws]'")
    ):
        _with_secret(arn)
