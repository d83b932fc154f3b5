"""The in-memory store's send path: ``claim_for_send`` and ``finish_send``, each under the
store's one lock, so each is as atomic as the SQL stores' one transaction."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

from sendqueue.domain import transitions
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import Campaign, Task, utc
from sendqueue.domain.sendclaim import ClaimRefusal, SendClaim, SendFinish, refused_claim
from sendqueue.domain.suppression import key_of_normalized
from sendqueue.testing.guard import guarded

__all__ = ["InMemorySending"]


class InMemorySending:
    """``TaskStore.claim_for_send`` and ``TaskStore.finish_send`` over the in-memory store's
    own methods (its lock is re-entrant)."""

    _lock: threading.RLock
    _available: bool
    _tasks: dict[str, Task]
    _campaigns: dict[str, Campaign]
    _task_at: dict[str, dict[tuple[int, int], str]]

    @guarded
    def claim_for_send(
        self,
        task_id: str,
        *,
        token: str | None,
        at: datetime,
        due_by: datetime,
        not_before: datetime | None = None,
    ) -> SendClaim:
        at, due_by = utc(at), utc(due_by)
        me: Any = self
        task: Task | None = me.get_task(task_id)
        if task is None:
            return SendClaim(None, None, ClaimRefusal.NOT_FOUND)
        campaign = self._campaigns.get(task.campaign_id)  # None: an orphan, NOT_FOUND
        state = None if campaign is None else campaign.state
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
        # The task as read (get_task: a test may act between this read and the write), then
        # the compare-and-set on its state and token, as the SQL stores' one statement does.
        current = self._tasks.get(task_id)
        if current is None or (current.state, current.token) != (task.state, task.token):
            return SendClaim(current, state, ClaimRefusal.TAKEN, entry, booking_at)
        change = transitions.claim(task, at)  # the SQL stores write the same fields
        claimed = me._transition(
            task_id, change.expected, change.new, at=at, changes=change.changes, note=change.note
        )
        return SendClaim(claimed, state, booking_at=booking_at)

    @guarded
    def finish_send(
        self,
        task_id: str,
        *,
        at: datetime,
        message_id: str,
        slot: datetime | None = None,
        follow_up: bool = False,
    ) -> SendFinish:
        at = utc(at)
        me: Any = self
        running: Task | None = me.get_task(task_id)
        if running is None:
            return SendFinish(None)
        change = transitions.finish(running, at, message_id)  # as the SQL stores' statement
        done: Task | None = me._transition(
            task_id, change.expected, change.new, at=at, changes=change.changes, note=change.note
        )
        if done is None:
            return SendFinish(None)
        if follow_up:
            me._follow_ups.add(task_id)
        settled = False
        if slot is not None:
            booking = me.booking_of(task_id)
            settled = booking is not None and booking.at == utc(slot)
            if settled:
                me.mark_sent(task_id)
        pending = any(
            self._tasks[other].state is TaskState.PENDING
            for other in self._task_at.get(done.campaign_id, {}).values()
        )
        return SendFinish(done, settled, pending)
