"""AWS in tests: one moto server per test process (``ThreadedMotoServer`` on 127.0.0.1).

boto3 makes real HTTP calls to it, which botocore validates against the service models. The
credentials and region are dummies passed to the session here, never read from or written to
the environment. Each builder resets moto first, so every test starts on an empty account.
"""

from __future__ import annotations

import atexit
import json
import socket
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config
from moto.server import ThreadedMotoServer

from sendqueue.adapters.eventbridge_scheduler import EventBridgeScheduler
from sendqueue.testing.alarm import RecordingAlarm
from sendqueue.testing.clock import FakeClock

if TYPE_CHECKING:
    from tests.contract.test_scheduler import Harness

__all__ = [
    "ACCOUNT",
    "REGION",
    "AwsWorld",
    "client",
    "eventbridge_harness",
    "moto_url",
    "reset",
    "world",
]

REGION = "eu-central-1"
ACCOUNT = "123456789012"
SEND_FUNCTION = "sendqueue-send"
SCHEDULE_GROUP = "sendqueue"

_server: dict[str, str] = {}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def moto_url() -> str:
    """The moto server of this test process, started on first use."""
    if "url" not in _server:
        port = _free_port()
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        atexit.register(server.stop)
        _server["url"] = f"http://127.0.0.1:{port}"
    return _server["url"]


def reset() -> None:
    """Forget every resource moto holds: the next test starts on an empty account."""
    request = urllib.request.Request(f"{moto_url()}/moto-api/reset", method="POST")
    with urllib.request.urlopen(request, timeout=10):
        pass


_session = boto3.session.Session(
    aws_access_key_id="testing", aws_secret_access_key="testing", region_name=REGION
)


def client(service: str, *, url: str | None = None, config: Config | None = None) -> Any:
    """A boto3 client for ``service`` on the moto server (or on ``url``)."""
    return _session.client(  # type: ignore[call-overload]
        service, endpoint_url=url or moto_url(), config=config
    )


@dataclass
class AwsWorld:
    """The resources the SAM template would make, made in moto."""

    dlq_url: str
    dlq_arn: str
    role_arn: str
    send_arn: str


def world() -> AwsWorld:
    """Reset moto and make the queue, the role and the schedule group."""
    reset()
    sqs = client("sqs")
    dlq_url = sqs.create_queue(QueueName="sendqueue-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    iam = client("iam")
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "scheduler.amazonaws.com"},
                "Action": "sts:AssumeRole",
            }
        ],
    }
    role_arn = iam.create_role(
        RoleName="sendqueue-scheduler", AssumeRolePolicyDocument=json.dumps(trust)
    )["Role"]["Arn"]
    client("scheduler").create_schedule_group(Name=SCHEDULE_GROUP)
    send_arn = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{SEND_FUNCTION}"
    return AwsWorld(dlq_url, dlq_arn, role_arn, send_arn)


def eventbridge(clock: FakeClock, made: AwsWorld) -> EventBridgeScheduler:
    return EventBridgeScheduler(
        client("scheduler"),
        client("sqs"),
        physical_group=SCHEDULE_GROUP,
        target_arn=made.send_arn,
        role_arn=made.role_arn,
        dead_letter_url=made.dlq_url,
        dead_letter_arn=made.dlq_arn,
        clock=clock,
    )


def eventbridge_harness(clock: FakeClock, alarm: RecordingAlarm, tmp: Path) -> Harness:
    """The Scheduler contract's builder: EventBridge fires, so there is no ``fire_due``."""
    from tests.contract.test_scheduler import Harness

    return Harness(eventbridge(clock, world()), clock, alarm, None)
