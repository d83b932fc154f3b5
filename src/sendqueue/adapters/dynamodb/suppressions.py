"""The suppression list in the DynamoDB table (:class:`SuppressionItems`, a base of
:class:`~sendqueue.adapters.dynamodb.store.DynamoDbTaskStore`).

One item per address: ``pk`` ``suppression``, ``sk`` the address in its compared form, ``rs``
its reason, ``task`` the task it came from (when known), ``at`` when. One partition, paged by
its range key (address order), like leases and counters. Insert-or-keep is a conditional put
per new address (``attribute_not_exists``): of two concurrent writers exactly one counts it.
Lookups are BatchGetItem, 100 keys a request, unprocessed keys retried
(:meth:`~sendqueue.adapters.dynamodb.client.TableClient._batch_get`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from botocore.exceptions import ClientError

from sendqueue.adapters.dynamodb.client import TableClient, error_code
from sendqueue.adapters.dynamodb.codec import parse_time, str_attr, time_key
from sendqueue.adapters.dynamodb.table import WRITERS
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import check_limit
from sendqueue.domain.suppression import (
    SUPPRESSED_PREFIX,
    Suppression,
    SuppressionReason,
    first_entries,
)
from sendqueue.ports import ReadsTaskThenSuppression

__all__ = ["SuppressionItems"]

_PK = "suppression"


def _item(entry: Suppression) -> dict[str, Any]:
    item = {
        "pk": str_attr(_PK),
        "sk": str_attr(entry.email),
        "rs": str_attr(entry.reason.value),
        "at": str_attr(time_key(entry.at)),
    }
    if entry.task_id is not None:
        item["task"] = str_attr(entry.task_id)
    return item


def _entry(item: Mapping[str, Any]) -> Suppression:
    task = item.get("task")
    return Suppression(
        email=str(item["sk"]["S"]),
        reason=SuppressionReason(item["rs"]["S"]),
        task_id=None if task is None else str(task["S"]),
        at=parse_time(item["at"]["S"]),
    )


class SuppressionItems(ReadsTaskThenSuppression, TableClient):
    """:class:`~sendqueue.ports.SuppressionList` in the store's table."""

    def suppress(self, entries: Sequence[Suppression]) -> int:
        first = first_entries(entries)
        if not first:
            return 0
        with self._errors("suppress addresses"):
            # Skip the puts of addresses already listed (an import run again, say).
            listed = self.suppressed(first)
            new = [e for email, e in first.items() if email not in listed]
            if len(new) == 1:
                return int(self._put_new(new[0]))
            with ThreadPoolExecutor(WRITERS) as pool:
                return sum(pool.map(self._put_new, new))

    def _put_new(self, entry: Suppression) -> bool:
        try:
            self._db.put_item(
                TableName=self._table,
                Item=_item(entry),
                ConditionExpression="attribute_not_exists(pk)",
            )
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                return False  # listed meanwhile: the first entry stays
            raise
        return True

    def unsuppress(self, email: str) -> bool:
        with self._errors("unsuppress an address"):
            old = self._db.delete_item(
                TableName=self._table,
                Key={"pk": str_attr(_PK), "sk": str_attr(email)},
                ReturnValues="ALL_OLD",
            )
        return bool(old.get("Attributes"))

    def suppressed(self, emails: Iterable[str]) -> dict[str, Suppression]:
        keys = [(_PK, email) for email in sorted(set(emails))]
        with self._errors("look up suppressed addresses"):
            return {(e := _entry(i)).email: e for i in self._batch_get(keys)}

    def list_suppressions(self, *, after: str | None = None, limit: int = 100) -> list[Suppression]:
        check_limit(limit)
        if limit == 0:
            return []
        condition = "pk = :pk" if after is None else "pk = :pk AND sk > :after"
        values = {":pk": str_attr(_PK)}
        if after is not None:
            values[":after"] = str_attr(after)
        out: list[Suppression] = []
        with self._errors("list suppressed addresses"):
            for item in self._query(
                KeyConditionExpression=condition,
                ExpressionAttributeValues=values,
                ConsistentRead=True,
                Limit=min(limit, 1000),
            ):
                out.append(_entry(item))
                if len(out) >= limit:
                    break
        return out

    def count_suppressions(self) -> int:
        with self._errors("count suppressed addresses"):
            return self._count(
                KeyConditionExpression="pk = :pk",
                ExpressionAttributeValues={":pk": str_attr(_PK)},
                ConsistentRead=True,
            )

    def count_suppressed_tasks(self, campaign_id: str) -> int:
        """The campaign's Cancelled part of the ``by_state`` index, filtered on ``rs``."""
        with self._errors("count suppressed tasks"):
            return self._count(
                IndexName="by_state",
                KeyConditionExpression="gs = :gs",
                FilterExpression="begins_with(rs, :p)",
                ExpressionAttributeValues={
                    ":gs": str_attr(f"{campaign_id}#{TaskState.CANCELLED.value}"),
                    ":p": str_attr(SUPPRESSED_PREFIX),
                },
            )
