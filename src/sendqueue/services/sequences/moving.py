"""Moving one Pending task of a sequence to another slot, as a re-plan moves one.

The caller holds the campaign's re-plan lease and has chosen (and, for a campaign with senders
or local time, booked) the new slot. The move is a compare-and-set on the task's token; the
task's schedule is replaced. When the task was claimed, cancelled or moved meanwhile, nothing
moves; the caller then settles its booking where the task now is (:func:`settle_current`),
after freeing what it booked for the move.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime

from sendqueue.domain import transitions
from sendqueue.domain.models import Campaign, Task
from sendqueue.ports import Tasks
from sendqueue.services.planning.capacity import CapacityPlanner, uses_capacity
from sendqueue.services.scheduling.schedules import ScheduleWriter

__all__ = ["move_pending", "settle_current"]

log = logging.getLogger(__name__)


def move_pending(
    store: Tasks,
    writer: ScheduleWriter,
    task: Task,
    slot: datetime,
    *,
    reason: str,
    at: datetime,
) -> Task | None:
    """Move the Pending ``task`` to ``slot`` (booked already) for ``reason``: the task as
    moved, or None when it was no longer Pending with its token."""
    move = transitions.move(task, slot)
    if store.reschedule([move], at=at, reason=reason) == 0:
        log.info("task %s: claimed or changed meanwhile; not moved (%s)", task.id, reason)
        return None
    moved = replace(task, send_at=slot, token=move.new_token, moves=task.moves + 1)
    report = writer.ensure_many([moved], moved={task.id})
    if report.failed:
        log.warning(
            "task %s: its schedule was not replaced (%s); the reconciler will retry",
            task.id,
            report.failed[0][1],
        )
    return moved


def settle_current(
    store: Tasks, capacity: CapacityPlanner, campaign: Campaign, task_id: str
) -> None:
    """Put the booking of a task that was not moved where the task now is (a campaign with
    senders or local time; nothing otherwise)."""
    if uses_capacity(campaign):
        current = store.get_task(task_id)
        if current is not None:
            capacity.settle(current)
