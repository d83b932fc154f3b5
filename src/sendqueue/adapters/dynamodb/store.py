"""The TaskStore on DynamoDB (boto3): conditional writes, and a change log in transactions.

The table's layout: :mod:`sendqueue.adapters.dynamodb.table`.

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
import secrets
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import replace
from datetime import datetime, timedelta
from itertools import islice
from typing import Any

from botocore.exceptions import ClientError

from sendqueue.adapters.campaign_reads import ComposedCampaignReads
from sendqueue.adapters.dynamodb.bookings import BookingItems
from sendqueue.adapters.dynamodb.client import error_code
from sendqueue.adapters.dynamodb.codec import (
    PendingEntry,
    campaign_from_item,
    campaign_item,
    item_size,
    json_copy,
    log_end,
    log_entries,
    log_key,
    position_key,
    recipient_item,
    str_attr,
    time_key,
)
from sendqueue.adapters.dynamodb.feedback import FeedbackItems
from sendqueue.adapters.dynamodb.senders import SenderItems
from sendqueue.adapters.dynamodb.sending import SendItems
from sendqueue.adapters.dynamodb.sequences import SequenceItems
from sendqueue.adapters.dynamodb.suppressions import SuppressionItems
from sendqueue.adapters.dynamodb.table import (
    ITEM_BYTES,
    LOG_MAX,
    WRITERS,
)
from sendqueue.adapters.dynamodb.tasks import TaskItems
from sendqueue.adapters.dynamodb.webhooks import WebhookItems
from sendqueue.domain.errors import (
    Conflict,
    InvalidField,
    NotFound,
    StoreUnavailable,
)
from sendqueue.domain.lifecycle import (
    CampaignState,
    check_campaign_transition,
)
from sendqueue.domain.models import (
    Campaign,
    ChangeLogEntry,
    Recipient,
    Task,
    check_cursor,
    check_limit,
    check_new_tasks,
    utc,
)
from sendqueue.domain.senders import Booking

__all__ = ["DynamoDbTaskStore"]


class DynamoDbTaskStore(
    ComposedCampaignReads,
    SendItems,
    SequenceItems,
    TaskItems,
    SuppressionItems,
    FeedbackItems,
    SenderItems,
    BookingItems,
    WebhookItems,
):
    """:class:`~sendqueue.ports.TaskStore` (and :class:`~sendqueue.ports.SuppressionList`,
    :mod:`~sendqueue.adapters.dynamodb.suppressions`; :class:`~sendqueue.ports.FeedbackStore`,
    :mod:`~sendqueue.adapters.dynamodb.feedback`; :class:`~sendqueue.ports.SenderStore`,
    :mod:`~sendqueue.adapters.dynamodb.senders` and :mod:`~sendqueue.adapters.dynamodb.bookings`)
    on DynamoDB; see the module docstring."""

    # -- tasks with their bookings -----------------------------------------------------------
    def insert_tasks(
        self, tasks: Sequence[Task], *, at: datetime, bookings: Sequence[Booking] = ()
    ) -> int:
        """:meth:`TaskItems.insert_tasks` with ``bookings`` booked first (:meth:`BookingItems.book`,
        its own atomic write: no transaction spans both). When the insert fails, the bookings of
        the tasks it did not store are released (the tasks it stored, 49 a transaction, keep
        theirs); a crash in between, or an outage that keeps the release from happening, leaves
        bookings without their tasks, which a resumed provisioning run moves (never past a
        cap)."""
        check_new_tasks(tasks)  # a bad task books nothing
        if not bookings:
            return super().insert_tasks(tasks, at=at)
        self.book(bookings)
        try:
            return super().insert_tasks(tasks, at=at)
        except Exception:
            with suppress(StoreUnavailable):
                stored = self.get_tasks([b.task_id for b in bookings])
                self.release([b.task_id for b in bookings if b.task_id not in stored])
            raise

    # -- campaigns ---------------------------------------------------------------------------
    def create_campaign(self, campaign: Campaign, recipients: Iterable[Recipient]) -> None:
        """Store the campaign and its recipients; see the module docstring for atomicity.

        ``recipients`` is consumed once, a window of batches at a time. A refused recipient
        (a repeated position, an item too large) deletes the recipients already written under
        this attempt's key before the error is raised.
        """
        checkpoint = (
            None if campaign.checkpoint is None else json_copy("checkpoint", campaign.checkpoint)
        )
        key = secrets.token_hex(8)
        # Positions written so far: to refuse a repeat, and to delete them if the import fails.
        written: set[int] = set()
        with self._errors("create a campaign"):
            if self._get("campaign", campaign.id, "pk") is not None:
                raise Conflict(f"campaign {campaign.id!r} already exists")
            if item_size(campaign_item(campaign, key)) > ITEM_BYTES:
                # Its steps' templates live in its item: refused before anything is written.
                raise InvalidField(
                    "steps", len(campaign.steps), "larger than a DynamoDB item can be (400 KB)"
                )
            try:
                with ThreadPoolExecutor(WRITERS) as pool:
                    for window in _windows(recipients, 25 * WRITERS * 4):
                        batch = [
                            self._recipient_request(campaign.id, key, r, written) for r in window
                        ]
                        batches = [batch[i : i + 25] for i in range(0, len(batch), 25)]
                        for _ in pool.map(self._batch_write, batches):
                            pass
            except InvalidField:
                self._delete_recipients(campaign.id, key, written)
                raise
            stored = replace(
                campaign,
                recipient_count=len(written),
                checkpoint=checkpoint,
                created_at=utc(campaign.created_at),
                updated_at=utc(campaign.updated_at),
            )
            try:
                self._db.put_item(
                    TableName=self._table,
                    Item=campaign_item(stored, key),
                    ConditionExpression="attribute_not_exists(pk)",
                )
            except ClientError as exc:
                if error_code(exc) == "ConditionalCheckFailedException":
                    raise Conflict(f"campaign {campaign.id!r} already exists") from exc
                raise

    @staticmethod
    def _recipient_request(
        campaign_id: str, key: str, r: Recipient, written: set[int]
    ) -> dict[str, Any]:
        if r.position in written:
            raise InvalidField("position", r.position, "each recipient needs its own position")
        item = recipient_item(campaign_id, key, r)
        if item_size(item) > ITEM_BYTES:
            raise InvalidField(
                "recipient", r.position, "larger than a DynamoDB item can be (400 KB)"
            )
        written.add(r.position)
        return {"PutRequest": {"Item": item}}

    def _delete_recipients(self, campaign_id: str, key: str, positions: Collection[int]) -> None:
        """Delete what a refused create wrote (unread without its campaign item anyway)."""
        pk = str_attr(f"R#{campaign_id}#{key}")  # as codec.recipient_item keys them
        deletes = [
            {"DeleteRequest": {"Key": {"pk": pk, "sk": str_attr(position_key(p))}}}
            for p in sorted(positions)
        ]
        for start in range(0, len(deletes), 25):
            self._batch_write(deletes[start : start + 25])

    def get_campaign(self, campaign_id: str) -> Campaign:
        with self._errors("read a campaign"):
            return campaign_from_item(self._require_campaign(campaign_id))

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
                    ExpressionAttributeValues={":pk": str_attr("campaign")},
                    ConsistentRead=True,
                )
            )
        campaigns = [campaign_from_item(i) for i in items]
        return sorted(campaigns, key=lambda c: (c.created_at, c.id), reverse=True)

    def _campaign_write(
        self,
        campaign_id: str,
        change: Callable[[Campaign], tuple[Campaign, PendingEntry | None] | None],
    ) -> bool:
        def build() -> tuple[list[dict[str, Any]], list[PendingEntry]] | None:
            item = self._require_campaign(campaign_id)
            changed = change(campaign_from_item(item))
            if changed is None:
                return None
            updated, entry = changed
            put = {
                "Put": {
                    "TableName": self._table,
                    "Item": campaign_item(updated, item["rk"]["S"]),
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

        def change(current: Campaign) -> tuple[Campaign, PendingEntry | None] | None:
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
        stored = None if checkpoint is None else json_copy("checkpoint", checkpoint)
        entry: PendingEntry | None = (
            None if note is None else (campaign_id, None, None, "progress", at, note)
        )

        def change(current: Campaign) -> tuple[Campaign, PendingEntry | None]:
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
                    ":pk": str_attr(f"R#{campaign_id}#{key}"),
                    ":after": str_attr(position_key(after) if after >= 0 else "-"),
                },
                ConsistentRead=True,
                Limit=min(limit, 1000),
            ):
                out.append(Recipient(**json.loads(item["d"]["S"])))
                if len(out) >= limit:
                    break
        return out

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
        # An item holds at most LOG_MAX entries: the one holding after_id + 1 starts here or
        # later.
        low = max(after_id + 2 - LOG_MAX, 1)
        out: list[ChangeLogEntry] = []
        expected = None  # the first id of the next item of the run
        with self._errors("read the change log"):
            for item in self._query(
                KeyConditionExpression="pk = :pk AND sk >= :low",
                ExpressionAttributeValues={":pk": str_attr("log"), ":low": str_attr(log_key(low))},
                ConsistentRead=True,
                Limit=min(limit + LOG_MAX, 1000),
            ):
                first, end = int(item["sk"]["S"]), log_end(item)
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
                for entry in log_entries(item):
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

    def newest_change_id(self) -> int:
        return self.last_change_id()  # every entry is readable once written

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
                        "pk": str_attr("lease"),
                        "sk": str_attr(name),
                        "owner": str_attr(owner),
                        "exp": str_attr(time_key(expires)),
                    },
                    ConditionExpression="attribute_not_exists(pk) OR #o = :o OR #e <= :now",
                    ExpressionAttributeNames={"#o": "owner", "#e": "exp"},
                    ExpressionAttributeValues={
                        ":o": str_attr(owner),
                        ":now": str_attr(time_key(at)),
                    },
                )
            except ClientError as exc:
                if error_code(exc) == "ConditionalCheckFailedException":
                    return False
                raise
        return True

    def release_lease(self, name: str, owner: str) -> None:
        with self._errors("release a lease"):
            try:
                self._db.delete_item(
                    TableName=self._table,
                    Key={"pk": str_attr("lease"), "sk": str_attr(name)},
                    ConditionExpression="#o = :o",
                    ExpressionAttributeNames={"#o": "owner"},
                    ExpressionAttributeValues={":o": str_attr(owner)},
                )
            except ClientError as exc:
                if error_code(exc) != "ConditionalCheckFailedException":
                    raise

    # -- counters ----------------------------------------------------------------------------
    def counter(self, name: str) -> int:
        _check_counter_name(name)
        with self._errors("read a counter"):
            found = self._get("counter", name)
        return int(found["n"]["N"]) if found else 0

    def increment_counter(self, name: str) -> int:
        """One ``UpdateItem`` with ``ADD n 1`` (atomic; creates the item at 1)."""
        _check_counter_name(name)
        with self._errors("increment a counter"):
            updated = self._db.update_item(
                TableName=self._table,
                Key={"pk": str_attr("counter"), "sk": str_attr(name)},
                UpdateExpression="ADD #n :one",
                ExpressionAttributeNames={"#n": "n"},
                ExpressionAttributeValues={":one": {"N": "1"}},
                ReturnValues="UPDATED_NEW",
            )
        return int(updated["Attributes"]["n"]["N"])

    def close(self) -> None:
        self._db.close()


def _check_counter_name(name: str) -> None:
    if not name or len(name) > 200:
        raise InvalidField("name", name, "must be 1 to 200 characters")


def _windows(items: Iterable[Recipient], size: int) -> Iterator[list[Recipient]]:
    """``items`` (possibly a one-pass iterator) in lists of at most ``size``."""
    it = iter(items)
    while window := list(islice(it, size)):
        yield window
