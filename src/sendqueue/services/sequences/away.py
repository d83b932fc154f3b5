"""An out-of-office notice's return date: the recipient's next step waits until then.

The feedback loop reads the date (:mod:`sendqueue.domain.returndates`) and hands it here with
the recipient's Pending tasks. Every later step among them (step 2 on) due before the start of
the first window on or after that date (the recipient's day, in a local-time campaign) moves to
the first free slot from then on: chosen and booked under the campaign's re-plan lease as a
retry's slot is, moved by compare-and-set, its schedule replaced. A first step is left where it
is: it is no step of a conversation the notice answered.

A step not made yet reads the date when it is made (``FollowUps``): :meth:`AwayDates.record`
keeps it, per campaign and recipient, where the follow-up maker finds it.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from datetime import date

from sendqueue.domain.errors import InvalidField, NoSendingDay, NotFound
from sendqueue.domain.followups import first_instant_on
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import Campaign, Task
from sendqueue.ports import CampaignTasks, Clock
from sendqueue.services.planning.capacity import CapacityPlanner
from sendqueue.services.planning.replanning import RETRY_LEASE_WAIT, Replanner
from sendqueue.services.scheduling.schedules import ScheduleWriter
from sendqueue.services.sequences.moving import move_pending, settle_current

__all__ = ["AwayDates", "away_reason"]

log = logging.getLogger(__name__)


def away_reason(back: date) -> str:
    """The moved reason of a step that waits for its recipient's return."""
    return f"auto-reply: away until {back.isoformat()}"


class AwayDates:
    """Postpones later steps to a recipient's return date (module docstring)."""

    def __init__(
        self,
        store: CampaignTasks,
        replanner: Replanner,
        capacity: CapacityPlanner,
        writer: ScheduleWriter,
        clock: Clock,
    ) -> None:
        self._store = store
        self._replanner = replanner
        self._capacity = capacity
        self._writer = writer
        self._clock = clock

    def postpone(self, pending: Sequence[Task], back: date) -> tuple[str, ...]:
        """Move the later steps among ``pending`` that are due before ``back`` (module
        docstring); the ids of those moved."""
        by_campaign: dict[str, list[Task]] = defaultdict(list)
        for task in pending:
            if task.step > 1 and task.state is TaskState.PENDING:
                by_campaign[task.campaign_id].append(task)
        moved: list[str] = []
        for campaign_id, tasks in sorted(by_campaign.items()):
            try:
                campaign = self._store.get_campaign(campaign_id)
            except NotFound:
                continue
            moved += self._postpone(campaign, tasks, back)
        return tuple(moved)

    def _postpone(self, campaign: Campaign, tasks: list[Task], back: date) -> list[str]:
        moved: list[str] = []
        reason = away_reason(back)
        with self._replanner.lease(campaign.id, wait=RETRY_LEASE_WAIT):
            for task in tasks:
                zone = task.timezone if campaign.local_time else None
                try:
                    start = first_instant_on(campaign.policy, back, zone)
                except (InvalidField, NoSendingDay) as exc:
                    log.warning("task %s: not postponed to %s: %s", task.id, back, exc)
                    continue
                if task.send_at >= start:
                    continue
                not_before = max(start, self._clock.now())
                slot = self._replanner.retry_slots(
                    campaign, 1, not_before=not_before, exclude=(task.send_at,), tasks=[task]
                )[0]
                now = self._clock.now()
                if move_pending(self._store, self._writer, task, slot, reason=reason, at=now):
                    moved.append(task.id)
                    log.info("task %s: waits for its recipient's return (%s)", task.id, back)
                else:
                    settle_current(self._store, self._capacity, campaign, task.id)
        return moved
