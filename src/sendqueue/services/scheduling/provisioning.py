"""Provisioning: one task per recipient, then one schedule per task.

The job is checkpointed after every chunk and can stop at any point (crash, time budget) and be
run again: tasks have deterministic ids and are inserted idempotently, schedules are created
with the task's stored client token (idempotent in the execution layer), and the send times are
re-planned from the instant recorded in the first checkpoint, so a resumed run plans exactly
what the first run planned.

Each chunk's addresses are looked up on the suppression list (one batch lookup per chunk): a
suppressed recipient's task is inserted Cancelled, with the reason "suppressed: <reason>", in
the same write as the rest of the chunk, and gets no schedule. It keeps its planned slot (the
plan is by position, so a resumed run plans the same), which then goes unused. A task inserted
by an earlier run is left as it is; an address suppressed since is caught by the send worker.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from zoneinfo import ZoneInfo

from sendqueue.domain.errors import IllegalTransition, InvalidField, SchedulerError
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import (
    CONTROL_GROUP,
    Campaign,
    Recipient,
    Task,
    new_token,
    pending_task,
    task_id,
)
from sendqueue.domain.planner import plan
from sendqueue.domain.senders import Booking
from sendqueue.domain.suppression import Suppression, key_of_normalized, suppressed_reason
from sendqueue.domain.wording import plural
from sendqueue.ports import Clock, LeasedCampaignTasks, Scheduler, SuppressionList
from sendqueue.services.campaigns.controls import complete_if_done
from sendqueue.services.config import ServiceConfig
from sendqueue.services.planning.capacity import (
    CapacityPlanner,
    Placement,
    PlannedRun,
    uses_capacity,
)
from sendqueue.services.scheduling.lease import LeaseLost, OutOfTime, ProvisionLease
from sendqueue.services.scheduling.schedules import ScheduleWriter, WriteReport

__all__ = ["Continuation", "ProvisionProgress", "ProvisionReport", "Provisioner"]

log = logging.getLogger(__name__)


def _cancel_if_listed(task: Task, listed: Mapping[str, Suppression]) -> Task:
    """``task`` to insert Cancelled with its reason when its address is on the list."""
    entry = listed.get(key_of_normalized(task.email))
    if entry is None:
        return task
    return replace(task, state=TaskState.CANCELLED, reason=suppressed_reason(entry.reason))


@dataclass(frozen=True)
class ProvisionProgress:
    """Where a provisioning run is: ``phase`` is ``tasks`` or ``schedules``."""

    campaign_id: str
    phase: str
    done: int
    total: int


@dataclass
class ProvisionReport:
    """What one provisioning run did. ``status``: done, continued, stopped or busy."""

    campaign_id: str
    status: str
    total: int = 0
    tasks_created: int = 0
    schedules_created: int = 0
    throttled: int = 0
    rebooked: int = 0
    """Chunks planned again because another process booked their senders' slots first."""
    suppressed: int = 0
    """The campaign's tasks cancelled because their address is suppressed (when done)."""
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass(frozen=True)
class _InFlight:
    """A chunk whose schedules are being written: its last position, and the wait for them."""

    last: int
    wait: Callable[[], WriteReport]


@dataclass
class _Lane:
    """A tasks phase's schedules: whether each chunk gets them with its tasks, those of the
    chunk last written while they are being written, and where their progress goes."""

    on_track: bool
    progress: Callable[[ProvisionProgress], None] | None
    in_flight: _InFlight | None = None


def _tasks_of(
    campaign: Campaign,
    recipients: list[Recipient],
    sends: list[datetime],
    tokens: str,
    now: datetime,
    listed: Mapping[str, Suppression],
) -> list[Task]:
    """A chunk's tasks of a campaign planned in one go (``sends`` by position), with the
    tokens drawn for the chunk; those of listed addresses to insert Cancelled."""
    tasks = [
        pending_task(
            task_id(campaign.id, r.position), campaign.id, r.position, r.email, r.name,
            r.subject, r.text, r.html, sends[r.position], tokens[32 * i : 32 * i + 32], now,
            timezone=r.timezone,
        )
        for i, r in enumerate(recipients)
    ]  # fmt: skip
    if listed:
        tasks = [_cancel_if_listed(t, listed) for t in tasks]
    return tasks


#: Hands the rest of a run that spent its time to another process: called with the campaign id
#: and the checkpoint just saved, after the provisioning lease is released. It raises when the
#: hand-over failed (the caller's retry, or the reconciler, then resumes from the checkpoint).
Continuation = Callable[[str, dict[str, object]], None]


class Provisioner:
    """Creates a campaign's tasks and schedules; see the module docstring."""

    def __init__(
        self,
        store: LeasedCampaignTasks,
        scheduler: Scheduler,
        writer: ScheduleWriter,
        clock: Clock,
        config: ServiceConfig,
        *,
        continuation: Continuation | None = None,
        suppressions: SuppressionList,
        capacity: CapacityPlanner,
    ) -> None:
        self._store = store
        self._capacity = capacity
        self._suppressions = suppressions
        self._scheduler = scheduler
        self._writer = writer
        self._clock = clock
        self._config = config
        self._continuation = continuation

    def provision(
        self,
        campaign_id: str,
        *,
        time_budget: float | None = None,
        safety_margin: float | None = None,
        progress: Callable[[ProvisionProgress], None] | None = None,
        time_left: Callable[[], float] | None = None,
        continuation: Continuation | None = None,
    ) -> ProvisionReport:
        """Provision the campaign, or continue where an earlier run stopped.

        With ``time_budget`` (seconds), or ``time_left`` (asked before every chunk for the
        seconds left, e.g. a Lambda context's remaining time), stop when less than
        ``safety_margin`` (default ``config.provision_margin``) is left, save the checkpoint and
        hand the rest on: to ``continuation``, else the constructor's, else a control schedule
        in the execution layer, which the running worker picks up.
        """
        started = time.monotonic()
        margin = self._config.provision_margin if safety_margin is None else safety_margin
        deadline: float | None = None
        if time_budget is not None:
            if time_budget <= margin:
                raise InvalidField(
                    "time_budget",
                    time_budget,
                    f"must be larger than the safety margin of {margin:g} s",
                )
            deadline = started + time_budget - margin
        campaign = self._begin(campaign_id)
        report = ProvisionReport(campaign_id, "done", total=campaign.recipient_count)
        if campaign.state is not CampaignState.PROVISIONING:
            return report  # already provisioned: nothing to do
        lease = ProvisionLease(
            self._store, self._clock, campaign_id, self._config.provision_lease_seconds,
            deadline=deadline, time_left=time_left, margin=margin,
        )  # fmt: skip
        if not lease.take():
            report.status = "busy"
            report.errors.append("another process is provisioning this campaign")
            return report
        try:
            self._run(campaign, report, lease.tick, progress)
            return report
        finally:
            report.seconds = time.monotonic() - started
            lease.release()
            if report.status == "continued":
                # After the release: a continuation that starts at once must not find it busy.
                self._continue_later(campaign_id, continuation or self._continuation)

    def _run(
        self,
        campaign: Campaign,
        report: ProvisionReport,
        tick: Callable[[], None],
        progress: Callable[[ProvisionProgress], None] | None,
    ) -> None:
        """Both phases from the checkpoint on, then the campaign made active. A run cut short
        says why in ``report.status``: ``continued`` (out of time, handed on by the caller
        once the lease is released) or ``stopped`` (schedule writes failed)."""
        checkpoint = dict(campaign.checkpoint or {})
        if "plan_start" not in checkpoint:
            checkpoint = {"phase": "tasks", "plan_start": self._clock.now().isoformat()}
            self._store.save_checkpoint(campaign.id, checkpoint, at=self._clock.now())
        try:
            if checkpoint["phase"] == "tasks":
                self._create_tasks(campaign, checkpoint, report, tick, progress)
                # Schedules were created with the tasks up to "scheduled" (all of them unless
                # a scheduler call failed, or an older run began without it).
                scheduled = int(str(checkpoint.get("scheduled", -1)))
                checkpoint = {**checkpoint, "phase": "schedules", "after": scheduled}
                self._store.save_checkpoint(campaign.id, checkpoint, at=self._clock.now())
            if not self._create_schedules(campaign, checkpoint, report, tick, progress):
                report.status = "stopped"
                return
        except OutOfTime:
            report.status = "continued"
            return
        self._activate(campaign.id, checkpoint, report)

    def _activate(
        self, campaign_id: str, checkpoint: dict[str, object], report: ProvisionReport
    ) -> None:
        """Every task and schedule exists: the last checkpoint, and the campaign active."""
        done = {
            "phase": "done",
            "plan_start": checkpoint["plan_start"],
            "finished_at": self._clock.now().isoformat(),
        }
        report.suppressed = self._suppressions.count_suppressed_tasks(campaign_id)
        note = f"provisioned {plural(report.total, 'email')}"
        if report.suppressed:
            note += f", {report.suppressed} suppressed"
        self._store.save_checkpoint(campaign_id, done, at=self._clock.now(), note=note)
        self._store.set_campaign_state(
            campaign_id,
            {CampaignState.PROVISIONING},
            CampaignState.ACTIVE,
            at=self._clock.now(),
            reason="provisioned",
        )
        if report.suppressed:
            # Every email may have been suppressed: then nothing fires to complete it (the
            # reconciler would, up to an interval later).
            complete_if_done(self._store, campaign_id, at=self._clock.now())

    def _begin(self, campaign_id: str) -> Campaign:
        campaign = self._store.get_campaign(campaign_id)
        if campaign.state is CampaignState.DRAFT:
            # A plan that fails here would strand the campaign in provisioning: fail first.
            plan(campaign.policy, campaign.recipient_count, now=self._clock.now())
            self._store.set_campaign_state(
                campaign_id,
                {CampaignState.DRAFT},
                CampaignState.PROVISIONING,
                at=self._clock.now(),
                reason="provisioning",
            )
            return self._store.get_campaign(campaign_id)
        if campaign.state is CampaignState.PROVISIONING:
            return campaign
        if (campaign.checkpoint or {}).get("phase") == "done":
            return campaign
        raise IllegalTransition("campaign", campaign.state.value, "provisioning")

    def _create_tasks(
        self,
        campaign: Campaign,
        checkpoint: dict[str, object],
        report: ProvisionReport,
        tick: Callable[[], None],
        progress: Callable[[ProvisionProgress], None] | None,
    ) -> None:
        plan_start = datetime.fromisoformat(str(checkpoint["plan_start"]))
        # A campaign with senders or local time is planned chunk by chunk over its senders'
        # books, and booked (services/planning/capacity.py); any other as one plan from plan_start.
        capacity = uses_capacity(campaign)
        sends = [] if capacity else plan(campaign.policy, campaign.recipient_count, now=plan_start)
        run: PlannedRun | None = None
        after = int(str(checkpoint.get("after", -1)))
        chunk, total = self._config.provision_chunk, campaign.recipient_count
        # Each chunk's schedules are written while the next chunk is made, and its checkpoint
        # saved once they are ("scheduled" == "after"), before the next chunk's tasks go in: a
        # resumed run finds at most its first chunk's tasks stored. Once a chunk's writes
        # fail, or when resuming a checkpoint without "scheduled" == "after", the rest is left
        # to the schedules phase, which starts after "scheduled".
        lane = _Lane(after < 0 or checkpoint.get("scheduled") == after, progress)

        def land() -> None:
            self._land(campaign, checkpoint, lane, report)

        try:
            while True:
                tick()
                recipients = self._store.list_recipients(campaign.id, after=after, limit=chunk)
                if not recipients:
                    break
                now = self._clock.now()
                # new_token()'s format, drawn in one call instead of one system call per task.
                tokens = secrets.token_hex(16 * len(recipients))
                listed = self._suppressions.suppressed(
                    {key_of_normalized(r.email) for r in recipients}
                )
                if capacity:
                    first = run is None
                    if run is None:
                        run = self._capacity.start_run(campaign, plan_start=plan_start, now=now)
                    tasks, inserted = self._insert_planned(
                        campaign, run, recipients, listed, tokens, now, plan_start,
                        resumed=first, land=land,
                    )  # fmt: skip
                    report.rebooked = run.rebooked
                else:
                    tasks = _tasks_of(campaign, recipients, sends, tokens, now, listed)
                    land()
                    inserted = self._store.insert_tasks(tasks, at=now)
                report.tasks_created += inserted
                last = recipients[-1].position
                if progress:
                    progress(ProvisionProgress(campaign.id, "tasks", last + 1, total))
                if lane.on_track:
                    started = self._start_schedules(campaign, tasks, inserted, after, last)
                    lane.in_flight = _InFlight(last, started)
                else:
                    self._chunk_done(campaign, checkpoint, last, None, progress)
                after = last
                if len(recipients) < chunk:
                    break
        except BaseException as exc:
            # Nothing is left writing; the chunk is checkpointed unless another process has
            # the campaign now, and an error of its own is logged, not raised over this one.
            self._land_quietly(
                campaign, checkpoint, lane, report, save=not isinstance(exc, LeaseLost)
            )
            raise
        self._land(campaign, checkpoint, lane, report)

    def _start_schedules(
        self, campaign: Campaign, tasks: list[Task], inserted: int, after: int, last: int
    ) -> Callable[[], WriteReport]:
        """Start writing the schedules of the chunk just written (``tasks``: its positions
        after ``after`` up to ``last``); the result waits for them (:meth:`_land`)."""
        if inserted < len(tasks):
            # Some existed already (a resumed run): schedule what the store holds, with its
            # tokens, not the tasks built here, which were not stored.
            stored = self._store.list_tasks(
                campaign.id,
                state=TaskState.PENDING,
                after=after,
                limit=self._config.provision_chunk,
                step=1,
            )
            tasks = [t for t in stored if t.position <= last]
        return self._writer.start_many([t for t in tasks if t.state is TaskState.PENDING])

    def _land(
        self,
        campaign: Campaign,
        checkpoint: dict[str, object],
        lane: _Lane,
        report: ProvisionReport,
    ) -> None:
        """Wait for the schedule writes in flight, if any, and save their chunk's checkpoint;
        when some failed, the rest is left to the schedules phase (``lane.on_track`` off)."""
        in_flight, lane.in_flight = lane.in_flight, None
        if in_flight is None:
            return
        result = in_flight.wait()
        report.throttled += result.throttled
        report.schedules_created += result.created
        if result.failed:
            log.warning(
                "provisioning %s: %s failed (first: %s); the schedules phase retries them",
                campaign.id,
                plural(len(result.failed), "schedule write"),
                result.failed[0][1],
            )
        lane.on_track = not result.failed
        scheduled = in_flight.last if lane.on_track else None
        self._chunk_done(campaign, checkpoint, in_flight.last, scheduled, lane.progress)

    def _land_quietly(
        self,
        campaign: Campaign,
        checkpoint: dict[str, object],
        lane: _Lane,
        report: ProvisionReport,
        *,
        save: bool,
    ) -> None:
        """:meth:`_land` while an error ends the tasks phase (a run out of time included): its
        own error is logged; with ``save`` off, the writes are waited for and nothing saved."""
        try:
            if save:
                self._land(campaign, checkpoint, lane, report)
            elif lane.in_flight is not None:
                lane.in_flight.wait()
        except Exception:
            log.exception("provisioning %s: the last chunk's checkpoint was not saved", campaign.id)

    def _chunk_done(
        self,
        campaign: Campaign,
        checkpoint: dict[str, object],
        after: int,
        scheduled: int | None,
        progress: Callable[[ProvisionProgress], None] | None,
    ) -> None:
        """The checkpoint of a chunk whose tasks are written up to position ``after`` (and, but
        for None, its schedules through ``scheduled``), and the schedules' progress."""
        total = campaign.recipient_count
        checkpoint.update(after=after)
        note = f"tasks {after + 1}/{total}"
        if scheduled is not None:
            checkpoint.update(scheduled=scheduled)
            note += f", schedules {scheduled + 1}/{total}"
        self._store.save_checkpoint(campaign.id, checkpoint, at=self._clock.now(), note=note)
        if progress and scheduled is not None:
            progress(ProvisionProgress(campaign.id, "schedules", scheduled + 1, total))

    def _insert_planned(
        self,
        campaign: Campaign,
        run: PlannedRun,
        recipients: list[Recipient],
        listed: Mapping[str, Suppression],
        tokens: str,
        now: datetime,
        plan_start: datetime,
        *,
        resumed: bool,
        land: Callable[[], None],
    ) -> tuple[list[Task], int]:
        """Plan the chunk's new recipients over the senders' books, and insert the chunk's
        tasks with their bookings in one write (planned and written again when another
        process booked first). A suppressed recipient (inserted Cancelled) books nothing; in
        the first chunk of a run, tasks an earlier run stored (it stopped between their insert
        and its checkpoint) keep their plan and booking. ``land`` is called right before the
        write. Returns the tasks built and how many were inserted."""
        ids = [task_id(campaign.id, r.position) for r in recipients]
        fresh = list(zip(recipients, ids, strict=True))
        if listed:
            fresh = [(r, tid) for r, tid in fresh if key_of_normalized(r.email) not in listed]
        if resumed:
            stored = self._store.get_tasks([tid for _, tid in fresh])
            fresh = [(r, tid) for r, tid in fresh if tid not in stored]
        items = [(tid, r.email, r.timezone) for r, tid in fresh]
        unplaced: Placement = (plan_start, None, None)  # a suppressed one's (never sent)

        def write(placements: list[Placement], bookings: list[Booking]) -> tuple[list[Task], int]:
            wheres = placements  # every recipient planned, in order: the common case
            if len(fresh) < len(recipients):
                placed = {tid: p for (_, tid), p in zip(fresh, placements, strict=True)}
                wheres = [placed.get(tid, unplaced) for tid in ids]
            tasks = [
                pending_task(
                    tid, campaign.id, r.position, r.email, r.name, r.subject, r.text, r.html,
                    at, tokens[32 * i : 32 * i + 32], now, sender_id, sender, r.timezone,
                )
                for i, (r, tid, (at, sender_id, sender)) in enumerate(
                    zip(recipients, ids, wheres, strict=True)
                )
            ]  # fmt: skip
            if listed:
                tasks = [_cancel_if_listed(t, listed) for t in tasks]
            land()
            return tasks, self._store.insert_tasks(tasks, at=now, bookings=bookings)

        return self._capacity.plan_chunk(campaign, run, items, write)

    def _create_schedules(
        self,
        campaign: Campaign,
        checkpoint: dict[str, object],
        report: ProvisionReport,
        tick: Callable[[], None],
        progress: Callable[[ProvisionProgress], None] | None,
    ) -> bool:
        after = int(str(checkpoint.get("after", -1)))
        chunk = self._config.provision_chunk
        total = campaign.recipient_count
        while True:
            tick()
            # step 1 only: a sequence's later steps get their schedules when they are made
            tasks = self._store.list_tasks(
                campaign.id, state=TaskState.PENDING, after=after, limit=chunk, step=1
            )
            if not tasks:
                return True
            result = self._writer.ensure_many(tasks)
            report.throttled += result.throttled
            report.schedules_created += result.created
            if result.failed:
                report.errors.extend(f"{tid}: {err}" for tid, err in result.failed[:20])
                log.error(
                    "provisioning %s stopped: %s failed; checkpoint kept at "
                    "position %d, run it again or let the reconciler resume it",
                    campaign.id,
                    plural(len(result.failed), "schedule write"),
                    after,
                )
                return False
            after = tasks[-1].position
            checkpoint.update(after=after)
            self._store.save_checkpoint(
                campaign.id,
                checkpoint,
                at=self._clock.now(),
                note=f"schedules {after + 1}/{total}",
            )
            if progress:
                progress(ProvisionProgress(campaign.id, "schedules", after + 1, total))
            if len(tasks) < chunk:
                return True

    def _continue_later(self, campaign_id: str, continuation: Continuation | None) -> None:
        """Hand the rest on: to ``continuation`` with the saved checkpoint, or by default to the
        execution layer, as a control schedule due now whose invocation runs :meth:`provision`
        again in the worker process."""
        if continuation is not None:
            checkpoint = dict(self._store.get_campaign(campaign_id).checkpoint or {})
            continuation(campaign_id, checkpoint)
            log.info("provisioning %s: time budget spent, continuation handed on", campaign_id)
            return
        now = self._clock.now()
        try:
            self._scheduler.create(
                f"sq-provision-{campaign_id}-{secrets.token_hex(4)}",
                CONTROL_GROUP,
                now.astimezone(ZoneInfo("UTC")).replace(tzinfo=None, microsecond=0),
                "UTC",
                {"kind": "provision", "campaign_id": campaign_id},
                new_token(),
            )
        except SchedulerError as exc:
            log.warning(
                "continuation of %s not scheduled (%s); the reconciler resumes it", campaign_id, exc
            )
        log.info("provisioning %s: time budget spent, continuation scheduled", campaign_id)
