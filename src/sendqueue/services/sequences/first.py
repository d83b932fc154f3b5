"""Follow-ups first: a due follow-up takes a first step's slot rather than wait past the list.

The rule is :mod:`sendqueue.domain.followups_first`; this module reads the candidates, swaps the
slots and writes the move, under the campaign's re-plan lease that the caller holds:

1. the follow-up's first free slot (booked, for a campaign with senders or local time), as a
   retry's slot is chosen; when it is on time, it is the slot;
2. otherwise the Pending step-1 task to displace is looked for among the tasks due in the
   on-time span (read by send time, so a long list is not read);
3. for a campaign with senders, the two bookings are freed and the follow-up is booked at the
   first step's instant (same sender, same day: its cap is unchanged);
4. the first step takes the next free slot after its own (booked), and moves there by
   compare-and-set on its token; its schedule is replaced;
5. when the first step was claimed or changed meanwhile, nothing is taken from it: its booking
   is settled where it is and the follow-up takes its own first free slot again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta

from sendqueue.domain.errors import InvalidField, NoSendingDay
from sendqueue.domain.followups_first import first_step_to_displace, on_time_until
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import Campaign, Task
from sendqueue.ports import Clock, Tasks
from sendqueue.services.planning.capacity import CapacityPlanner, policy_for, uses_capacity
from sendqueue.services.planning.replanning import Replanner
from sendqueue.services.scheduling.schedules import ScheduleWriter
from sendqueue.services.sequences.moving import move_pending, settle_current

__all__ = ["DISPLACED_REASON", "FollowUpsFirst"]

log = logging.getLogger(__name__)

#: The moved reason of a first step whose slot went to a due follow-up.
DISPLACED_REASON = "follow-ups first: its slot went to a due follow-up"
#: Tasks per page when reading what is due in the on-time span.
_PAGE = 1000
_ONE_MS = timedelta(milliseconds=1)


class FollowUpsFirst:
    """Chooses a follow-up's slot (module docstring)."""

    def __init__(
        self,
        store: Tasks,
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

    def slot(
        self, campaign: Campaign, draft: Task, *, not_before: datetime, displace: bool = True
    ) -> datetime:
        """The slot of the follow-up ``draft`` (not stored yet) due no earlier than
        ``not_before``: its first free slot when that is on time, else the slot of a first step
        displaced for it. Booked for a campaign with senders. The caller holds the lease; when
        it could not get it (``displace`` False), no first step is displaced."""
        free = self._free_slot(campaign, draft, not_before)
        if not displace:
            return free
        zone = draft.timezone if campaign.local_time else None
        try:
            until = on_time_until(campaign.policy, not_before, zone)
        except (InvalidField, NoSendingDay):
            return free  # no second sending day in reach: the first free slot it is
        if free < until:
            return free
        victim = first_step_to_displace(
            draft,
            self._due_between(campaign.id, not_before, until),
            earliest=not_before,
            until=until,
            policy=policy_for(campaign, zone),
        )
        if victim is None:
            return free
        taken = self._take(campaign, draft, victim)
        return taken if taken is not None else self._free_slot(campaign, draft, not_before)

    def _free_slot(self, campaign: Campaign, draft: Task, not_before: datetime) -> datetime:
        return self._replanner.retry_slots(
            campaign, 1, not_before=not_before, exclude=(), tasks=[draft]
        )[0]

    def _due_between(self, campaign_id: str, since: datetime, until: datetime) -> Iterator[Task]:
        """The campaign's Pending tasks due in ``[since, until)``, read by send time."""
        cursor = (since - _ONE_MS, "")
        while True:
            page = self._store.due_tasks(TaskState.PENDING, before=until, after=cursor)
            yield from (t for t in page if t.campaign_id == campaign_id and t.send_at >= since)
            if len(page) < _PAGE:
                return
            cursor = (page[-1].send_at, page[-1].id)

    def _take(self, campaign: Campaign, draft: Task, victim: Task) -> datetime | None:
        """Give ``victim``'s slot to ``draft`` and move ``victim`` to the next free slot; the
        slot taken, or None when the victim could not be moved (nothing then changed)."""
        capacity = uses_capacity(campaign)
        if capacity:
            self._capacity.release([draft.id, victim.id])
            if not self._capacity.book_in_place(replace(draft, send_at=victim.send_at)):
                self._capacity.settle(victim)  # its slot was taken meanwhile: nothing to swap
                return None
        # the victim's own row still counts its instant: it now stands for the follow-up's
        new = self._replanner.retry_slots(
            campaign, 1, not_before=victim.send_at, exclude=(), tasks=[victim]
        )[0]
        moved = move_pending(
            self._store, self._writer, victim, new, reason=DISPLACED_REASON, at=self._clock.now()
        )
        if moved is None:  # claimed or changed meanwhile: its slot stays its own
            if capacity:
                self._capacity.release([draft.id])
                settle_current(self._store, self._capacity, campaign, victim.id)
            return None
        log.info(
            "task %s: its slot %s went to follow-up %s; moved to %s",
            victim.id,
            victim.send_at.isoformat(),
            draft.id,
            new.isoformat(),
        )
        return victim.send_at
