"""An in-memory :class:`~sendqueue.ports.TaskStore`, for tests and for trying things out.

It honours the same contract as the SQL store and runs the same contract tests
(``tests/contract/test_task_store.py``). One lock guards everything, so it is safe to share
between threads; it does not persist anything and is not shared between processes.
"""

from __future__ import annotations

import builtins
import json
import threading
from bisect import bisect_right, insort
from collections.abc import Collection, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from sendqueue.adapters.campaign_reads import ComposedCampaignReads
from sendqueue.domain.errors import (
    Conflict,
    InvalidField,
    NotFound,
)
from sendqueue.domain.lifecycle import (
    CampaignState,
    TaskState,
    check_campaign_transition,
    check_task_transition,
)
from sendqueue.domain.models import (
    MAX_STEP,
    Campaign,
    ChangeLogEntry,
    Move,
    Recipient,
    Task,
    TaskChanges,
    check_cursor,
    check_limit,
    check_new_tasks,
    check_step,
    checked_changes,
    utc,
)
from sendqueue.domain.senders import Booking
from sendqueue.testing.feedback import InMemoryFeedback
from sendqueue.testing.guard import guarded as _guarded
from sendqueue.testing.senders import InMemorySenders
from sendqueue.testing.sending import InMemorySending
from sendqueue.testing.sequences import InMemorySequenceEdits
from sendqueue.testing.suppressions import InMemorySuppressions
from sendqueue.testing.webhooks import InMemoryWebhooks

__all__ = ["InMemoryTaskStore"]


def _json_copy(field: str, value: Any) -> Any:
    # What the SQL store does to JSON columns: validate, and hand back an unshared copy.
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise InvalidField(field, value, f"must be JSON-serialisable: {exc}") from exc


def _utc_or_none(value: datetime | None) -> datetime | None:
    return None if value is None else utc(value)


class InMemoryTaskStore(
    ComposedCampaignReads,
    InMemorySending,
    InMemorySequenceEdits,
    InMemorySuppressions,
    InMemoryFeedback,
    InMemorySenders,
    InMemoryWebhooks,
):
    """:class:`~sendqueue.ports.TaskStore`, :class:`~sendqueue.ports.SuppressionList` and
    :class:`~sendqueue.ports.FeedbackStore` and the webhooks' store in memory; thread-safe, one
    lock.

    :meth:`set_available` simulates an outage: while unavailable, every method raises
    :class:`~sendqueue.domain.errors.StoreUnavailable`, as a real store does when its database
    is unreachable.
    """

    def __init__(self) -> None:
        InMemorySuppressions.__init__(self)
        InMemoryFeedback.__init__(self)
        InMemorySenders.__init__(self)
        InMemoryWebhooks.__init__(self)
        self._lock = threading.RLock()
        self._available = True
        self._campaigns: dict[str, Campaign] = {}
        self._recipients: dict[str, dict[int, Recipient]] = {}
        self._recipient_positions: dict[str, list[int]] = {}
        self._tasks: dict[str, Task] = {}
        # campaign id -> (position, step) -> task id, and those keys sorted for cursor paging.
        self._task_at: dict[str, dict[tuple[int, int], str]] = {}
        self._task_positions: dict[str, list[tuple[int, int]]] = {}
        self._log: list[ChangeLogEntry] = []
        self._leases: dict[str, tuple[str, datetime]] = {}
        self._counters: dict[str, int] = {}
        self._follow_ups: set[str] = set()  # marked tasks (InMemorySequenceEdits)

    def set_available(self, available: bool) -> None:
        """Make every call fail with StoreUnavailable (``False``) or work again (``True``)."""
        with self._lock:
            self._available = available

    def _read_together(self) -> AbstractContextManager[object]:
        """One view's reads see one state: they run under the store's lock."""
        return self._lock

    def close(self) -> None:
        """Nothing to release; the data stays readable."""

    # helpers (called with the lock held) -----------------------------------------------------

    def _require_campaign(self, campaign_id: str) -> Campaign:
        campaign = self._campaigns.get(campaign_id)
        if campaign is None:
            raise NotFound("campaign", campaign_id)
        return campaign

    def _append(
        self,
        campaign_id: str,
        task_id: str | None,
        from_state: str | None,
        to_state: str,
        at: datetime,
        note: str | None,
    ) -> None:
        self._log.append(
            ChangeLogEntry(
                id=len(self._log) + 1,
                campaign_id=campaign_id,
                task_id=task_id,
                from_state=from_state,
                to_state=to_state,
                at=at,
                note=note,
            )
        )

    def _campaign_out(self, campaign: Campaign) -> Campaign:
        if campaign.checkpoint is None:
            return campaign
        return replace(campaign, checkpoint=_json_copy("checkpoint", campaign.checkpoint))

    @staticmethod
    def _recipient_out(recipient: Recipient) -> Recipient:
        return replace(recipient, variables=dict(recipient.variables))

    # campaigns -------------------------------------------------------------------------------

    @_guarded
    def create_campaign(self, campaign: Campaign, recipients: Iterable[Recipient]) -> None:
        """Store the campaign and its recipients, or nothing (see the SQL store for errors)."""
        if campaign.id in self._campaigns:
            raise Conflict(f"campaign {campaign.id!r} already exists")
        stored: dict[int, Recipient] = {}
        for r in recipients:
            if r.position in stored:
                raise InvalidField("position", r.position, "each recipient needs its own position")
            stored[r.position] = replace(r, variables=dict(r.variables))
        checkpoint = (
            None if campaign.checkpoint is None else _json_copy("checkpoint", campaign.checkpoint)
        )
        self._campaigns[campaign.id] = replace(
            campaign,
            recipient_count=len(stored),
            checkpoint=checkpoint,
            created_at=utc(campaign.created_at),
            updated_at=utc(campaign.updated_at),
        )
        self._recipients[campaign.id] = stored
        self._recipient_positions[campaign.id] = sorted(stored)
        self._task_at[campaign.id] = {}
        self._task_positions[campaign.id] = []

    @_guarded
    def get_campaign(self, campaign_id: str) -> Campaign:
        return self._campaign_out(self._require_campaign(campaign_id))

    @_guarded
    def list_campaigns(self) -> list[Campaign]:
        ordered = sorted(self._campaigns.values(), key=lambda c: (c.created_at, c.id), reverse=True)
        return [self._campaign_out(c) for c in ordered]

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
        return self._set_campaign_state(campaign_id, expected, new, at=at, reason=reason)

    @_guarded
    def _set_campaign_state(
        self,
        campaign_id: str,
        expected: Collection[CampaignState],
        new: CampaignState,
        *,
        at: datetime,
        reason: str | None,
    ) -> bool:
        at = utc(at)
        campaign = self._require_campaign(campaign_id)
        if campaign.state not in expected:
            return False
        self._campaigns[campaign_id] = replace(
            campaign, state=new, state_reason=reason, updated_at=at
        )
        self._append(campaign_id, None, campaign.state.value, new.value, at, reason)
        return True

    @_guarded
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
        campaign = self._require_campaign(campaign_id)
        self._campaigns[campaign_id] = replace(campaign, checkpoint=stored, updated_at=at)
        if note is not None:
            self._append(campaign_id, None, None, "progress", at, note)

    # recipients ------------------------------------------------------------------------------

    @_guarded
    def list_recipients(
        self, campaign_id: str, *, after: int = -1, limit: int = 1000
    ) -> list[Recipient]:
        check_limit(limit)
        check_cursor(after)
        self._require_campaign(campaign_id)
        positions = self._recipient_positions[campaign_id]
        start = bisect_right(positions, after)
        by_position = self._recipients[campaign_id]
        return [self._recipient_out(by_position[p]) for p in positions[start : start + limit]]

    # tasks -----------------------------------------------------------------------------------

    @_guarded
    def insert_tasks(
        self, tasks: Sequence[Task], *, at: datetime, bookings: Sequence[Booking] = ()
    ) -> int:
        at = utc(at)
        check_new_tasks(tasks)
        for campaign_id in sorted({t.campaign_id for t in tasks}):
            self._require_campaign(campaign_id)
        # Normalise everything first, so a bad value leaves nothing half inserted.
        prepared = [
            replace(
                t,
                send_at=utc(t.send_at),
                planned_at=utc(t.planned_at or t.send_at),
                claimed_at=_utc_or_none(t.claimed_at),
                sent_at=_utc_or_none(t.sent_at),
                created_at=at,
                updated_at=at,
            )
            for t in tasks
        ]
        self.book(bookings)  # checked before it writes: Overbooked leaves everything as it was
        inserted = 0
        for task in prepared:
            at_position = self._task_at[task.campaign_id]
            key = (task.position, task.step)
            if task.id in self._tasks or key in at_position:
                continue
            self._tasks[task.id] = task
            self._index_task(task)
            at_position[key] = task.id
            insort(self._task_positions[task.campaign_id], key)
            note = task.reason if task.state is TaskState.CANCELLED else None
            self._append(task.campaign_id, task.id, None, task.state.value, at, note)
            inserted += 1
        return inserted

    @_guarded
    def get_task(self, task_id: str) -> Task | None:
        return self._tasks.get(task_id)

    @_guarded
    def get_tasks(self, task_ids: Collection[str]) -> dict[str, Task]:
        return {i: self._tasks[i] for i in task_ids if i in self._tasks}

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
        # The lifecycle is checked before the store is touched, as the SQL store does.
        check_task_transition(expected, new)
        return self._transition(task_id, expected, new, at=at, changes=changes, note=note)

    @_guarded
    def _transition(
        self,
        task_id: str,
        expected: TaskState,
        new: TaskState,
        *,
        at: datetime,
        changes: TaskChanges | None,
        note: str | None,
    ) -> Task | None:
        at = utc(at)
        values = checked_changes(changes)
        task = self._tasks.get(task_id)
        if task is None or task.state is not expected:
            return None
        updated = replace(task, **values, state=new, updated_at=at)
        self._tasks[task_id] = updated
        self._append(task.campaign_id, task_id, expected.value, new.value, at, note)
        return updated

    def transition_all(
        self,
        campaign_id: str,
        expected: TaskState,
        new: TaskState,
        *,
        at: datetime,
        note: str | None = None,
    ) -> int:
        check_task_transition(expected, new)
        return self._transition_all(campaign_id, expected, new, at=at, note=note)

    @_guarded
    def _transition_all(
        self,
        campaign_id: str,
        expected: TaskState,
        new: TaskState,
        *,
        at: datetime,
        note: str | None,
    ) -> int:
        at = utc(at)
        self._require_campaign(campaign_id)
        moved = 0
        at_position = self._task_at[campaign_id]
        for key in self._task_positions[campaign_id]:
            task = self._tasks[at_position[key]]
            if task.state is expected:
                self._tasks[task.id] = replace(task, state=new, updated_at=at)
                self._append(campaign_id, task.id, expected.value, new.value, at, note)
                moved += 1
        return moved

    @_guarded
    def reschedule(self, moves: Sequence[Move], *, at: datetime, reason: str) -> int:
        at = utc(at)
        prepared = [m._replace(send_at=utc(m.send_at)) for m in moves]
        updated = 0
        pending = TaskState.PENDING
        for move in prepared:
            task = self._tasks.get(move.task_id)
            if task is not None and task.state is pending and task.token == move.token:
                self._tasks[task.id] = replace(
                    task,
                    send_at=move.send_at,
                    token=move.new_token,
                    moves=task.moves + 1,
                    moved_reason=reason,
                    updated_at=at,
                )
                self._append(
                    task.campaign_id, task.id, pending.value, pending.value, at, f"moved: {reason}"
                )
                updated += 1
        return updated

    @_guarded
    def count_moves(self, campaign_id: str, *, late_after: float) -> tuple[int, int]:
        moved = late = 0
        limit = timedelta(seconds=late_after)
        for key in self._task_positions.get(campaign_id, ()):
            task = self._tasks[self._task_at[campaign_id][key]]
            moved += task.moves > 0
            late += task.sent_at is not None and task.sent_at - task.send_at > limit
        return moved, late

    @_guarded
    def booked(
        self, campaign_id: str, *, since: datetime, until: datetime | None = None
    ) -> list[tuple[TaskState, datetime]]:
        since = utc(since)
        end = None if until is None else utc(until)
        out: list[tuple[TaskState, datetime]] = []
        for key in self._task_positions.get(campaign_id, ()):
            task = self._tasks[self._task_at[campaign_id][key]]
            when = _booked_at(task)
            if when is not None and when >= since and (end is None or when < end):
                out.append((task.state, when))
        return out

    @_guarded
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
        self._require_campaign(campaign_id)
        needle = search.lower() if search else None
        keys = self._task_positions[campaign_id]
        at_position = self._task_at[campaign_id]
        page: list[Task] = []
        # (after, MAX_STEP) is the last key position ``after`` can have.
        for key in keys[bisect_right(keys, (after, MAX_STEP)) :]:
            if len(page) >= limit:
                break
            task = self._tasks[at_position[key]]
            if state is not None and task.state is not state:
                continue
            if step is not None and task.step != step:
                continue
            if needle is not None and needle not in task.email.lower():
                continue
            page.append(task)
        return page

    @_guarded
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
        due = [
            t
            for t in self._tasks.values()
            if t.state is state
            and t.send_at < before
            and (cursor is None or (t.send_at, t.id) > cursor)
        ]
        due.sort(key=lambda t: (t.send_at, t.id))
        return due[:limit]

    @_guarded
    def stale_running(self, *, claimed_before: datetime, limit: int = 1000) -> list[Task]:
        check_limit(limit)
        claimed_before = utc(claimed_before)
        stale = [
            t
            for t in self._tasks.values()
            if t.state is TaskState.RUNNING
            and t.claimed_at is not None
            and t.claimed_at < claimed_before
        ]
        stale.sort(key=lambda t: (t.claimed_at or claimed_before, t.id))
        return stale[:limit]

    @_guarded
    def campaign_state(self, campaign_id: str) -> CampaignState:
        return self._require_campaign(campaign_id).state

    @_guarded
    def has_unfinished_tasks(self, campaign_id: str) -> bool:
        open_states = (TaskState.PENDING, TaskState.RUNNING)
        return any(
            self._tasks[task_id].state in open_states or task_id in self._follow_ups
            for task_id in self._task_at.get(campaign_id, {}).values()
        )

    @_guarded
    def count_tasks(self, campaign_id: str) -> dict[TaskState, int]:
        self._require_campaign(campaign_id)
        counts = dict.fromkeys(TaskState, 0)
        for task_id in self._task_at[campaign_id].values():
            counts[self._tasks[task_id].state] += 1
        return counts

    # change log ------------------------------------------------------------------------------

    @_guarded
    def changes_after(
        self, after_id: int, *, campaign_id: str | None = None, limit: int = 1000
    ) -> builtins.list[ChangeLogEntry]:
        check_limit(limit)
        check_cursor(after_id, field="after_id")
        # Entry n sits at index n - 1.
        start = max(after_id, 0)
        if campaign_id is None:
            return self._log[start : start + limit]
        page: list[ChangeLogEntry] = []
        for entry in self._log[start:]:
            if len(page) >= limit:
                break
            if entry.campaign_id == campaign_id:
                page.append(entry)
        return page

    @_guarded
    def last_change_id(self) -> int:
        return len(self._log)

    @_guarded
    def newest_change_id(self) -> int:
        return len(self._log)  # every entry is readable once written

    # leases ----------------------------------------------------------------------------------

    @_guarded
    def acquire_lease(self, name: str, owner: str, *, ttl_seconds: float, at: datetime) -> bool:
        if ttl_seconds <= 0:
            raise InvalidField("ttl_seconds", ttl_seconds, "must be more than zero")
        at = utc(at)
        held = self._leases.get(name)
        if held is not None:
            holder, expires_at = held
            if holder != owner and expires_at > at:
                return False
        self._leases[name] = (owner, at + timedelta(seconds=ttl_seconds))
        return True

    @_guarded
    def release_lease(self, name: str, owner: str) -> None:
        held = self._leases.get(name)
        if held is not None and held[0] == owner:
            del self._leases[name]

    # counters --------------------------------------------------------------------------------

    @_guarded
    def counter(self, name: str) -> int:
        _check_counter_name(name)
        return self._counters.get(name, 0)

    @_guarded
    def increment_counter(self, name: str) -> int:
        _check_counter_name(name)
        value = self._counters[name] = self._counters.get(name, 0) + 1
        return value


def _booked_at(task: Task) -> datetime | None:
    """The instant a task holds in its campaign's calendar (TaskStore.booked), if any."""
    if task.state is TaskState.FINISHED:
        return task.sent_at
    if task.state is TaskState.RUNNING:
        return task.claimed_at
    if task.state is TaskState.PENDING:
        return task.send_at
    return None


def _check_counter_name(name: str) -> None:
    if not name or len(name) > 200:
        raise InvalidField("name", name, "must be 1 to 200 characters")
