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
- A relayed dead letter is the marker item (``DL#<letter id>``, ``#``), put only if absent in
  the same TransactWriteItems as the log item holding its ``dead_letter`` entry: up to 49
  letters per transaction. Each group's markers are read first (one BatchGetItem), so letters
  relayed before cost a read and no write; a marker that appears meanwhile (another relay won)
  fails the transaction's condition, and the group is read again and written without it.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
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
    RelayedLetter,
    WebhookEndpoint,
    checked_endpoint_changes,
    delivery_cursor,
    delivery_cursor_key,
)

__all__ = ["WebhookItems"]

_PK = "webhook"
#: Letters per relay transaction: their markers and one log item (DynamoDB takes 100 items).
_RELAY_GROUP = 49
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
#: The delivery log's cursors name sort keys: the attempt's time_key, ``#``, process, sequence.
_CURSOR_KIND = "dynamodb"
_SORT_KEY = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}#[0-9a-f]{6}\d{12,}")


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


def _marker_pk(letter_id: str) -> str:
    return f"DL#{letter_id}"


@dataclass
class _Group:
    """One relay transaction's letters, and which of them it logged."""

    letters: list[RelayedLetter]
    logged: list[str]


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
        cursor=delivery_cursor(_CURSOR_KIND, endpoint_id, item["sk"]["S"]),
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

    def deliveries(
        self, endpoint_id: str, *, limit: int = 100, before: str | None = None
    ) -> list[DeliveryRecord]:
        check_limit(limit)
        condition = "pk = :pk"
        values = {":pk": str_attr(_log_pk(endpoint_id))}
        if before is not None:
            key = delivery_cursor_key(
                before, store=_CURSOR_KIND, endpoint_id=endpoint_id, key=_SORT_KEY
            )
            condition += " AND sk < :before"
            values[":before"] = str_attr(key)
        if limit == 0:
            return []
        with self._errors("read webhook deliveries"):
            # pages of ``limit`` until it is reached (a page stops at 1 MB)
            items = self._query(
                KeyConditionExpression=condition,
                ExpressionAttributeValues=values,
                ScanIndexForward=False,
                Limit=limit,
                ConsistentRead=True,
            )
            return [_record(endpoint_id, item) for item in itertools.islice(items, limit)]

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

    def relay_dead_letters(self, letters: Sequence[RelayedLetter]) -> list[str]:
        given: dict[str, RelayedLetter] = {}
        for letter in letters:
            given.setdefault(letter.letter_id, letter)
        logged: set[str] = set()
        todo = list(given.values())
        with self._errors("relay dead letters"):
            for start in range(0, len(todo), _RELAY_GROUP):
                group = _Group(todo[start : start + _RELAY_GROUP], [])
                self._with_log(partial(self._relay_group, group))
                logged.update(group.logged)
        return [letter_id for letter_id in given if letter_id in logged]

    def _unrelayed(self, letters: list[RelayedLetter]) -> list[RelayedLetter]:
        """The letters that have no marker yet (consistent batch reads)."""
        keys = [(_marker_pk(r.letter_id), "#") for r in letters]
        known = {item["pk"]["S"] for item in self._batch_get(keys, projection="pk, sk")}
        return [r for r in letters if _marker_pk(r.letter_id) not in known]

    def _relay_group(self, group: _Group) -> tuple[list[dict[str, Any]], list[PendingEntry]] | None:
        """``_with_log``'s build: the markers of the group's letters still unrelayed, and the
        entries of those whose task exists (its state as read now)."""
        letters = self._unrelayed(group.letters)
        group.logged = []
        if not letters:
            return None
        task_keys = sorted({(f"T#{r.task_id}", "#") for r in letters})
        found = self._batch_get(task_keys, projection="pk, sk, gc, st")
        tasks = {item["pk"]["S"].removeprefix("T#"): item for item in found}
        writes: list[dict[str, Any]] = []
        entries: list[PendingEntry] = []
        for r in letters:
            marker = {
                "pk": str_attr(_marker_pk(r.letter_id)),
                "sk": str_attr("#"),
                "task": str_attr(r.task_id),
                "at": str_attr(time_key(r.at)),
            }
            writes.append(
                {
                    "Put": {
                        "TableName": self._table,
                        "Item": marker,
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                }
            )
            task = tasks.get(r.task_id)
            if task is not None:
                state = task["st"]["S"]
                entries.append((task["gc"]["S"], r.task_id, state, DEAD_LETTER, r.at, r.error))
                group.logged.append(r.letter_id)
        return writes, entries

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
