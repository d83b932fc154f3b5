"""What ``sendqueue check`` tries on AWS (moto server): the EventBridge schedule group and SES,
each answering, missing or unreachable, and ``not checked`` without credentials."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.config import Config

from sendqueue.adapters.eventbridge.scheduler import EventBridgeScheduler
from sendqueue.adapters.mail.ses import SesMailer
from sendqueue.domain.errors import NotChecked, SchedulerError, TransientMailError
from sendqueue.ports import Probe
from sendqueue.testing.clock import FakeClock
from tests.support.aws import REGION, AwsWorld, client, eventbridge, moto_url, world

NO_RETRIES = Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=1)


def _without_credentials(monkeypatch: pytest.MonkeyPatch, service: str) -> Any:
    """A client of ``service`` on moto from a session that finds no credentials anywhere."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    session = boto3.session.Session(region_name=REGION)
    return session.client(service, endpoint_url=moto_url(), config=NO_RETRIES)  # type: ignore[call-overload]


def _scheduler(made: AwsWorld, scheduler: Any, group: str = "sendqueue") -> EventBridgeScheduler:
    return EventBridgeScheduler(
        scheduler,
        client("sqs"),
        physical_group=group,
        target_arn=made.send_arn,
        role_arn=made.role_arn,
        dead_letter_url=made.dlq_url,
        dead_letter_arn=made.dlq_arn,
        clock=FakeClock(),
    )


def test_the_schedule_group_answers_or_is_missing() -> None:
    made = world()
    built = eventbridge(FakeClock(), made)
    assert isinstance(built, Probe)
    assert built.probe(5) == "EventBridge Scheduler group sendqueue (ACTIVE)"
    missing = _scheduler(made, client("scheduler"), group="not-there")
    with pytest.raises(SchedulerError, match="no schedule group not-there"):
        missing.probe(5)


def test_the_schedule_group_is_not_checked_without_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made = world()
    built = _scheduler(made, _without_credentials(monkeypatch, "scheduler"))
    with pytest.raises(NotChecked, match="no AWS credentials"):
        built.probe(5)


def test_ses_answers_is_unreachable_or_not_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    world()
    assert SesMailer(client("sesv2")).probe(5) == f"SES answered in {REGION}"
    unreachable = SesMailer(client("sesv2", url="http://127.0.0.1:1", config=NO_RETRIES))
    with pytest.raises(TransientMailError, match="SES unreachable"):
        unreachable.probe(5)
    with pytest.raises(NotChecked, match="no AWS credentials"):
        SesMailer(_without_credentials(monkeypatch, "sesv2")).probe(5)
