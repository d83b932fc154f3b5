"""The feedback loop's service: what a bounce, a complaint, a reply or an unsubscribe does to
the plan, as far as it proves what it is about.

:meth:`FeedbackService.apply` takes one :class:`~sendqueue.domain.feedback.Feedback`, whatever
brought it (the IMAP poller, the SES feedback function, the unsubscribe routes), and:

- sets the outcome of the task it is about (``bounced``, ``complained``, ``replied``,
  ``unsubscribed``), logged so the live page updates;
- puts the address on the suppression list where the kind says so (a transient bounce only
  after :data:`~sendqueue.domain.feedback.SOFT_BOUNCE_LIMIT` within a week);
- cancels the address's Pending emails: every one of them when it is suppressed (reason
  "suppressed: <why>"), and for a reply those in the scope of the campaign's ``stop_on_reply``
  (reason "replied");
- for an auto-reply naming a return date (an out-of-office notice), changes no outcome and
  cancels nothing: its writer's later steps wait until that date (``postpone``), and the date
  is kept for the recipient of the email it answers, for the steps not made yet
  (``FeedbackOutcomes.set_away``).

What an item may change follows its :class:`~sendqueue.domain.feedback.Proof`. A bounce or a
complaint from the mail parser must name its task (VERP or a signed id), and the recipient it
names must be that task's address. A reply counts for a task when it cites the task's signed
Message-ID and comes from the task's address, or for its From address when a trusted server
authenticated that address. Any other reply is *unverified*: noted on the newest email sent to
its From (the outcome stays ``accepted``, the detail says "unverified reply") and nothing else.

Every step is idempotent (a second outcome write changes nothing, the list keeps its first
entry, a cancel is a compare-and-set, a soft bounce is kept once per message), so feedback
applied twice (two pollers, a retried SQS message) has the effect of applying it once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import date

from sendqueue.domain.addresses import parse_mailbox
from sendqueue.domain.errors import InvalidField, NotFound
from sendqueue.domain.feedback import (
    SOFT_BOUNCE_LIMIT,
    SOFT_BOUNCE_WINDOW,
    UNVERIFIED_REPLY,
    Feedback,
    FeedbackKind,
    Proof,
)
from sendqueue.domain.lifecycle import CampaignState, StopOnReply, TaskState
from sendqueue.domain.models import Campaign, Task, expected_schedule_name
from sendqueue.domain.suppression import (
    Suppression,
    SuppressionReason,
    key_of_normalized,
    suppressed_reason,
    suppression_key,
)
from sendqueue.domain.transitions import cancel
from sendqueue.domain.wording import plural
from sendqueue.ports import CampaignTasks, Clock, FeedbackOutcomes, SenderStore, SuppressionList
from sendqueue.services.campaigns.controls import complete_if_done
from sendqueue.services.task_changes import apply_change

__all__ = ["REPLIED_REASON", "Applied", "FeedbackService"]

log = logging.getLogger(__name__)

#: The ``reason`` of a Pending task cancelled because its recipient replied.
REPLIED_REASON = "replied"

_FINAL_CAMPAIGN = frozenset({CampaignState.COMPLETED, CampaignState.CANCELLED})


@dataclass(frozen=True)
class Applied:
    """What applying one piece of feedback did. ``ignored`` says why nothing was done (not
    about anything sendqueue sent); otherwise ``task_id`` is the task it was matched to (None
    when only the address was known), ``outcome_set`` whether the task's outcome changed,
    ``suppressed`` whether the address was newly put on the list, and ``cancelled`` the
    Pending tasks cancelled. ``unverified`` is set (with ``ignored`` saying why) for a reply
    that proved nothing; ``task_id`` is then the task it was noted on, if any."""

    kind: FeedbackKind
    task_id: str | None = None
    outcome_set: bool = False
    suppressed: bool = False
    cancelled: tuple[str, ...] = field(default_factory=tuple)
    ignored: str | None = None
    unverified: bool = False
    moved: tuple[str, ...] = field(default_factory=tuple)
    """The later steps an auto-reply's return date moved."""


class FeedbackService:
    """Applies feedback to tasks, the suppression list and the plan.

    ``delete_schedules`` removes the schedules of the tasks it cancels (the campaign service's
    schedule writer); ``suppress_replies`` also lists an address that replied (reason
    "replied"), for senders who want one conversation per recipient ever; ``steps_missing``
    makes a sequence's missing later steps before a campaign is completed (True: not done).
    """

    def __init__(
        self,
        store: CampaignTasks,
        feedback: FeedbackOutcomes,
        suppressions: SuppressionList,
        clock: Clock,
        *,
        senders: SenderStore,
        delete_schedules: Callable[[Sequence[str]], object] | None = None,
        suppress_replies: bool = False,
        postpone: Callable[[Sequence[Task], date], tuple[str, ...]] | None = None,
        steps_missing: Callable[[str], bool] | None = None,
    ) -> None:
        self._store = store
        self._feedback = feedback
        self._suppressions = suppressions
        self._senders = senders
        self._clock = clock
        self._delete_schedules = delete_schedules
        self._suppress_replies = suppress_replies
        self._postpone = postpone
        # True for a campaign that must not be completed yet: a later step was missing
        self._steps_missing = steps_missing

    def apply(self, item: Feedback) -> Applied:
        """Apply one piece of feedback (see the module's docstring); never raises for feedback
        about an unknown task or an unusable address, which is ``ignored`` instead."""
        task = self._store.get_task(item.task_id) if item.task_id else None
        if task is None and item.task_id and not item.recipient:
            return Applied(item.kind, ignored=f"unknown task {item.task_id}")
        try:
            key = (
                key_of_normalized(task.email)
                if task is not None
                else suppression_key(item.recipient, field="recipient")
            )
            named = suppression_key(item.recipient, field="recipient") if item.recipient else key
        except InvalidField as exc:
            return Applied(item.kind, ignored=f"not an address: {exc}")
        if item.kind is FeedbackKind.REPLY:
            return self._any_reply(item, task, key, named)
        if item.kind is FeedbackKind.AUTO_REPLY:
            return self._auto_reply(item, task, key, named)
        if item.proof is Proof.NONE or item.proof is Proof.AUTHENTICATED:
            return Applied(item.kind, ignored="proves no email sendqueue sent")
        if item.proof is not Proof.TRUSTED and task is None:
            return Applied(item.kind, ignored=f"unknown task {item.task_id}")
        if (
            item.proof is Proof.SIGNED
            and named != key
            and item.kind is not FeedbackKind.UNSUBSCRIBE
        ):
            # the email it returns went to another address: a report about someone else (a
            # mailed unsubscribe token speaks for its email, as a click on its link does)
            return Applied(item.kind, ignored="names another address than its email's")
        if task is None:
            task = self._newest(key, (TaskState.FINISHED,))
        outcome_set = self._set_outcome(item, task)
        reason = item.kind.suppression
        if item.kind is FeedbackKind.SOFT_BOUNCE:
            counted = self._feedback.record_soft_bounce(
                key,
                item.key or f"{task.id if task else key}@{item.at.isoformat()}",
                at=item.at,
                since=item.at - SOFT_BOUNCE_WINDOW,
            )
            if counted < SOFT_BOUNCE_LIMIT:
                return Applied(item.kind, task_id=task.id if task else None)
            reason = SuppressionReason.BOUNCED
        if reason is None:  # pragma: no cover - every other kind has a reason
            raise AssertionError(f"{item.kind} suppresses nothing")
        suppressed = self._suppress(key, reason, task)
        cancelled = self._cancel(
            self._feedback.tasks_for(key, states=(TaskState.PENDING,)),
            suppressed_reason(reason),
        )
        return Applied(
            item.kind,
            task_id=task.id if task else None,
            outcome_set=outcome_set,
            suppressed=suppressed,
            cancelled=cancelled,
        )

    # -- replies ---------------------------------------------------------------------------

    def _any_reply(self, item: Feedback, task: Task | None, key: str, named: str) -> Applied:
        """A reply counts for its task when it cites the task's signed Message-ID from the
        task's address, or for its own From when that is authenticated (or the item came from
        a trusted caller); else it is only noted (see the module's docstring)."""
        if item.proof is Proof.TRUSTED:
            # a trusted caller's reply speaks for its From; one naming another recipient's
            # email counts as a message from its sender's address
            return self._reply(item, task, key) if named == key else self._reply(item, None, named)
        if item.proof is Proof.SIGNED and task is not None and named == key:
            return self._reply(item, task, key)
        own = task if task is not None and named == key else None
        if item.proof is Proof.AUTHENTICATED:
            answered = own or self._answered(named, item.mailbox_sender)
            if self._written_to_us(item, answered):
                # read in a sender's own mailbox: the reply answers that sender's email
                return self._reply(item, own or (answered if item.mailbox_sender else None), named)
        return self._unverified(item, own, named)

    def _auto_reply(self, item: Feedback, task: Task | None, key: str, named: str) -> Applied:
        """An out-of-office notice naming its return date (the detail): proven as a reply is,
        it keeps the date for the recipient of the email it answers and moves its writer's
        later steps due before then (in that email's campaign; in every campaign when only its
        From is known). It sets no outcome and cancels nothing."""
        try:
            back = date.fromisoformat(item.detail)
        except ValueError:
            return Applied(item.kind, ignored=f"no return date in {item.detail[:40]!r}")
        own = task if task is not None and named == key else None
        if item.proof is Proof.TRUSTED or (item.proof is Proof.SIGNED and own is not None):
            answered = own
        elif item.proof is Proof.AUTHENTICATED:
            answered = own or self._answered(named, item.mailbox_sender)
            if not self._written_to_us(item, answered):
                return Applied(item.kind, ignored="an auto-reply not written to the campaign")
        else:
            return Applied(item.kind, ignored="an auto-reply that proves nothing")
        if answered is not None:
            self._feedback.set_away(answered.campaign_id, answered.position, back, at=item.at)
        pending = self._feedback.tasks_for(named, states=(TaskState.PENDING,))
        if answered is not None:
            pending = [t for t in pending if t.campaign_id == answered.campaign_id]
        moved = self._postpone(pending, back) if self._postpone is not None else ()
        return Applied(item.kind, task_id=answered.id if answered else None, moved=moved)

    def _answered(self, key: str, sender_id: str | None) -> Task | None:
        """The email an authenticated reply without a signed id answers: the newest sent (else
        Pending) to its From, of the sender whose mailbox it was read in when there is one
        that wrote to it (else of any sender)."""
        if sender_id is not None:
            for states in ((TaskState.FINISHED,), (TaskState.PENDING,)):
                found = self._feedback.tasks_for(key, states=states, limit=100)
                mine = [t for t in found if t.sender_id == sender_id]
                if mine:
                    return mine[0]
        return self._newest(key, (TaskState.FINISHED,)) or self._newest(key, (TaskState.PENDING,))

    def _written_to_us(self, item: Feedback, task: Task | None) -> bool:
        """Whether an authenticated reply's To or Cc names the From or Reply-To of the email it
        answers (its campaign's, or its sender's address and Reply-To): DKIM proves a domain
        signed the message, not that it was written to us."""
        if task is None or not item.to:
            return False
        campaign = self._store.get_campaign(task.campaign_id)
        ours = {campaign.from_addr, campaign.reply_to, task.sender}
        if task.sender_id is not None:
            with suppress(NotFound):  # a sender removed since: its address is in task.sender
                sender = self._senders.get_sender(task.sender_id)
                ours |= {sender.email, sender.reply_to}
        ours_keys = {_sender_key(a) for a in ours if a}
        return any(_sender_key(a) in ours_keys for a in item.to)

    def _unverified(self, item: Feedback, task: Task | None, key: str) -> Applied:
        """Note a reply that proved nothing on the email it answers (else the newest one sent
        to its From), leaving the outcome and the plan as they are."""
        if task is None or task.state is not TaskState.FINISHED:
            task = self._newest(key, (TaskState.FINISHED,))
        why = "unverified reply: it proves neither our Message-ID nor its sender"
        if task is None:
            return Applied(item.kind, ignored=why, unverified=True)
        detail = f"{UNVERIFIED_REPLY} from {item.recipient}: {item.detail}"[:1000]
        self._feedback.note_unverified_reply(task.id, detail=detail, at=item.at)
        return Applied(item.kind, task_id=task.id, ignored=why, unverified=True)

    def _reply(self, item: Feedback, task: Task | None, key: str) -> Applied:
        """A reply: by its headers (``task``), or from an address with Pending emails."""
        pending = self._feedback.tasks_for(key, states=(TaskState.PENDING,))
        if task is None:
            if not pending:
                return Applied(item.kind, ignored="not a reply to an email sendqueue sent")
            task = self._newest(key, (TaskState.FINISHED,))
        answered = task if task is not None else pending[0]
        campaign = self._store.get_campaign(answered.campaign_id)
        if item.recipient and _sender_key(item.recipient) in {
            _sender_key(campaign.from_addr),
            _sender_key(answered.sender or campaign.from_addr),
        }:
            # the sender writing in its own thread (a follow-up by hand, a copy to itself)
            return Applied(item.kind, ignored="a message from the campaign's own sender")
        outcome_set = self._set_outcome(item, task)
        in_scope = self._reply_scope(campaign, answered)
        cancelled = self._cancel([t for t in pending if in_scope(t)], REPLIED_REASON)
        suppressed = (
            self._suppress(key, SuppressionReason.REPLIED, task)
            if self._suppress_replies
            else False
        )
        return Applied(
            item.kind,
            task_id=task.id if task else None,
            outcome_set=outcome_set,
            suppressed=suppressed,
            cancelled=cancelled,
        )

    def _reply_scope(self, campaign: Campaign, answered: Task) -> Callable[[Task], bool]:
        """Which of the address's Pending tasks a reply to ``answered`` (of ``campaign``)
        cancels. With ``sender``: those that go out from the mailbox that sent the answered
        email (the same sender, or the same address: a task's sender, else its campaign's
        From), in campaigns neither completed, cancelled nor set to ``off``."""
        scope = campaign.stop_on_reply
        if scope is StopOnReply.OFF:
            return lambda task: False
        if scope is StopOnReply.CAMPAIGN:
            return lambda task: task.campaign_id == campaign.id
        sender_id = answered.sender_id
        sender = _sender_key(answered.sender or campaign.from_addr)
        # campaign id -> its From when its tasks may be cancelled (None: final, or opted out)
        froms: dict[str, str | None] = {campaign.id: campaign.from_addr}

        def in_scope(task: Task) -> bool:
            if task.campaign_id not in froms:
                other = self._store.get_campaign(task.campaign_id)
                stops = (
                    other.state not in _FINAL_CAMPAIGN
                    and other.stop_on_reply is not StopOnReply.OFF  # it opted out of stopping
                )
                froms[task.campaign_id] = other.from_addr if stops else None
            from_addr = froms[task.campaign_id]
            if from_addr is None:
                return False
            if sender_id is not None and task.sender_id == sender_id:
                return True
            return _sender_key(task.sender or from_addr) == sender

        return in_scope

    # -- steps -----------------------------------------------------------------------------

    def _newest(self, key: str, states: Sequence[TaskState]) -> Task | None:
        found = self._feedback.tasks_for(key, states=states, limit=1)
        return found[0] if found else None

    def _set_outcome(self, item: Feedback, task: Task | None) -> bool:
        outcome = item.kind.outcome
        if task is None or outcome is None:
            return False
        detail = item.detail[:1000] or None
        return self._feedback.set_outcome(task.id, outcome, detail=detail, at=item.at) is not None

    def _suppress(self, key: str, reason: SuppressionReason, task: Task | None) -> bool:
        entry = Suppression(key, reason, task.id if task else None, self._clock.now())
        return self._suppressions.suppress([entry]) == 1

    def _steps_left(self, campaign_id: str) -> bool:
        """Whether a campaign with nothing left to send had a sequence's later step missing
        (made now, or not looked for): not done then. Looked for only at the campaign's end."""
        missing = self._steps_missing
        if missing is None or self._store.has_unfinished_tasks(campaign_id):
            return False
        return missing(campaign_id)

    def _cancel(self, tasks: Sequence[Task], reason: str) -> tuple[str, ...]:
        """Cancel those of ``tasks`` still Pending (compare-and-set each), delete their
        schedules, and complete the campaigns left with nothing to send."""
        now = self._clock.now()
        cancelled: list[Task] = []
        for task in tasks:
            done = apply_change(self._store, cancel(task, reason=reason), at=now)
            if done is not None:
                cancelled.append(task)
        if cancelled and self._delete_schedules is not None:
            self._delete_schedules([expected_schedule_name(t) for t in cancelled])
        booked = [t.id for t in cancelled if t.sender_id is not None]
        if booked:  # their sender slots are free for other sends again
            self._senders.release(booked)
        for campaign_id in sorted({t.campaign_id for t in cancelled}):
            if self._steps_left(campaign_id):
                continue
            complete_if_done(self._store, campaign_id, at=now)
        if cancelled:
            log.info("feedback cancelled %s (%s)", plural(len(cancelled), "pending email"), reason)
        return tuple(t.id for t in cancelled)


def _sender_key(from_addr: str) -> str:
    """The compared form of a campaign's From: its bare address, case-folded."""
    try:
        return parse_mailbox("from_addr", from_addr).addr_spec.casefold()
    except InvalidField:
        return from_addr.strip().casefold()
