"""The task half of the DynamoDB task store: inserts, transitions, queries of tasks."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from sendqueue.adapters.dynamodb.client import TableClient
from sendqueue.adapters.dynamodb.codec import (
    PendingEntry,
    entry_size,
    item_size,
    num_attr,
    position_marker,
    str_attr,
    task_from_item,
    task_item,
    time_key,
)
from sendqueue.adapters.dynamodb.sequences import follow_up_pk
from sendqueue.adapters.dynamodb.table import (
    ITEM_BYTES,
    LOG_MAX,
    TXN_BYTES,
    TXN_ITEMS,
)
from sendqueue.domain.errors import (
    InvalidField,
)
from sendqueue.domain.lifecycle import (
    TaskOutcome,
    TaskState,
    check_task_transition,
)
from sendqueue.domain.models import (
    Move,
    Task,
    TaskChanges,
    check_cursor,
    check_limit,
    check_new_tasks,
    check_step,
    checked_changes,
    utc,
)

__all__ = ["TaskItems", "task_put"]

#: What a transaction builder hands ``_with_log``: the writes and their log entries.
_Built = tuple[list[dict[str, Any]], list[PendingEntry]]


def task_put(table: str, task: Task, expected: TaskState, version: int) -> dict[str, Any]:
    """The transaction item that writes ``task`` over the one read in ``expected`` state at
    ``version`` (and bumps the version)."""
    return {
        "Put": {
            "TableName": table,
            "Item": task_item(task, version + 1),
            # The state is the transition's compare-and-set; the version also catches any
            # other write (a reschedule) between our read and this put.
            "ConditionExpression": "st = :st AND v = :v",
            "ExpressionAttributeValues": {
                ":st": str_attr(expected.value),
                ":v": num_attr(version),
            },
        }
    }


class TaskItems(TableClient):
    """Tasks in the DynamoDB table (see :mod:`sendqueue.adapters.dynamodb.store`)."""

    # -- tasks -------------------------------------------------------------------------------
    def insert_tasks(self, tasks: Sequence[Task], *, at: datetime) -> int:
        """Insert the tasks that do not exist yet, each with its ``None -> Pending`` entry
        (``None -> Cancelled`` noted with its reason, for a suppressed recipient's).

        Written in transactions of up to 49 tasks (the task and its position marker, conditional
        on both being new, plus one log item), not all in one: a crash in between leaves a
        prefix inserted, which is what an idempotent retry expects.
        """
        at = utc(at)
        check_new_tasks(tasks)
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
        items = [task_item(t, 1) for t in prepared]
        for task, item in zip(prepared, items, strict=True):
            if item_size(item) > ITEM_BYTES:
                raise InvalidField("task", task.id, "larger than a DynamoDB item can be (400 KB)")
        chunks: list[list[tuple[Task, dict[str, Any]]]] = [[]]
        chunk_bytes = 0
        for task, item in zip(prepared, items, strict=True):
            size = item_size(item) + 200
            if len(chunks[-1]) >= (TXN_ITEMS - 1) // 2 or chunk_bytes + size > TXN_BYTES:
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

        def build() -> tuple[list[dict[str, Any]], list[PendingEntry]] | None:
            nonlocal count
            keys = [(f"T#{t.id}", "#") for t, _ in chunk]
            keys += [(f"P#{t.campaign_id}", position_marker(t.position, t.step)) for t, _ in chunk]
            existing = {
                (str(i["pk"]["S"]), str(i["sk"]["S"])) for i in self._batch_get(keys, "pk, sk")
            }
            writes: list[dict[str, Any]] = []
            entries: list[PendingEntry] = []
            taken: set[tuple[str, str]] = set()
            for t, item in chunk:
                marker = (f"P#{t.campaign_id}", position_marker(t.position, t.step))
                if (f"T#{t.id}", "#") in existing or marker in existing or marker in taken:
                    continue
                if (f"T#{t.id}", "#") in taken:
                    continue
                taken.update({marker, (f"T#{t.id}", "#")})
                new = "attribute_not_exists(pk)"
                marker_item = {
                    "pk": str_attr(marker[0]),
                    "sk": str_attr(marker[1]),
                    "task": str_attr(t.id),
                }
                for put in (item, marker_item):
                    writes.append(
                        {"Put": {"TableName": self._table, "Item": put, "ConditionExpression": new}}
                    )
                note = t.reason if t.state is TaskState.CANCELLED else None
                entries.append((t.campaign_id, t.id, None, t.state.value, t.created_at, note))
            count = len(entries)
            return (writes, entries) if entries else None

        return count if self._with_log(build) else 0

    def get_task(self, task_id: str) -> Task | None:
        with self._errors("read a task"):
            item = self._get(f"T#{task_id}", "#")
        return None if item is None else task_from_item(item)[0]

    def get_tasks(self, task_ids: Collection[str]) -> dict[str, Task]:
        """BatchGetItem, consistent, 100 keys a request (unprocessed keys asked again)."""
        keys = [(f"T#{i}", "#") for i in dict.fromkeys(task_ids)]  # no duplicate keys: refused
        with self._errors("read tasks"):
            items = self._batch_get(keys)
        return {task.id: task for task in (task_from_item(item)[0] for item in items)}

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
        return self._transition(task_id, expected, new, at=at, changes=changes, note=note)

    def _transition(
        self,
        task_id: str,
        expected: TaskState,
        new: TaskState,
        *,
        at: datetime,
        changes: TaskChanges | None = None,
        note: str | None = None,
        also: Callable[[Task], list[dict[str, Any]]] | None = None,
    ) -> Task | None:
        """:meth:`transition`, with ``also``'s writes (given the updated task) in its
        transaction."""
        check_task_transition(expected, new)
        at = utc(at)
        values = checked_changes(changes)
        if values.get("outcome") is not None:
            values["outcome"] = TaskOutcome(values["outcome"])
        result: list[Task] = []

        def build() -> tuple[list[dict[str, Any]], list[PendingEntry]] | None:
            result.clear()
            item = self._get(f"T#{task_id}", "#")
            if item is None:
                return None
            task, version = task_from_item(item)
            if task.state is not expected:
                return None
            updated = replace(task, **values, state=new, updated_at=at)
            result.append(updated)
            writes = [self._task_put(updated, expected, version)]
            writes += [] if also is None else also(updated)
            return writes, [(task.campaign_id, task_id, expected.value, new.value, at, note)]

        with self._errors("change a task's state"):
            return result[0] if self._with_log(build) else None

    def _task_put(self, task: Task, expected: TaskState, version: int) -> dict[str, Any]:
        return task_put(self._table, task, expected, version)

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
                    ExpressionAttributeValues={":gs": str_attr(f"{campaign_id}#{expected.value}")},
                    ProjectionExpression="pk, gp",
                )
            ]
            keys = [pk for _, pk in sorted(found)]
            while keys:
                done, consumed = self._move_chunk(keys[:LOG_MAX], expected, new, at, note)
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

        def build() -> tuple[list[dict[str, Any]], list[PendingEntry]] | None:
            nonlocal count, consumed
            writes: list[dict[str, Any]] = []
            entries: list[PendingEntry] = []
            total = log_bytes = 0
            items = {i["pk"]["S"]: i for i in self._batch_get([(k, "#") for k in keys])}
            consumed = 0
            for key in keys:
                item = items.get(key)
                if item is not None:
                    task, version = task_from_item(item)
                    if task.state is expected:
                        entry = (task.campaign_id, task.id, expected.value, new.value, at, note)
                        put = self._task_put(
                            replace(task, state=new, updated_at=at), expected, version
                        )
                        size = item_size(put["Put"]["Item"]) + 100
                        log_bytes += entry_size(entry)
                        if writes and (
                            total + size + log_bytes > TXN_BYTES or log_bytes > ITEM_BYTES
                        ):
                            break
                        total += size
                        writes.append(put)
                        entries.append(entry)
                consumed += 1
            count = len(writes)
            return (writes, entries) if writes else None

        return (count if self._with_log(build) else 0), consumed

    def reschedule(self, moves: Sequence[Move], *, at: datetime, reason: str) -> int:
        """Each move a conditional Put (the task's state and version as read, Pending with the
        move's token), up to 99 tasks per transaction with their log item; a chunk that lost a
        race is read again and retried."""
        at = utc(at)
        note = f"moved: {reason}"
        pending = TaskState.PENDING.value
        by_key = {f"T#{m.task_id}": m._replace(send_at=utc(m.send_at)) for m in moves}
        keys = sorted(by_key)
        updated = 0
        with self._errors("reschedule tasks"):
            while keys:
                chunk = keys[:LOG_MAX]
                count = 0

                def build(
                    chunk: list[str] = chunk,
                ) -> tuple[list[dict[str, Any]], list[PendingEntry]] | None:
                    nonlocal count
                    writes: list[dict[str, Any]] = []
                    entries: list[PendingEntry] = []
                    for item in self._batch_get([(k, "#") for k in chunk]):
                        task, version = task_from_item(item)
                        move = by_key[str(item["pk"]["S"])]
                        if task.state is not TaskState.PENDING or task.token != move.token:
                            continue
                        moved = replace(
                            task,
                            send_at=move.send_at,
                            token=move.new_token,
                            moves=task.moves + 1,
                            moved_reason=reason,
                            updated_at=at,
                        )
                        writes.append(self._task_put(moved, TaskState.PENDING, version))
                        entries.append((task.campaign_id, task.id, pending, pending, at, note))
                    count = len(writes)
                    return (writes, entries) if writes else None

                if self._with_log(build):
                    updated += count
                keys = keys[len(chunk) :]
        return updated

    def count_moves(self, campaign_id: str, *, late_after: float) -> tuple[int, int]:
        """Reads the campaign's tasks (every state's part of the ``by_state`` index): DynamoDB
        counts items, not a condition on two attributes."""
        limit = timedelta(seconds=late_after)
        moved = late = 0
        with self._errors("count moved tasks"):
            for state in TaskState:
                for item in self._query(
                    IndexName="by_state",
                    KeyConditionExpression="gs = :gs",
                    ExpressionAttributeValues={":gs": str_attr(f"{campaign_id}#{state.value}")},
                ):
                    task = task_from_item(item)[0]
                    moved += task.moves > 0
                    late += task.sent_at is not None and task.sent_at - task.send_at > limit
        return moved, late

    def booked(
        self, campaign_id: str, *, since: datetime, until: datetime | None = None
    ) -> list[tuple[TaskState, datetime]]:
        since = utc(since)
        end = None if until is None else utc(until)
        out: list[tuple[TaskState, datetime]] = []
        high = "~" if end is None else time_key(end)
        with self._errors("list booked sends"):
            for state in (TaskState.FINISHED, TaskState.RUNNING, TaskState.PENDING):
                condition = "gs = :gs"
                values = {":gs": str_attr(f"{campaign_id}#{state.value}")}
                if state is TaskState.PENDING:
                    # gt is "<send_at>#<id>": the index narrows Pending tasks to the span.
                    condition += " AND gt BETWEEN :low AND :high"
                    values.update({":low": str_attr(time_key(since)), ":high": str_attr(high)})
                for item in self._query(
                    IndexName="by_state",
                    KeyConditionExpression=condition,
                    ExpressionAttributeValues=values,
                ):
                    task = task_from_item(item)[0]
                    when = (
                        task.sent_at
                        if state is TaskState.FINISHED
                        else task.claimed_at
                        if state is TaskState.RUNNING
                        else task.send_at
                    )
                    if when is not None and when >= since and (end is None or when < end):
                        out.append((state, when))
        return out

    def list_tasks(
        self,
        campaign_id: str,
        *,
        state: TaskState | None = None,
        search: str | None = None,
        after: int = -1,
        limit: int = 100,
        step: int | None = None,
    ) -> list[Task]:
        check_limit(limit)
        check_cursor(after)
        if step is not None:
            check_step(step)
        needle = search.lower() if search else None
        with self._errors("list tasks"):
            self._require_campaign(campaign_id)
            if limit == 0:
                return []
            args: dict[str, Any] = {
                "IndexName": "by_campaign",
                "KeyConditionExpression": "gc = :c AND gp > :after",
                "ExpressionAttributeValues": {
                    ":c": str_attr(campaign_id),
                    ":after": num_attr(after),
                },
            }
            filters = []
            if state is not None:
                filters.append("st = :s")
                args["ExpressionAttributeValues"][":s"] = str_attr(state.value)
            if step is not None:
                # A step-1 item carries no ``sp`` (see codec.task_item).
                filters.append("(sp = :p OR attribute_not_exists(sp))" if step == 1 else "sp = :p")
                args["ExpressionAttributeValues"][":p"] = num_attr(step)
            if filters:
                args["FilterExpression"] = " AND ".join(filters)
            if needle is None and not filters:
                args["Limit"] = limit
            out: list[Task] = []
            for item in self._query(**args):
                task = task_from_item(item)[0]
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
        low = "0" if cursor is None else f"{time_key(cursor[0])}#{cursor[1]}"
        with self._errors("list due tasks"):
            out: list[Task] = []
            for item in self._query(
                IndexName="due",
                KeyConditionExpression="gd = :s AND gt BETWEEN :low AND :high",
                ExpressionAttributeValues={
                    ":s": str_attr(state.value),
                    ":low": str_attr(low),
                    ":high": str_attr(time_key(before)),
                },
                Limit=min(limit + 1, 1000),
            ):
                task = task_from_item(item)[0]
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
                task_from_item(item)[0]
                for item in self._query(
                    IndexName="due",
                    KeyConditionExpression="gd = :s",
                    FilterExpression="ca < :before",
                    ExpressionAttributeValues={
                        ":s": str_attr(TaskState.RUNNING.value),
                        ":before": str_attr(time_key(claimed_before)),
                    },
                )
            ]
        stale.sort(key=lambda t: (t.claimed_at or claimed_before, t.id))
        return stale[:limit]

    def has_unfinished_tasks(self, campaign_id: str) -> bool:
        # A Pending or a Running task (the by_state index), or a follow-up mark (a consistent
        # read of its partition): a sequence's next step still to make keeps the campaign open.
        queries: list[dict[str, Any]] = [
            {
                "IndexName": "by_state",
                "KeyConditionExpression": "gs = :k",
                "ExpressionAttributeValues": {":k": str_attr(f"{campaign_id}#{state.value}")},
            }
            for state in (TaskState.PENDING, TaskState.RUNNING)
        ]
        queries.append(
            {
                "KeyConditionExpression": "pk = :k",
                "ExpressionAttributeValues": {":k": str_attr(follow_up_pk(campaign_id))},
                "ConsistentRead": True,
            }
        )
        with self._errors("look for unfinished tasks"):
            for query in queries:
                page = self._db.query(
                    TableName=self._table, ProjectionExpression="pk", Limit=1, **query
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
                    ExpressionAttributeValues={":gs": str_attr(f"{campaign_id}#{state.value}")},
                )
                for state in TaskState
            }
