"""What DynamoDbTaskStore asks of DynamoDB, and how it reads DynamoDB's answers (moto server).

The store contracts (tests/contract/, backends in store_backends.py) run against it too; these
are the AWS-specific parts: the table the template must agree with, the URL, throttling and
other vendor errors at the edge.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

import pytest
from botocore.config import Config

from sendqueue.adapters.dynamodb.store import DynamoDbTaskStore
from sendqueue.adapters.dynamodb.table import GSI_NAMES, table_definition
from sendqueue.bootstrap import upgrade_store_schema
from sendqueue.domain.errors import InvalidField, StoreUnavailable
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import task_id
from sendqueue.settings import Settings
from tests.aws.test_aws_settings import ARNS
from tests.contract.store_backends import campaign, make_task, recipients
from tests.support.aws import REGION, client, dynamodb_url, reset

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
NO_RETRIES = Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=1)


@pytest.fixture
def store() -> Iterator[DynamoDbTaskStore]:
    reset()
    made = DynamoDbTaskStore(client("dynamodb", url=dynamodb_url()), "sqt", create_table=True)
    yield made
    made.close()


def test_the_table_is_on_demand_with_the_documented_keys_and_indexes() -> None:
    table = table_definition("sqt")
    assert table["TableName"] == "sqt"
    assert table["BillingMode"] == "PAY_PER_REQUEST"
    assert "ProvisionedThroughput" not in table
    assert table["KeySchema"] == [
        {"AttributeName": "pk", "KeyType": "HASH"},
        {"AttributeName": "sk", "KeyType": "RANGE"},
    ]
    indexes = {
        index["IndexName"]: tuple(key["AttributeName"] for key in index["KeySchema"])
        for index in table["GlobalSecondaryIndexes"]
    }
    assert indexes == {
        "by_campaign": ("gc", "gp"),
        "by_state": ("gs", "gt"),
        "due": ("gd", "gt"),
        "by_address": ("ga", "gt"),
    }
    assert indexes == GSI_NAMES
    projections = {
        index["IndexName"]: index["Projection"]["ProjectionType"]
        for index in table["GlobalSecondaryIndexes"]
    }
    # Keys only for the address index: a state change does not rewrite its entry.
    assert projections == {
        "by_campaign": "ALL",
        "by_state": "ALL",
        "due": "ALL",
        "by_address": "KEYS_ONLY",
    }
    types = {d["AttributeName"]: d["AttributeType"] for d in table["AttributeDefinitions"]}
    assert types == {
        "pk": "S",
        "sk": "S",
        "gc": "S",
        "gp": "N",
        "gs": "S",
        "gt": "S",
        "gd": "S",
        "ga": "S",
    }


def test_create_table_makes_that_table_with_point_in_time_recovery(
    store: DynamoDbTaskStore,
) -> None:
    dynamodb = client("dynamodb", url=dynamodb_url())
    described = dynamodb.describe_table(TableName="sqt")["Table"]
    assert described["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    assert {i["IndexName"] for i in described["GlobalSecondaryIndexes"]} == set(GSI_NAMES)
    backups = dynamodb.describe_continuous_backups(TableName="sqt")
    recovery = backups["ContinuousBackupsDescription"]["PointInTimeRecoveryDescription"]
    assert recovery["PointInTimeRecoveryStatus"] == "ENABLED"
    # Creating it again (another process started first) is not an error.
    store.create_table()
    dynamodb.close()


def test_a_transition_writes_the_task_and_its_log_item_together(store: DynamoDbTaskStore) -> None:
    store.create_campaign(campaign(), recipients(2))
    assert store.insert_tasks([make_task("c1", 0), make_task("c1", 1)], at=T0) == 2
    assert store.transition(task_id("c1", 0), TaskState.PENDING, TaskState.RUNNING, at=T0)

    dynamodb = client("dynamodb", url=dynamodb_url())
    log = dynamodb.query(
        TableName="sqt",
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": "log"}},
        ConsistentRead=True,
    )["Items"]
    dynamodb.close()
    # One log item per transaction: both inserts in the first, the claim in the second.
    assert [(i["sk"]["S"], i["n"]["N"]) for i in log] == [
        (f"{1:020d}", "2"),
        (f"{3:020d}", "1"),
    ]
    assert [e.id for e in store.changes_after(0)] == [1, 2, 3]
    assert store.last_change_id() == 3


def test_an_item_larger_than_dynamodb_allows_is_an_invalid_field(
    store: DynamoDbTaskStore,
) -> None:
    store.create_campaign(campaign(), [])
    huge = make_task("c1", 0, text="x" * 500_000)
    with pytest.raises(InvalidField) as info:
        store.insert_tasks([huge], at=T0)
    assert info.value.field == "task"
    with pytest.raises(InvalidField) as about_recipient:
        store.create_campaign(campaign("c2"), [replace(recipients(1)[0], text="x" * 500_000)])
    assert about_recipient.value.field == "recipient"
    assert store.last_change_id() == 0


@pytest.mark.usefixtures("aws_environment")
def test_items_written_before_the_feedback_loop_read_and_index_as_new_ones(
    store: DynamoDbTaskStore,
) -> None:
    """Task and campaign items of an older release: no ``ga``, no outcome fields, no reply
    options. They read with the defaults, and the backfill puts them in the address index."""
    store.create_campaign(campaign(), recipients(3))
    store.insert_tasks([make_task("c1", i, email=f"Old{i}@Example.com") for i in range(3)], at=T0)
    dynamodb = client("dynamodb", url=dynamodb_url())
    for i in range(3):
        key = {"pk": {"S": f"T#{task_id('c1', i)}"}, "sk": {"S": "#"}}
        item = dynamodb.get_item(TableName="sqt", Key=key, ConsistentRead=True)["Item"]
        doc = json.loads(item["d"]["S"])
        for name in ("outcome", "outcome_detail", "outcome_at"):
            del doc[name]
        item["d"] = {"S": json.dumps(doc)}
        del item["ga"]
        dynamodb.put_item(TableName="sqt", Item=item)
    key = {"pk": {"S": "campaign"}, "sk": {"S": "c1"}}
    item = dynamodb.get_item(TableName="sqt", Key=key, ConsistentRead=True)["Item"]
    doc = json.loads(item["d"]["S"])
    del doc["stop_on_reply"], doc["unsubscribe_footer"]
    item["d"] = {"S": json.dumps(doc)}
    dynamodb.put_item(TableName="sqt", Item=item)
    dynamodb.close()

    old = store.get_task(task_id("c1", 0))
    assert old is not None and (old.outcome, old.outcome_detail, old.outcome_at) == (None,) * 3
    got = store.get_campaign("c1")
    assert (got.stop_on_reply.value, got.unsubscribe_footer) == ("sender", False)
    assert store.tasks_for("old0@example.com", states=[TaskState.PENDING]) == []

    # `sendqueue db upgrade` runs the backfill on a DynamoDB store.
    values: dict[str, Any] = {
        "_env_file": None,
        "execution": "eventbridge",
        "database_url": f"dynamodb://sqt?region={REGION}&endpoint_url={dynamodb_url()}",
        **ARNS,
    }
    settings = Settings(**values)
    assert upgrade_store_schema(settings) == "dynamodb (address keys added to 3 tasks)"
    assert store.backfill_address_keys() == 0  # nothing left: a second run is a no-op
    found = store.tasks_for("old0@example.com", states=[TaskState.PENDING])
    assert [t.id for t in found] == [task_id("c1", 0)]
    assert found[0] == old


def test_task_items_written_before_steps_read_and_list_as_step_one(
    store: DynamoDbTaskStore,
) -> None:
    """A task item of an older release has no ``step`` in its document (and, as every step-1
    item, no ``sp``): it reads as step 1, lists under step 1, and its position marker still
    holds step 1 while a later step of the same recipient gets its own."""
    store.create_campaign(campaign(), recipients(2))
    store.insert_tasks([make_task("c1", i) for i in range(2)], at=T0)
    dynamodb = client("dynamodb", url=dynamodb_url())
    for i in range(2):
        key = {"pk": {"S": f"T#{task_id('c1', i)}"}, "sk": {"S": "#"}}
        item = dynamodb.get_item(TableName="sqt", Key=key, ConsistentRead=True)["Item"]
        assert "sp" not in item
        doc = json.loads(item["d"]["S"])
        del doc["step"]
        item["d"] = {"S": json.dumps(doc)}
        dynamodb.put_item(TableName="sqt", Item=item)
    dynamodb.close()

    old = store.get_task(task_id("c1", 0))
    assert old is not None and old.step == 1
    both = store.get_tasks([task_id("c1", 0), task_id("c1", 1)])
    assert [t.step for t in both.values()] == [1, 1]
    later = make_task("c1", 0, id=task_id("c1", 0, 2), step=2)
    assert store.insert_tasks([later, make_task("c1", 0, id="c1-again")], at=T0) == 1
    assert [t.id for t in store.list_tasks("c1", step=1)] == ["c1-0", "c1-1"]
    assert [t.id for t in store.list_tasks("c1", step=2)] == ["c1-0-s2"]
    assert sorted(t.id for t in store.list_tasks("c1")) == ["c1-0", "c1-0-s2", "c1-1"]


# --- vendor errors at the edge ------------------------------------------------------------------


class _Flaky(BaseHTTPRequestHandler):
    """Forwards to moto, but cancels the first ``throttle`` TransactWriteItems for throttling
    (as DynamoDB does when a partition is hot) and answers every call with a 500 once
    ``broken`` is set."""

    throttle = 0
    broken = False
    upstream = ""
    seen: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        target = self.headers.get("X-Amz-Target", "")
        type(self).seen.append(target)
        if type(self).broken:
            self._answer(500, "InternalServerError", {"message": "boom"})
            return
        if target.endswith("TransactWriteItems") and type(self).throttle > 0:
            type(self).throttle -= 1
            items = json.loads(body)["TransactItems"]
            reasons = [{"Code": "ThrottlingError", "Message": "hot"}] + [
                {"Code": "None"} for _ in items[1:]
            ]
            self._answer(
                400,
                "TransactionCanceledException",
                {"message": "Transaction cancelled", "CancellationReasons": reasons},
            )
            return
        request = urllib.request.Request(
            type(self).upstream, data=body, method="POST", headers=dict(self.headers)
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            data = answer.read()
            self.send_response(answer.status)
            for name, value in answer.headers.items():
                if name.lower() not in {"content-length", "connection", "transfer-encoding"}:
                    self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _answer(self, status: int, code: str, payload: dict[str, object]) -> None:
        body = json.dumps({"__type": f"com.amazonaws.dynamodb.v20120810#{code}", **payload})
        data = body.encode()
        self.send_response(status)
        self.send_header("x-amzn-ErrorType", code)
        self.send_header("Content-Type", "application/x-amz-json-1.0")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def flaky_url(store: DynamoDbTaskStore) -> Iterator[str]:
    """The URL of a :class:`_Flaky` endpoint in front of the ``store``'s moto server."""
    _Flaky.throttle, _Flaky.broken, _Flaky.upstream, _Flaky.seen = 0, False, dynamodb_url(), []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


def test_a_transaction_cancelled_for_throttling_is_retried(
    store: DynamoDbTaskStore, flaky_url: str
) -> None:
    store.create_campaign(campaign(), recipients(1))
    store.insert_tasks([make_task("c1", 0)], at=T0)
    _Flaky.throttle = 3
    through = DynamoDbTaskStore(client("dynamodb", url=flaky_url, config=NO_RETRIES), "sqt")

    moved = through.transition(task_id("c1", 0), TaskState.PENDING, TaskState.RUNNING, at=T0)

    assert moved is not None
    assert moved.state is TaskState.RUNNING
    assert _Flaky.throttle == 0
    assert len([t for t in _Flaky.seen if t.endswith("TransactWriteItems")]) == 4
    assert [(e.task_id, e.to_state) for e in store.changes_after(1)] == [
        (task_id("c1", 0), "Running")
    ]
    through.close()


def test_service_errors_and_unreachable_endpoints_are_store_unavailable(
    store: DynamoDbTaskStore, flaky_url: str
) -> None:
    store.create_campaign(campaign(), recipients(1))
    _Flaky.broken = True
    broken = DynamoDbTaskStore(client("dynamodb", url=flaky_url, config=NO_RETRIES), "sqt")
    with pytest.raises(StoreUnavailable, match="InternalServerError"):
        broken.get_campaign("c1")
    with pytest.raises(StoreUnavailable):
        broken.transition(task_id("c1", 0), TaskState.PENDING, TaskState.RUNNING, at=T0)
    broken.close()
    unreachable = DynamoDbTaskStore(
        client("dynamodb", url="http://127.0.0.1:1", config=NO_RETRIES), "sqt"
    )
    with pytest.raises(StoreUnavailable, match="Could not connect"):
        unreachable.campaign_state("c1")
    with pytest.raises(StoreUnavailable):
        unreachable.has_unfinished_tasks("c1")
    unreachable.close()


# --- the URL ------------------------------------------------------------------------------------


@pytest.fixture
def aws_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Dummy credentials and no region in boto3's chain (this test's environment only)."""
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    empty = tmp_path / "aws-config"
    empty.write_text("")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(empty))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")


@pytest.mark.usefixtures("aws_environment")
def test_from_url_builds_a_client_for_the_table_region_and_endpoint(
    store: DynamoDbTaskStore,
) -> None:
    store.create_campaign(campaign(), [])
    url = f"dynamodb://sqt?region={REGION}&endpoint_url={dynamodb_url()}"
    made = DynamoDbTaskStore.from_url(url)
    assert [c.id for c in made.list_campaigns()] == ["c1"]
    made.close()
    # The table name is the URL's: another one is not there.
    other = DynamoDbTaskStore.from_url(
        f"dynamodb://elsewhere?region={REGION}&endpoint_url={dynamodb_url()}"
    )
    with pytest.raises(StoreUnavailable, match="ResourceNotFound"):
        other.list_campaigns()
    other.close()


@pytest.mark.usefixtures("aws_environment")
@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("postgresql://x", "expected dynamodb://TABLE"),
        ("dynamodb://a", "3 to 255 characters"),
        ("dynamodb://sqt/path", "nothing else"),
        ("dynamodb://sqt?colour=blue", "unknown parameter 'colour'"),
        ("dynamodb://sqt?region=Mars", "AWS region"),
        ("dynamodb://sqt?region=eu-west-1&endpoint_url=ftp://x", "http:// or https://"),
        ("dynamodb://sqt", "no AWS region"),
    ],
)
def test_a_bad_url_is_an_invalid_field_naming_the_setting(url: str, reason: str) -> None:
    with pytest.raises(InvalidField, match=reason) as info:
        DynamoDbTaskStore.from_url(url)
    assert info.value.field == "SENDQUEUE_DATABASE_URL"


def test_a_cancelled_transaction_leaves_none_of_its_items(store: DynamoDbTaskStore) -> None:
    """The moto server's rollback (tests/support/aws.py) undoes every item of the transaction."""
    dynamodb = client("dynamodb", url=dynamodb_url())
    dynamodb.put_item(TableName="sqt", Item={"pk": {"S": "b"}, "sk": {"S": "#"}, "v": {"N": "1"}})
    with pytest.raises(dynamodb.exceptions.TransactionCanceledException):
        dynamodb.transact_write_items(
            TransactItems=[
                {"Put": {"TableName": "sqt", "Item": {"pk": {"S": "a"}, "sk": {"S": "#"}}}},
                {
                    "Put": {
                        "TableName": "sqt",
                        "Item": {"pk": {"S": "b"}, "sk": {"S": "#"}, "v": {"N": "2"}},
                    }
                },
                {
                    "Put": {
                        "TableName": "sqt",
                        "Item": {"pk": {"S": "c"}, "sk": {"S": "#"}},
                        "ConditionExpression": "attribute_exists(pk)",
                    }
                },
            ]
        )
    key = {"sk": {"S": "#"}}
    assert "Item" not in dynamodb.get_item(TableName="sqt", Key={"pk": {"S": "a"}, **key})
    kept = dynamodb.get_item(TableName="sqt", Key={"pk": {"S": "b"}, **key})["Item"]
    assert kept["v"] == {"N": "1"}
    assert "Item" not in dynamodb.get_item(TableName="sqt", Key={"pk": {"S": "c"}, **key})
    dynamodb.close()


class _HalfUnprocessed:
    """A DynamoDB client whose BatchGetItem answers only the first half of each request's keys
    and hands the rest back as UnprocessedKeys (as DynamoDB may, under load), or, ``never``
    processing, none of them."""

    def __init__(self, inner: Any, *, never: bool = False) -> None:
        self.inner = inner
        self.never = never
        self.requests: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def batch_get_item(self, RequestItems: dict[str, Any]) -> dict[str, Any]:
        [(table, request)] = RequestItems.items()
        keys = request["Keys"]
        self.requests.append(len(keys))
        cut = 0 if self.never else (len(keys) + 1) // 2
        answered = (
            self.inner.batch_get_item(RequestItems={table: {**request, "Keys": keys[:cut]}})
            if cut
            else {"Responses": {table: []}}
        )
        rest = keys[cut:]
        return {**answered, "UnprocessedKeys": {table: {**request, "Keys": rest}} if rest else {}}


def test_get_tasks_asks_again_for_unprocessed_keys_100_at_a_time(
    store: DynamoDbTaskStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.create_campaign(campaign("c1"), recipients(230))
    tasks = [make_task("c1", i) for i in range(230)]
    assert store.insert_tasks(tasks, at=T0) == 230
    flaky = _HalfUnprocessed(client("dynamodb", url=dynamodb_url()))
    reader = DynamoDbTaskStore(cast("DynamoDBClient", flaky), "sqt")
    monkeypatch.setattr(reader, "_backoff", lambda attempt: None)
    got = reader.get_tasks([t.id for t in tasks])
    assert got == {t.id: store.get_task(t.id) for t in tasks}
    # 100, 100 and 30 keys, each request's unprocessed half asked again until none is left
    assert flaky.requests == [*[100, 50, 25, 12, 6, 3, 1] * 2, 30, 15, 7, 3, 1]

    never = DynamoDbTaskStore(
        cast("DynamoDBClient", _HalfUnprocessed(flaky.inner, never=True)), "sqt"
    )
    monkeypatch.setattr(never, "_backoff", lambda attempt: None)
    with pytest.raises(StoreUnavailable, match="unprocessed"):
        never.get_tasks([tasks[0].id])
    reader.close()
    never.close()
