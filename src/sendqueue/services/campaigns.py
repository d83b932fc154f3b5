"""Campaign use cases: create, preview, cancel, pause, resume, retry-failed, cancel one task.

Every control keeps the same rules: a campaign state change is a compare-and-set in the store,
tasks move only along the lifecycle table, and schedules follow the tasks (deleted on pause and
cancel, re-planned from now on resume and retry-failed). A crash between two steps leaves
nothing the reconciler cannot repair.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import BinaryIO, cast

from sendqueue.domain import transitions
from sendqueue.domain.addresses import normalize_sender
from sendqueue.domain.errors import IllegalTransition, InvalidField, NotFound
from sendqueue.domain.lifecycle import (
    CampaignState,
    StopOnReply,
    TaskState,
    check_campaign_transition,
)
from sendqueue.domain.models import (
    Campaign,
    Recipient,
    Task,
    expected_schedule_name,
    new_campaign_id,
    schedule_group,
)
from sendqueue.domain.outages import Outage, OutageCause
from sendqueue.domain.planner import plan
from sendqueue.domain.policy import SendingPolicy
from sendqueue.domain.wording import plural
from sendqueue.ports import Clock, SenderStore, TaskStore
from sendqueue.services.config import ServiceConfig
from sendqueue.services.import_stream import CheckedImport, check_csv, check_rows
from sendqueue.services.importing import ImportLimits, Templates
from sendqueue.services.previews import PlanSummary, Previews, ZoneDays
from sendqueue.services.recovery import Recovery
from sendqueue.services.replanning import Replanner, iter_tasks
from sendqueue.services.scheduling import ScheduleWriter
from sendqueue.services.senders import SenderService
from sendqueue.services.task_changes import apply_change

__all__ = [
    "PREVIEW_CACHE_SIZE",
    "PREVIEW_SENDS",
    "CampaignService",
    "CreatedCampaign",
    "Draft",
    "PlanSummary",
    "ZoneDays",
    "iter_tasks",
]

log = logging.getLogger(__name__)

MAX_NAME_CHARS = 200
_PAGE = 1000
#: Sends a plan summary lists one by one; campaign plans it keeps (least recently used go).
PREVIEW_SENDS = 1000
PREVIEW_CACHE_SIZE = 16


def _next_minute(now: datetime) -> datetime:
    floor = now.replace(second=0, microsecond=0)
    return floor if floor == now else floor + timedelta(minutes=1)


@dataclass(frozen=True)
class CreatedCampaign:
    campaign: Campaign
    imported: CheckedImport


@dataclass(frozen=True)
class Draft:
    """A campaign checked by :meth:`CampaignService.validate` and not stored: what a preview
    shows and what :meth:`CampaignService.create` writes."""

    name: str
    from_addr: str
    reply_to: str | None
    imported: CheckedImport
    """Counts and first addresses; the recipients are read again from the source on
    demand, so a stream source must stay open until the draft is created."""
    stop_on_reply: StopOnReply = StopOnReply.SENDER
    unsubscribe_footer: bool = False
    sender_ids: tuple[str, ...] = ()
    """The senders (ids) the recipients are spread across; empty: ``from_addr`` sends."""
    local_time: bool = False
    """Windows read in each recipient's zone (the CSV's ``timezone`` column)."""


class CampaignService:
    """The campaign controls the CLI, the API and the worker share."""

    def __init__(
        self,
        store: TaskStore,
        writer: ScheduleWriter,
        clock: Clock,
        config: ServiceConfig,
    ) -> None:
        self._store = store
        self._writer = writer
        self._clock = clock
        self._config = config
        self._previews: OrderedDict[tuple[object, ...], PlanSummary] = OrderedDict()
        self._previews_lock = threading.Lock()
        self.replanner = Replanner(store, writer, clock, config)
        self.recovery = Recovery(store, self.replanner, clock, config)
        # Every task store keeps the senders too (ports.SenderStore).
        self.senders = SenderService(
            cast(SenderStore, store), clock, default_timezone=config.default_timezone
        )

    # -- create and read ----------------------------------------------------------------
    def validate(
        self,
        *,
        name: str,
        recipients: bytes | str | os.PathLike[str] | BinaryIO | None = None,
        rows: Sequence[Mapping[str, object]] | None = None,
        from_addr: str | None = None,
        reply_to: str | None = None,
        templates: Templates | None = None,
        limits: ImportLimits | None = None,
        stop_on_reply: StopOnReply | str = StopOnReply.SENDER,
        unsubscribe_footer: bool = False,
        senders: Sequence[str] = (),
        local_time: bool = False,
    ) -> Draft:
        """Check a new campaign without writing anything.

        The recipients come either as a CSV (``recipients``: bytes, a path or a binary stream)
        or as mappings (``rows``, see
        :func:`~sendqueue.services.import_rows.parse_recipient_rows`). ``stop_on_reply`` is a
        :class:`StopOnReply` or its spelling in any case; ``unsubscribe_footer`` a bool;
        ``senders`` names senders by id or address (InvalidField ``senders`` for an unknown
        one); ``local_time`` a bool. Raises InvalidField / InvalidInput.
        """
        if (recipients is None) == (rows is None):
            raise TypeError("give either recipients (CSV) or rows")
        clean_name = name.strip() if isinstance(name, str) else ""
        if not clean_name:
            raise InvalidField("name", name, "give the campaign a name")
        if len(clean_name) > MAX_NAME_CHARS or any(
            ord(c) < 32 or 0x7F <= ord(c) < 0xA0 or c in "\u2028\u2029" for c in clean_name
        ):
            raise InvalidField(
                "name",
                name,
                f"one line of at most {MAX_NAME_CHARS} characters, without control characters",
            )
        sender = normalize_sender(from_addr or self._config.default_from, "from")
        reply = normalize_sender(reply_to, "reply_to") if reply_to else None
        scope = StopOnReply.parse(stop_on_reply, field="stop_on_reply")
        if not isinstance(unsubscribe_footer, bool):
            raise InvalidField("unsubscribe_footer", unsubscribe_footer, "true or false")
        if not isinstance(local_time, bool):
            raise InvalidField("local_time", local_time, "true or false")
        if isinstance(senders, str):
            senders = [senders]
        sender_ids = self.senders.resolve(list(senders)) if senders else ()
        if rows is not None:
            imported = check_rows(
                rows, templates=templates or Templates(), limits=limits or ImportLimits()
            )
        else:
            assert recipients is not None
            imported = check_csv(
                recipients, templates=templates or Templates(), limits=limits or ImportLimits()
            )
        if not imported.count:
            raise InvalidField("recipients", imported.rows, "the file has no recipient rows")
        return Draft(
            clean_name, sender, reply, imported, scope, unsubscribe_footer, sender_ids, local_time
        )

    def create(
        self,
        *,
        name: str,
        recipients: bytes | str | os.PathLike[str] | BinaryIO,
        policy: SendingPolicy,
        from_addr: str | None = None,
        reply_to: str | None = None,
        templates: Templates | None = None,
        limits: ImportLimits | None = None,
        stop_on_reply: StopOnReply | str = StopOnReply.SENDER,
        unsubscribe_footer: bool = False,
        senders: Sequence[str] = (),
        local_time: bool = False,
    ) -> CreatedCampaign:
        """Validate everything, then store the campaign and its recipients whole, as a draft.

        Raises InvalidField / InvalidInput before anything is written.
        """
        draft = self.validate(
            name=name,
            recipients=recipients,
            from_addr=from_addr,
            reply_to=reply_to,
            templates=templates,
            limits=limits,
            stop_on_reply=stop_on_reply,
            unsubscribe_footer=unsubscribe_footer,
            senders=senders,
            local_time=local_time,
        )
        return self.create_draft(draft, policy)

    def create_from_rows(
        self,
        *,
        name: str,
        rows: Sequence[Mapping[str, object]],
        policy: SendingPolicy,
        from_addr: str | None = None,
        reply_to: str | None = None,
        templates: Templates | None = None,
        limits: ImportLimits | None = None,
        stop_on_reply: StopOnReply | str = StopOnReply.SENDER,
        unsubscribe_footer: bool = False,
        senders: Sequence[str] = (),
        local_time: bool = False,
    ) -> CreatedCampaign:
        """:meth:`create` with the recipients as mappings (the API's JSON rows)."""
        draft = self.validate(
            name=name,
            rows=rows,
            from_addr=from_addr,
            reply_to=reply_to,
            templates=templates,
            limits=limits,
            stop_on_reply=stop_on_reply,
            unsubscribe_footer=unsubscribe_footer,
            senders=senders,
            local_time=local_time,
        )
        return self.create_draft(draft, policy)

    def create_draft(self, draft: Draft, policy: SendingPolicy) -> CreatedCampaign:
        """Store a validated :class:`Draft` with its policy."""
        return self.create_from_recipients(
            name=draft.name,
            recipients=draft.imported.recipients(),
            count=draft.imported.count,
            policy=policy,
            from_addr=draft.from_addr,
            reply_to=draft.reply_to,
            imported=draft.imported,
            stop_on_reply=draft.stop_on_reply,
            unsubscribe_footer=draft.unsubscribe_footer,
            sender_ids=draft.sender_ids,
            local_time=draft.local_time,
        )

    def create_from_recipients(
        self,
        *,
        name: str,
        recipients: Iterable[Recipient],
        count: int,
        policy: SendingPolicy,
        from_addr: str,
        reply_to: str | None,
        imported: CheckedImport,
        stop_on_reply: StopOnReply = StopOnReply.SENDER,
        unsubscribe_footer: bool = False,
        sender_ids: tuple[str, ...] = (),
        local_time: bool = False,
    ) -> CreatedCampaign:
        """Store ``count`` recipients, streamed into the store in chunks (all or nothing)."""
        self.check_plannable(policy, count)
        now = self._clock.now()
        campaign = Campaign(
            id=new_campaign_id(),
            name=name,
            policy=policy,
            from_addr=from_addr,
            reply_to=reply_to,
            recipient_count=count,
            created_at=now,
            updated_at=now,
            stop_on_reply=stop_on_reply,
            unsubscribe_footer=unsubscribe_footer,
            sender_ids=tuple(sender_ids),
            local_time=local_time,
        )
        self._store.create_campaign(campaign, recipients)
        stored = self._store.get_campaign(campaign.id)
        log.info("created campaign %s (%s) with %s", campaign.id, name, plural(count, "recipient"))
        return CreatedCampaign(stored, imported)

    def check_plannable(self, policy: SendingPolicy, count: int) -> None:
        """Refuse a policy under which ``count`` sends cannot be planned from now, before
        anything is written: a draft that provisioning could never plan would otherwise be
        stored, then stranded in provisioning.

        Raises NoSendingDay (every allowed day for two years is skipped or has no window time
        left) or InvalidField naming ``start`` (too late for even one send before the year
        10000) or ``policy`` (the sends would run past it).
        """
        now = self._clock.now()
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
            self.check_plannable(campaign.policy, campaign.recipient_count)
        self._move(campaign_id, {CampaignState.DRAFT}, CampaignState.PROVISIONING, "provisioning")
        self._forget_previews(campaign_id)
        return self._store.get_campaign(campaign_id)

    def preview_summary(self, campaign_id: str) -> PlanSummary:
        """The plan of a stored campaign from now, as a summary: cached per campaign.

        Planning a million sends takes seconds, and a page asks again and again. The key holds
        everything the plan depends on: the campaign (its state and ``updated_at`` change on
        every write), its policy and recipient count, and "now" rounded up to the minute; the
        plan starts at that minute, so each send is at most a minute later than planned from
        the exact instant. Provisioning drops the campaign's entries.

        A local-time campaign is planned in each recipient's zone; the summary counts its
        sends per day of the campaign's timezone (``days``) and per recipient zone in that
        zone's days (``zones``); see :mod:`sendqueue.services.previews`.
        """
        campaign = self._store.get_campaign(campaign_id)
        start = _next_minute(self._clock.now())
        key = (
            campaign.id,
            campaign.state,
            campaign.updated_at,
            campaign.policy,
            campaign.recipient_count,
            campaign.local_time,
            campaign.sender_ids,
            start,
        )
        with self._previews_lock:
            cached = self._previews.get(key)
            if cached is not None:
                self._previews.move_to_end(key)
                return cached
        summary = Previews(self._store, self.replanner.capacity).summary(
            campaign, start, shown=PREVIEW_SENDS
        )
        with self._previews_lock:
            self._previews[key] = summary
            while len(self._previews) > PREVIEW_CACHE_SIZE:
                self._previews.popitem(last=False)
        return summary

    def draft_summary(self, draft: Draft, policy: SendingPolicy) -> PlanSummary:
        """A draft's plan if it were provisioned now, summarized as a stored campaign's
        preview is (first sends in time order, each with its zone): over its senders' books
        as they are (nothing booked), in each recipient's zone for local time."""
        campaign = Campaign(
            id="draft", name=draft.name, policy=policy, from_addr=draft.from_addr,
            sender_ids=draft.sender_ids, local_time=draft.local_time,
        )  # fmt: skip
        imported = draft.imported
        return Previews(self._store, self.replanner.capacity).unsaved(
            campaign, imported.count, imported.first_emails, imported.recipients,
            self._clock.now(), shown=PREVIEW_SENDS,
        )  # fmt: skip

    def _forget_previews(self, campaign_id: str) -> None:
        with self._previews_lock:
            for key in [k for k in self._previews if k[0] == campaign_id]:
                del self._previews[key]

    def preview(self, campaign_id: str) -> list[tuple[Recipient, datetime]]:
        """The plan for the campaign's recipients from now: (recipient, send instant) pairs,
        in recipient order (a local-time campaign's sends are in each recipient's zone, so
        not in time order)."""
        campaign = self._store.get_campaign(campaign_id)
        return Previews(self._store, self.replanner.capacity).pairs(campaign, self._clock.now())

    # -- controls -------------------------------------------------------------------------
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
                freed += self.replanner.capacity.release(batch)
                batch = []
        return freed + self.replanner.capacity.release(batch)

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
        self.replanner.replan_pending(
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
        retried = self.replanner.retry_in_free_slots(
            campaign,
            failed,
            lambda task, slot: transitions.retry_into(task, slot, reason=again, note=again),
            not_before=now,
            at=now,
        )
        back = [task for task in retried if task is not None]
        if campaign.state is CampaignState.PAUSED:
            # A paused campaign holds no sender capacity: resume books these with the rest.
            self.replanner.capacity.release([t.id for t in back if t.sender_id is not None])
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
        self.replanner.capacity.release([task_id])
        self.complete_if_done(task.campaign_id)
        return done

    def complete_if_done(self, campaign_id: str) -> bool:
        """Mark an active campaign completed when no Pending or Running task is left."""
        return complete_if_done(self._store, campaign_id, at=self._clock.now())


def complete_if_done(store: TaskStore, campaign_id: str, *, at: datetime) -> bool:
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
