"""The in-memory store's sequence edits (:class:`~sendqueue.ports.SequenceEdits`) and follow-up
marks (:class:`~sendqueue.ports.FollowUpMarks`), each under the store's one lock, so each
compare-and-set is as atomic as a SQL store's."""

from __future__ import annotations

import threading
from collections.abc import Collection, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from sendqueue.domain.errors import NotFound
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import Campaign, Task, utc
from sendqueue.domain.steps import Step, check_steps
from sendqueue.domain.transitions import Rerender
from sendqueue.testing.guard import guarded

__all__ = ["InMemorySequenceEdits"]


class InMemorySequenceEdits:
    """``replace_steps``, ``rerender`` and the follow-up marks over the in-memory store's
    dictionaries; the marks are a set of task ids (``_follow_ups``)."""

    _lock: threading.RLock
    _available: bool
    _tasks: dict[str, Task]
    _campaigns: dict[str, Campaign]
    _follow_ups: set[str]

    @guarded
    def follow_ups_due(self, campaign_id: str, *, limit: int = 500) -> list[Task]:
        marked = [self._tasks[i] for i in self._follow_ups if i in self._tasks]
        mine = sorted(
            (t for t in marked if t.campaign_id == campaign_id), key=lambda t: (t.position, t.step)
        )
        return mine[:limit]

    @guarded
    def follow_ups_made(self, campaign_id: str, task_ids: Collection[str]) -> int:
        cleared = 0
        for tid in set(task_ids):
            task = self._tasks.get(tid)
            if tid in self._follow_ups and task is not None and task.campaign_id == campaign_id:
                self._follow_ups.discard(tid)
                cleared += 1
        return cleared

    @guarded
    def replace_steps(
        self, campaign_id: str, expected: Sequence[Step], steps: Sequence[Step], *, at: datetime
    ) -> bool:
        checked = check_steps(steps)
        campaign = self._campaigns.get(campaign_id)
        if campaign is None:
            raise NotFound("campaign", campaign_id)
        if campaign.steps != tuple(expected):
            return False
        self._campaigns[campaign_id] = replace(campaign, steps=checked, updated_at=utc(at))
        return True

    @guarded
    def rerender(self, changes: Sequence[Rerender], *, at: datetime, note: str) -> int:
        at = utc(at)
        me: Any = self
        pending = TaskState.PENDING.value
        applied = 0
        for change in changes:
            task = self._tasks.get(change.task_id)
            if task is None or task.state is not TaskState.PENDING or task.token != change.token:
                continue
            self._tasks[task.id] = replace(
                task, subject=change.subject, text=change.text, html=change.html, updated_at=at
            )
            me._append(task.campaign_id, task.id, pending, pending, at, note)
            applied += 1
        return applied
