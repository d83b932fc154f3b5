"""The send worker's claim and finish on DynamoDB (``TaskStore.claim_for_send`` and
``TaskStore.finish_send``).

A change-log entry is an item of its own, so a state change is a ``TransactWriteItems`` (the
task's conditional Put and the log item), never a single UpdateItem. The claim reads the task
(consistent), then its campaign's state, its address's entry and its booking, and writes the
claim as that transaction, conditioned on the task's version (so its state and token are the
ones read). The campaign's state and the suppression entry are read just before the write,
not conditioned in it: a pause landing between the two lets this one send go out, as one
landing just after the claim would. The finish is the transition (with the follow-up mark,
when asked, in its transaction), then the booking counted sent (``mark_sent``), two writes; it
reports no Pending tasks left, so the worker runs its usual completion check.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from sendqueue.adapters.dynamodb.codec import PendingEntry, task_from_item
from sendqueue.adapters.dynamodb.sequences import mark_put
from sendqueue.adapters.dynamodb.tasks import task_put
from sendqueue.domain.errors import NotFound
from sendqueue.domain.lifecycle import CampaignState, TaskOutcome, TaskState
from sendqueue.domain.models import utc
from sendqueue.domain.sendclaim import (
    ClaimRefusal,
    SendClaim,
    SendFinish,
    claim_refusal,
    refused_claim,
)
from sendqueue.domain.suppression import key_of_normalized

__all__ = ["SendItems"]

_Built = tuple[list[dict[str, Any]], list[PendingEntry]]


class SendItems:
    """The send path of :class:`~sendqueue.adapters.dynamodb.store.DynamoDbTaskStore`."""

    _table: str

    def claim_for_send(
        self,
        task_id: str,
        *,
        token: str | None,
        at: datetime,
        due_by: datetime,
        not_before: datetime | None = None,
    ) -> SendClaim:
        me: Any = self
        at = utc(at)
        with me._errors("claim a task"):
            item = me._get(f"T#{task_id}", "#")
        if item is None:
            return SendClaim(None, None, ClaimRefusal.NOT_FOUND)
        task, version = task_from_item(item)
        try:
            state: CampaignState | None = me.campaign_state(task.campaign_id)
        except NotFound:  # an orphan (its campaign gone): refused_claim answers NOT_FOUND
            state = None
        key = key_of_normalized(task.email)
        entry = me.suppressed([key]).get(key)
        booking = me.booking_of(task_id)
        booking_at = None if booking is None else booking.at
        refused = refused_claim(
            task, state, token=token, suppression=entry, booking_at=booking_at,
            due_by=due_by, not_before=not_before,
        )  # fmt: skip
        if refused is not None:
            return refused
        due, floor = utc(due_by), None if not_before is None else utc(not_before)
        entries: list[PendingEntry] = [
            (task.campaign_id, task_id, TaskState.PENDING.value, TaskState.RUNNING.value, at, None)
        ]
        made: list[Any] = []
        tries = [0]

        def build() -> _Built | None:
            # The first try writes over the version read above. A retry (a throttled or
            # conflicting transaction, or another writer's change) reads the task afresh and
            # claims only while the rule still finds nothing against it: else it is TAKEN.
            nonlocal task, version
            tries[0] += 1
            if tries[0] > 1:
                found = me._get(f"T#{task_id}", "#")
                if found is None:
                    return None
                task, version = task_from_item(found)
                refusal = claim_refusal(
                    task, token=token, campaign_state=state, suppression=entry,
                    due_by=due, not_before=floor,
                )  # fmt: skip
                if refusal is not None:
                    return None
            claimed = replace(
                task,
                state=TaskState.RUNNING,
                claimed_at=at,
                attempts=task.attempts + 1,
                updated_at=at,
            )
            made[:] = [claimed]
            return [task_put(self._table, claimed, TaskState.PENDING, version)], entries

        with me._errors("claim a task"):
            written = me._with_log(build)
        if not written:
            return SendClaim(me.get_task(task_id), state, ClaimRefusal.TAKEN, entry, booking_at)
        claimed = made[0]
        return SendClaim(claimed, state, booking_at=booking_at)

    def finish_send(
        self,
        task_id: str,
        *,
        at: datetime,
        message_id: str,
        slot: datetime | None = None,
        follow_up: bool = False,
    ) -> SendFinish:
        me: Any = self
        at = utc(at)
        # The follow-up mark is a third item of the transition's own transaction (with the
        # task's Put and its log item): a finish never commits without it.
        table = self._table
        done = me._transition(
            task_id,
            TaskState.RUNNING,
            TaskState.FINISHED,
            at=at,
            changes={
                "sent_at": at,
                "message_id": message_id,
                "error": None,
                "outcome": TaskOutcome.ACCEPTED,
                "outcome_at": at,
            },
            also=(lambda task: [mark_put(table, task, at)]) if follow_up else None,
        )
        if done is None or slot is None:
            return SendFinish(done)
        booking = me.booking_of(task_id)
        settled = booking is not None and booking.at == utc(slot)
        if settled:
            me.mark_sent(task_id)
        return SendFinish(done, settled)
