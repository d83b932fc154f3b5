"""AWS in tests: one moto server per test process (``ThreadedMotoServer`` on 127.0.0.1).

boto3 makes real HTTP calls to it, which botocore validates against the service models. The
credentials and region are dummies passed to the session here, never read from or written to
the environment. Each builder resets moto first, so every test starts on an empty account.
"""

from __future__ import annotations

import atexit
import copy
import json
import socket
import threading
import types
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from botocore.config import Config
from moto.dynamodb import models as moto_dynamodb_models
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from moto.server import ThreadedMotoServer
from werkzeug.serving import make_server

from sendqueue.adapters.dynamodb_store import DynamoDbTaskStore
from sendqueue.adapters.eventbridge_scheduler import EventBridgeScheduler
from sendqueue.testing.alarm import RecordingAlarm
from sendqueue.testing.clock import FakeClock

if TYPE_CHECKING:
    from tests.contract.test_scheduler import Harness
    from tests.contract.test_task_store import Backend

__all__ = [
    "ACCOUNT",
    "REGION",
    "AwsWorld",
    "client",
    "dynamodb_backend",
    "dynamodb_url",
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


_dynamodb_server: dict[str, str] = {}


class _CopyOnce(threading.local):
    """Stands in for the ``copy`` module in moto's ``transact_write_items``: one deep copy of
    each table per call, where moto makes one per item of the transaction."""

    copies: dict[int, Any] | None = None

    def deepcopy(self, value: Any) -> Any:
        if self.copies is None:
            return copy.deepcopy(value)
        if id(value) not in self.copies:
            self.copies[id(value)] = copy.deepcopy(value)
        return self.copies[id(value)]


def _copy_each_table_once() -> None:
    """Make moto's TransactWriteItems copy each table once instead of once per item.

    To roll back, moto deep-copies the whole table for every item of a transaction, all before
    it writes anything, keeping the last copy: 99 copies for a 99-item transaction, each as
    large as the table, which made a few thousand tasks take minutes. One copy per table is the
    same rollback point, so this changes the cost only. The function runs unchanged, with its
    own globals in which ``copy`` is :class:`_CopyOnce`; nothing else in moto is touched.
    """
    backend = moto_dynamodb_models.DynamoDBBackend
    if getattr(backend.transact_write_items, "copies_once", False):
        return
    original = backend.transact_write_items
    shim = _CopyOnce()
    clone = types.FunctionType(
        original.__code__,
        {**original.__globals__, "copy": shim},
        original.__name__,
        original.__defaults__,
        original.__closure__,
    )

    def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
        shim.copies = {}
        try:
            clone(self, transact_items)
        finally:
            shim.copies = None

    transact_write_items.copies_once = True  # type: ignore[attr-defined]
    backend.transact_write_items = transact_write_items  # type: ignore[method-assign]


def dynamodb_url() -> str:
    """A moto endpoint that handles one request at a time, for DynamoDB (started on first use).

    moto's DynamoDB has no locks: two TransactWriteItems in flight at once can both pass their
    conditions, and a cancelled one puts back a copy of the whole table taken when it started,
    undoing what other requests wrote meanwhile. DynamoDB applies each request atomically, so
    the store's races (between its requests) are only tested faithfully if moto handles one
    request at a time. It shares moto's state with :func:`moto_url`'s server (one process), so
    :func:`reset` empties it too. Its TransactWriteItems copies each table once
    (:func:`_copy_each_table_once`).
    """
    if "url" not in _dynamodb_server:
        _copy_each_table_once()
        app = DomainDispatcherApplication(create_backend_app)
        lock = threading.Lock()

        def one_at_a_time(environ: Any, start_response: Any) -> list[bytes]:
            with lock:
                return list(app(environ, start_response))

        server = make_server(
            "127.0.0.1", 0, one_at_a_time, threaded=True, request_handler=MotoRequestHandler
        )
        threading.Thread(target=server.serve_forever, daemon=True).start()
        atexit.register(server.shutdown)
        _dynamodb_server["url"] = f"http://127.0.0.1:{server.server_port}"
    return _dynamodb_server["url"]


def dynamodb_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """The TaskStore contract's backend: a table in moto; unreachable is a closed port.

    The two bulk tests run with 1,000 tasks instead of 20,000 and 2,000, only because of costs
    moto has and DynamoDB does not: every TransactWriteItems deep-copies the whole table (even
    once per call, that is 20,000 tasks times 600 transactions) and every Query sorts the whole
    table. 1,000 tasks still take 21 insert and 11 cancel transactions per call (49 and 99
    tasks each), so a mistake at a transaction boundary, in log order or in counting still
    fails them.
    """
    from tests.contract.test_task_store import Backend

    reset()
    table = "sendqueue"
    DynamoDbTaskStore(client("dynamodb", url=dynamodb_url()), table, create_table=True).close()
    no_retries = Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=1)
    return Backend(
        "dynamodb",
        lambda: DynamoDbTaskStore(client("dynamodb", url=dynamodb_url()), table),
        lambda: DynamoDbTaskStore(
            client("dynamodb", url="http://127.0.0.1:1", config=no_retries), table
        ),
        bulk_tasks=1_000,
        concurrent_inserts=1_000,
    )


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
