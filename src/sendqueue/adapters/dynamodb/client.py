"""The DynamoDB table as the task store uses it: the client, reads, batches, and
transactions that carry a change-log item (see :mod:`sendqueue.adapters.dynamodb.store`)."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Self

from botocore.exceptions import BotoCoreError, ClientError

from sendqueue.adapters.dynamodb.codec import (
    PendingEntry,
    log_end,
    log_item,
    str_attr,
)
from sendqueue.adapters.dynamodb.table import (
    ATTEMPTS,
    RETRYABLE,
    table_definition,
)
from sendqueue.adapters.dynamodb.url import parse_dynamodb_url
from sendqueue.domain.errors import (
    InvalidField,
    NotFound,
    StoreUnavailable,
)

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

__all__ = ["Retry", "TableClient", "error_code"]


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


class Retry(Exception):
    """A transaction lost a race (a condition failed) or was throttled: read again, retry.

    ``reasons`` are TransactWriteItems' cancellation reasons, one per item (empty otherwise).
    """

    def __init__(self, reasons: Sequence[Mapping[str, Any]] = ()) -> None:
        super().__init__("lost a race")
        self.reasons = list(reasons)


class TableClient:
    """The table's client and the store's plumbing; the first base of
    :class:`~sendqueue.adapters.dynamodb.store.DynamoDbTaskStore`."""

    def __init__(self, client: DynamoDBClient, table: str, *, create_table: bool = False) -> None:
        self._db = client
        self._table = table
        #: The id of the last log entry this handle wrote: a guess for the next log key that
        #: spares a read while no one else writes (a wrong guess fails the key's condition).
        self._log_end: int | None = None
        if create_table:
            self.create_table()

    @classmethod
    def from_url(cls, url: str) -> Self:
        """A store on ``dynamodb://TABLE?region=REGION&endpoint_url=URL`` (both optional).

        Builds the boto3 client (credentials from boto3's usual chain; standard retry mode, so
        throttling is retried with exponential backoff and jitter). The table must exist: on
        AWS the SAM template makes it. A malformed URL, or no region anywhere, raises
        InvalidField naming ``SENDQUEUE_DATABASE_URL``.
        """
        import boto3  # the aws extra: imported only when DynamoDB is configured
        from botocore.config import Config
        from botocore.exceptions import NoRegionError

        parsed = parse_dynamodb_url(url)
        config = Config(retries={"mode": "standard", "max_attempts": 8})
        try:
            client = boto3.client(
                "dynamodb",
                region_name=parsed.region,
                endpoint_url=parsed.endpoint_url,
                config=config,
            )
        except NoRegionError as exc:
            raise InvalidField(
                "SENDQUEUE_DATABASE_URL",
                url,
                "no AWS region: add ?region=REGION or set AWS_REGION",
            ) from exc
        return cls(client, parsed.table)

    def create_table(self) -> None:
        """Create the table and wait until it is active (tests and local runs; on AWS the
        template makes it), then turn point-in-time recovery on where the endpoint offers it."""
        with self._errors("create the table"):
            try:
                self._db.create_table(**table_definition(self._table))
            except ClientError as exc:
                if error_code(exc) != "ResourceInUseException":
                    raise
            self._db.get_waiter("table_exists").wait(
                TableName=self._table, WaiterConfig={"Delay": 1, "MaxAttempts": 60}
            )
            try:
                self._db.update_continuous_backups(
                    TableName=self._table,
                    PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": True},
                )
            except ClientError as exc:
                # DynamoDB Local has no backups; the table works without them there.
                if error_code(exc) != "UnknownOperationException":
                    raise

    # -- plumbing ----------------------------------------------------------------------------
    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        try:
            yield
        except (ClientError, BotoCoreError) as exc:
            raise StoreUnavailable(f"DynamoDB failed to {action}: {exc}") from exc

    def _get(self, pk: str, sk: str, projection: str | None = None) -> dict[str, Any] | None:
        args: dict[str, Any] = {
            "TableName": self._table,
            "Key": {"pk": str_attr(pk), "sk": str_attr(sk)},
            "ConsistentRead": True,
        }
        if projection is not None:
            args["ProjectionExpression"] = projection
        item = self._db.get_item(**args).get("Item")
        return None if item is None else dict(item)

    def _query(self, **args: Any) -> Iterator[dict[str, Any]]:
        args["TableName"] = self._table
        while True:
            page = self._db.query(**args)
            for item in page.get("Items", []):
                yield dict(item)
            last = page.get("LastEvaluatedKey")
            if not last:
                return
            args["ExclusiveStartKey"] = last

    def _count(self, **args: Any) -> int:
        args["TableName"] = self._table
        args["Select"] = "COUNT"
        total = 0
        while True:
            page = self._db.query(**args)
            total += int(page.get("Count", 0))
            last = page.get("LastEvaluatedKey")
            if not last:
                return total
            args["ExclusiveStartKey"] = last

    def _last_log(self) -> dict[str, Any] | None:
        """The newest change-log item, read consistently."""
        page = self._db.query(
            TableName=self._table,
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": str_attr("log")},
            ProjectionExpression="sk, n",
            ScanIndexForward=False,
            Limit=1,
            ConsistentRead=True,
        )
        items = page.get("Items", [])
        return dict(items[0]) if items else None

    def _last_id(self) -> int:
        last = self._last_log()
        return 0 if last is None else log_end(last)

    def _transact(self, items: Sequence[dict[str, Any]]) -> None:
        """Write ``items`` atomically; a failed condition, a conflict or throttling raise Retry.

        One conditional Put goes alone (PutItem: half the cost of a transaction). More go in
        one TransactWriteItems, whose request token makes botocore's own retry of a request
        whose answer was lost idempotent: DynamoDB does not apply it twice.
        """
        try:
            if len(items) == 1 and "Put" in items[0]:
                self._db.put_item(**items[0]["Put"])
            else:
                self._db.transact_write_items(
                    TransactItems=list(items),  # type: ignore[arg-type]
                    ClientRequestToken=uuid.uuid4().hex,
                )
        except ClientError as exc:
            code = error_code(exc)
            if code in ("ConditionalCheckFailedException", "TransactionConflictException"):
                raise Retry from exc
            if code == "TransactionCanceledException":
                reasons = exc.response.get("CancellationReasons") or []
                if all(str(r.get("Code", "None")) in RETRYABLE for r in reasons):
                    raise Retry(reasons) from exc
            raise

    @staticmethod
    def _backoff(attempt: int) -> None:
        # Full jitter from 10 ms (about a winner's round trip), capped low so that a writer
        # that lost many times is not starved by fresh ones.
        time.sleep(random.uniform(0, min(0.1, 0.01 * 2 ** min(attempt, 10))))

    def _commit(self, items: Sequence[dict[str, Any]]) -> list[int]:
        """Write ``items`` in one TransactWriteItems: [] once committed, else the indexes of
        the items whose conditions failed (nothing was written). Conflicts with other
        transactions and throttling are retried with jitter."""
        for attempt in range(ATTEMPTS):
            try:
                self._db.transact_write_items(
                    TransactItems=list(items),  # type: ignore[arg-type]
                    ClientRequestToken=uuid.uuid4().hex,
                )
                return []
            except ClientError as exc:
                code = error_code(exc)
                if code == "TransactionCanceledException":
                    reasons = exc.response.get("CancellationReasons") or []
                    codes = [str(r.get("Code", "None")) for r in reasons]
                    failed = [i for i, c in enumerate(codes) if c == "ConditionalCheckFailed"]
                    if failed:
                        return failed
                    if not all(c in RETRYABLE for c in codes):
                        raise
                elif code not in ("TransactionConflictException", "TransactionInProgressException"):
                    raise
            self._backoff(attempt)
        raise StoreUnavailable("DynamoDB: a transaction kept conflicting with others")

    def _with_log(
        self,
        build: Callable[[], tuple[list[dict[str, Any]], list[PendingEntry]] | None],
    ) -> bool:
        """Run ``build`` and commit its writes with one log item holding its entries.

        ``build`` reads what it needs and returns (writes, entries), or None when there is
        nothing to do. The log key is the entry after the last one this handle wrote (read
        from the log when it has not written, or lost a race). When only the log key's
        condition failed (another write took that key), the same writes are tried again under
        a key read afresh; when any other condition failed, ``build`` runs again and reads
        afresh. Returns whether a transaction committed.
        """
        built = None
        for attempt in range(ATTEMPTS):
            if built is None:
                built = build()
                if built is None:
                    return False
            writes, entries = built
            items = list(writes)
            first = 0
            if entries:
                if self._log_end is None:
                    self._log_end = self._last_id()
                first = self._log_end + 1
                items.append(
                    {
                        "Put": {
                            "TableName": self._table,
                            "Item": log_item(first, entries),
                            "ConditionExpression": "attribute_not_exists(pk)",
                        }
                    }
                )
            try:
                self._transact(items)
            except Retry as lost:
                self._log_end = None
                codes = [str(r.get("Code", "None")) for r in lost.reasons]
                log_only = entries and codes and codes[-1] == "ConditionalCheckFailed"
                if not (log_only and all(code == "None" for code in codes[:-1])):
                    built = None  # a write's own condition failed: read again
                self._backoff(attempt)
                continue
            if entries:
                self._log_end = first + len(entries) - 1
            return True
        raise StoreUnavailable("DynamoDB: a write kept losing races on the change log")

    def _require_campaign(self, campaign_id: str) -> dict[str, Any]:
        item = self._get("campaign", campaign_id)
        if item is None:
            raise NotFound("campaign", campaign_id)
        return item

    def _batch_write(self, requests: list[dict[str, Any]]) -> None:
        pending: Any = {self._table: requests}
        for attempt in range(ATTEMPTS):
            left = self._db.batch_write_item(RequestItems=pending)
            pending = left.get("UnprocessedItems") or {}
            if not pending:
                return
            self._backoff(attempt)
        raise StoreUnavailable("DynamoDB kept leaving batch writes unprocessed")

    def _batch_get(
        self, keys: Sequence[tuple[str, str]], projection: str | None = None
    ) -> list[dict[str, Any]]:
        """The items of ``keys`` that exist, in the order of ``keys``, read consistently."""
        found: dict[tuple[str, str], dict[str, Any]] = {}
        for start in range(0, len(keys), 100):
            request: Any = {
                "Keys": [
                    {"pk": str_attr(pk), "sk": str_attr(sk)} for pk, sk in keys[start : start + 100]
                ],
                "ConsistentRead": True,
            }
            if projection is not None:
                request["ProjectionExpression"] = projection
            for attempt in range(ATTEMPTS):
                got = self._db.batch_get_item(RequestItems={self._table: request})
                for item in got.get("Responses", {}).get(self._table, []):
                    found[(str(item["pk"]["S"]), str(item["sk"]["S"]))] = dict(item)
                rest = got.get("UnprocessedKeys", {}).get(self._table)
                if not rest:
                    break
                request = {**request, "Keys": rest["Keys"]}
                self._backoff(attempt)
            else:
                raise StoreUnavailable("DynamoDB kept leaving batch reads unprocessed")
        return [found[key] for key in keys if key in found]
