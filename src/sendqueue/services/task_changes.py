"""Applying a named transition (:mod:`sendqueue.domain.transitions`) to the task store."""

from __future__ import annotations

from datetime import datetime

from sendqueue.domain.models import Task
from sendqueue.domain.transitions import TaskChange
from sendqueue.ports import Tasks

__all__ = ["apply_change"]


def apply_change(store: Tasks, change: TaskChange, *, at: datetime) -> Task | None:
    """``change`` as the store's compare-and-set on its expected state, logged at ``at``: the
    updated task, or None when the task was no longer in that state (someone changed it first)."""
    return store.transition(
        change.task_id,
        change.expected,
        change.new,
        at=at,
        changes=change.changes or None,
        note=change.note,
    )
