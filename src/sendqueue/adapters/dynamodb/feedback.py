"""The feedback store in the DynamoDB table (:class:`FeedbackItems`, a base of
:class:`~sendqueue.adapters.dynamodb.store.DynamoDbTaskStore`); the items and the index are in
:mod:`~sendqueue.adapters.dynamodb.table`.

- ``set_outcome`` reads the task consistently and writes it back conditionally (its state and
  version as read), with its log item, in one transaction (``_with_log``): a writer that lost a
  race reads again, and then finds the outcome already set.
- ``tasks_for`` queries the ``by_address`` index (keys only, newest ``gt`` first), then reads
  the tasks themselves consistently and keeps those in the wanted states.
- A soft bounce is a conditional put (``attribute_not_exists``: the same key kept once) of an
  item in the address's own partition, then a count of that partition since a time.
- A recipient's return date is an item in its campaign's ``AW#`` partition, updated only by a
  notice at least as new as the kept one (a failed condition: a newer one is kept); many are
  read at once with BatchGetItem (``away_dates``).
- A mailbox cursor is an update conditional on moving forward (or another UIDVALIDITY); a
  failed condition means a newer position is already stored. The same item keeps the
  mailbox's pass state (``pa`` polled at, ``mr`` messages read, added to; ``le`` the last
  error); a pass before any position writes UIDVALIDITY 0 (no server uses it), read as none.
- ``count_outcomes`` reads the ``oc`` attribute of the campaign's Finished tasks (the
  ``by_state`` index): only a sent task has an outcome. ``count_steps`` reads ``sp`` (absent:
  step 1) and ``oc`` of its tasks in every state the same way.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Collection
from dataclasses import replace
from datetime import date, datetime
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
from sendqueue.adapters.dynamodb.tasks import task_put
from sendqueue.domain.feedback import UNVERIFIED_NOTE, MailboxState, outcome_note
from sendqueue.domain.lifecycle import TaskOutcome, TaskState
from sendqueue.domain.models import Task, check_limit, utc
from sendqueue.domain.reads import StepCounts
from sendqueue.domain.suppression import key_of_normalized

__all__ = ["FeedbackItems"]

_CURSOR = "cursor"
#: Task keys read per BatchGetItem while walking the address index.
_READ_CHUNK = 100


def _bounce_pk(email: str) -> str:
    return f"SB#{email}"


def _away_pk(campaign_id: str) -> str:
    return f"AW#{campaign_id}"


class FeedbackItems(TableClient):
    """:class:`~sendqueue.ports.FeedbackStore` in the store's table."""

    def set_outcome(
        self, task_id: str, outcome: TaskOutcome, *, detail: str | None, at: datetime
    ) -> Task | None:
        at = utc(at)
        outcome = TaskOutcome(outcome)
        result: list[Task] = []
        finished = TaskState.FINISHED

        def build() -> tuple[list[dict[str, Any]], list[PendingEntry]] | None:
            result.clear()
            item = self._get(f"T#{task_id}", "#")
            if item is None:
                return None
            task, version = task_from_item(item)
            if task.state is not finished or task.outcome is outcome:
                return None
            if outcome is TaskOutcome.ACCEPTED and task.outcome is not None:
                return None  # accepted never replaces another outcome
            updated = replace(
                task, outcome=outcome, outcome_detail=detail, outcome_at=at, updated_at=at
            )
            result.append(updated)
            note = outcome_note(outcome, detail or "")
            entry = (task.campaign_id, task_id, finished.value, finished.value, at, note)
            return [task_put(self._table, updated, finished, version)], [entry]

        with self._errors("set a task's outcome"):
            return result[0] if self._with_log(build) else None

    def note_unverified_reply(self, task_id: str, *, detail: str, at: datetime) -> Task | None:
        at = utc(at)
        result: list[Task] = []
        finished = TaskState.FINISHED

        def build() -> tuple[list[dict[str, Any]], list[PendingEntry]] | None:
            result.clear()
            item = self._get(f"T#{task_id}", "#")
            if item is None:
                return None
            task, version = task_from_item(item)
            if task.state is not finished or task.outcome is not TaskOutcome.ACCEPTED:
                return None
            if task.outcome_detail is not None:
                return None  # the first note is kept
            updated = replace(task, outcome_detail=detail, updated_at=at)
            result.append(updated)
            entry = (task.campaign_id, task_id, finished.value, finished.value, at, UNVERIFIED_NOTE)
            return [task_put(self._table, updated, finished, version)], [entry]

        with self._errors("note an unverified reply"):
            return result[0] if self._with_log(build) else None

    def tasks_for(
        self, email: str, *, states: Collection[TaskState], limit: int = 1000
    ) -> list[Task]:
        check_limit(limit)
        wanted = frozenset(TaskState(s) for s in states)
        if not wanted or limit == 0:
            return []
        found: list[Task] = []
        keys: list[tuple[str, str]] = []

        def read(chunk: list[tuple[str, str]]) -> None:
            for item in self._batch_get(chunk):
                task = task_from_item(item)[0]
                if task.state in wanted:
                    found.append(task)

        with self._errors("list an address's tasks"):
            for entry in self._query(
                IndexName="by_address",
                KeyConditionExpression="ga = :ga",
                ExpressionAttributeValues={":ga": str_attr(email)},
                ScanIndexForward=False,
            ):
                keys.append((str(entry["pk"]["S"]), "#"))
                if len(keys) == _READ_CHUNK:
                    read(keys)
                    keys = []
                    if len(found) >= limit:
                        break
            else:
                if keys:
                    read(keys)
        # In send order as read from the tasks themselves (the index may lag a reschedule).
        found.sort(key=lambda t: (t.send_at, t.id), reverse=True)
        return found[:limit]

    def record_soft_bounce(self, email: str, key: str, *, at: datetime, since: datetime) -> int:
        with self._errors("record a soft bounce"):
            try:
                self._db.put_item(
                    TableName=self._table,
                    Item={
                        "pk": str_attr(_bounce_pk(email)),
                        "sk": str_attr(key),
                        "at": str_attr(time_key(at)),
                    },
                    ConditionExpression="attribute_not_exists(pk)",
                )
            except ClientError as exc:
                if error_code(exc) != "ConditionalCheckFailedException":
                    raise  # a failed condition: that message was counted already
            return self._count(
                KeyConditionExpression="pk = :pk",
                FilterExpression="#at >= :since",
                ExpressionAttributeNames={"#at": "at"},
                ExpressionAttributeValues={
                    ":pk": str_attr(_bounce_pk(email)),
                    ":since": str_attr(time_key(since)),
                },
                ConsistentRead=True,
            )

    def set_away(self, campaign_id: str, position: int, until: date, *, at: datetime) -> None:
        with self._errors("keep a return date"):
            try:
                self._db.update_item(
                    TableName=self._table,
                    Key={"pk": str_attr(_away_pk(campaign_id)), "sk": str_attr(str(position))},
                    UpdateExpression="SET #until = :until, #at = :at",
                    ConditionExpression="attribute_not_exists(pk) OR #at <= :at",
                    ExpressionAttributeNames={"#until": "until", "#at": "at"},
                    ExpressionAttributeValues={
                        ":until": str_attr(until.isoformat()),
                        ":at": str_attr(time_key(at)),
                    },
                )
            except ClientError as exc:
                if error_code(exc) != "ConditionalCheckFailedException":
                    raise  # a failed condition: a newer notice's date is kept

    def away_until(self, campaign_id: str, position: int) -> date | None:
        with self._errors("read a return date"):
            item = self._get(_away_pk(campaign_id), str(position))
        return None if item is None else date.fromisoformat(item["until"]["S"])

    def away_dates(self, campaign_id: str, positions: Collection[int]) -> dict[int, date]:
        """BatchGetItem of the positions' ``AW#`` items, consistent, 100 keys a request."""
        keys = [(_away_pk(campaign_id), str(p)) for p in sorted(set(positions))]
        with self._errors("read return dates"):
            items = self._batch_get(keys) if keys else []
        return {int(i["sk"]["S"]): date.fromisoformat(i["until"]["S"]) for i in items}

    def feedback_cursor(self, mailbox: str) -> tuple[int, int] | None:
        with self._errors("read a feedback cursor"):
            item = self._get(_CURSOR, mailbox)
        if item is None or int(item["uv"]["N"]) == 0:  # 0: a pass was kept, no position yet
            return None
        return int(item["uv"]["N"]), int(item["uid"]["N"])

    def save_feedback_cursor(self, mailbox: str, uidvalidity: int, uid: int) -> None:
        with self._errors("save a feedback cursor"):
            try:
                self._db.update_item(
                    TableName=self._table,
                    Key={"pk": str_attr(_CURSOR), "sk": str_attr(mailbox)},
                    UpdateExpression="SET uv = :uv, #uid = :uid",
                    # Forward only within one UIDVALIDITY; another one replaces the position.
                    ConditionExpression="attribute_not_exists(pk) OR uv <> :uv OR #uid < :uid",
                    ExpressionAttributeNames={"#uid": "uid"},
                    ExpressionAttributeValues={":uv": num_attr(uidvalidity), ":uid": num_attr(uid)},
                )
            except ClientError as exc:
                if error_code(exc) != "ConditionalCheckFailedException":
                    raise  # a failed condition: as far or further already

    def record_mailbox_pass(
        self, mailbox: str, *, at: datetime, messages: int, error: str | None
    ) -> None:
        values: dict[str, Any] = {
            ":at": str_attr(time_key(at)),
            ":n": num_attr(messages),
            ":zero": num_attr(0),
        }
        update = "SET pa = :at, uv = if_not_exists(uv, :zero), #uid = if_not_exists(#uid, :zero)"
        if error is None:
            update += " REMOVE le"
        else:
            update += ", le = :le"
            values[":le"] = str_attr(error)
        with self._errors("record a mailbox's pass"):
            self._db.update_item(
                TableName=self._table,
                Key={"pk": str_attr(_CURSOR), "sk": str_attr(mailbox)},
                UpdateExpression=update + " ADD mr :n",
                ExpressionAttributeNames={"#uid": "uid"},
                ExpressionAttributeValues=values,
            )

    def mailbox_states(self, mailboxes: Collection[str]) -> dict[str, MailboxState]:
        keys = [(_CURSOR, name) for name in sorted(set(mailboxes))]
        with self._errors("read mailbox states"):
            items = self._batch_get(keys) if keys else []
        return {
            item["sk"]["S"]: MailboxState(
                item["sk"]["S"],
                parse_time(item["pa"]["S"]),
                int(item.get("mr", {"N": "0"})["N"]),
                item["le"]["S"] if "le" in item else None,
            )
            for item in items
            if "pa" in item
        }

    def backfill_address_keys(self) -> int:
        """Give every task item written before the ``by_address`` index existed its ``ga``
        (``sendqueue db upgrade`` runs it, from the operator's machine: its policy grants the
        Scan, the functions' do not). Safe to run again, and while workers run.

        One Scan for task items without ``ga``; each is put back with it, conditional on its
        version being the one read and on still lacking ``ga`` (a writer of this release that
        got there first wrote its own); returns how many it set."""
        done = 0
        args: dict[str, Any] = {
            "TableName": self._table,
            "FilterExpression": "begins_with(pk, :t) AND sk = :s AND attribute_not_exists(ga)",
            "ExpressionAttributeValues": {":t": str_attr("T#"), ":s": str_attr("#")},
            "ConsistentRead": True,
        }
        with self._errors("index tasks by address"):
            while True:
                page = self._db.scan(**args)
                for item in page.get("Items", []):
                    email = json.loads(item["d"]["S"])["email"]
                    try:
                        self._db.put_item(
                            TableName=self._table,
                            Item={**item, "ga": str_attr(key_of_normalized(email))},
                            ConditionExpression="v = :v AND attribute_not_exists(ga)",
                            ExpressionAttributeValues={":v": item["v"]},
                        )
                    except ClientError as exc:
                        if error_code(exc) != "ConditionalCheckFailedException":
                            raise
                        continue  # rewritten meanwhile (with its ga) or deleted
                    done += 1
                last = page.get("LastEvaluatedKey")
                if not last:
                    return done
                args["ExclusiveStartKey"] = last

    def count_steps(self, campaign_id: str) -> dict[int, StepCounts]:
        found: Counter[tuple[int, TaskState, TaskOutcome | None]] = Counter()
        with self._errors("count tasks per step"):
            for state in TaskState:
                for item in self._query(
                    IndexName="by_state",
                    KeyConditionExpression="gs = :gs",
                    ExpressionAttributeValues={":gs": str_attr(f"{campaign_id}#{state.value}")},
                    ProjectionExpression="sp, oc",
                ):
                    step = int(item["sp"]["N"]) if "sp" in item else 1
                    outcome = TaskOutcome(item["oc"]["S"]) if "oc" in item else None
                    found[step, state, outcome] += 1
        return StepCounts.tally((*key, n) for key, n in found.items())

    def count_outcomes(self, campaign_id: str) -> dict[TaskOutcome, int]:
        counts: dict[TaskOutcome, int] = {}
        with self._errors("count outcomes"):
            for item in self._query(
                IndexName="by_state",
                KeyConditionExpression="gs = :gs",
                FilterExpression="attribute_exists(oc)",
                ExpressionAttributeValues={
                    ":gs": str_attr(f"{campaign_id}#{TaskState.FINISHED.value}")
                },
                ProjectionExpression="oc",
            ):
                outcome = TaskOutcome(item["oc"]["S"])
                counts[outcome] = counts.get(outcome, 0) + 1
        return counts
