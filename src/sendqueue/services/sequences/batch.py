"""Later steps made many at a time: the next steps of a batch of sent steps, with one read of
each kind, one lease, one slot search per due instant, one insert and one call for the
schedules.

The send worker's finish marks a sent step that has a next one (``finish_send(follow_up=
True)``); :meth:`BatchMaker.make` makes the next steps of the marked tasks it is given, under
the rules :mod:`sendqueue.services.sequences.followups` states for one (the delay, the return
date, stops, rendering, follow-ups first), and the caller then clears their marks. Why this
shape: docs/decisions/0008-follow-ups-in-batches.md.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from datetime import date, datetime

from sendqueue.domain.errors import InvalidField, NoSendingDay
from sendqueue.domain.followups import first_instant_on, follow_up_earliest
from sendqueue.domain.followups_first import on_time_until
from sendqueue.domain.lifecycle import CampaignState, TaskOutcome, TaskState
from sendqueue.domain.models import Campaign, Recipient, Task, new_token, pending_task, task_id
from sendqueue.domain.policy import load_timezone
from sendqueue.domain.steps import Delay
from sendqueue.domain.suppression import key_of_normalized
from sendqueue.ports import FeedbackOutcomes, FollowUpStore, SuppressionList
from sendqueue.services.planning.replanning import RETRY_LEASE_WAIT, Replanner
from sendqueue.services.scheduling.schedules import ScheduleWriter
from sendqueue.services.sequences.first import FollowUpsFirst
from sendqueue.services.sequences.render import StepRenderer

__all__ = ["GOING_ON", "BatchMaker", "stop_reason"]

log = logging.getLogger(__name__)

#: States of a campaign in which a recipient's sequence goes on.
GOING_ON = frozenset({CampaignState.ACTIVE, CampaignState.PAUSED, CampaignState.PROVISIONING})
#: Positions a read of recipients' rows may span for each row it needs: rows are read as a
#: range, and a wide one for a few scattered positions would cost more than a read each.
_ROWS_SPAN = 4
#: At most this many rows in one read of recipients.
_ROWS_READ = 1000


def stop_reason(earlier: Sequence[Task]) -> str | None:
    """Why a recipient's sequence ends after ``earlier`` (their tasks of the steps before, in
    step order), or None while it goes on."""
    for task in earlier:
        if task.state in (TaskState.CANCELLED, TaskState.FAILED):
            return f"step {task.step} {task.state.value}: the sequence stopped"
        if task.outcome is not None and task.outcome is not TaskOutcome.ACCEPTED:
            return f"step {task.step} {task.outcome.value}: the sequence stopped"
    return None


def _day_key(
    campaign: Campaign, after: Delay, sent_at: datetime, zone: str | None
) -> tuple[object, ...] | None:
    """What a follow-up's earliest instant depends on when ``after`` counts sending days:
    the local date of the send and the zone; None for elapsed time (its own instant)."""
    if after.elapsed is not None:
        return None
    local = sent_at.astimezone(load_timezone(zone, "zone") if zone else campaign.policy.zone)
    return (after, zone, local.date())


def _on_time_until(campaign: Campaign, earliest: datetime, zone: str | None) -> datetime | None:
    """When a follow-up due at ``earliest`` is late (:func:`on_time_until`); None when that
    cannot be known (no second sending day in reach): let the full rule decide."""
    try:
        return on_time_until(campaign.policy, earliest, zone)
    except (InvalidField, NoSendingDay):
        return None


def _task_at(item: _Due, slot: datetime) -> Task:
    """The Pending task of ``item``, rendered, at ``slot``."""
    draft = item.draft
    subject, text, html = item.text
    return pending_task(
        draft.id, draft.campaign_id, draft.position, draft.email, draft.name, subject, text,
        html, slot, draft.token, draft.created_at, draft.sender_id, draft.sender, draft.timezone,
        draft.step,
    )  # fmt: skip


@dataclass(slots=True)
class _Due:
    """A next step to make: the sent step it follows, its draft (no text, no slot yet), its
    earliest instant, and its subject, text and html once rendered."""

    sent: Task
    draft: Task
    earliest: datetime
    text: tuple[str, str, str | None] = ("", "", None)


class BatchMaker:
    """Makes the next steps of many sent steps of one campaign together (module docstring)."""

    def __init__(
        self,
        store: FollowUpStore,
        suppressions: SuppressionList,
        replanner: Replanner,
        writer: ScheduleWriter,
        renderer: StepRenderer,
        first: FollowUpsFirst,
        away: FeedbackOutcomes,
    ) -> None:
        self._store = store
        self._suppressions = suppressions
        self._replanner = replanner
        self._writer = writer
        self._renderer = renderer
        self._first = first
        self._away = away

    def make(
        self, campaign: Campaign, marked: Sequence[Task], *, now: datetime
    ) -> list[Task] | None:
        """Make the next step of each of ``marked`` (Finished tasks of ``campaign`` before its
        last step whose next step has no task yet) whose sequence goes on, due no earlier than
        ``now``. Returns the tasks made: Pending, or Cancelled when a step cannot be made for
        its recipient (with the reason). None: the campaign's lease was another process's,
        and nothing was made."""
        sent = [t for t in marked if t.step < len(campaign.steps) and t.sent_at is not None]
        going_on = self._going_on(campaign, sent)
        if not going_on:
            return []
        backs = self._away.away_dates(campaign.id, [t.position for t in going_on])
        due: list[_Due] = []
        ended: list[Task] = []
        earliest: dict[tuple[object, ...], datetime] = {}  # shared by sends of one local day
        for task in going_on:
            item = self._draft(campaign, task, backs.get(task.position), now, earliest)
            (due.append(item) if isinstance(item, _Due) else ended.append(item))
        with self._replanner.lease(campaign.id, wait=RETRY_LEASE_WAIT) as held:
            if not held:  # another process's pass: its slots must not be taken twice
                log.info("campaign %s: next steps left to the lease's holder", campaign.id)
                return None
            # read under the lease a step is edited under: an edit landing now is seen, and
            # a cancel: its campaign's marks are dropped, nothing made
            campaign = self._store.get_campaign(campaign.id)
            if campaign.state not in GOING_ON:
                return []
            # another process's pass over the same marks, made under it, too
            made_meanwhile = self._store.get_tasks(
                [d.draft.id for d in due] + [t.id for t in ended]
            )
            due = [d for d in due if d.draft.id not in made_meanwhile]
            ended = [t for t in ended if t.id not in made_meanwhile]
            rendered = self._render(campaign, due, ended)
            made = self._place(campaign, rendered, now=now)
            made += self._insert(ended, now)
        pending = [t for t in made if t.state is TaskState.PENDING]
        report = self._writer.ensure_many(pending)
        for tid, error in report.failed:
            log.warning("task %s: no schedule made (%s); the reconciler will", tid, error)
        return made

    def _going_on(self, campaign: Campaign, sent: Sequence[Task]) -> list[Task]:
        """Those of ``sent`` whose sequence goes on: no earlier step stopped it, and the
        address is not suppressed."""
        earlier = [task_id(campaign.id, t.position, k) for t in sent for k in range(1, t.step)]
        found = self._store.get_tasks(earlier) if earlier else {}
        keys = {key_of_normalized(t.email) for t in sent}
        listed = self._suppressions.suppressed(keys) if keys else {}
        out: list[Task] = []
        for task in sent:
            if key_of_normalized(task.email) in listed:
                continue
            ids = [task_id(campaign.id, task.position, k) for k in range(1, task.step)]
            before = [found.get(i) for i in ids]
            if any(t is None for t in before):
                log.warning("task %s: an earlier step of its recipient is missing", task.id)
                continue
            if stop_reason([t for t in before if t is not None] + [task]) is None:
                out.append(task)
        return out

    def _draft(
        self,
        campaign: Campaign,
        sent: Task,
        back: date | None,
        now: datetime,
        known: dict[tuple[object, ...], datetime],
    ) -> _Due | Task:
        """The next step of ``sent`` as a draft with its earliest instant, or as a Cancelled
        task when it has no send time (its delay leads past every sending day). ``known``
        keeps the earliest instants found: a delay of sending days gives every send of one
        local day the same one."""
        step = campaign.steps[sent.step]  # numbered from 1: this is step sent.step + 1
        assert step.after is not None
        assert sent.sent_at is not None
        draft = pending_task(
            task_id(campaign.id, sent.position, step.number), campaign.id, sent.position,
            sent.email, sent.name, "", "", None, now, new_token(), now, sent.sender_id,
            sent.sender, sent.timezone, step.number,
        )  # fmt: skip
        zone = sent.timezone if campaign.local_time else None
        try:
            key = _day_key(campaign, step.after, sent.sent_at, zone)
            earliest = known.get(key) if key is not None else None
            if earliest is None:
                earliest = follow_up_earliest(campaign.policy, sent.sent_at, step.after, zone)
                if key is not None:
                    known[key] = earliest
            if back is not None:  # the recipient said when they are back: not before then
                earliest = max(earliest, first_instant_on(campaign.policy, back, zone))
        except (InvalidField, NoSendingDay) as exc:
            why = f"step {step.number} has no send time: {exc}"
            return replace(draft, state=TaskState.CANCELLED, reason=why)
        return _Due(sent, draft, max(earliest, now))

    def _render(self, campaign: Campaign, due: Sequence[_Due], ended: list[Task]) -> list[_Due]:
        """``due`` with their subject, text and html rendered from the steps as stored now;
        those whose template fails for their recipient go to ``ended``, Cancelled."""
        rows = self._recipients(campaign.id, [d.sent.position for d in due])
        firsts = self._first_subjects(campaign.id, due)
        out: list[_Due] = []
        for item in due:
            step = campaign.steps[item.draft.step - 1]
            recipient = rows.get(item.sent.position)
            subject = firsts.get(item.sent.position, "")
            rendered = self._renderer.render(campaign, step, recipient, first_subject=subject)
            if isinstance(rendered, str):
                ended.append(replace(item.draft, state=TaskState.CANCELLED, reason=rendered))
                continue
            item.text = rendered
            out.append(item)
        return out

    def _first_subjects(self, campaign_id: str, due: Sequence[_Due]) -> dict[int, str]:
        """Each recipient's step-1 subject (a later step without one replies to it)."""
        out = {d.sent.position: d.sent.subject for d in due if d.sent.step == 1}
        wanted = [task_id(campaign_id, d.sent.position, 1) for d in due if d.sent.step > 1]
        for task in (self._store.get_tasks(wanted) if wanted else {}).values():
            out[task.position] = task.subject
        return out

    def _recipients(self, campaign_id: str, positions: Collection[int]) -> dict[int, Recipient]:
        """The recipients' rows at ``positions``, read as ranges of nearby positions."""
        wanted = sorted(set(positions))
        found: dict[int, Recipient] = {}
        start = 0
        while start < len(wanted):
            end = start + 1  # take the following positions while the range stays dense
            while end < len(wanted) and wanted[end] - wanted[start] < min(
                _ROWS_SPAN * (end - start + 1), _ROWS_READ
            ):
                end += 1
            low, high = wanted[start], wanted[end - 1]
            page = self._store.list_recipients(campaign_id, after=low - 1, limit=high - low + 1)
            found.update((r.position, r) for r in page if r.position <= high)
            start = end
        return found

    def _place(self, campaign: Campaign, due: Sequence[_Due], *, now: datetime) -> list[Task]:
        """Each draft at its slot, inserted: one slot search for all the drafts due at the
        same instant (booked for a campaign with senders), those due earliest first, each
        instant's on-time drafts inserted before the next search reads the bookings. A draft
        whose free slot is late goes the way a step made alone does (a fresh search, then
        follow-ups first may give it a first step's slot), inserted at once: the first steps
        it may move must see every follow-up placed before it."""
        groups: dict[datetime, list[_Due]] = defaultdict(list)
        for item in due:
            groups[item.earliest].append(item)
        made: list[Task] = []
        for earliest in sorted(groups):
            items = groups[earliest]
            drafts = [i.draft for i in items]
            slots = self._replanner.retry_slots(
                campaign, len(drafts), not_before=earliest, exclude=(), tasks=drafts
            )
            until: dict[str | None, datetime | None] = {}  # per zone: from when it is late
            on_time: list[Task] = []
            late: list[_Due] = []
            for item, free in zip(items, slots, strict=True):
                zone = item.draft.timezone if campaign.local_time else None
                if zone not in until:
                    until[zone] = _on_time_until(campaign, earliest, zone)
                limit = until[zone]
                if limit is not None and free < limit:
                    on_time.append(_task_at(item, free))
                else:
                    late.append(item)
            made += self._insert(on_time, now)
            for item in late:
                slot = self._first.slot(campaign, item.draft, not_before=earliest)
                made += self._insert([_task_at(item, slot)], now)
        return made

    def _insert(self, tasks: Sequence[Task], now: datetime) -> list[Task]:
        """Insert ``tasks``; those another process made first are returned as stored."""
        if not tasks:
            return []
        if self._store.insert_tasks(tasks, at=now) == len(tasks):
            first, last = min(t.send_at for t in tasks), max(t.send_at for t in tasks)
            log.info(
                "campaign %s: %d later steps made, due %s to %s", tasks[0].campaign_id,
                len(tasks), first.isoformat(), last.isoformat(),
            )  # fmt: skip
            return list(tasks)
        stored = self._store.get_tasks([t.id for t in tasks])
        return [stored[t.id] for t in tasks if t.id in stored]
