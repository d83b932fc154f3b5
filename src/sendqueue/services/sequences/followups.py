"""A sequence's later steps: made when the step before them is sent, checked before they go.

Provisioning writes step 1 of every recipient. When the send worker has sent step k (the mail
server accepted it), its finish marks the task (``finish_send(follow_up=True)``), and
:meth:`FollowUps.make_due` then makes the marked tasks' next steps in batches
(:mod:`sendqueue.services.sequences.batch`); a marked task counts as unfinished, so a campaign
is never seen with nothing left to send while a recipient's sequence goes on
(docs/decisions/0007-sequence-steps.md, docs/decisions/0008-follow-ups-in-batches.md). One
step, made alone (:meth:`FollowUps.after_sent`: the repair's sweep) or in a batch:

- its id is deterministic (``task_id(campaign, position, k+1)``): made twice, it is stored once;
- it is due at the first free slot of the campaign (and of its sender, which is step 1's) at or
  after the step's delay (:func:`~sendqueue.domain.followups.follow_up_earliest`), chosen under
  the campaign's lease as a retry's slot is; when that slot is more than a sending day late, it
  takes the slot of a newer recipient's first step instead (follow-ups first:
  :mod:`sendqueue.services.sequences.first`); when an out-of-office notice of the recipient
  named a return date (``FeedbackOutcomes.away_until``), no earlier than the first window on
  or after that date;
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
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime

from sendqueue.domain.errors import Conflict, InvalidField, NoSendingDay, StoreUnavailable
from sendqueue.domain.followups import first_instant_on, follow_up_earliest
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import Campaign, Recipient, Task, new_token, pending_task, task_id
from sendqueue.domain.steps import Step, thread_headers
from sendqueue.domain.suppression import key_of_normalized, suppressed_reason
from sendqueue.domain.transitions import TaskChange, move, retry_into
from sendqueue.ports import FeedbackOutcomes, FollowUpStore, SuppressionList
from sendqueue.services.planning.replanning import RETRY_LEASE_WAIT, Replanner, iter_tasks
from sendqueue.services.scheduling.schedules import ScheduleWriter
from sendqueue.services.sequences.batch import GOING_ON, BatchMaker, stop_reason
from sendqueue.services.sequences.first import FollowUpsFirst
from sendqueue.services.sequences.render import StepRenderer

__all__ = ["FollowUps", "SendCheck", "stop_reason"]

log = logging.getLogger(__name__)

#: Finished tasks whose next step is looked up at once by :meth:`FollowUps.repair`.
_REPAIR_BATCH = 500
#: Marked sent steps whose next steps :meth:`FollowUps.make_due` makes together.
_MAKE_BATCH = 500


@dataclass(frozen=True)
class SendCheck:
    """What :meth:`FollowUps.before_send` says of a claimed task: ``stop`` is why it must not
    go out (None: send it), ``headers`` the thread headers it goes out with."""

    stop: str | None = None
    headers: Mapping[str, str] | None = None
    wait: str | None = None
    """Why it must wait (an earlier step is not recorded sent yet); see :meth:`FollowUps.hold`."""


#: Errors a pass leaves the marks for: the next pass tries the same batch again.
_TRANSIENT = (StoreUnavailable, Conflict)


def _sent_before(task: Task, instant: datetime) -> bool:
    return task.sent_at is not None and task.sent_at < instant


class FollowUps:
    """Makes and checks the later steps of sequences (module docstring)."""

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
        self._first = first
        self._away = away
        self._suppressions = suppressions
        self._replanner = replanner
        self._writer = writer
        self._renderer = renderer
        self._batch = BatchMaker(store, suppressions, replanner, writer, renderer, first, away)

    def make_due(
        self, campaign_id: str, *, now: datetime, sent_before: datetime | None = None
    ) -> int:
        """Make the next step of every marked sent step of the campaign (``finish_send(
        follow_up=True)``), a batch at a time (:class:`~sendqueue.services.sequences.batch.
        BatchMaker`), due no earlier than ``now``, and clear their marks. A mark whose next
        step exists already (made by a pass that died before clearing it) gets its schedule
        checked. ``sent_before``: only marks of tasks sent before then (the reconciler leaves
        newer ones to the worker making them). Returns how many steps were made."""
        made = 0
        while marked := self._store.follow_ups_due(campaign_id, limit=_MAKE_BATCH):
            due = [t for t in marked if sent_before is None or _sent_before(t, sent_before)]
            if not due:
                break
            campaign = self._store.get_campaign(campaign_id)
            kept: set[str] = set()
            if campaign.state in GOING_ON:
                outcome = self._make_marked(campaign, due, now)
                if outcome is None:  # another process holds the lease: its pass makes them
                    break
                made += outcome[0]
                kept = outcome[1]
            self._store.follow_ups_made(campaign_id, [t.id for t in due if t.id not in kept])
            if len(marked) < _MAKE_BATCH or len(due) < len(marked) or kept:
                break
        return made

    def _make_marked(
        self, campaign: Campaign, due: list[Task], now: datetime
    ) -> tuple[int, set[str]] | None:
        """Make the next steps of ``due``: how many were made, and the marks to keep (steps
        that could not even be recorded Cancelled); None when the campaign's lease was another
        process's (nothing made). A batch that fails for a reason other than the store is
        made one step at a time, so one recipient's step cannot hold up the rest."""
        nexts = {t.id: task_id(campaign.id, t.position, t.step + 1) for t in due}
        found = self._store.get_tasks(list(nexts.values()))
        new = [t for t in due if nexts[t.id] not in found]
        for task in due:
            if nexts[task.id] in found and task.sent_at is not None:
                self.after_sent(campaign, task, sent_at=task.sent_at, now=now)
        try:
            made = self._batch.make(campaign, new, now=now)
        except _TRANSIENT:
            raise
        except Exception:
            log.exception(
                "campaign %s: a batch of next steps failed; each is made alone", campaign.id
            )
            alone = {task.id: self._make_alone(campaign, task, now) for task in new}
            kept = {tid for tid, count in alone.items() if count is None}
            return sum(count or 0 for count in alone.values()), kept
        return None if made is None else (len(made), set())

    def _make_alone(self, campaign: Campaign, sent: Task, now: datetime) -> int | None:
        """Make ``sent``'s next step by itself (1 when made Pending); when that fails too for
        a reason other than the store, its recipient's sequence ends there: the step is
        stored Cancelled with the error, visible on the email (0). None when even that
        could not be stored: its mark stays for a later pass."""
        assert sent.sent_at is not None
        try:
            made = self.after_sent(campaign, sent, sent_at=sent.sent_at, now=now)
        except _TRANSIENT:
            raise
        except Exception as exc:
            log.exception("task %s: its next step could not be made", sent.id)
            number = sent.step + 1
            why = f"step {number} could not be made: {exc}"[:1000]
            ended = pending_task(
                task_id(campaign.id, sent.position, number), campaign.id, sent.position,
                sent.email, sent.name, "", "", None, now, new_token(), now, sent.sender_id,
                sent.sender, sent.timezone, number,
            )  # fmt: skip
            try:
                self._insert(replace(ended, state=TaskState.CANCELLED, reason=why))
            except _TRANSIENT:
                raise
            except Exception:
                log.exception("task %s: its next step could not be recorded either", sent.id)
                return None
            return 0
        return int(made is not None and made.state is TaskState.PENDING)

    def after_sent(
        self, campaign: Campaign, sent: Task, *, sent_at: datetime, now: datetime | None = None
    ) -> Task | None:
        """Make the task of the step after ``sent`` (accepted by the mail server at
        ``sent_at``) for its recipient, and its schedule, due no earlier than ``now`` (default
        ``sent_at``); the task made (or found, when an earlier call made it), or None: no
        later step, or the sequence stopped."""
        steps = campaign.steps
        if sent.step >= len(steps) or campaign.state not in GOING_ON:
            return None
        step = steps[sent.step]  # steps are numbered from 1: this is step sent.step + 1
        ids = [task_id(campaign.id, sent.position, k) for k in range(1, step.number + 1)]
        found = self._store.get_tasks(ids)
        made = found.get(ids[-1])
        if made is not None:  # an earlier call made it: its schedule may be what is missing
            if made.state is TaskState.PENDING:
                later = self._after_delay(campaign, made, step, sent, sent_at)
                self._schedule(later, moved=later.token != made.token)
            return made
        earlier = [found.get(tid, sent if tid == sent.id else None) for tid in ids[:-1]]
        if any(t is None for t in earlier):
            log.warning("task %s: an earlier step of its recipient is missing", sent.id)
            return None
        done = [t for t in earlier if t is not None]
        # ``sent`` too: the repair passes a Finished step whose outcome may have changed since
        if stop_reason(done) is not None:
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
        back = self._away.away_until(campaign.id, sent.position)
        try:
            earliest = follow_up_earliest(campaign.policy, sent_at, step.after, zone)
            if back is not None:  # the recipient said when they are back: not before then
                earliest = max(earliest, first_instant_on(campaign.policy, back, zone))
        except (InvalidField, NoSendingDay) as exc:
            why = f"step {step.number} has no send time: {exc}"
            return self._insert(replace(draft, state=TaskState.CANCELLED, reason=why))
        with self._replanner.lease(campaign.id, wait=RETRY_LEASE_WAIT) as held:
            # rendered under the lease a step is edited under: an edit landing now is seen
            step = self._current(campaign.id, step)
            recipient = self._recipient(campaign.id, sent.position)
            out = self._renderer.render(campaign, step, recipient, first_subject=first.subject)
            if isinstance(out, str):  # the template failed for this recipient
                return self._insert(replace(draft, state=TaskState.CANCELLED, reason=out))
            draft = replace(draft, subject=out[0], text=out[1], html=out[2])
            slot = self._first.slot(campaign, draft, not_before=max(earliest, now), displace=held)
            task = self._insert(replace(draft, send_at=slot))
        if task is not None and task.state is TaskState.PENDING:
            self._schedule(task)
        return task

    def _after_delay(
        self, campaign: Campaign, made: Task, step: Step, sent: Task, sent_at: datetime
    ) -> Task:
        """``made`` (Pending), moved to the first free slot after its delay from ``sent_at``
        when it is due before: made by a send that was not recorded (its worker died) and is
        now sent again, later. Returns the task as it is."""
        assert step.after is not None
        zone = sent.timezone if campaign.local_time else None
        try:
            earliest = follow_up_earliest(campaign.policy, sent_at, step.after, zone)
        except (InvalidField, NoSendingDay):
            return made
        if made.send_at >= earliest:
            return made
        why = f"step {sent.step} sent again at {sent_at.isoformat(timespec='seconds')}"
        with self._replanner.lease(campaign.id, wait=RETRY_LEASE_WAIT):
            slot = self._replanner.retry_slots(
                campaign, 1, not_before=earliest, exclude=[made.send_at], tasks=[made]
            )[0]
            self._store.reschedule([move(made, slot)], at=sent_at, reason=why)
        return self._store.get_task(made.id) or made

    def hold(self, campaign: Campaign, claimed: Task, why: str, *, now: datetime) -> Task | None:
        """Give a claimed later step back (its attempt not counted) at the first free slot
        after its delay from ``now``: the step before it, not recorded sent yet (:class:`
        SendCheck` ``wait``), goes out no earlier than now. When that one is sent,
        :meth:`after_sent` moves this one after its delay from then if needed; when it fails,
        this one is stopped at its next claim. Returns the task given back (None: changed
        meanwhile), its schedule made."""
        step = campaign.steps[claimed.step - 1]
        assert step.after is not None
        zone = claimed.timezone if campaign.local_time else None
        try:
            earliest = follow_up_earliest(campaign.policy, now, step.after, zone)
        except (InvalidField, NoSendingDay):
            earliest = now

        def back(task: Task, slot: datetime) -> TaskChange:
            change = retry_into(task, slot, reason=why, note=f"waits: {why}")
            return replace(change, changes={**change.changes, "attempts": task.attempts - 1})

        exclude = [claimed.claimed_at] if claimed.claimed_at else []
        [held] = self._replanner.retry_in_free_slots(
            campaign, [claimed], back, not_before=earliest, exclude=exclude, at=now
        )
        if held is not None:
            log.info("task %s waits until %s: %s", held.id, held.send_at.isoformat(), why)
            self._schedule(held, moved=True)
        return held

    def _current(self, campaign_id: str, step: Step) -> Step:
        """``step`` as stored now (its text may have been edited since the campaign was read)."""
        steps = self._store.get_campaign(campaign_id).steps
        return steps[step.number - 1] if step.number <= len(steps) else step

    def _recipient(self, campaign_id: str, position: int) -> Recipient | None:
        found = self._store.list_recipients(campaign_id, after=position - 1, limit=1)
        return found[0] if found and found[0].position == position else None

    def _insert(self, task: Task) -> Task | None:
        if self._store.insert_tasks([task], at=task.created_at) == 0:
            return self._store.get_task(task.id)  # another process made it first
        log.info("task %s: step %d made, due %s", task.id, task.step, task.send_at.isoformat())
        return task

    def _schedule(self, task: Task, *, moved: bool = False) -> None:
        report = self._writer.ensure_many([task], moved=[task.id] if moved else ())
        if report.failed:
            log.warning(
                "task %s: its schedule was not created (%s); the reconciler will retry",
                task.id,
                report.failed[0][1],
            )

    def repair(
        self, campaign: Campaign, *, now: datetime, sent_before: datetime | None = None
    ) -> int:
        """Make the later steps a crash kept from being made: every Finished task of the
        campaign before its last step whose next step has no task (its sequence not stopped)
        gets it, due no earlier than ``now``. A step added at the end reaches those who had
        finished the sequence the same way. ``sent_before``: only tasks sent before then (a
        recent send's next step is its mark's, which a worker is making). Returns how many
        were made."""
        last = len(campaign.steps)
        if last < 2 or campaign.state not in GOING_ON:
            return 0
        made = 0
        batch: list[Task] = []
        for task in iter_tasks(self._store, campaign.id, TaskState.FINISHED):
            sent = task.sent_at
            if (
                task.step < last
                and sent is not None
                and (sent_before is None or sent < sent_before)
            ):
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
            if len(campaign.steps) < 2:
                return False
            return self.make_due(campaign_id, now=now) + self.repair(campaign, now=now) > 0
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
        # A worker that died after making this step may not have recorded the step before
        # (Running, or Pending again under the stale policy): that one goes out first.
        unsent = [t for t in earlier if t.state in (TaskState.PENDING, TaskState.RUNNING)]
        if unsent:
            return SendCheck(wait=f"step {unsent[0].step} is not sent yet")
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
