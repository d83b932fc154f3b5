"""The in-memory :class:`~sendqueue.ports.FeedbackStore`, a base of the in-memory task store
(it shares the store's lock, its tasks, its change log and its simulated outages)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from dataclasses import replace
from datetime import date, datetime

from sendqueue.domain.feedback import UNVERIFIED_NOTE, MailboxState, outcome_note
from sendqueue.domain.lifecycle import TaskOutcome, TaskState
from sendqueue.domain.models import Task, check_limit, utc
from sendqueue.domain.reads import StepCounts
from sendqueue.domain.suppression import key_of_normalized
from sendqueue.testing.guard import guarded

__all__ = ["InMemoryFeedback"]


class InMemoryFeedback:
    """:class:`~sendqueue.ports.FeedbackStore` in memory. Reads of an address go through an
    index kept by :meth:`_index_task` (the store calls it for every task it inserts), as the
    real stores read an index rather than scan the tasks."""

    _lock: threading.RLock
    _available: bool
    _tasks: dict[str, Task]
    _task_at: dict[str, dict[tuple[int, int], str]]

    # The task store's change-log append (campaign, task, from, to, at, note).
    _append: Callable[[str, str | None, str | None, str, datetime, str | None], None]

    def __init__(self) -> None:
        self._tasks_of_address: dict[str, set[str]] = {}
        self._soft_bounces: dict[str, dict[str, datetime]] = {}
        self._cursors: dict[str, tuple[int, int]] = {}
        self._mailbox_states: dict[str, MailboxState] = {}
        self._away: dict[tuple[str, int], tuple[date, datetime]] = {}

    def _index_task(self, task: Task) -> None:
        self._tasks_of_address.setdefault(key_of_normalized(task.email), set()).add(task.id)

    @guarded
    def set_outcome(
        self, task_id: str, outcome: TaskOutcome, *, detail: str | None, at: datetime
    ) -> Task | None:
        at = utc(at)
        outcome = TaskOutcome(outcome)
        task = self._tasks.get(task_id)
        if task is None or task.state is not TaskState.FINISHED or task.outcome is outcome:
            return None
        if outcome is TaskOutcome.ACCEPTED and task.outcome is not None:
            return None
        updated = replace(
            task, outcome=outcome, outcome_detail=detail, outcome_at=at, updated_at=at
        )
        self._tasks[task_id] = updated
        state = TaskState.FINISHED.value
        self._append(task.campaign_id, task_id, state, state, at, outcome_note(outcome))
        return updated

    @guarded
    def note_unverified_reply(self, task_id: str, *, detail: str, at: datetime) -> Task | None:
        at = utc(at)
        task = self._tasks.get(task_id)
        if (
            task is None
            or task.state is not TaskState.FINISHED
            or task.outcome is not TaskOutcome.ACCEPTED
            or task.outcome_detail is not None
        ):
            return None
        updated = replace(task, outcome_detail=detail, updated_at=at)
        self._tasks[task_id] = updated
        state = TaskState.FINISHED.value
        self._append(task.campaign_id, task_id, state, state, at, UNVERIFIED_NOTE)
        return updated

    @guarded
    def tasks_for(
        self, email: str, *, states: Collection[TaskState], limit: int = 1000
    ) -> list[Task]:
        check_limit(limit)
        wanted = frozenset(TaskState(s) for s in states)
        found = [
            task
            for task_id in self._tasks_of_address.get(email, ())
            if (task := self._tasks[task_id]).state in wanted
        ]
        found.sort(key=lambda t: (t.send_at, t.id), reverse=True)
        return found[:limit]

    @guarded
    def record_soft_bounce(self, email: str, key: str, *, at: datetime, since: datetime) -> int:
        kept = self._soft_bounces.setdefault(email, {})
        kept.setdefault(key, utc(at))
        since = utc(since)
        return sum(1 for when in kept.values() if when >= since)

    @guarded
    def set_away(self, campaign_id: str, position: int, until: date, *, at: datetime) -> None:
        at = utc(at)
        kept = self._away.get((campaign_id, position))
        if kept is None or kept[1] <= at:
            self._away[(campaign_id, position)] = (until, at)

    @guarded
    def away_dates(self, campaign_id: str, positions: Collection[int]) -> dict[int, date]:
        kept = ((p, self._away.get((campaign_id, p))) for p in set(positions))
        return {p: k[0] for p, k in kept if k is not None}

    @guarded
    def away_until(self, campaign_id: str, position: int) -> date | None:
        kept = self._away.get((campaign_id, position))
        return None if kept is None else kept[0]

    @guarded
    def feedback_cursor(self, mailbox: str) -> tuple[int, int] | None:
        return self._cursors.get(mailbox)

    @guarded
    def save_feedback_cursor(self, mailbox: str, uidvalidity: int, uid: int) -> None:
        current = self._cursors.get(mailbox)
        if current is not None and current[0] == uidvalidity and current[1] >= uid:
            return
        self._cursors[mailbox] = (uidvalidity, uid)

    @guarded
    def record_mailbox_pass(
        self, mailbox: str, *, at: datetime, messages: int, error: str | None
    ) -> None:
        before = self._mailbox_states.get(mailbox, MailboxState(mailbox))
        self._mailbox_states[mailbox] = MailboxState(
            mailbox, utc(at), before.messages_read + messages, error
        )

    @guarded
    def mailbox_states(self, mailboxes: Collection[str]) -> dict[str, MailboxState]:
        return {m: self._mailbox_states[m] for m in mailboxes if m in self._mailbox_states}

    @guarded
    def count_steps(self, campaign_id: str) -> dict[int, StepCounts]:
        tasks = (self._tasks[i] for i in self._task_at.get(campaign_id, {}).values())
        return StepCounts.tally((t.step, t.state, t.outcome, 1) for t in tasks)

    @guarded
    def count_outcomes(self, campaign_id: str) -> dict[TaskOutcome, int]:
        counts: dict[TaskOutcome, int] = {}
        for task_id in self._task_at.get(campaign_id, {}).values():
            outcome = self._tasks[task_id].outcome
            if outcome is not None:
                counts[outcome] = counts.get(outcome, 0) + 1
        return counts
