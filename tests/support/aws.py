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
from moto.dynamodb.models.dynamo_type import DynamoType
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from moto.server import ThreadedMotoServer
from werkzeug.serving import make_server

from sendqueue.adapters.dynamodb.store import DynamoDbTaskStore
from sendqueue.adapters.eventbridge.scheduler import EventBridgeScheduler
from sendqueue.testing.alarm import RecordingAlarm
from sendqueue.testing.clock import FakeClock

if TYPE_CHECKING:
    from tests.contract.store_backends import Backend
    from tests.contract.test_scheduler import Harness

__all__ = [
    "ACCOUNT",
    "REGION",
    "AwsWorld",
    "aws_environment",
    "client",
    "dynamodb_backend",
    "dynamodb_url",
    "eventbridge_harness",
    "moto_secret",
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


def aws_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """What Lambda's environment gives boto3's default chain (credentials, the region), with
    every client pointed at the moto server: for code that builds its own clients."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url())


def moto_secret(
    monkeypatch: pytest.MonkeyPatch, text: str, *, name: str = "sendqueue/secret-key"
) -> str:
    """Reset moto, keep ``text`` in a Secrets Manager secret there and point boto3's default
    chain at moto (:func:`aws_environment`); the secret's ARN."""
    reset()
    aws_environment(monkeypatch)
    arn: str = client("secretsmanager").create_secret(Name=name, SecretString=text)["ARN"]
    return arn


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


class _NoCopy(threading.local):
    """Stands in for the ``copy`` module in moto's ``transact_write_items`` while
    :func:`_undo_instead_of_copies` keeps the rollback: the table itself, not a copy."""

    active = False

    def deepcopy(self, value: Any) -> Any:
        return value if self.active else copy.deepcopy(value)


def _undo_instead_of_copies() -> None:
    """Make moto's TransactWriteItems undo its own items instead of copying the table.

    To roll back, moto deep-copies the whole table for every item of a transaction (all before
    it writes anything) and, when an item fails, puts the copy in the table's place: 99 copies
    for a 99-item transaction, each as large as the table, which made a few thousand tasks
    take minutes and every transition cost as much as the table. A transaction only writes the
    items it names, so keeping those items' previous versions and putting them back on failure
    is the same rollback at the cost of the transaction. The function runs unchanged, with its
    own globals in which ``copy`` is :class:`_NoCopy`; nothing else in moto is touched (a
    transaction on a table without a range key keeps moto's copies). Like moto's own rollback,
    it is only sound while requests run one at a time (:func:`dynamodb_url`).
    """
    backend = moto_dynamodb_models.DynamoDBBackend
    if getattr(backend.transact_write_items, "undoes", False):
        return
    original = backend.transact_write_items
    shim = _NoCopy()
    clone = types.FunctionType(
        original.__code__,
        {**original.__globals__, "copy": shim},
        original.__name__,
        original.__defaults__,
        original.__closure__,
    )

    def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
        before: list[tuple[Any, Any, Any, Any]] = []
        for entry in transact_items:
            op = next(iter(entry.values()))
            table = self.tables.get(op.get("TableName"))
            key = op.get("Item") or op.get("Key") or {}
            if (
                table is None
                or table.range_key_attr is None
                or not (table.hash_key_attr in key and table.range_key_attr in key)
            ):
                clone(self, transact_items)  # not our kind of table: moto's own copies
                return
            hash_key = DynamoType(key[table.hash_key_attr])
            range_key = DynamoType(key[table.range_key_attr])
            old = table.items.get(hash_key, {}).get(range_key)
            before.append((table, hash_key, range_key, copy.deepcopy(old)))
        shim.active = True
        try:
            clone(self, transact_items)
        except BaseException:
            for table, hash_key, range_key, old in reversed(before):
                if old is None:
                    table.items.get(hash_key, {}).pop(range_key, None)
                else:
                    table.items[hash_key][range_key] = old
            raise
        finally:
            shim.active = False

    transact_write_items.undoes = True  # type: ignore[attr-defined]
    backend.transact_write_items = transact_write_items  # type: ignore[method-assign]


def dynamodb_url() -> str:
    """A moto endpoint that handles one request at a time, for DynamoDB (started on first use).

    moto's DynamoDB has no locks: two TransactWriteItems in flight at once can both pass their
    conditions, and a cancelled one puts back a copy of the whole table taken when it started,
    undoing what other requests wrote meanwhile. DynamoDB applies each request atomically, so
    the store's races (between its requests) are only tested faithfully if moto handles one
    request at a time. It shares moto's state with :func:`moto_url`'s server (one process), so
    :func:`reset` empties it too. Its TransactWriteItems rolls back without copying the table
    (:func:`_undo_instead_of_copies`).
    """
    if "url" not in _dynamodb_server:
        _undo_instead_of_copies()
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

    The bulk test runs with 2,000 tasks instead of 20,000, only because of a cost moto has and
    DynamoDB does not: every Query sorts the whole table (the insert reads the end of the log
    once per transaction, 400 times for 20,000 tasks in a table that grows to 40,000 items).
    2,000 tasks still take 41 insert and 21 cancel transactions (49 and 99 tasks each), so a
    mistake at a transaction boundary, in log order or in counting still fails it.
    """
    from tests.contract.store_backends import Backend

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
        bulk_tasks=2_000,
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
