"""The reconciler: repairs drift between the task store and the execution layer.

One pass (guarded by a lease in the store, so only one runs at a time across processes):

1. resumes provisioning that stopped (crash, failed scheduler calls, spent time budget);
2. finishes cancels interrupted by a crash (Pending tasks of a cancelled campaign);
3. per active campaign, diffs Pending tasks against the campaign's schedule group: recreates
   missing schedules with the task's stored token (overdue ones fire as soon as possible) and
   deletes orphans (task final, missing, re-planned, or campaign paused/cancelled);
4. recovers Running tasks claimed longer than ``stale_after`` ago: policy ``retry`` puts them
   back to Pending with a new schedule (at-least-once: the email may go out twice if the lost
   worker had already handed it to the provider); policy ``fail`` marks them Failed with
   "outcome unknown" (at-most-once: an email may be lost, never duplicated);
5. re-plans active campaigns with a Pending email more than ``max_lateness`` overdue (the
   catch-up of :mod:`sendqueue.services.planning.recovery`), before step 3 recreates any schedule;
6. marks active campaigns with no Pending or Running task completed, and reopens a completed
   campaign that still has one (a store with eventually consistent queries completed it early).

Workers keep sending during a pass, so what the pass read may be out of date by the time it
acts. Each repair of steps 3 and 4 checks its candidate again just before (see
:meth:`Reconciler._recreate` and :meth:`Reconciler._still_stale`); a candidate that resolved
itself is counted in ``skipped_in_flight`` and logged at INFO, not repaired.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta

from sendqueue.domain.errors import Conflict, SchedulerError
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import Campaign, Task, expected_schedule_name, schedule_group
from sendqueue.domain.transitions import TaskChange, fail, retry_into
from sendqueue.domain.wording import plural
from sendqueue.ports import Clock, Events, LeasedCampaignTasks, NoEvents, Scheduler
from sendqueue.services.campaigns.controls import CampaignControls
from sendqueue.services.config import ServiceConfig
from sendqueue.services.planning.capacity import CapacityPlanner
from sendqueue.services.planning.recovery import Recovery
from sendqueue.services.planning.replanning import Replanner, iter_tasks
from sendqueue.services.scheduling.provisioning import Continuation, Provisioner
from sendqueue.services.scheduling.schedules import ScheduleWriter
from sendqueue.services.sequences.followups import FollowUps
from sendqueue.services.task_changes import apply_change

__all__ = ["ReconcileReport", "Reconciler"]

log = logging.getLogger(__name__)
LEASE = "reconciler"

#: Missing-schedule candidates checked again, then recreated, at a time (one bulk write).
_RECHECK_CHUNK = 1000


def _same_pending(read: Task, current: Task) -> bool:
    """``current`` is the Pending task ``read`` was: same schedule name, token and send time."""
    return current.state is TaskState.PENDING and (
        current.attempts, current.token, current.send_at
    ) == (read.attempts, read.token, read.send_at)  # fmt: skip


#: Each repair of a report in words: its counter, its noun and what was done.
_REPAIRS = (
    ("missing_schedules_created", "missing schedule", "created"),
    ("orphan_schedules_deleted", "orphan schedule", "deleted"),
    ("stale_retried", "stale Running email", "given back to Pending"),
    ("stale_failed", "stale Running email", "failed"),
    ("overdue_moved", "overdue email", "moved"),
    ("provisioning_resumed", "provisioning run", "resumed"),
    ("cancels_finished", "cancel", "finished"),
    ("campaigns_completed", "campaign", "completed"),
    ("campaigns_reopened", "campaign", "reopened"),
    ("bookings_released", "sender booking", "released"),
    ("follow_ups_made", "missing later step", "made"),
)

#: How long after a campaign ended its tasks' sender slots are still swept for leftovers.
_SWEEP_FINAL_FOR = timedelta(days=1)
#: Marks of sends this recent are a live worker's: its process makes them within 20 lingers
#: (at most 200 s, the setting being at most 10 s); the sweep for missing next steps leaves
#: such sends out too.
_MARKS_SETTLE = timedelta(minutes=5)


@dataclass
class ReconcileReport:
    """What one pass found and repaired."""

    ran: bool = True
    campaigns_checked: int = 0
    schedules_checked: int = 0
    missing_schedules_created: int = 0
    orphan_schedules_deleted: int = 0
    stale_retried: int = 0
    stale_failed: int = 0
    overdue_moved: int = 0
    provisioning_resumed: int = 0
    cancels_finished: int = 0
    campaigns_completed: int = 0
    campaigns_reopened: int = 0
    #: Sender slots freed that Cancelled or Failed tasks still held (a cancel by feedback, or
    #: one interrupted by a crash).
    bookings_released: int = 0
    #: Later steps of sequences made because a crash kept them from being made at the send.
    follow_ups_made: int = 0
    #: Not repairs: candidates that resolved themselves before the repair, found when checked
    #: again just before it (a task sent since the listing that showed its schedule missing;
    #: a stale Running task that finished, or was given back and claimed again, since read).
    skipped_in_flight: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def repairs(self) -> int:
        return (
            self.missing_schedules_created
            + self.orphan_schedules_deleted
            + self.stale_retried
            + self.stale_failed
            + self.overdue_moved
            + self.provisioning_resumed
            + self.cancels_finished
            + self.campaigns_completed
            + self.campaigns_reopened
            + self.bookings_released
            + self.follow_ups_made
        )

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "repairs": self.repairs}

    def repairs_text(self) -> str:
        """The repairs in words: ``2 repairs: 1 missing schedule created, 1 campaign
        completed``, or ``no repairs``."""
        done = [
            f"{plural(getattr(self, key), noun)} {verb}"
            for key, noun, verb in _REPAIRS
            if getattr(self, key)
        ]
        return f"{plural(self.repairs, 'repair')}: {', '.join(done)}" if done else "no repairs"


class Reconciler:
    """See the module docstring."""

    def __init__(
        self,
        store: LeasedCampaignTasks,
        scheduler: Scheduler,
        writer: ScheduleWriter,
        campaigns: CampaignControls,
        provisioner: Provisioner,
        clock: Clock,
        config: ServiceConfig,
        *,
        replanner: Replanner,
        capacity: CapacityPlanner,
        recovery: Recovery,
        events: Events | None = None,
        followups: FollowUps | None = None,
    ) -> None:
        self._store = store
        self._followups = followups
        self._scheduler = scheduler
        self._writer = writer
        self._campaigns = campaigns
        self._replanner = replanner
        self._capacity = capacity
        self._recovery = recovery
        self._provisioner = provisioner
        self._clock = clock
        self._config = config
        self._owner = secrets.token_hex(8)
        self._events: Events = events if events is not None else NoEvents()

    def run(
        self,
        *,
        time_left: Callable[[], float] | None = None,
        continuation: Continuation | None = None,
    ) -> ReconcileReport:
        """One pass. Returns ``ran=False`` when another pass holds the lease.

        ``time_left`` and ``continuation`` go to every provisioning run the pass resumes (see
        :meth:`Provisioner.provision`): a process with a deadline (the reconcile Lambda) stops
        it ``provision_margin`` seconds before and hands the rest on.
        """
        report = ReconcileReport()
        with self._recovery.watch.store_calls():  # overdue sends name it later
            leased = self._store.acquire_lease(
                LEASE, self._owner, ttl_seconds=self._config.reconcile_lease_seconds,
                at=self._clock.now(),
            )  # fmt: skip
        if not leased:
            report.ran = False
            return report
        try:
            self._stale_running(report)
            report.overdue_moved += self._recovery.catch_up_overdue()
            for campaign in self._store.list_campaigns():
                self._renew()
                report.campaigns_checked += 1
                try:
                    self._campaign(campaign, report, time_left, continuation)
                except SchedulerError as exc:
                    report.errors.append(f"{campaign.id}: {exc}")
                    log.warning("reconciling %s failed: %s", campaign.id, exc)
        finally:
            self._store.release_lease(LEASE, self._owner)
        for kind in (
            "missing_schedules_created", "orphan_schedules_deleted", "stale_retried",
            "stale_failed", "overdue_moved", "provisioning_resumed", "cancels_finished",
            "campaigns_completed",
            "campaigns_reopened", "follow_ups_made",
        ):  # fmt: skip
            value = getattr(report, kind)
            if value:
                self._events.repaired(kind, value)
        if report.repairs:
            log.warning("reconciler made %s", report.repairs_text())
        if report.skipped_in_flight:
            log.info(
                "reconciler left %d alone: in flight or changed since it read them, not drift",
                report.skipped_in_flight,
            )
        return report

    def _renew(self) -> None:
        """Keep the lease while the pass goes on. It is short, so a pass whose process died
        blocks the next one only briefly."""
        if not self._store.acquire_lease(
            LEASE, self._owner, ttl_seconds=self._config.reconcile_lease_seconds,
            at=self._clock.now(),
        ):  # fmt: skip
            raise Conflict("the reconciler lease was taken over; stopping this pass")

    def _campaign(
        self,
        campaign: Campaign,
        report: ReconcileReport,
        time_left: Callable[[], float] | None = None,
        continuation: Continuation | None = None,
    ) -> None:
        state = campaign.state
        if campaign.sender_ids and (
            not state.is_final or self._clock.now() - campaign.updated_at < _SWEEP_FINAL_FOR
        ):
            for done in (TaskState.CANCELLED, TaskState.FAILED):
                report.bookings_released += self._campaigns.release_bookings(campaign.id, done)
        if state is CampaignState.PROVISIONING:
            result = self._provisioner.provision(
                campaign.id, time_left=time_left, continuation=continuation
            )
            if result.status in {"done", "continued"}:
                report.provisioning_resumed += 1
            if result.errors and result.status != "busy":
                report.errors.extend(result.errors[:5])
            campaign = self._store.get_campaign(campaign.id)
            state = campaign.state
        if state is CampaignState.CANCELLED:
            if self._store.list_tasks(campaign.id, state=TaskState.PENDING, limit=1):
                report.cancels_finished += 1
            self._campaigns.cancel_pending(campaign.id)
            if self._followups is not None and len(campaign.steps) > 1:
                # its marks are dropped (a cancelled campaign makes no next step)
                self._followups.make_due(campaign.id, now=self._clock.now())
            return
        if state is CampaignState.COMPLETED:
            report.follow_ups_made += self._follow_ups_of_completed(campaign)
        if state is CampaignState.COMPLETED and self._reopen(campaign.id):
            report.campaigns_reopened += 1
            state = CampaignState.ACTIVE
        if (
            self._followups is not None
            and len(campaign.steps) > 1
            and state is not CampaignState.COMPLETED
        ):
            # the marks a dead worker left (an index lookup), then the sweep for steps a send
            # recorded before marks existed, or a step added at the end, left unmade; newer
            # sends' marks are a live worker's to make
            now = self._clock.now()
            settled = now - _MARKS_SETTLE
            made = self._followups.make_due(campaign.id, now=now, sent_before=settled)
            if state in {CampaignState.ACTIVE, CampaignState.PROVISIONING}:
                made += self._followups.repair(campaign, now=now, sent_before=settled)
            report.follow_ups_made += made
        if state in {CampaignState.ACTIVE, CampaignState.PROVISIONING}:
            self._diff(campaign, report)
            if state is CampaignState.ACTIVE and self._campaigns.complete_if_done(campaign.id):
                report.campaigns_completed += 1
            return
        if state in {CampaignState.PAUSED, CampaignState.COMPLETED}:
            report.orphan_schedules_deleted += self._writer.delete_group(
                schedule_group(campaign.id)
            )

    def _follow_ups_of_completed(self, campaign: Campaign) -> int:
        """The later steps of a sequence completed while one was not made (its worker failed
        between the send and the step), looked for during a day after it completed."""
        if self._followups is None or len(campaign.steps) < 2:
            return 0
        if self._clock.now() - campaign.updated_at >= _SWEEP_FINAL_FOR:
            return 0
        going_on = replace(campaign, state=CampaignState.ACTIVE)  # reopened below if one is made
        return self._followups.repair(going_on, now=self._clock.now())

    def _reopen(self, campaign_id: str) -> bool:
        """Give a campaign completed too early back its unfinished emails.

        A store whose task queries are eventually consistent (DynamoDB's indexes) can answer
        "nothing left" a moment before a task that just went back to Pending shows up, and the
        campaign is completed with that task still to send. The worker skips tasks of a
        campaign that is not active, so without this repair the email would wait forever.
        """
        if not self._store.has_unfinished_tasks(campaign_id):
            return False
        return self._store.set_campaign_state(
            campaign_id,
            {CampaignState.COMPLETED},
            CampaignState.ACTIVE,
            at=self._clock.now(),
            reason="reopened by the reconciler: emails were still Pending or Running",
        )

    def _diff(self, campaign: Campaign, report: ReconcileReport) -> None:
        expected: dict[str, Task] = {
            expected_schedule_name(t): t
            for t in iter_tasks(self._store, campaign.id, TaskState.PENDING)
        }
        group = schedule_group(campaign.id)
        orphans: list[str] = []
        after: str | None = None
        while True:
            page = self._scheduler.list(group, after=after, limit=1000)
            for schedule in page:
                report.schedules_checked += 1
                task = expected.pop(schedule.name, None)
                if task is not None:
                    continue
                if self._is_orphan(schedule.name, schedule.payload.get("task_id", "")):
                    orphans.append(schedule.name)
            if len(page) < 1000:
                break
            after = page[-1].name
        if orphans:
            result = self._writer.delete_many(orphans)
            report.orphan_schedules_deleted += result.created
        if expected:
            if campaign.state is CampaignState.PROVISIONING:
                return  # the provisioner creates those; it holds the checkpoint
            self._recreate(list(expected.values()), report)

    def _recreate(self, candidates: list[Task], report: ReconcileReport) -> None:
        """Recreate the schedules of ``candidates`` (Pending tasks the diff found without one)
        that are still missing, a chunk at a time.

        The diff read the tasks before the schedules, so a task a worker sent in between looks
        missing: its schedule deleted itself once the invocation returned. Each candidate is
        read again, its schedule first, then its task, which must still be Pending with the
        token, attempt and send time the diff read. A schedule lives until its invocation
        returns, by which time its task has left Pending under that name, so a task still
        Pending after its schedule was seen gone was not in flight then.
        """
        for start in range(0, len(candidates), _RECHECK_CHUNK):
            if start:
                self._renew()  # a chunk reads each schedule, then its tasks: a mass repair is long
            chunk = candidates[start : start + _RECHECK_CHUNK]
            gone = self._writer.missing([expected_schedule_name(t) for t in chunk])
            unsure = [t for t in chunk if expected_schedule_name(t) in gone]
            current = self._store.get_tasks([t.id for t in unsure]) if unsure else {}
            still = [
                current[t.id] for t in unsure if t.id in current and _same_pending(t, current[t.id])
            ]
            report.skipped_in_flight += len(chunk) - len(still)
            if not still:
                continue
            # A schedule made since the re-check (a re-plan: same name, new token) is newer than
            # what this pass read: kept, not replaced.
            result = self._writer.ensure_many(still, replace=False)
            report.skipped_in_flight += len(result.kept)
            report.missing_schedules_created += result.created
            report.errors.extend(f"{tid}: {err}" for tid, err in result.failed[:5])

    def _is_orphan(self, name: str, task_id: str) -> bool:
        """A schedule nobody needs: its task is gone, final, or Pending under another name.
        A Running task's schedule is in flight and is left alone."""
        task = self._store.get_task(task_id)
        if task is None or task.state.is_final:
            return True
        return task.state is TaskState.PENDING and expected_schedule_name(task) != name

    def _stale_running(self, report: ReconcileReport) -> None:
        now = self._clock.now()
        cutoff = now - timedelta(seconds=self._config.stale_after)
        seen: set[str] = set()  # one left alone stays out of the next page's work
        while True:
            stale = [
                t
                for t in self._store.stale_running(claimed_before=cutoff, limit=500)
                if t.id not in seen
            ]
            if not stale:
                return
            for task in stale:
                seen.add(task.id)
                self._recover(task, report)

    def _still_stale(self, task: Task) -> bool:
        """Is ``task`` still Running under the claim read as stale?

        The transitions below are a compare-and-set on the state only. That refuses a task
        that finished since the read, but not one given back and claimed again (a new attempt,
        in flight now), and a page of stale tasks is read before any is recovered.
        """
        current = self._store.get_task(task.id)
        return (
            current is not None
            and current.state is TaskState.RUNNING
            and (current.attempts, current.claimed_at) == (task.attempts, task.claimed_at)
        )

    def _recover(self, task: Task, report: ReconcileReport) -> None:
        now = self._clock.now()
        unknown = (
            f"outcome unknown: the worker did not finish within {self._config.stale_after:g} s "
            f"of its claim at {task.claimed_at.isoformat() if task.claimed_at else '?'}"
        )
        if self._config.stale_policy == "fail" or task.attempts >= self._config.max_attempts:
            why = (
                unknown
                if self._config.stale_policy == "fail"
                else (f"{unknown}; {task.attempts} attempts used")
            )
            failed = fail(task, why, note=f"stale: {why}")  # the email.failed reason
            if self._still_stale(task) and apply_change(self._store, failed, at=now):
                report.stale_failed += 1
                self._capacity.release([task.id])
            else:
                report.skipped_in_flight += 1
            return
        campaign = self._store.get_campaign(task.campaign_id)
        reason = f"stale: no outcome within {self._config.stale_after:g} s"

        def retry(read: Task, slot: datetime) -> TaskChange | None:
            if not self._still_stale(read):  # finished, or claimed again, since it was read
                return None
            return retry_into(read, slot, reason=reason, error=unknown, note="stale: retry")

        # A free slot of the grid from now on, as a transient retry takes (the lost claim not
        # counted: under policy retry the email counts as not sent).
        [back] = self._replanner.retry_in_free_slots(
            campaign,
            [task],
            retry,
            not_before=now,
            exclude=[task.claimed_at] if task.claimed_at else [],
            at=now,
        )
        if back is None:
            report.skipped_in_flight += 1  # finished, or claimed again, since it was read
            current = self._store.get_task(task.id)
            if current is not None:  # its slot was booked for the retry: put it back
                self._capacity.settle(current)
            return
        report.stale_retried += 1
        if campaign.state in {CampaignState.ACTIVE, CampaignState.PROVISIONING}:
            try:
                self._writer.ensure(back, moved=True)  # a schedule of the lost claim may remain
            except SchedulerError as exc:
                report.errors.append(f"{back.id}: {exc}")
