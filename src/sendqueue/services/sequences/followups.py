"""A sequence's later steps: made when the step before them is sent, checked before they go.

Provisioning writes step 1 of every recipient. When the send worker has sent step k (the mail
server accepted it), :meth:`FollowUps.after_sent` makes step k+1's task before step k is
recorded Finished, so a campaign is never seen with nothing left to send while a recipient's
sequence goes on (docs/decisions/0007-sequence-steps.md):

- its id is deterministic (``task_id(campaign, position, k+1)``): made twice, it is stored once;
- it is due at the first free slot of the campaign (and of its sender, which is step 1's) at or
  after the step's delay (:func:`~sendqueue.domain.followups.follow_up_earliest`), chosen under
  the campaign's lease as a retry's slot is;
- its subject, text and html are the step's templates rendered with the recipient's row, as
  step 1's were at import; a step without a subject replies to step 1's (``Re: ...``). A
  template that fails for this recipient makes the task Cancelled with the reason, so the
  failure is visible on the email and the sequence ends there;
- nothing is made after an answer: a step cancelled or failed, an outcome other than
  ``accepted`` (bounced, complained, replied, unsubscribed), or an address on the suppression
  list ends the recipient's sequence.

:meth:`FollowUps.before_send` runs on a claimed later step: it stops it when an earlier step
was answered since it was made, and gives the headers that keep it in the thread.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from sendqueue.domain.errors import InvalidField, NoSendingDay
from sendqueue.domain.followups import follow_up_earliest
from sendqueue.domain.lifecycle import CampaignState, TaskOutcome, TaskState
from sendqueue.domain.models import Campaign, Recipient, Task, new_token, pending_task, task_id
from sendqueue.domain.steps import Step, thread_headers
from sendqueue.domain.suppression import key_of_normalized, suppressed_reason
from sendqueue.ports import CampaignTasks, SuppressionList
from sendqueue.services.planning.replanning import RETRY_LEASE_WAIT, Replanner, iter_tasks
from sendqueue.services.scheduling.schedules import ScheduleWriter
from sendqueue.services.sequences.render import StepRenderer

__all__ = ["FollowUps", "SendCheck"]

log = logging.getLogger(__name__)

#: Finished tasks whose next step is looked up at once by :meth:`FollowUps.repair`.
_REPAIR_BATCH = 500
#: States of a campaign in which a recipient's sequence goes on.
_GOING_ON = frozenset({CampaignState.ACTIVE, CampaignState.PAUSED, CampaignState.PROVISIONING})


@dataclass(frozen=True)
class SendCheck:
    """What :meth:`FollowUps.before_send` says of a claimed task: ``stop`` is why it must not
    go out (None: send it), ``headers`` the thread headers it goes out with."""

    stop: str | None = None
    headers: Mapping[str, str] | None = None


def stop_reason(earlier: Sequence[Task]) -> str | None:
    """Why a recipient's sequence ends after ``earlier`` (their tasks of the steps before, in
    step order), or None while it goes on."""
    for task in earlier:
        if task.state in (TaskState.CANCELLED, TaskState.FAILED):
            return f"step {task.step} {task.state.value}: the sequence stopped"
        if task.outcome is not None and task.outcome is not TaskOutcome.ACCEPTED:
            return f"step {task.step} {task.outcome.value}: the sequence stopped"
    return None


class FollowUps:
    """Makes and checks the later steps of sequences (module docstring)."""

    def __init__(
        self,
        store: CampaignTasks,
        suppressions: SuppressionList,
        replanner: Replanner,
        writer: ScheduleWriter,
        renderer: StepRenderer,
    ) -> None:
        self._store = store
        self._suppressions = suppressions
        self._replanner = replanner
        self._writer = writer
        self._renderer = renderer

    def after_sent(
        self, campaign: Campaign, sent: Task, *, sent_at: datetime, now: datetime | None = None
    ) -> Task | None:
        """Make the task of the step after ``sent`` (accepted by the mail server at
        ``sent_at``) for its recipient, and its schedule, due no earlier than ``now`` (default
        ``sent_at``); the task made (or found, when an earlier call made it), or None: no
        later step, or the sequence stopped."""
        steps = campaign.steps
        if sent.step >= len(steps) or campaign.state not in _GOING_ON:
            return None
        step = steps[sent.step]  # steps are numbered from 1: this is step sent.step + 1
        ids = [task_id(campaign.id, sent.position, k) for k in range(1, step.number + 1)]
        found = self._store.get_tasks(ids)
        made = found.get(ids[-1])
        if made is not None:  # an earlier call made it: its schedule may be what is missing
            if made.state is TaskState.PENDING:
                self._schedule(made)
            return made
        earlier = [found.get(tid, sent if tid == sent.id else None) for tid in ids[:-1]]
        if any(t is None for t in earlier):
            log.warning("task %s: an earlier step of its recipient is missing", sent.id)
            return None
        done = [t for t in earlier if t is not None]
        if stop_reason([t for t in done if t.id != sent.id]) is not None:
            return None
        if self._suppressions.suppressed({key_of_normalized(sent.email)}):
            return None
        return self._make(campaign, step, sent, done[0], ids[-1], sent_at, now or sent_at)

    def _make(
        self,
        campaign: Campaign,
        step: Step,
        sent: Task,
        first: Task,
        new_id: str,
        sent_at: datetime,
        now: datetime,
    ) -> Task | None:
        assert step.after is not None  # checked: every later step has a delay
        zone = sent.timezone if campaign.local_time else None
        draft = pending_task(
            new_id, campaign.id, sent.position, sent.email, sent.name, "", "", None, now,
            new_token(), now, first.sender_id, first.sender, sent.timezone, step.number,
        )  # fmt: skip
        recipient = self._recipient(campaign.id, sent.position)
        rendered = self._renderer.render(campaign, step, recipient, first_subject=first.subject)
        if isinstance(rendered, str):  # the template failed for this recipient
            return self._insert(replace(draft, state=TaskState.CANCELLED, reason=rendered))
        subject, text, html = rendered
        draft = replace(draft, subject=subject, text=text, html=html)
        try:
            earliest = follow_up_earliest(campaign.policy, sent_at, step.after, zone)
        except (InvalidField, NoSendingDay) as exc:
            why = f"step {step.number} has no send time: {exc}"
            return self._insert(replace(draft, state=TaskState.CANCELLED, reason=why))
        with self._replanner.lease(campaign.id, wait=RETRY_LEASE_WAIT):
            slot = self._replanner.retry_slots(
                campaign, 1, not_before=max(earliest, now), exclude=(), tasks=[draft]
            )[0]
            task = self._insert(replace(draft, send_at=slot))
        if task is not None and task.state is TaskState.PENDING:
            self._schedule(task)
        return task

    def _recipient(self, campaign_id: str, position: int) -> Recipient | None:
        found = self._store.list_recipients(campaign_id, after=position - 1, limit=1)
        return found[0] if found and found[0].position == position else None

    def _insert(self, task: Task) -> Task | None:
        if self._store.insert_tasks([task], at=task.created_at) == 0:
            return self._store.get_task(task.id)  # another process made it first
        log.info("task %s: step %d made, due %s", task.id, task.step, task.send_at.isoformat())
        return task

    def _schedule(self, task: Task) -> None:
        report = self._writer.ensure_many([task])
        if report.failed:
            log.warning(
                "task %s: its schedule was not created (%s); the reconciler will retry",
                task.id,
                report.failed[0][1],
            )

    def repair(self, campaign: Campaign, *, now: datetime) -> int:
        """Make the later steps a crash kept from being made: every Finished task of the
        campaign before its last step whose next step has no task (its sequence not stopped)
        gets it, due no earlier than ``now``. A step added at the end reaches those who had
        finished the sequence the same way. Returns how many were made."""
        last = len(campaign.steps)
        if last < 2 or campaign.state not in _GOING_ON:
            return 0
        made = 0
        batch: list[Task] = []
        for task in iter_tasks(self._store, campaign.id, TaskState.FINISHED):
            if task.step < last and task.sent_at is not None:
                batch.append(task)
            if len(batch) >= _REPAIR_BATCH:
                made += self._repair_batch(campaign, batch, now)
                batch = []
        return made + self._repair_batch(campaign, batch, now)

    def missing_made(self, campaign_id: str, *, now: datetime) -> bool:
        """Before a campaign with nothing left to send is completed: make the later steps a
        failed send kept from being made (:meth:`repair`). True when one was made, or when
        they could not be looked for (the store failed): the campaign is not done then."""
        try:
            campaign = self._store.get_campaign(campaign_id)
            return len(campaign.steps) > 1 and self.repair(campaign, now=now) > 0
        except Exception:
            log.exception("campaign %s: missing later steps not looked for", campaign_id)
            return True

    def _repair_batch(self, campaign: Campaign, sent: list[Task], now: datetime) -> int:
        nexts = {t.id: task_id(campaign.id, t.position, t.step + 1) for t in sent}
        found = self._store.get_tasks(list(nexts.values())) if sent else {}
        made = 0
        for task in sent:
            if nexts[task.id] in found:
                continue
            assert task.sent_at is not None
            if self.after_sent(campaign, task, sent_at=task.sent_at, now=now) is not None:
                log.warning("task %s: its next step was missing and is now made", task.id)
                made += 1
        return made

    def before_send(self, campaign: Campaign, task: Task) -> SendCheck:
        """Check a claimed task of a later step: stopped when an earlier step of its recipient
        was answered, cancelled or failed, or its address was suppressed since the task was
        made; otherwise the thread headers it goes out with (none for step 1 and a step that
        starts a new thread)."""
        if task.step == 1:
            return SendCheck()
        ids = [task_id(campaign.id, task.position, k) for k in range(1, task.step)]
        found = self._store.get_tasks(ids)
        earlier = [found[tid] for tid in ids if tid in found]
        why = stop_reason(earlier)
        if why is not None:
            return SendCheck(stop=why)
        listed = self._suppressions.suppressed({key_of_normalized(task.email)})
        if listed:
            return SendCheck(stop=suppressed_reason(next(iter(listed.values())).reason))
        steps = campaign.steps
        if task.step > len(steps) or steps[task.step - 1].new_thread:
            return SendCheck()
        # the thread runs from the latest earlier step that started one (step 1 at the latest)
        start = max(k for k in range(1, task.step) if k == 1 or steps[k - 1].new_thread)
        ids_in_thread = [t.message_id for t in earlier if t.step >= start and t.message_id]
        if not ids_in_thread:
            return SendCheck()
        try:
            return SendCheck(headers=thread_headers(ids_in_thread))
        except InvalidField as exc:  # a message id the mail server made up differently
            log.warning("task %s: sent without thread headers: %s", task.id, exc)
            return SendCheck()
