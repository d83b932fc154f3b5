"""The store's part in sequences on DynamoDB: the follow-up marks
(:class:`~sendqueue.ports.FollowUpMarks`) and the sequence edits
(:class:`~sendqueue.ports.SequenceEdits`).

A mark is a small item in its campaign's ``FU#`` partition, keyed by the task's position and
step (so one consistent Query reads a campaign's marks in (position, step) order) and holding
the task's id. ``finish_send`` puts it in the finish's own transaction (:func:`mark_put`);
``follow_ups_due`` is that Query and a BatchGetItem of the tasks; ``follow_ups_made`` reads
the tasks for their keys and deletes each mark conditional on its task id (so its count is of
marks this call removed; a few deletes at a time); ``has_unfinished_tasks`` also asks the
partition for one item.

The steps live in the campaign item: :meth:`replace_steps` is the campaign's conditional Put
(on the item as read), after the stored steps are compared with the expected ones. A
re-rendered task is a conditional Put on its state and version as read (so its token too),
with its log item, a few tasks a transaction: a transaction holds at most 4 MB, and a task's
bodies can be large.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

from sendqueue.adapters.dynamodb.client import error_code
from sendqueue.adapters.dynamodb.codec import (
    PendingEntry,
    campaign_item,
    item_size,
    position_key,
    str_attr,
    task_from_item,
    time_key,
)
from sendqueue.adapters.dynamodb.table import ITEM_BYTES, LOG_MAX, WRITERS
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import Campaign, Task, check_limit, utc
from sendqueue.domain.steps import Step, check_steps
from sendqueue.domain.transitions import Rerender

__all__ = ["SequenceItems", "follow_up_pk", "mark_put"]

#: Stands for the campaign item's recipient key (16 hex digits) when its size is measured.
_SIZED_KEY = "0" * 16
#: The most characters of bodies and subjects one transaction writes (of its 4 MB).
_CHUNK_CHARS = 1_000_000


def follow_up_pk(campaign_id: str) -> str:
    """The partition of a campaign's follow-up marks."""
    return f"FU#{campaign_id}"


def _mark_key(task: Task) -> str:
    # Steps run 1 to MAX_STEP (10): two digits keep them in order after the position.
    return f"{position_key(task.position)}#{task.step:02d}"


def mark_put(table: str, task: Task, at: datetime) -> dict[str, Any]:
    """The transaction item that marks ``task`` as having its next step to make (a Put:
    marking twice is harmless)."""
    item = {
        "pk": str_attr(follow_up_pk(task.campaign_id)),
        "sk": str_attr(_mark_key(task)),
        "task": str_attr(task.id),
        "at": str_attr(time_key(at)),
    }
    return {"Put": {"TableName": table, "Item": item}}


def _chunks(changes: Sequence[Rerender]) -> list[list[Rerender]]:
    """``changes`` in id order, cut so no chunk passes LOG_MAX tasks or _CHUNK_CHARS."""
    chunks: list[list[Rerender]] = []
    size = 0
    for change in sorted(changes, key=lambda r: r.task_id):
        chars = len(change.subject) + len(change.text) + len(change.html or "")
        if not chunks or len(chunks[-1]) >= LOG_MAX or (size + chars > _CHUNK_CHARS and size):
            chunks.append([])
            size = 0
        chunks[-1].append(change)
        size += chars
    return chunks


class SequenceItems:
    """The follow-up marks, ``replace_steps`` and ``rerender`` of
    :class:`~sendqueue.adapters.dynamodb.store.DynamoDbTaskStore`."""

    def follow_ups_due(self, campaign_id: str, *, limit: int = 500) -> list[Task]:
        me: Any = self
        check_limit(limit)
        if limit == 0:
            return []
        with me._errors("list follow-ups due"):
            keys: list[tuple[str, str]] = []
            for item in me._query(
                KeyConditionExpression="pk = :pk",
                ExpressionAttributeValues={":pk": str_attr(follow_up_pk(campaign_id))},
                ProjectionExpression="#t",
                ExpressionAttributeNames={"#t": "task"},
                ConsistentRead=True,
                Limit=min(limit, 1000),
            ):
                keys.append((f"T#{item['task']['S']}", "#"))
                if len(keys) >= limit:
                    break
            # _batch_get keeps the order of ``keys``: the marks' (position, step) order.
            return [task_from_item(item)[0] for item in me._batch_get(keys)]

    def follow_ups_made(self, campaign_id: str, task_ids: Collection[str]) -> int:
        me: Any = self
        keys = [(f"T#{i}", "#") for i in dict.fromkeys(task_ids)]  # no duplicate keys: refused

        def clear(task: Task) -> bool:
            try:
                me._db.delete_item(
                    TableName=me._table,
                    Key={
                        "pk": str_attr(follow_up_pk(campaign_id)),
                        "sk": str_attr(_mark_key(task)),
                    },
                    ConditionExpression="#t = :t",
                    ExpressionAttributeNames={"#t": "task"},
                    ExpressionAttributeValues={":t": str_attr(task.id)},
                )
            except ClientError as exc:
                if error_code(exc) != "ConditionalCheckFailedException":
                    raise
                return False  # not marked (never, or cleared already)
            return True

        with me._errors("clear follow-up marks"):
            tasks = [task_from_item(item)[0] for item in me._batch_get(keys)]
            # Another campaign's task is left alone: its marks are its own campaign's.
            mine = [t for t in tasks if t.campaign_id == campaign_id]
            if not mine:
                return 0
            with ThreadPoolExecutor(WRITERS) as pool:  # boto3 clients are thread-safe
                return sum(pool.map(clear, mine))

    def replace_steps(
        self, campaign_id: str, expected: Sequence[Step], steps: Sequence[Step], *, at: datetime
    ) -> bool:
        me: Any = self
        checked, wanted, at = check_steps(steps), tuple(expected), utc(at)

        def change(current: Campaign) -> tuple[Campaign, PendingEntry | None] | None:
            if current.steps != wanted:
                return None
            updated = replace(current, steps=checked, updated_at=at)
            if item_size(campaign_item(updated, _SIZED_KEY)) > ITEM_BYTES:
                # refused as create_campaign refuses it: DynamoDB's own refusal reads as an outage
                changed = next(
                    (s.number for s, old in zip(checked, wanted, strict=False) if s != old),
                    len(checked),
                )
                raise InvalidField(
                    f"steps[{changed}]", len(checked),
                    "with the other steps, larger than a DynamoDB item can be (400 KB)",
                )  # fmt: skip
            return updated, None

        with me._errors("replace a campaign's steps"):
            return bool(me._campaign_write(campaign_id, change))

    def rerender(self, changes: Sequence[Rerender], *, at: datetime, note: str) -> int:
        me: Any = self
        at = utc(at)
        pending = TaskState.PENDING.value
        applied = 0
        with me._errors("re-render tasks"):
            for chunk in _chunks(changes):
                by_key = {f"T#{c.task_id}": c for c in chunk}
                count = 0

                def build(
                    by_key: dict[str, Rerender] = by_key,
                ) -> tuple[list[dict[str, Any]], list[PendingEntry]] | None:
                    nonlocal count
                    writes: list[dict[str, Any]] = []
                    entries: list[PendingEntry] = []
                    for item in me._batch_get([(k, "#") for k in by_key]):
                        task, version = task_from_item(item)
                        edit = by_key[str(item["pk"]["S"])]
                        if task.state is not TaskState.PENDING or task.token != edit.token:
                            continue
                        new = replace(
                            task, subject=edit.subject, text=edit.text, html=edit.html,
                            updated_at=at,
                        )  # fmt: skip
                        writes.append(me._task_put(new, TaskState.PENDING, version))
                        entries.append((task.campaign_id, task.id, pending, pending, at, note))
                    count = len(writes)
                    return (writes, entries) if writes else None

                if me._with_log(build):
                    applied += count
        return applied
