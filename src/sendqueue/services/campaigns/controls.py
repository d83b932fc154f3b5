"""Campaign controls: start provisioning, pause, resume, cancel, retry-failed, cancel one task.

Every control keeps the same rules: a campaign state change is a compare-and-set in the store,
tasks move only along the lifecycle table, and schedules follow the tasks (deleted on pause and
cancel, re-planned from now on resume and retry-failed). A crash between two steps leaves
nothing the reconciler cannot repair. The send worker and the reconciler share these controls;
the campaign's creation (:mod:`sendqueue.services.campaigns.creation`) and its preview
(:mod:`sendqueue.services.campaigns.preview`) are apart, so the send path imports no CSV reading.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

from sendqueue.domain import transitions
from sendqueue.domain.errors import IllegalTransition, InvalidField, NotFound
from sendqueue.domain.lifecycle import CampaignState, TaskState, check_campaign_transition
from sendqueue.domain.models import (
    Campaign,
    Task,
    expected_schedule_name,
    schedule_group,
)
from sendqueue.domain.outages import Outage, OutageCause
from sendqueue.domain.planner import plan
from sendqueue.domain.policy import SendingPolicy
from sendqueue.domain.wording import plural
from sendqueue.ports import CampaignTasks, Clock, LeasedCampaignTasks
from sendqueue.services.planning.capacity import CapacityPlanner
from sendqueue.services.planning.replanning import Replanner, iter_tasks
from sendqueue.services.scheduling.schedules import ScheduleWriter
from sendqueue.services.task_changes import apply_change

__all__ = ["CampaignControls", "check_plannable", "complete_if_done"]

log = logging.getLogger(__name__)

_PAGE = 1000


class CampaignControls:
    """The campaign controls the CLI, the API, the worker and the reconciler share."""

    def __init__(
        self,
        store: LeasedCampaignTasks,
        writer: ScheduleWriter,
        clock: Clock,
        *,
        replanner: Replanner,
        capacity: CapacityPlanner,
        on_provisioning: Callable[[str], None] | None = None,
    ) -> None:
        self._store = store
        self._writer = writer
        self._clock = clock
        self._replanner = replanner
        self._capacity = capacity
        # Called with the id of a campaign that has just started provisioning (the previews
        # drop what they cached for it).
        self._on_provisioning = on_provisioning

    def get(self, campaign_id: str) -> Campaign:
        return self._store.get_campaign(campaign_id)

    def start_provisioning(self, campaign_id: str) -> Campaign:
        """Move a draft into provisioning, so the caller can hand the work to the background.

        A campaign already provisioning is returned as it is (the provisioner resumes it from
        its checkpoint); any other state raises IllegalTransition.
        """
        campaign = self._store.get_campaign(campaign_id)
        if campaign.state is CampaignState.PROVISIONING:
            return campaign
        if campaign.state is CampaignState.DRAFT:
            check_plannable(campaign.policy, campaign.recipient_count, now=self._clock.now())
        self._move(campaign_id, {CampaignState.DRAFT}, CampaignState.PROVISIONING, "provisioning")
        if self._on_provisioning is not None:
            self._on_provisioning(campaign_id)
        return self._store.get_campaign(campaign_id)

    def _move(
        self,
        campaign_id: str,
        allowed_from: set[CampaignState],
        target: CampaignState,
        reason: str | None = None,
    ) -> Campaign:
        """CAS the campaign into ``target``; IllegalTransition if it is not in a state allowing
        it. Retries when a concurrent writer changed the state between read and write."""
        for _ in range(5):
            campaign = self._store.get_campaign(campaign_id)
            if campaign.state not in allowed_from:
                raise IllegalTransition("campaign", campaign.state.value, target.value)
            check_campaign_transition(campaign.state, target)
            if self._store.set_campaign_state(
                campaign_id, {campaign.state}, target, at=self._clock.now(), reason=reason
            ):
                return replace(campaign, state=target, state_reason=reason)
        raise IllegalTransition("campaign", "changing", target.value, "state kept changing")

    def cancel(self, campaign_id: str) -> Campaign:
        """Cancel every Pending task and delete the campaign's schedules. Running ones finish."""
        campaign = self._move(
            campaign_id,
            {s for s in CampaignState if not s.is_final and s is not CampaignState.COMPLETED},
            CampaignState.CANCELLED,
            "cancelled by the user",
        )
        self.cancel_pending(campaign_id)
        self.release_bookings(campaign_id, TaskState.CANCELLED)
        return campaign

    def cancel_pending(self, campaign_id: str) -> int:
        """Cancel the Pending tasks of a cancelled campaign and drop its schedules (idempotent;
        the reconciler calls it too, to finish a cancel interrupted by a crash)."""
        count = self._store.transition_all(
            campaign_id,
            TaskState.PENDING,
            TaskState.CANCELLED,
            at=self._clock.now(),
            note="campaign cancelled",
        )
        self._writer.delete_group(schedule_group(campaign_id))
        return count

    def release_bookings(self, campaign_id: str, state: TaskState) -> int:
        """Free the sender slots of the campaign's tasks in ``state`` (Cancelled after a cancel,
        Pending on a pause, so other campaigns may use the capacity); idempotent. Nothing to
        do for a campaign without senders."""
        campaign = self._store.get_campaign(campaign_id)
        if not campaign.sender_ids:
            return 0
        freed = 0
        batch: list[str] = []
        for task in iter_tasks(self._store, campaign_id, state):
            if task.sender_id is not None:
                batch.append(task.id)
            if len(batch) >= _PAGE:
                freed += self._capacity.release(batch)
                batch = []
        return freed + self._capacity.release(batch)

    def pause(self, campaign_id: str, reason: str = "paused by the user") -> Campaign:
        """Stop sending: delete the schedules of Pending tasks; they stay Pending."""
        campaign = self._move(campaign_id, {CampaignState.ACTIVE}, CampaignState.PAUSED, reason)
        self._writer.delete_group(schedule_group(campaign_id))
        # A paused campaign holds no sender capacity; resume books its slots again.
        self.release_bookings(campaign_id, TaskState.PENDING)
        return campaign

    def resume(self, campaign_id: str) -> Campaign:
        """Re-plan the remaining Pending tasks from now, schedule them, and go active. The reason
        names the pause: from the paused campaign's last change (its pause) until now."""
        campaign = self._move(campaign_id, {CampaignState.PAUSED}, CampaignState.ACTIVE)
        paused = Outage(OutageCause.PAUSED, campaign.updated_at, self._clock.now())
        self._replanner.replan_pending(
            campaign, reason=paused.reason, schedule_all=True, level=logging.INFO
        )
        return campaign

    def retry_failed(self, campaign_id: str) -> int:
        """Send the Failed tasks again: back to Pending, re-planned with the rest from now."""
        campaign = self._store.get_campaign(campaign_id)
        if campaign.state not in {
            CampaignState.ACTIVE,
            CampaignState.PAUSED,
            CampaignState.COMPLETED,
        }:
            raise IllegalTransition(
                "campaign",
                campaign.state.value,
                "retry-failed",
                "only active, paused or completed campaigns can retry failed emails",
            )
        now = self._clock.now()
        failed = list(iter_tasks(self._store, campaign_id, TaskState.FAILED))
        # Each takes a free slot of the grid; the emails still planned keep theirs.
        again = "retry-failed"
        retried = self._replanner.retry_in_free_slots(
            campaign,
            failed,
            lambda task, slot: transitions.retry_into(task, slot, reason=again, note=again),
            not_before=now,
            at=now,
        )
        back = [task for task in retried if task is not None]
        if campaign.state is CampaignState.PAUSED:
            # A paused campaign holds no sender capacity: resume books these with the rest.
            self._capacity.release([t.id for t in back if t.sender_id is not None])
        if campaign.state is CampaignState.COMPLETED:
            campaign = self._move(campaign_id, {CampaignState.COMPLETED}, CampaignState.ACTIVE)
        if campaign.state is CampaignState.ACTIVE and back:
            report = self._writer.ensure_many(back)
            if report.failed:
                log.warning(
                    "%s could not be created for %s; the reconciler will retry",
                    plural(len(report.failed), "retry schedule"),
                    campaign_id,
                )
        return len(back)

    def cancel_task(self, task_id: str) -> Task:
        """Cancel one Pending task and delete its schedule."""
        task = self._store.get_task(task_id)
        if task is None:
            raise NotFound("task", task_id)
        done = apply_change(
            self._store,
            transitions.cancel(task, note="cancelled by the user"),
            at=self._clock.now(),
        )
        if done is None:
            current = self._store.get_task(task_id)
            state = current.state.value if current else "missing"
            raise IllegalTransition("task", state, TaskState.CANCELLED.value)
        self._writer.delete_many([expected_schedule_name(task)])
        self._capacity.release([task_id])
        self.complete_if_done(task.campaign_id)
        return done

    def complete_if_done(self, campaign_id: str) -> bool:
        """Mark an active campaign completed when no Pending or Running task is left."""
        return complete_if_done(self._store, campaign_id, at=self._clock.now())


def complete_if_done(store: CampaignTasks, campaign_id: str, *, at: datetime) -> bool:
    """Mark an active campaign completed when no Pending or Running task is left."""
    if store.has_unfinished_tasks(campaign_id):
        return False
    return store.set_campaign_state(
        campaign_id,
        {CampaignState.ACTIVE},
        CampaignState.COMPLETED,
        at=at,
        reason="every email reached a final state",
    )


def check_plannable(policy: SendingPolicy, count: int, *, now: datetime) -> None:
    """Refuse a policy under which ``count`` sends cannot be planned from now, before
    anything is written: a draft that provisioning could never plan would otherwise be
    stored, then stranded in provisioning.

    Raises NoSendingDay (every allowed day for two years is skipped or has no window time
    left) or InvalidField naming ``start`` (too late for even one send before the year
    10000) or ``policy`` (the sends would run past it).
    """
    try:
        plan(policy, min(count, 1), now=now)
    except InvalidField as exc:
        if exc.field != "count":
            raise
        raise InvalidField(
            "start",
            policy.start.isoformat() if policy.start else None,
            "too late: no send fits before the year 10000",
        ) from exc
    try:
        plan(policy, count, now=now)
    except InvalidField as exc:
        if exc.field != "count":
            raise
        raise InvalidField(
            "policy",
            policy.describe(),
            f"{count} sends at this rate would run past the year 9999; raise per_day, "
            "allow more days or send fewer",
        ) from exc
