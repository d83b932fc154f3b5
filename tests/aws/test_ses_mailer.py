"""SesMailer against SES in moto: accepted, rejected (permanent) and throttled (transient)."""

from __future__ import annotations

import json
import urllib.request
from datetime import UTC, datetime

import pytest
from botocore.config import Config

from sendqueue.adapters.mail.factory import mailer_from_url
from sendqueue.adapters.mail.ses import SesMailer
from sendqueue.domain.errors import InvalidField, PermanentMailError, TransientMailError
from sendqueue.ports import OutgoingMessage
from tests.aws.test_eventbridge import throttling_url  # noqa: F401  (a fixture)
from tests.support.aws import client, moto_url, reset

MESSAGE = OutgoingMessage(
    message_id="<c1-0.abc@example.com>",
    from_addr="news@example.com",
    to_addr="ada@example.org",
    subject="Hello",
    text="Body",
    date=datetime(2026, 3, 20, 9, 0, tzinfo=UTC),
    to_name="Ada",
)

NO_RETRIES = Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=1)


def sent_messages() -> list[dict[str, object]]:
    """The raw messages moto's SES accepted (its inspection endpoint)."""
    with urllib.request.urlopen(f"{moto_url()}/moto-api/data.json", timeout=10) as answer:
        data = json.load(answer)
    return list(data["ses"]["RawMessage"])


def test_a_verified_sender_is_accepted_with_our_message_id() -> None:
    reset()
    ses = client("sesv2")
    ses.create_email_identity(EmailIdentity="example.com")
    mailer = SesMailer(ses)
    assert mailer.send(MESSAGE) == MESSAGE.message_id
    [sent] = sent_messages()
    raw = str(sent["raw_data"])
    assert "Message-ID: <c1-0.abc@example.com>" in raw
    assert "Subject: Hello" in raw
    mailer.close()


def test_an_unverified_sender_is_rejected_permanently() -> None:
    reset()
    mailer = SesMailer(client("sesv2"))
    with pytest.raises(PermanentMailError, match="MessageRejected"):
        mailer.send(MESSAGE)
    mailer.close()


def test_throttling_and_connection_errors_are_transient(throttling_url: str) -> None:  # noqa: F811
    throttled = SesMailer(client("sesv2", url=throttling_url, config=NO_RETRIES))
    with pytest.raises(TransientMailError, match="ThrottlingException"):
        throttled.send(MESSAGE)
    throttled.close()
    unreachable = SesMailer(client("sesv2", url="http://127.0.0.1:1", config=NO_RETRIES))
    with pytest.raises(TransientMailError, match="unreachable"):
        unreachable.send(MESSAGE)
    unreachable.close()


def test_the_mailer_url_names_ses() -> None:
    mailer = mailer_from_url("ses:eu-west-1?configuration_set=campaigns")
    assert isinstance(mailer, SesMailer)
    mailer.close()
    with pytest.raises(InvalidField):
        mailer_from_url("ses:eu-west-1?colour=blue")
