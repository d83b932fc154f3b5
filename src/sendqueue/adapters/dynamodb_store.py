"""The TaskStore on DynamoDB (boto3): one on-demand table, conditional writes, transactions.

The table (``table_definition`` gives its ``CreateTable`` arguments; the SAM template declares
the same, with point-in-time recovery on). Billing is on demand (``PAY_PER_REQUEST``). Every
item has the string key ``pk`` (hash) and ``sk`` (range); these names, the index names and their
key attributes are the contract with the template and must stay stable:

==================  ===========  ==============================================================
``pk``              ``sk``       item
==================  ===========  ==============================================================
``campaign``        id           a campaign: ``st`` its state, ``rk`` its recipient key, ``d``
                                 the campaign as JSON
``R#<id>#<rk>``     position     a recipient (position zero-padded to 10 digits)
``T#<task id>``     ``#``        a task: ``v`` its version, ``st`` its state, ``d`` the task as
                                 JSON, ``ca`` its claim time, and the index keys below
``P#<campaign>``    position     the marker that makes a campaign's position taken once
``log``             first id     change-log entries ``first..first+n-1`` (``n``; ``d`` JSON;
                                 ``cs`` the set of their campaigns); ids are zero-padded to 20
``lease``           name         a lease: ``owner``, ``exp``
==================  ===========  ==============================================================

Global secondary indexes (projection ALL), all on task items:

- ``by_campaign``: hash ``gc`` (campaign id, S), range ``gp`` (position, N): a campaign's tasks
  in position order (``list_tasks``).
- ``by_state``: hash ``gs`` (``<campaign>#<state>``, S), range ``gt`` (``<send_at>#<task id>``,
  S): a campaign's tasks in one state by send time (``transition_all``, ``count_tasks``,
  ``has_unfinished_tasks``).
- ``due``: hash ``gd`` (state, S), range ``gt``: due and stale tasks across campaigns.

Every write that changes a state is conditional: a task is written only while it still has the
state ``st`` and version ``v`` it was read with, a campaign only while its document is the one
read. The change log needs ids that are strictly increasing and become visible in order with no
gaps, which DynamoDB has no sequence for. So one ``TransactWriteItems`` makes the change (under
its own condition) and puts one log item holding all of the change's entries, keyed by the id
after the last entry, with ``attribute_not_exists``: two writers that read the same end of the
log cannot both commit; the loser reads the end again and retries (with the same writes when only
the log key was taken), with jitter. Log items are therefore contiguous: each starts where the
one before it ends, and no key ever falls inside another item's range. The log partition
serialises logged writes; that is the price of a tailing reader that never misses an entry. A
log item holds up to 99 entries (an insert of 49 tasks, a cancel of 99), so a bulk write costs
one log item per transaction, not one per task. ``changes_after`` is one consistent query, and
returns only a gap-free run of items: a query reads items one by one, and an item that became
visible before an earlier one is left for the next call, so a reader never steps past an id.

``create_campaign`` writes the recipients first (batch writes, under a fresh recipient key
``rk``) and the campaign item last, conditionally: the campaign item is the commit point.
Recipients without it, or under another key (a crashed or concurrent attempt), are never read,
because every read of recipients starts at the campaign item.

Consistency: the table itself is read consistently (``get_task``, every transition, the log, the
campaign). Global secondary indexes are eventually consistent on AWS, so pages of tasks, counts,
``due_tasks``, ``stale_running``, ``has_unfinished_tasks`` and the set of tasks ``transition_all``
considers may lag a write by a moment (typically well under a second). Each task they return is
re-read or re-checked under its condition before it is changed, so the lag can delay work, leave
a just-inserted task out of a cancel, or show a stale count, but never apply a transition twice
or to a task in another state. (moto's indexes are immediate, so the contract tests cannot show
the lag.)

Errors: botocore's ``ClientError`` and ``BotoCoreError`` become ``StoreUnavailable``; a failed
condition becomes the contract's answer (None, False or ``Conflict``). Throttling is retried by
botocore (the client ``from_url`` builds uses the standard retry mode, exponential backoff with
jitter); a transaction cancelled for throttling or a conflict is retried here with jitter.
"""

from __future__ import annotations

import builtins
import json
import random
import secrets
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from sendqueue.domain.errors import (
    Conflict,
    IllegalTransition,
    InvalidField,
    NotFound,
    StoreUnavailable,
)
from sendqueue.domain.lifecycle import (
    CampaignState,
    TaskState,
    check_campaign_transition,
    check_task_transition,
)
from sendqueue.domain.models import (
    Campaign,
    ChangeLogEntry,
    Recipient,
    Task,
    TaskChanges,
    check_cursor,
    check_limit,
    checked_changes,
    utc,
)
from sendqueue.domain.policy import SendingPolicy

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

__all__ = ["GSI_NAMES", "DynamoDbTaskStore", "table_definition"]

#: The global secondary indexes, by name: (hash key, range key). Stable: the template uses them.
GSI_NAMES: dict[str, tuple[str, str]] = {
    "by_campaign": ("gc", "gp"),
    "by_state": ("gs", "gt"),
    "due": ("gd", "gt"),
}
_KEY_TYPES = {"pk": "S", "sk": "S", "gc": "S", "gp": "N", "gs": "S", "gt": "S", "gd": "S"}

#: Items per TransactWriteItems (DynamoDB's limit is 100) and entries per log item.
_TXN_ITEMS = 100
_LOG_MAX = _TXN_ITEMS - 1
#: Bytes per TransactWriteItems (DynamoDB's limit is 4 MB) and per item (400 KB), with room.
_TXN_BYTES = 3_500_000
_ITEM_BYTES = 380_000
#: Transaction cancellation reasons that a retry (after reading again) resolves.
_RETRYABLE = frozenset(
    {
        "None",
        "ConditionalCheckFailed",
        "TransactionConflict",
        "ThrottlingError",
        "ProvisionedThroughputExceeded",
        "RequestLimitExceeded",
    }
)
_ATTEMPTS = 200
#: Threads writing recipient batches in parallel (boto3 clients are thread-safe).
_WRITERS = 4


def table_definition(name: str) -> dict[str, Any]:
    """``CreateTable`` arguments for the store's table (the SAM template declares the same).

    On-demand billing; point-in-time recovery is a table setting the template turns on (and
    ``create_table`` too, where the endpoint supports it).
    """
    return {
        "TableName": name,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [
            {"AttributeName": k, "AttributeType": t} for k, t in _KEY_TYPES.items()
        ],
        "KeySchema": [
            {"AttributeName": "pk", "KeyType": "HASH"},
            {"AttributeName": "sk", "KeyType": "RANGE"},
        ],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": index,
                "KeySchema": [
                    {"AttributeName": hash_key, "KeyType": "HASH"},
                    {"AttributeName": range_key, "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            }
            for index, (hash_key, range_key) in GSI_NAMES.items()
        ],
    }


# --- encoding -----------------------------------------------------------------------------------


def _t(value: datetime) -> str:
    """A UTC instant as a string that sorts like the instant."""
    return utc(value).strftime("%Y-%m-%dT%H:%M:%S.%f")


def _from_t(value: str) -> datetime:
    return datetime.fromisoformat(value).replace(tzinfo=UTC)


def _opt_t(value: str | None) -> datetime | None:
    return None if value is None else _from_t(value)


def _s(value: str) -> dict[str, str]:
    return {"S": value}


def _n(value: int) -> dict[str, str]:
    return {"N": str(value)}


def _dumps(value: object) -> str:
    # Not ASCII-escaped: the item size DynamoDB counts is the UTF-8 size.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _size(item: Mapping[str, Any]) -> int:
    """An item's size as DynamoDB counts it (names plus UTF-8 values), near enough."""
    total = 0
    for name, value in item.items():
        total += len(name)
        for kind, raw in value.items():
            if kind == "SS":
                total += sum(len(v.encode()) for v in raw)
            else:
                total += len(str(raw).encode())
    return total


def _json_copy(field: str, value: Any) -> Any:
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise InvalidField(field, value, f"must be JSON-serialisable: {exc}") from exc


def _pos(position: int) -> str:
    return f"{position:010d}"


def _log_key(first: int) -> str:
    return f"{first:020d}"


def _task_doc(task: Task) -> dict[str, Any]:
    return {
        "id": task.id,
        "campaign_id": task.campaign_id,
        "position": task.position,
        "email": task.email,
        "name": task.name,
        "subject": task.subject,
        "text": task.text,
        "html": task.html,
        "send_at": _t(task.send_at),
        "token": task.token,
        "state": task.state.value,
        "attempts": task.attempts,
        "claimed_at": None if task.claimed_at is None else _t(task.claimed_at),
        "sent_at": None if task.sent_at is None else _t(task.sent_at),
        "message_id": task.message_id,
        "error": task.error,
        "created_at": _t(task.created_at),
        "updated_at": _t(task.updated_at),
    }


def _task_item(task: Task, version: int) -> dict[str, Any]:
    item: dict[str, Any] = {
        "pk": _s(f"T#{task.id}"),
        "sk": _s("#"),
        "v": _n(version),
        "st": _s(task.state.value),
        "gc": _s(task.campaign_id),
        "gp": _n(task.position),
        "gs": _s(f"{task.campaign_id}#{task.state.value}"),
        "gd": _s(task.state.value),
        "gt": _s(f"{_t(task.send_at)}#{task.id}"),
        "d": _s(_dumps(_task_doc(task))),
    }
    if task.claimed_at is not None:
        item["ca"] = _s(_t(task.claimed_at))
    return item


def _task(item: Mapping[str, Any]) -> tuple[Task, int]:
    doc = json.loads(item["d"]["S"])
    task = Task(
        id=doc["id"],
        campaign_id=doc["campaign_id"],
        position=doc["position"],
        email=doc["email"],
        name=doc["name"],
        subject=doc["subject"],
        text=doc["text"],
        html=doc["html"],
        send_at=_from_t(doc["send_at"]),
        token=doc["token"],
        state=TaskState(doc["state"]),
        attempts=doc["attempts"],
        claimed_at=_opt_t(doc["claimed_at"]),
        sent_at=_opt_t(doc["sent_at"]),
        message_id=doc["message_id"],
        error=doc["error"],
        created_at=_from_t(doc["created_at"]),
        updated_at=_from_t(doc["updated_at"]),
    )
    return task, int(item["v"]["N"])


def _campaign_item(campaign: Campaign, recipient_key: str) -> dict[str, Any]:
    doc = {
        "id": campaign.id,
        "name": campaign.name,
        "policy": campaign.policy.to_dict(),
        "from_addr": campaign.from_addr,
        "reply_to": campaign.reply_to,
        "state": campaign.state.value,
        "state_reason": campaign.state_reason,
        "recipient_count": campaign.recipient_count,
        "checkpoint": None if campaign.checkpoint is None else dict(campaign.checkpoint),
        "created_at": _t(campaign.created_at),
        "updated_at": _t(campaign.updated_at),
    }
    return {
        "pk": _s("campaign"),
        "sk": _s(campaign.id),
        "st": _s(campaign.state.value),
        "rk": _s(recipient_key),
        "d": _s(_dumps(doc)),
    }


def _campaign(item: Mapping[str, Any]) -> Campaign:
    doc = json.loads(item["d"]["S"])
    return Campaign(
        id=doc["id"],
        name=doc["name"],
        policy=SendingPolicy.from_dict(doc["policy"]),
        from_addr=doc["from_addr"],
        state=CampaignState(doc["state"]),
        reply_to=doc["reply_to"],
        recipient_count=doc["recipient_count"],
        state_reason=doc["state_reason"],
        checkpoint=doc["checkpoint"],
        created_at=_from_t(doc["created_at"]),
        updated_at=_from_t(doc["updated_at"]),
    )


def _recipient_item(campaign_id: str, key: str, r: Recipient) -> dict[str, Any]:
    doc = {
        "position": r.position,
        "email": r.email,
        "name": r.name,
        "subject": r.subject,
        "text": r.text,
        "html": r.html,
        "variables": dict(r.variables),
    }
    return {"pk": _s(f"R#{campaign_id}#{key}"), "sk": _s(_pos(r.position)), "d": _s(_dumps(doc))}


#: A change-log entry still to be numbered: (campaign, task, from, to, at, note).
_Pending = tuple[str, str | None, str | None, str, datetime, str | None]


def _entry_size(entry: _Pending) -> int:
    cid, tid, _src, _dst, _at, note = entry
    return 80 + len(cid.encode()) + len((tid or "").encode()) + len((note or "").encode())


def _log_item(first: int, entries: Sequence[_Pending]) -> dict[str, Any]:
    rows = [[cid, tid, src, dst, _t(at), note] for cid, tid, src, dst, at, note in entries]
    return {
        "pk": _s("log"),
        "sk": _s(_log_key(first)),
        "n": _n(len(entries)),
        "cs": {"SS": sorted({e[0] for e in entries})},
        "d": _s(_dumps(rows)),
    }


def _log_entries(item: Mapping[str, Any]) -> Iterator[ChangeLogEntry]:
    first = int(item["sk"]["S"])
    for offset, (cid, tid, src, dst, at, note) in enumerate(json.loads(item["d"]["S"])):
        yield ChangeLogEntry(first + offset, cid, tid, src, dst, _from_t(at), note)


def _log_end(item: Mapping[str, Any]) -> int:
    """The id of the last entry in a log item."""
    return int(item["sk"]["S"]) + int(item["n"]["N"]) - 1


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


class _Retry(Exception):
    """A transaction lost a race (a condition failed) or was throttled: read again, retry.

    ``reasons`` are TransactWriteItems' cancellation reasons, one per item (empty otherwise).
    """

    def __init__(self, reasons: Sequence[Mapping[str, Any]] = ()) -> None:
        super().__init__("lost a race")
        self.reasons = list(reasons)


class DynamoDbTaskStore:
    """:class:`~sendqueue.ports.TaskStore` on DynamoDB; see the module docstring."""

    def __init__(self, client: DynamoDBClient, table: str, *, create_table: bool = False) -> None:
        self._db = client
        self._table = table
        #: The id of the last log entry this handle wrote: a guess for the next log key that
        #: spares a read while no one else writes (a wrong guess fails the key's condition).
        self._log_end: int | None = None
        if create_table:
            self.create_table()

    @classmethod
    def from_url(cls, url: str) -> DynamoDbTaskStore:
        """A store on ``dynamodb://TABLE?region=REGION&endpoint_url=URL`` (both optional).

        Builds the boto3 client (credentials from boto3's usual chain; standard retry mode, so
        throttling is retried with exponential backoff and jitter). The table must exist: on
        AWS the SAM template makes it. A malformed URL, or no region anywhere, raises
        InvalidField naming ``SENDQUEUE_DATABASE_URL``.
        """
        import boto3  # the aws extra: imported only when DynamoDB is configured
        from botocore.config import Config
        from botocore.exceptions import NoRegionError

        from sendqueue.settings import parse_dynamodb_url

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
                if _code(exc) != "ResourceInUseException":
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
                if _code(exc) != "UnknownOperationException":
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
            "Key": {"pk": _s(pk), "sk": _s(sk)},
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
            ExpressionAttributeValues={":pk": _s("log")},
            ProjectionExpression="sk, n",
            ScanIndexForward=False,
            Limit=1,
            ConsistentRead=True,
        )
        items = page.get("Items", [])
        return dict(items[0]) if items else None

    def _last_id(self) -> int:
        last = self._last_log()
        return 0 if last is None else _log_end(last)

    def _transact(self, items: Sequence[dict[str, Any]]) -> None:
        """Write ``items`` atomically; a failed condition, a conflict or throttling raise _Retry.

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
            code = _code(exc)
            if code in ("ConditionalCheckFailedException", "TransactionConflictException"):
                raise _Retry from exc
            if code == "TransactionCanceledException":
                reasons = exc.response.get("CancellationReasons") or []
                if all(str(r.get("Code", "None")) in _RETRYABLE for r in reasons):
                    raise _Retry(reasons) from exc
            raise

    @staticmethod
    def _backoff(attempt: int) -> None:
        # Full jitter from 10 ms (about a winner's round trip), capped low so that a writer
        # that lost many times is not starved by fresh ones.
        time.sleep(random.uniform(0, min(0.1, 0.01 * 2 ** min(attempt, 10))))

    def _with_log(
        self,
        build: Callable[[], tuple[list[dict[str, Any]], list[_Pending]] | None],
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
        for attempt in range(_ATTEMPTS):
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
                            "Item": _log_item(first, entries),
                            "ConditionExpression": "attribute_not_exists(pk)",
                        }
                    }
                )
            try:
                self._transact(items)
            except _Retry as lost:
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
        for attempt in range(_ATTEMPTS):
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
                "Keys": [{"pk": _s(pk), "sk": _s(sk)} for pk, sk in keys[start : start + 100]],
                "ConsistentRead": True,
            }
            if projection is not None:
                request["ProjectionExpression"] = projection
            for attempt in range(_ATTEMPTS):
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

    # -- campaigns ---------------------------------------------------------------------------
    def create_campaign(self, campaign: Campaign, recipients: Sequence[Recipient]) -> None:
        """Store the campaign and its recipients; see the module docstring for atomicity."""
        checkpoint = (
            None if campaign.checkpoint is None else _json_copy("checkpoint", campaign.checkpoint)
        )
        seen: set[int] = set()
        for r in recipients:
            if r.position in seen:
                raise InvalidField("position", r.position, "each recipient needs its own position")
            seen.add(r.position)
        stored = replace(
            campaign,
            recipient_count=len(recipients),
            checkpoint=checkpoint,
            created_at=utc(campaign.created_at),
            updated_at=utc(campaign.updated_at),
        )
        key = secrets.token_hex(8)
        rows = [{"PutRequest": {"Item": _recipient_item(campaign.id, key, r)}} for r in recipients]
        for row in rows:
            if _size(row["PutRequest"]["Item"]) > _ITEM_BYTES:
                position = int(row["PutRequest"]["Item"]["sk"]["S"])
                raise InvalidField(
                    "recipient", position, "larger than a DynamoDB item can be (400 KB)"
                )
        with self._errors("create a campaign"):
            if self._get("campaign", campaign.id, "pk") is not None:
                raise Conflict(f"campaign {campaign.id!r} already exists")
            batches = [rows[start : start + 25] for start in range(0, len(rows), 25)]
            if len(batches) > 1:
                with ThreadPoolExecutor(_WRITERS) as pool:
                    for _ in pool.map(self._batch_write, batches):
                        pass
            elif batches:
                self._batch_write(batches[0])
            try:
                self._db.put_item(
                    TableName=self._table,
                    Item=_campaign_item(stored, key),
                    ConditionExpression="attribute_not_exists(pk)",
                )
            except ClientError as exc:
                if _code(exc) == "ConditionalCheckFailedException":
                    raise Conflict(f"campaign {campaign.id!r} already exists") from exc
                raise

    def get_campaign(self, campaign_id: str) -> Campaign:
        with self._errors("read a campaign"):
            return _campaign(self._require_campaign(campaign_id))

    def campaign_state(self, campaign_id: str) -> CampaignState:
        with self._errors("read a campaign's state"):
            item = self._get("campaign", campaign_id, "st")
        if item is None:
            raise NotFound("campaign", campaign_id)
        return CampaignState(item["st"]["S"])

    def list_campaigns(self) -> list[Campaign]:
        with self._errors("list campaigns"):
            items = list(
                self._query(
                    KeyConditionExpression="pk = :pk",
                    ExpressionAttributeValues={":pk": _s("campaign")},
                    ConsistentRead=True,
                )
            )
        campaigns = [_campaign(i) for i in items]
        return sorted(campaigns, key=lambda c: (c.created_at, c.id), reverse=True)

    def _campaign_write(
        self,
        campaign_id: str,
        change: Callable[[Campaign], tuple[Campaign, _Pending | None] | None],
    ) -> bool:
        def build() -> tuple[list[dict[str, Any]], list[_Pending]] | None:
            item = self._require_campaign(campaign_id)
            changed = change(_campaign(item))
            if changed is None:
                return None
            updated, entry = changed
            put = {
                "Put": {
                    "TableName": self._table,
                    "Item": _campaign_item(updated, item["rk"]["S"]),
                    "ConditionExpression": "d = :old",
                    "ExpressionAttributeValues": {":old": item["d"]},
                }
            }
            return [put], [] if entry is None else [entry]

        return self._with_log(build)

    def set_campaign_state(
        self,
        campaign_id: str,
        expected: Collection[CampaignState],
        new: CampaignState,
        *,
        at: datetime,
        reason: str | None = None,
    ) -> bool:
        for state in expected:
            check_campaign_transition(state, new)
        at = utc(at)

        def change(current: Campaign) -> tuple[Campaign, _Pending | None] | None:
            if current.state not in expected:
                return None
            updated = replace(current, state=new, state_reason=reason, updated_at=at)
            return updated, (campaign_id, None, current.state.value, new.value, at, reason)

        with self._errors("change a campaign's state"):
            return self._campaign_write(campaign_id, change)

    def save_checkpoint(
        self,
        campaign_id: str,
        checkpoint: Mapping[str, object] | None,
        *,
        at: datetime,
        note: str | None = None,
    ) -> None:
        at = utc(at)
        stored = None if checkpoint is None else _json_copy("checkpoint", checkpoint)
        entry: _Pending | None = (
            None if note is None else (campaign_id, None, None, "progress", at, note)
        )

        def change(current: Campaign) -> tuple[Campaign, _Pending | None]:
            return replace(current, checkpoint=stored, updated_at=at), entry

        with self._errors("save a checkpoint"):
            self._campaign_write(campaign_id, change)

    # -- recipients --------------------------------------------------------------------------
    def list_recipients(
        self, campaign_id: str, *, after: int = -1, limit: int = 1000
    ) -> list[Recipient]:
        check_limit(limit)
        check_cursor(after)
        with self._errors("list recipients"):
            key = self._require_campaign(campaign_id)["rk"]["S"]
            if limit == 0:
                return []
            out: list[Recipient] = []
            for item in self._query(
                KeyConditionExpression="pk = :pk AND sk > :after",
                ExpressionAttributeValues={
                    ":pk": _s(f"R#{campaign_id}#{key}"),
                    ":after": _s(_pos(after) if after >= 0 else "-"),
                },
                ConsistentRead=True,
                Limit=min(limit, 1000),
            ):
                out.append(Recipient(**json.loads(item["d"]["S"])))
                if len(out) >= limit:
                    break
        return out

    # -- tasks -------------------------------------------------------------------------------
    def insert_tasks(self, tasks: Sequence[Task], *, at: datetime) -> int:
        """Insert the tasks that do not exist yet, each with its ``None -> Pending`` entry.

        Written in transactions of up to 49 tasks (the task and its position marker, conditional
        on both being new, plus one log item), not all in one: a crash in between leaves a
        prefix inserted, which is what an idempotent retry expects.
        """
        at = utc(at)
        for task in tasks:
            if task.state is not TaskState.PENDING:
                raise IllegalTransition(
                    "task", "(new)", task.state.value, "tasks are created Pending"
                )
        prepared = [
            replace(
                t,
                send_at=utc(t.send_at),
                claimed_at=None if t.claimed_at is None else utc(t.claimed_at),
                sent_at=None if t.sent_at is None else utc(t.sent_at),
                created_at=at,
                updated_at=at,
            )
            for t in tasks
        ]
        items = [_task_item(t, 1) for t in prepared]
        for task, item in zip(prepared, items, strict=True):
            if _size(item) > _ITEM_BYTES:
                raise InvalidField("task", task.id, "larger than a DynamoDB item can be (400 KB)")
        chunks: list[list[tuple[Task, dict[str, Any]]]] = [[]]
        chunk_bytes = 0
        for task, item in zip(prepared, items, strict=True):
            size = _size(item) + 200
            if len(chunks[-1]) >= (_TXN_ITEMS - 1) // 2 or chunk_bytes + size > _TXN_BYTES:
                chunks.append([])
                chunk_bytes = 0
            chunks[-1].append((task, item))
            chunk_bytes += size
        inserted = 0
        with self._errors("insert tasks"):
            for campaign_id in sorted({t.campaign_id for t in tasks}):
                self._require_campaign(campaign_id)
            for chunk in chunks:
                if chunk:
                    inserted += self._insert_chunk(chunk)
        return inserted

    def _insert_chunk(self, chunk: Sequence[tuple[Task, dict[str, Any]]]) -> int:
        count = 0

        def build() -> tuple[list[dict[str, Any]], list[_Pending]] | None:
            nonlocal count
            keys = [(f"T#{t.id}", "#") for t, _ in chunk]
            keys += [(f"P#{t.campaign_id}", _pos(t.position)) for t, _ in chunk]
            existing = {
                (str(i["pk"]["S"]), str(i["sk"]["S"])) for i in self._batch_get(keys, "pk, sk")
            }
            writes: list[dict[str, Any]] = []
            entries: list[_Pending] = []
            taken: set[tuple[str, str]] = set()
            for t, item in chunk:
                marker = (f"P#{t.campaign_id}", _pos(t.position))
                if (f"T#{t.id}", "#") in existing or marker in existing or marker in taken:
                    continue
                if (f"T#{t.id}", "#") in taken:
                    continue
                taken.update({marker, (f"T#{t.id}", "#")})
                new = "attribute_not_exists(pk)"
                marker_item = {"pk": _s(marker[0]), "sk": _s(marker[1]), "task": _s(t.id)}
                for put in (item, marker_item):
                    writes.append(
                        {"Put": {"TableName": self._table, "Item": put, "ConditionExpression": new}}
                    )
                entries.append(
                    (t.campaign_id, t.id, None, TaskState.PENDING.value, t.created_at, None)
                )
            count = len(entries)
            return (writes, entries) if entries else None

        return count if self._with_log(build) else 0

    def get_task(self, task_id: str) -> Task | None:
        with self._errors("read a task"):
            item = self._get(f"T#{task_id}", "#")
        return None if item is None else _task(item)[0]

    def transition(
        self,
        task_id: str,
        expected: TaskState,
        new: TaskState,
        *,
        at: datetime,
        changes: TaskChanges | None = None,
        note: str | None = None,
    ) -> Task | None:
        check_task_transition(expected, new)
        at = utc(at)
        values = checked_changes(changes)
        result: list[Task] = []

        def build() -> tuple[list[dict[str, Any]], list[_Pending]] | None:
            result.clear()
            item = self._get(f"T#{task_id}", "#")
            if item is None:
                return None
            task, version = _task(item)
            if task.state is not expected:
                return None
            updated = replace(task, **values, state=new, updated_at=at)
            result.append(updated)
            return [self._task_put(updated, expected, version)], [
                (task.campaign_id, task_id, expected.value, new.value, at, note)
            ]

        with self._errors("change a task's state"):
            return result[0] if self._with_log(build) else None

    def _task_put(self, task: Task, expected: TaskState, version: int) -> dict[str, Any]:
        return {
            "Put": {
                "TableName": self._table,
                "Item": _task_item(task, version + 1),
                # The state is the transition's compare-and-set; the version also catches any
                # other write (a reschedule) between our read and this put.
                "ConditionExpression": "st = :st AND v = :v",
                "ExpressionAttributeValues": {":st": _s(expected.value), ":v": _n(version)},
            }
        }

    def transition_all(
        self,
        campaign_id: str,
        expected: TaskState,
        new: TaskState,
        *,
        at: datetime,
        note: str | None = None,
    ) -> int:
        """Move the campaign's tasks in ``expected`` (from the ``by_state`` index, in position
        order) in transactions of up to 99, each task re-read and conditional on its state."""
        check_task_transition(expected, new)
        at = utc(at)
        moved = 0
        with self._errors("change the state of a campaign's tasks"):
            self._require_campaign(campaign_id)
            found = [
                (int(item["gp"]["N"]), str(item["pk"]["S"]))
                for item in self._query(
                    IndexName="by_state",
                    KeyConditionExpression="gs = :gs",
                    ExpressionAttributeValues={":gs": _s(f"{campaign_id}#{expected.value}")},
                    ProjectionExpression="pk, gp",
                )
            ]
            keys = [pk for _, pk in sorted(found)]
            while keys:
                done, consumed = self._move_chunk(keys[:_LOG_MAX], expected, new, at, note)
                moved += done
                keys = keys[consumed:]
        return moved

    def _move_chunk(
        self,
        keys: Sequence[str],
        expected: TaskState,
        new: TaskState,
        at: datetime,
        note: str | None,
    ) -> tuple[int, int]:
        """Move a prefix of ``keys`` that fits one transaction; (moved, keys consumed)."""
        count = consumed = 0

        def build() -> tuple[list[dict[str, Any]], list[_Pending]] | None:
            nonlocal count, consumed
            writes: list[dict[str, Any]] = []
            entries: list[_Pending] = []
            total = log_bytes = 0
            items = {i["pk"]["S"]: i for i in self._batch_get([(k, "#") for k in keys])}
            consumed = 0
            for key in keys:
                item = items.get(key)
                if item is not None:
                    task, version = _task(item)
                    if task.state is expected:
                        entry = (task.campaign_id, task.id, expected.value, new.value, at, note)
                        put = self._task_put(
                            replace(task, state=new, updated_at=at), expected, version
                        )
                        size = _size(put["Put"]["Item"]) + 100
                        log_bytes += _entry_size(entry)
                        if writes and (
                            total + size + log_bytes > _TXN_BYTES or log_bytes > _ITEM_BYTES
                        ):
                            break
                        total += size
                        writes.append(put)
                        entries.append(entry)
                consumed += 1
            count = len(writes)
            return (writes, entries) if writes else None

        return (count if self._with_log(build) else 0), consumed

    def reschedule(self, updates: Sequence[tuple[str, datetime, str]], *, at: datetime) -> int:
        """Each Pending task's new (send_at, token): one conditional PutItem per task (state
        Pending and the version read), re-read and retried when another write came first."""
        at = utc(at)
        prepared = [(tid, utc(send_at), token) for tid, send_at, token in updates]
        updated = 0
        with self._errors("reschedule tasks"):
            current: dict[str, dict[str, Any] | None] = {
                item["pk"]["S"]: item
                for item in self._batch_get([(f"T#{tid}", "#") for tid, _, _ in prepared])
            }
            for tid, send_at, token in prepared:
                key = f"T#{tid}"
                for attempt in range(_ATTEMPTS):
                    item = current.get(key)
                    if item is None:
                        break
                    task, version = _task(item)
                    if task.state is not TaskState.PENDING:
                        break
                    new = replace(task, send_at=send_at, token=token, updated_at=at)
                    put = self._task_put(new, TaskState.PENDING, version)
                    try:
                        self._transact([put])
                    except _Retry:
                        self._backoff(attempt)
                        current[key] = self._get(key, "#")
                        continue
                    current[key] = put["Put"]["Item"]
                    updated += 1
                    break
                else:
                    raise StoreUnavailable(f"DynamoDB: rescheduling {tid!r} kept losing races")
        return updated

    def list_tasks(
        self,
        campaign_id: str,
        *,
        state: TaskState | None = None,
        search: str | None = None,
        after: int = -1,
        limit: int = 100,
    ) -> list[Task]:
        check_limit(limit)
        check_cursor(after)
        needle = search.lower() if search else None
        with self._errors("list tasks"):
            self._require_campaign(campaign_id)
            if limit == 0:
                return []
            args: dict[str, Any] = {
                "IndexName": "by_campaign",
                "KeyConditionExpression": "gc = :c AND gp > :after",
                "ExpressionAttributeValues": {":c": _s(campaign_id), ":after": _n(after)},
            }
            if state is not None:
                args["FilterExpression"] = "st = :s"
                args["ExpressionAttributeValues"][":s"] = _s(state.value)
            if needle is None and state is None:
                args["Limit"] = limit
            out: list[Task] = []
            for item in self._query(**args):
                task = _task(item)[0]
                if needle is not None and needle not in task.email.lower():
                    continue
                out.append(task)
                if len(out) >= limit:
                    break
        return out

    def due_tasks(
        self,
        state: TaskState,
        *,
        before: datetime,
        after: tuple[datetime, str] | None = None,
        limit: int = 1000,
    ) -> list[Task]:
        check_limit(limit)
        before = utc(before)
        cursor = None if after is None else (utc(after[0]), after[1])
        if limit == 0:
            return []
        # gt is "<send_at>#<id>"; every key of a task due before ``before`` sorts below
        # "<before>" (a prefix sorts first), and a cursor's own key is skipped below.
        low = "0" if cursor is None else f"{_t(cursor[0])}#{cursor[1]}"
        with self._errors("list due tasks"):
            out: list[Task] = []
            for item in self._query(
                IndexName="due",
                KeyConditionExpression="gd = :s AND gt BETWEEN :low AND :high",
                ExpressionAttributeValues={
                    ":s": _s(state.value),
                    ":low": _s(low),
                    ":high": _s(_t(before)),
                },
                Limit=min(limit + 1, 1000),
            ):
                task = _task(item)[0]
                if cursor is not None and (task.send_at, task.id) <= cursor:
                    continue
                if task.send_at >= before:
                    continue
                out.append(task)
                if len(out) >= limit:
                    break
        return out

    def stale_running(self, *, claimed_before: datetime, limit: int = 1000) -> list[Task]:
        check_limit(limit)
        claimed_before = utc(claimed_before)
        with self._errors("list stale tasks"):
            stale = [
                _task(item)[0]
                for item in self._query(
                    IndexName="due",
                    KeyConditionExpression="gd = :s",
                    FilterExpression="ca < :before",
                    ExpressionAttributeValues={
                        ":s": _s(TaskState.RUNNING.value),
                        ":before": _s(_t(claimed_before)),
                    },
                )
            ]
        stale.sort(key=lambda t: (t.claimed_at or claimed_before, t.id))
        return stale[:limit]

    def has_unfinished_tasks(self, campaign_id: str) -> bool:
        with self._errors("look for unfinished tasks"):
            for state in (TaskState.PENDING, TaskState.RUNNING):
                page = self._db.query(
                    TableName=self._table,
                    IndexName="by_state",
                    KeyConditionExpression="gs = :gs",
                    ExpressionAttributeValues={":gs": _s(f"{campaign_id}#{state.value}")},
                    ProjectionExpression="pk",
                    Limit=1,
                )
                if page.get("Items"):
                    return True
        return False

    def count_tasks(self, campaign_id: str) -> dict[TaskState, int]:
        with self._errors("count tasks"):
            self._require_campaign(campaign_id)
            return {
                state: self._count(
                    IndexName="by_state",
                    KeyConditionExpression="gs = :gs",
                    ExpressionAttributeValues={":gs": _s(f"{campaign_id}#{state.value}")},
                )
                for state in TaskState
            }

    # -- change log --------------------------------------------------------------------------
    def changes_after(
        self, after_id: int, *, campaign_id: str | None = None, limit: int = 1000
    ) -> builtins.list[ChangeLogEntry]:
        """Entries after ``after_id``, from one consistent query of the log partition.

        Log items are contiguous (each starts where the previous one ended, see the module
        docstring), so only a gap-free run of items starting at the one that holds
        ``after_id + 1`` is returned: an item that became visible before an earlier one (a
        query reads items one by one) is left for the next call, never stepped over.
        """
        check_limit(limit)
        check_cursor(after_id, field="after_id")
        if limit == 0:
            return []
        after_id = max(after_id, 0)
        # An item holds at most _LOG_MAX entries: the one holding after_id + 1 starts here or
        # later.
        low = max(after_id + 2 - _LOG_MAX, 1)
        out: list[ChangeLogEntry] = []
        expected = None  # the first id of the next item of the run
        with self._errors("read the change log"):
            for item in self._query(
                KeyConditionExpression="pk = :pk AND sk >= :low",
                ExpressionAttributeValues={":pk": _s("log"), ":low": _s(_log_key(low))},
                ConsistentRead=True,
                Limit=min(limit + _LOG_MAX, 1000),
            ):
                first, end = int(item["sk"]["S"]), _log_end(item)
                if expected is None:
                    if end <= after_id:
                        continue
                    if first > after_id + 1:
                        return out  # the item holding after_id + 1 is not visible yet
                elif first != expected:
                    return out  # a gap: the run ends here
                expected = end + 1
                if campaign_id is not None and campaign_id not in item["cs"]["SS"]:
                    continue
                for entry in _log_entries(item):
                    if entry.id <= after_id:
                        continue
                    if campaign_id is not None and entry.campaign_id != campaign_id:
                        continue
                    out.append(entry)
                    if len(out) >= limit:
                        return out
        return out

    def last_change_id(self) -> int:
        with self._errors("read the change log"):
            return self._last_id()

    # -- leases ------------------------------------------------------------------------------
    def acquire_lease(self, name: str, owner: str, *, ttl_seconds: float, at: datetime) -> bool:
        if ttl_seconds <= 0:
            raise InvalidField("ttl_seconds", ttl_seconds, "must be more than zero")
        at = utc(at)
        expires = at + timedelta(seconds=ttl_seconds)
        with self._errors("take a lease"):
            try:
                self._db.put_item(
                    TableName=self._table,
                    Item={
                        "pk": _s("lease"),
                        "sk": _s(name),
                        "owner": _s(owner),
                        "exp": _s(_t(expires)),
                    },
                    ConditionExpression="attribute_not_exists(pk) OR #o = :o OR #e <= :now",
                    ExpressionAttributeNames={"#o": "owner", "#e": "exp"},
                    ExpressionAttributeValues={":o": _s(owner), ":now": _s(_t(at))},
                )
            except ClientError as exc:
                if _code(exc) == "ConditionalCheckFailedException":
                    return False
                raise
        return True

    def release_lease(self, name: str, owner: str) -> None:
        with self._errors("release a lease"):
            try:
                self._db.delete_item(
                    TableName=self._table,
                    Key={"pk": _s("lease"), "sk": _s(name)},
                    ConditionExpression="#o = :o",
                    ExpressionAttributeNames={"#o": "owner"},
                    ExpressionAttributeValues={":o": _s(owner)},
                )
            except ClientError as exc:
                if _code(exc) != "ConditionalCheckFailedException":
                    raise

    def close(self) -> None:
        self._db.close()
