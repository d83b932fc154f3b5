"""The webhooks' store in the DynamoDB table (:class:`WebhookItems`, a base of
:class:`~sendqueue.adapters.dynamodb.store.DynamoDbTaskStore`).

- An endpoint is the item (``webhook``, id); each of its fields is its own attribute holding
  the field's JSON, so an update sets only the given fields in one conditional
  ``UpdateItem`` (the endpoint must exist) and the delivery loop's cursor and a user's change
  of the URL never overwrite each other. Listing is a query of the one partition.
- The delivery log of an endpoint is its own partition ``WD#<endpoint>``, sorted by
  ``<attempt time>#<sequence>``: newest first is a backwards query with a limit, "failed
  since" a range query; pruning queries each endpoint's partition below a time (keys only)
  and batch-deletes. Removing an endpoint deletes its partition too.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

from sendqueue.adapters.dynamodb.client import TableClient, error_code
from sendqueue.adapters.dynamodb.codec import (
    PendingEntry,
    num_attr,
    parse_time,
    str_attr,
    task_from_item,
    time_key,
)
from sendqueue.domain.errors import Conflict
from sendqueue.domain.models import check_limit, utc
from sendqueue.domain.webhooks import (
    DEAD_LETTER,
    DeliveryRecord,
    EndpointChanges,
    EventTask,
    WebhookEndpoint,
    checked_endpoint_changes,
)

__all__ = ["WebhookItems"]

_PK = "webhook"
_FIELDS = (
    "url",
    "created_at",
    "secret",
    "event_types",
    "campaign_ids",
    "enabled",
    "disabled_reason",
    "previous_secret",
    "previous_secret_expires_at",
    "cursor",
    "attempts",
    "retry_at",
    "failing_since",
)
_TIMES = frozenset({"created_at", "previous_secret_expires_at", "retry_at", "failing_since"})
#: Makes two attempts logged in the same microsecond distinct and in write order.
_SEQUENCE = itertools.count()
_PROCESS = os.urandom(3).hex()


def _log_pk(endpoint_id: str) -> str:
    return f"WD#{endpoint_id}"


def _encode(name: str, value: Any) -> dict[str, str]:
    if name in _TIMES and value is not None:
        value = time_key(value)
    elif isinstance(value, tuple):
        value = list(value)
    return str_attr(json.dumps(value))


def _decode(item: dict[str, Any]) -> WebhookEndpoint:
    values: dict[str, Any] = {"id": item["sk"]["S"]}
    for name in _FIELDS:
        value = json.loads(item[name]["S"])
        if name in _TIMES and value is not None:
            value = parse_time(value)
        elif isinstance(value, list):
            value = tuple(value)
        values[name] = value
    return WebhookEndpoint(**values)


def _record_item(record: DeliveryRecord) -> dict[str, Any]:
    sk = f"{time_key(record.at)}#{_PROCESS}{next(_SEQUENCE):012d}"
    item: dict[str, Any] = {
        "pk": str_attr(_log_pk(record.endpoint_id)),
        "sk": str_attr(sk),
        "ev": str_attr(record.event_id),
        "et": str_attr(record.event_type),
        "at": str_attr(time_key(record.at)),
        "n": num_attr(record.attempt),
        "ms": num_attr(record.latency_ms),
        "rd": {"BOOL": record.redelivery},
    }
    if record.status is not None:
        item["sc"] = num_attr(record.status)
    if record.error is not None:
        item["er"] = str_attr(record.error)
    return item


def _record(endpoint_id: str, item: dict[str, Any]) -> DeliveryRecord:
    return DeliveryRecord(
        endpoint_id=endpoint_id,
        event_id=item["ev"]["S"],
        event_type=item["et"]["S"],
        at=parse_time(item["at"]["S"]),
        attempt=int(item["n"]["N"]),
        latency_ms=int(item["ms"]["N"]),
        status=int(item["sc"]["N"]) if "sc" in item else None,
        error=item["er"]["S"] if "er" in item else None,
        redelivery=bool(item["rd"]["BOOL"]),
    )


class WebhookItems(TableClient):
    """:class:`~sendqueue.ports.webhooks.WebhookStore` in the store's table."""

    def add_endpoint(self, endpoint: WebhookEndpoint) -> None:
        item = {"pk": str_attr(_PK), "sk": str_attr(endpoint.id)}
        for name in _FIELDS:
            item[name] = _encode(name, getattr(endpoint, name))
        with self._errors("add a webhook endpoint"):
            try:
                self._db.put_item(
                    TableName=self._table,
                    Item=item,
                    ConditionExpression="attribute_not_exists(pk)",
                )
            except ClientError as exc:
                if error_code(exc) != "ConditionalCheckFailedException":
                    raise
                raise Conflict(f"webhook {endpoint.id!r} already exists") from None

    def get_endpoint(self, endpoint_id: str) -> WebhookEndpoint | None:
        with self._errors("get a webhook endpoint"):
            item = self._get(_PK, endpoint_id)
        return None if item is None else _decode(item)

    def list_endpoints(self) -> list[WebhookEndpoint]:
        with self._errors("list webhook endpoints"):
            items = list(
                self._query(
                    KeyConditionExpression="pk = :pk",
                    ExpressionAttributeValues={":pk": str_attr(_PK)},
                    ConsistentRead=True,
                )
            )
        found = [_decode(item) for item in items]
        return sorted(found, key=lambda e: (e.created_at, e.id))

    def update_endpoint(self, endpoint_id: str, changes: EndpointChanges) -> WebhookEndpoint | None:
        values = checked_endpoint_changes(changes)
        if not values:
            return self.get_endpoint(endpoint_id)
        names = {f"#f{i}": name for i, name in enumerate(values)}
        attrs = {f":v{i}": _encode(name, value) for i, (name, value) in enumerate(values.items())}
        update = "SET " + ", ".join(f"#f{i} = :v{i}" for i in range(len(values)))
        with self._errors("update a webhook endpoint"):
            try:
                got = self._db.update_item(
                    TableName=self._table,
                    Key={"pk": str_attr(_PK), "sk": str_attr(endpoint_id)},
                    UpdateExpression=update,
                    ConditionExpression="attribute_exists(pk)",
                    ExpressionAttributeNames=names,
                    ExpressionAttributeValues=attrs,
                    ReturnValues="ALL_NEW",
                )
            except ClientError as exc:
                if error_code(exc) != "ConditionalCheckFailedException":
                    raise
                return None
        return _decode(dict(got["Attributes"]))

    def remove_endpoint(self, endpoint_id: str) -> bool:
        with self._errors("remove a webhook endpoint"):
            got = self._db.delete_item(
                TableName=self._table,
                Key={"pk": str_attr(_PK), "sk": str_attr(endpoint_id)},
                ReturnValues="ALL_OLD",
            )
            self._delete_log(endpoint_id, None)
        return bool(got.get("Attributes"))

    def record_deliveries(self, records: Sequence[DeliveryRecord]) -> None:
        items = [{"PutRequest": {"Item": _record_item(r)}} for r in records]
        with self._errors("record webhook deliveries"):
            for start in range(0, len(items), 25):
                self._batch_write(items[start : start + 25])

    def deliveries(self, endpoint_id: str, *, limit: int = 100) -> list[DeliveryRecord]:
        check_limit(limit)
        if limit == 0:
            return []
        with self._errors("read webhook deliveries"):
            page = self._db.query(
                TableName=self._table,
                KeyConditionExpression="pk = :pk",
                ExpressionAttributeValues={":pk": str_attr(_log_pk(endpoint_id))},
                ScanIndexForward=False,
                Limit=limit,
                ConsistentRead=True,
            )
        return [_record(endpoint_id, dict(item)) for item in page.get("Items", [])]

    def failed_since(self, endpoint_id: str, since: datetime) -> list[str]:
        out: dict[str, None] = {}
        with self._errors("read failed webhook deliveries"):
            for item in self._query(
                KeyConditionExpression="pk = :pk AND sk >= :since",
                FilterExpression="attribute_exists(er)",
                ExpressionAttributeValues={
                    ":pk": str_attr(_log_pk(endpoint_id)),
                    ":since": str_attr(time_key(utc(since))),
                },
                ConsistentRead=True,
            ):
                out.setdefault(item["ev"]["S"])
        return list(out)

    def prune_deliveries(self, before: datetime) -> int:
        pruned = 0
        with self._errors("prune webhook deliveries"):
            for endpoint in self.list_endpoints():
                pruned += self._delete_log(endpoint.id, time_key(utc(before)))
        return pruned

    def log_dead_letter(self, task_id: str, error: str, *, at: datetime) -> bool:
        at = utc(at)

        def build() -> tuple[list[dict[str, Any]], list[PendingEntry]] | None:
            item = self._get(f"T#{task_id}", "#", projection="gc, st")
            if item is None:
                return None
            # The state as read (a race moves only the entry's from_state, never its task).
            state = item["st"]["S"]
            entry = (item["gc"]["S"], task_id, state, DEAD_LETTER, at, error[:500])
            return [], [entry]

        with self._errors("log a dead letter"):
            return self._with_log(build)

    def event_tasks(self, task_ids: Collection[str]) -> dict[str, EventTask]:
        """BatchGetItem of the task items, as ``get_tasks`` reads them."""
        keys = [(f"T#{i}", "#") for i in dict.fromkeys(task_ids)]  # no duplicate keys: refused
        with self._errors("read the tasks of webhook events"):
            items = self._batch_get(keys)
        return {t.id: EventTask.of(t) for t in (task_from_item(item)[0] for item in items)}

    def _delete_log(self, endpoint_id: str, before: str | None) -> int:
        condition = "pk = :pk" if before is None else "pk = :pk AND sk < :before"
        values = {":pk": str_attr(_log_pk(endpoint_id))}
        if before is not None:
            values[":before"] = str_attr(before)
        keys = [
            {"DeleteRequest": {"Key": {"pk": item["pk"], "sk": item["sk"]}}}
            for item in self._query(
                KeyConditionExpression=condition,
                ExpressionAttributeValues=values,
                ProjectionExpression="pk, sk",
                ConsistentRead=True,
            )
        ]
        for start in range(0, len(keys), 25):
            self._batch_write(keys[start : start + 25])
        return len(keys)
