"""The send worker: what a schedule invokes at a task's send time.

Rules:

- The claim is one store call (``TaskStore.claim_for_send``: one statement or transaction):
  Pending -> Running under compare-and-set on the state and the invocation's token, only when
  the task is not invoked before its firing slot, its campaign is sending, its address is not
  suppressed and it is not past ``max_lateness``; it returns the task and its campaign's state
  as read, or why it refused (:class:`~sendqueue.domain.sendclaim.ClaimRefusal`). Of two
  concurrent invocations of one schedule, exactly one wins and sends. The finish is the second
  call (``TaskStore.finish_send``), with a sender's booking counted sent in the same write: a
  send costs two store round trips.
- A task that is not Pending (Finished, Cancelled, Failed, Running) is skipped, and the
  invocation returns normally: raising would only make the execution layer retry into the
  dead-letter queue. A schedule whose payload token is not the task's current token is stale
  (the task was re-planned since) and is skipped the same way. A campaign not sending (paused,
  cancelled) when the claim is written stops the send; a cancelled campaign's Pending task that
  its cancel's sweep missed is cancelled.
- Mail accepted -> Finished with sent_at and message id. Permanent error -> Failed with the
  error. Transient error -> Pending with a new schedule after back-off while attempts remain,
  then Failed.
- Too late (past ``max_lateness``: the claim refuses) or outside the policy's windows (checked
  after the claim, which is then given back): not sent; the campaign's Pending tasks are
  re-planned from now (outcome "moved").
- A late send (past its firing slack, the layer's precision allowed) is checked after its
  claim for other sends of the campaign within half the planned spacing of now (sent, being
  sent, or Pending and due then). If there is one it is not sent: the task is given back and the
  campaign re-planned (outcome "moved"), so emails due together never go out in a burst. An
  on-time send skips this check: no extra store read on the hot path.
- An address put on the suppression list since provisioning is caught by the claim: the task
  goes Pending -> Cancelled (a conditional write) with the reason "suppressed: <reason>" and is
  never sent.
- Every email carries the task's one-click unsubscribe link (``List-Unsubscribe`` and
  ``List-Unsubscribe-Post``, RFC 2369 and RFC 8058) when ``config.unsubscribe`` is set; its
  URL replaces the templates' ``{{ unsubscribe_url }}`` and, with the campaign's
  ``unsubscribe_footer``, ends the text and html parts (:mod:`sendqueue.domain.unsubscribe`).
- Every invocation ends in one outcome told to the Events port: sent, transient, permanent, or
  skipped (any of the skips above, a lost claim, a campaign not sending, a suppressed address).
- The worker raises only when infrastructure fails (the store is unreachable), so the execution
  layer's retry and dead-letter path covers that.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta

from sendqueue.domain.alarms import AutoPause, auto_pause_reason
from sendqueue.domain.errors import (
    NotFound,
    PermanentMailError,
    SchedulerError,
    TransientMailError,
)
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import Campaign, Task
from sendqueue.domain.sendclaim import SENDING_STATES, ClaimRefusal, SendClaim
from sendqueue.domain.senders import Sender
from sendqueue.domain.slots import in_policy, into_slot, nominal_spacing
from sendqueue.domain.suppression import Suppression, suppressed_reason
from sendqueue.domain.transitions import (
    ERROR_LIMIT,
    cancel,
    fail,
    give_back,
    retry_into,
)
from sendqueue.domain.wording import plural
from sendqueue.ports import (
    Alarm,
    CampaignTasks,
    Clock,
    Events,
    Mailer,
    NoEvents,
)
from sendqueue.services.campaigns.controls import CampaignControls
from sendqueue.services.config import ServiceConfig
from sendqueue.services.planning.capacity import CapacityPlanner, policy_for
from sendqueue.services.planning.recovery import Recovery
from sendqueue.services.planning.replanning import FIRING_SLACK, Replanner
from sendqueue.services.scheduling.schedules import ScheduleWriter
from sendqueue.services.senders.service import SenderService
from sendqueue.services.sending.outgoing import outgoing_message
from sendqueue.services.sequences.followups import FollowUps
from sendqueue.services.sequences.runner import FollowUpRunner
from sendqueue.services.task_changes import apply_change

__all__ = [
    "CAMPAIGN_CACHE_SECONDS",
    "EARLY_TOLERANCE",
    "FIRING_SLACK",
    "SENDING_STATES",
    "SendWorker",
    "due_by",
]

#: How early an invocation may arrive (clock skew between hosts) and still send.
EARLY_TOLERANCE = timedelta(seconds=1)
#: How long the worker reuses a campaign it read (sender, policy) while the campaign is
#: sending; the state that decides a send is the one its claim reads.
CAMPAIGN_CACHE_SECONDS = 1.0

#: How long a late send waits for a re-plan of its campaign running elsewhere (the re-plan that
#: moves it must run after its give-back, or it could be left with a schedule already fired).
REPLAN_WAIT = 10.0

log = logging.getLogger(__name__)


def due_by(now: datetime, precision: float) -> datetime:
    """The latest send_at an invocation at ``now`` may claim: one whose firing slot (of
    ``precision`` seconds; none at 0) starts no later than ``now + EARLY_TOLERANCE``. Exactly
    the send_at values for which ``send_at - now <= EARLY_TOLERANCE + into_slot(send_at)``."""
    latest = now + EARLY_TOLERANCE
    if precision <= 0:
        return latest
    step = timedelta(microseconds=round(precision * 1_000_000))
    return latest - into_slot(latest, precision) + step - timedelta(microseconds=1)


def _not_before(now: datetime, max_lateness: float) -> datetime | None:
    """The earliest send_at that is not past ``max_lateness``; None when no instant is (the
    setting has no upper bound: a huge one, or inf, means never too late)."""
    try:
        return now - timedelta(seconds=max_lateness)
    except OverflowError:
        return None


class SendWorker:
    """Handles ``{"kind": "send", "task_id": ..., "token": ...}`` invocations."""

    def __init__(
        self,
        store: CampaignTasks,
        mailer: Mailer,
        writer: ScheduleWriter,
        campaigns: CampaignControls,
        clock: Clock,
        config: ServiceConfig,
        *,
        replanner: Replanner,
        capacity: CapacityPlanner,
        recovery: Recovery,
        senders: SenderService,
        on_event: Callable[[str, Task], None] | None = None,
        events: Events | None = None,
        alarm: Alarm | None = None,
        mailer_for: Callable[[Sender], Mailer] | None = None,
        followups: FollowUps | None = None,
        follow_up_linger: float | None = None,
    ) -> None:
        self._store = store
        # Makes and checks a sequence's later steps (None: every campaign is one email); the
        # runner makes the next steps the sends mark, inline or ``follow_up_linger`` later.
        self._followups = followups
        self._follow_ups = FollowUpRunner(self._make_follow_ups, linger=follow_up_linger)
        # A sender -> the mailer it sends through (its own transport, its OAuth sign-in); None:
        # every sender uses ``mailer``.
        self._mailer_for = mailer_for
        self._replanner = replanner
        self._capacity = capacity
        self._recovery = recovery
        self._senders = senders
        self._senders_seen: dict[str, tuple[float, Sender | None]] = {}
        self._mailer = mailer
        self._writer = writer
        self._campaigns = campaigns
        self._clock = clock
        self._config = config
        self._on_event = on_event
        self._events: Events = events if events is not None else NoEvents()
        self._alarm = alarm
        self._lock = threading.Lock()
        self._failures_in_a_row: dict[str, int] = {}
        self._campaigns_seen: dict[str, tuple[float, Campaign]] = {}
        self._swept_at = time.monotonic()
        #: Sends of each campaign claimed in this process and not yet ended (their tasks are
        #: Running until their outcome is recorded).
        self._sending: dict[str, int] = {}

    def _end_send(self, campaign_id: str) -> int:
        """Count a send of the campaign as ended; how many others are still under way here."""
        with self._lock:
            left = self._sending[campaign_id] - 1
            if left:
                self._sending[campaign_id] = left
            else:
                del self._sending[campaign_id]
        return left

    def _complete_if_done(self, campaign_id: str) -> None:
        # Nearly every send leaves Pending tasks behind; one cheap query spares the full
        # completion check (which checks again, under its compare-and-set) until the last one.
        if not self._store.has_unfinished_tasks(campaign_id) and not self._steps_missing(
            campaign_id
        ):
            self._forget(campaign_id)
            self._campaigns.complete_if_done(campaign_id)

    def close(self) -> None:
        """Make the next steps already marked in this process, then stop its runner."""
        self._follow_ups.close()

    def _make_follow_ups(self, campaign_id: str) -> None:
        """Make the campaign's marked next steps; it may be done after (each one stopped)."""
        assert self._followups is not None
        self._followups.make_due(campaign_id, now=self._clock.now())
        self._complete_if_done(campaign_id)

    def _steps_missing(self, campaign_id: str) -> bool:
        """Whether a missing later step is made now, or could not be looked for: not done."""
        followups = self._followups
        return followups is not None and followups.missing_made(campaign_id, now=self._clock.now())

    def _forget(self, campaign_id: str) -> None:
        """Drop what the worker keeps about a campaign with nothing left to send: a worker
        process lives through many campaigns, and its memory must not grow with each."""
        with self._lock:
            self._campaigns_seen.pop(campaign_id, None)
            self._failures_in_a_row.pop(campaign_id, None)

    def _campaign(self, campaign_id: str) -> Campaign:
        """The campaign, from a cache of :data:`CAMPAIGN_CACHE_SECONDS` when it was sending.

        Only a sending state is taken from the cache. Whether the campaign sends is decided by
        the state the claim reads, never by the cache, so it never lets a paused campaign send.
        """
        now = time.monotonic()
        with self._lock:
            seen = self._campaigns_seen.get(campaign_id)
        if (
            seen is not None
            and now - seen[0] < CAMPAIGN_CACHE_SECONDS
            and seen[1].state in SENDING_STATES
        ):
            return seen[1]
        campaign = self._store.get_campaign(campaign_id)
        with self._lock:
            # Expired entries go too, at most once a cache period (a campaign cancelled or
            # paused is never completed here, so _forget does not see it).
            if now - self._swept_at >= CAMPAIGN_CACHE_SECONDS:
                self._swept_at = now
                for key in [
                    key
                    for key, (at, _) in self._campaigns_seen.items()
                    if now - at >= CAMPAIGN_CACHE_SECONDS
                ]:
                    del self._campaigns_seen[key]
            self._campaigns_seen[campaign_id] = (now, campaign)
        return campaign

    def _sender(self, sender_id: str) -> Sender | None:
        """The sender, from a cache of :data:`CAMPAIGN_CACHE_SECONDS` (None: removed)."""
        now = time.monotonic()
        with self._lock:
            seen = self._senders_seen.get(sender_id)
        if seen is not None and now - seen[0] < CAMPAIGN_CACHE_SECONDS:
            return seen[1]
        try:
            sender: Sender | None = self._senders.get(sender_id)
        except NotFound:
            sender = None
        with self._lock:
            if len(self._senders_seen) >= 1000:
                self._senders_seen.clear()
            self._senders_seen[sender_id] = (now, sender)
        return sender

    def __call__(self, payload: Mapping[str, str]) -> None:
        self.send(payload)

    def send(self, payload: Mapping[str, str]) -> None:
        with self._recovery.watch.store_calls():  # a send kept waiting by the store names it
            sent = self._send(payload)
        if not sent:
            self._events.send_finished("skipped")

    def _send(self, payload: Mapping[str, str]) -> bool:
        """Handle one invocation; False when it was skipped (nothing sent or recorded)."""
        now = self._clock.now()
        claim = self._store.claim_for_send(
            payload.get("task_id", ""),
            token=payload.get("token"),
            at=now,
            due_by=due_by(now, self._config.firing_precision),
            not_before=_not_before(now, self._config.max_lateness),
        )
        claimed = claim.task
        if claim.refused is not None or claimed is None:
            return self._not_claimed(claim, payload.get("task_id", ""), now)
        campaign = self._campaign(claimed.campaign_id)
        if self._overdue(campaign, claimed, now):  # outside the policy's windows (rare)
            self._give_back(claimed, now, "outside its sending windows: not sent")
            self._catch_up(campaign, claimed, now, claim.campaign_state)
            return True
        if claimed.sender_id is not None and not self._holds_booking(
            campaign, claimed, claim.booking_at, now
        ):
            return True
        # (a provisioning campaign, not re-planned until provisioned, sends as it was planned)
        active = claim.campaign_state is CampaignState.ACTIVE
        spaced = self._config.space_late_sends and active
        if spaced and self._late(claimed, now) and self._too_close(campaign, claimed, now):
            return True
        self._send_claimed(campaign, claimed)
        return True

    def _not_claimed(self, claim: SendClaim, task_id: str, now: datetime) -> bool:
        """Act on a refused claim (nothing was written): skip and log why, cancel a suppressed
        address's task or a cancelled campaign's, or catch up an overdue one (True)."""
        task, why = claim.task, claim.refused
        if task is None or why is ClaimRefusal.NOT_FOUND:
            log.warning("schedule for unknown task %r: skipped", task_id)
        elif why is ClaimRefusal.STALE:
            log.info("task %s: stale schedule (token changed), skipped", task_id)
        elif why is ClaimRefusal.NOT_PENDING:
            log.info("task %s is %s: skipped", task_id, task.state.value)
        elif why is ClaimRefusal.TAKEN:
            log.info("task %s was claimed by another invocation", task_id)
        elif why is ClaimRefusal.EARLY:
            # Earlier than the layer ever fires (before the start of send_at's firing slot,
            # the minute under EventBridge): an invocation this early is a stray one (a
            # manual or duplicated fire). Sending now could mean sending at night. The task's
            # own schedule still fires on time; if this was it, the reconciler recreates it.
            log.warning(
                "task %s invoked %.0f s before its send time: skipped",
                task_id,
                (task.send_at - now).total_seconds(),
            )
        elif why is ClaimRefusal.NOT_SENDING:
            state = claim.campaign_state
            log.info("task %s: campaign %s is %s, skipped", task_id, task.campaign_id, state)
            if state is CampaignState.CANCELLED:
                self._cancel_with_campaign(task, now)
        elif why is ClaimRefusal.SUPPRESSED and claim.suppression is not None:
            self._cancel_suppressed(task, claim.suppression, now)
        elif why is ClaimRefusal.LATE:
            self._catch_up(self._campaign(task.campaign_id), task, now, claim.campaign_state)
            return True
        return False

    def _cancel_with_campaign(self, task: Task, now: datetime) -> None:
        """A Pending task of a cancelled campaign that the cancel's sweep missed (it was
        Running then, and given back since) is cancelled too, its slot freed."""
        cancelled = apply_change(self._store, cancel(task, note="campaign cancelled"), at=now)
        if cancelled is not None and task.sender_id is not None:
            self._capacity.release([task.id])

    def _give_back(self, claimed: Task, now: datetime, reason: str) -> None:
        """Running -> Pending, its attempt not counted: the claim turned out not to send."""
        apply_change(self._store, give_back(claimed, reason, undo_attempt=True), at=now)

    def _send_claimed(self, campaign: Campaign, claimed: Task) -> None:
        """Send the claimed task and record its outcome, counted among this process's sends
        of the campaign while it is under way."""
        self._emit("claimed", claimed)
        with self._lock:
            self._sending[campaign.id] = self._sending.get(campaign.id, 0) + 1
        final = False
        try:
            final = self._deliver(campaign, claimed)
        finally:
            others = self._end_send(campaign.id)
        # Another send of this campaign under way here holds a Running task, so the campaign
        # cannot be done yet; the last of them to end (after every other one recorded its
        # outcome) runs the check.
        if final and not others:
            self._complete_if_done(campaign.id)

    def _holds_booking(
        self, campaign: Campaign, claimed: Task, booking_at: datetime | None, now: datetime
    ) -> bool:
        """Whether the claimed task holds its sender slot (``booking_at``, read by the claim;
        booking it again if it lost it, e.g. a crash between a re-plan's release and its
        booking). A send never goes out unbooked: when the slot is taken meanwhile, the task
        is given back and the campaign re-planned (False)."""
        if booking_at == claimed.send_at or self._capacity.book_in_place(claimed):
            return True
        reason = "its sender's slot was taken"
        self._give_back(claimed, now, reason)
        self._recovery.catch_up(
            campaign.id, since=claimed.send_at, reason=reason, firing=claimed.id, wait=REPLAN_WAIT
        )
        self._events.send_finished("moved")
        return False

    def _cancel_suppressed(self, task: Task, entry: Suppression, now: datetime) -> None:
        """Cancel a Pending task whose address is on the suppression list (unless someone
        changed it first), and check the campaign for completion."""
        reason = suppressed_reason(entry.reason)
        cancelled = apply_change(self._store, cancel(task, reason=reason), at=now)
        log.info("task %s: address suppressed (%s), not sent", task.id, entry.reason.value)
        if cancelled is not None and task.sender_id is not None:
            self._capacity.release([task.id])
        if cancelled is not None:
            with self._lock:
                others = self._sending.get(task.campaign_id, 0)
            if not others:
                self._complete_if_done(task.campaign_id)

    def _overdue(self, campaign: Campaign, task: Task, now: datetime) -> bool:
        """Outside the policy (the layer's firing precision and :data:`EARLY_TOLERANCE`
        allowed); more than ``max_lateness`` past send_at is the claim's refusal (LATE)."""
        late = timedelta(seconds=self._config.firing_precision)
        policy = policy_for(campaign, task.timezone)
        return not in_policy(policy, now, late=late, early=EARLY_TOLERANCE)

    def _late(self, task: Task, now: datetime) -> bool:
        """Later than a healthy worker fires: past the firing slack and the layer's precision."""
        return now - task.send_at > FIRING_SLACK + timedelta(seconds=self._config.firing_precision)

    def _too_close(self, campaign: Campaign, claimed: Task, now: datetime) -> bool:
        """For a late send, just claimed: whether another send of the campaign lies within half
        the planned spacing of now. If so the task is given back (Pending, its attempt not
        counted) and the campaign re-planned: True, the invocation is over (moved).

        The claim wrote claimed_at first, so of two late sends claimed at once each sees the
        other (as Running) and neither goes out now; the re-plans, one after the other, place
        them. A Pending send counts when its send_at lies near now (it fires then)."""
        gap = nominal_spacing(campaign.policy) / 2
        near = self._store.booked(campaign.id, since=now - gap, until=now + gap)
        own = [i for i, (state, _) in enumerate(near) if state is TaskState.RUNNING]
        if own:  # this task's own claim (the Running one nearest its claimed_at)
            at = claimed.claimed_at or now
            del near[min(own, key=lambda i: abs(near[i][1] - at))]
        if not near:
            return False
        closest = min(abs(when - now) for _, when in near).total_seconds()
        reason = self._recovery.reason(claimed.send_at)  # why it came late, not where it would
        self._give_back(claimed, now, reason)
        moved = self._recovery.catch_up(
            campaign.id, since=claimed.send_at, reason=reason, firing=claimed.id, wait=REPLAN_WAIT
        )
        log.info(  # per task: the re-plan's one line per campaign is the warning
            "task %s due %s is late at %s, %.0f s from another send: not sent (%s); "
            "%s of campaign %s moved",
            claimed.id, claimed.send_at.isoformat(), now.isoformat(), closest, reason,
            plural(moved, "email"), campaign.id,
        )  # fmt: skip
        self._events.send_finished("moved")
        return True

    def _catch_up(
        self, campaign: Campaign, task: Task, now: datetime, state: CampaignState | None
    ) -> None:
        """Not sent: the campaign's Pending emails are re-planned from now instead (a
        provisioning campaign, ``state`` as the claim read it, is left to the reconciler, once
        the provisioner is done)."""
        moved = 0
        if state is CampaignState.ACTIVE:
            # Waits for the campaign's lease: its holder may be a retry taking one slot, which
            # would not move this task (and its schedule goes with this invocation).
            moved = self._recovery.catch_up(campaign.id, since=task.send_at, wait=REPLAN_WAIT)
        log.info(  # per task: the re-plan's one line per campaign is the warning
            "task %s due %s is overdue at %s: not sent; %s of campaign %s moved",
            task.id, task.send_at.isoformat(), now.isoformat(), plural(moved, "email"),
            campaign.id,
        )  # fmt: skip
        self._events.send_finished("moved")

    def _deliver(self, campaign: Campaign, task: Task) -> bool:
        """Send and record the outcome; True when the task ended final (Finished, Failed) and
        the campaign may be done (no other Pending task was seen by the finish)."""
        mailer = self._mailer
        sender = self._sender(task.sender_id) if task.sender_id is not None else None
        # A sender with a transport or an OAuth sign-in of its own sends through its mailer.
        own = sender is not None and (sender.transport is not None or sender.oauth is not None)
        if sender is not None and own and self._mailer_for is not None:
            mailer = self._mailer_for(sender)
        thread = None
        if task.step > 1 and self._followups is not None:
            check = self._followups.before_send(campaign, task)
            if check.stop is not None:
                return self._stop_sequence(task, check.stop)
            if check.wait is not None:  # the step before it goes out first
                self._followups.hold(campaign, task, check.wait, now=self._clock.now())
                self._events.send_finished("moved")
                return False
            thread = check.headers
        now = self._clock.now()
        message = outgoing_message(self._config, campaign, task, sender, now, thread=thread)
        try:
            accepted_id = mailer.send(message)
        except PermanentMailError as exc:
            return self._failed(campaign, task, f"permanent: {exc}")
        except TransientMailError as exc:
            return self._transient(campaign, task, str(exc))
        sent_at = self._clock.now()
        # The outcome starts as "accepted"; feedback (a bounce, a reply) may change it later.
        # With a sender, the booking at the claimed send time is counted sent in the same write;
        # with a next step, the task is marked for it in the same write (made just after).
        slot = task.send_at if task.sender_id is not None else None
        follow_up = self._followups is not None and task.step < len(campaign.steps)
        finish = self._store.finish_send(
            task.id, at=sent_at, message_id=accepted_id, slot=slot, follow_up=follow_up
        )
        done = finish.task
        if done is not None and done.sender_id is not None and not finish.settled:
            # a re-plan that lost its move to this claim may have moved the booking: back first
            self._capacity.settle(done)
            self._capacity.mark_sent(task.id)  # the slot stays used: the email went out
        self._events.send_finished("sent", (sent_at - task.send_at).total_seconds())
        with self._lock:
            self._failures_in_a_row.pop(campaign.id, None)  # the streak is broken
        # The runner makes the marked next step, then checks whether the campaign is done; the
        # last send of a sequence kicks it too (a mark a failed pass left may be all that is left)
        last = len(campaign.steps) > 1 and not finish.pending_left
        kick = self._followups is not None and done is not None and (follow_up or last)
        if done is not None:
            self._emit("finished", done)
        if kick:
            self._follow_ups.kick(campaign.id)
        # Other Pending tasks seen by the finish: the campaign is certainly not done yet.
        return not kick and not finish.pending_left

    def _stop_sequence(self, claimed: Task, reason: str) -> bool:
        """A later step whose recipient answered (or whose sequence stopped otherwise) since it
        was made: given back and cancelled with the reason, its slot freed; True (final)."""
        now = self._clock.now()
        back = apply_change(self._store, give_back(claimed, reason, undo_attempt=True), at=now)
        if back is not None and apply_change(self._store, cancel(back, reason=reason), at=now):
            if claimed.sender_id is not None:
                self._capacity.release([claimed.id])
            log.info("task %s not sent: %s", claimed.id, reason)
        self._events.send_finished("skipped")
        return True

    def _failed(self, campaign: Campaign, task: Task, error: str) -> bool:
        """Record a failure (auto-pausing after too many in a row); True unless it paused."""
        error = error[:ERROR_LIMIT]
        # the change's note is the error: the email.failed event's reason
        done = apply_change(self._store, fail(task, error), at=self._clock.now())
        if task.sender_id is not None:
            self._capacity.release([task.id])  # nothing went out: the slot is free again
        self._events.send_finished("permanent")
        if done is not None:
            self._emit("failed", done)
        with self._lock:
            count = self._failures_in_a_row.get(campaign.id, 0) + 1
            self._failures_in_a_row[campaign.id] = count
        limit = self._config.auto_pause_after
        if limit and count >= limit:
            self._auto_pause(campaign, count, error)
            return False
        return True

    def _auto_pause(self, campaign: Campaign, count: int, error: str) -> None:
        reason = auto_pause_reason(count, error)
        try:
            self._campaigns.pause(campaign.id, reason=reason)
            log.error("campaign %s %s", campaign.id, reason)
        except Exception as exc:  # already paused or cancelled by someone else
            log.info("campaign %s not auto-paused: %s", campaign.id, exc)
        else:
            if self._alarm is not None:  # the alarm never raises (its port's contract)
                pause = AutoPause(campaign.id, campaign.name, reason, self._clock.now())
                self._alarm.auto_paused(pause)
        with self._lock:
            self._failures_in_a_row.pop(campaign.id, None)

    def _transient(self, campaign: Campaign, task: Task, error: str) -> bool:
        if task.attempts >= self._config.max_attempts:
            return self._failed(
                campaign, task, f"gave up after {plural(task.attempts, 'attempt')}; last: {error}"
            )
        delay = self._config.retry_backoff * 2 ** (task.attempts - 1)
        # The retry takes a free slot of the grid after the back-off: inside a window, within
        # the day's cap, away from the campaign's other sends (its own failed claim not counted).
        why = f"transient: {error}"
        note = f"retry {task.attempts + 1} of {self._config.max_attempts} in {delay:.0f}s"
        [back] = self._replanner.retry_in_free_slots(
            campaign,
            [task],
            lambda claimed, slot: retry_into(claimed, slot, reason=why, error=why, note=note),
            not_before=self._clock.now() + timedelta(seconds=delay),
            exclude=[task.claimed_at] if task.claimed_at else [],
        )
        self._events.send_finished("transient")
        if back is None:
            current = self._store.get_task(task.id)
            if current is not None:  # changed meanwhile: its booking goes back to it
                self._capacity.settle(current)
            return False
        self._emit("retry", back)
        try:
            self._writer.ensure(back, moved=True)  # its firing schedule holds the name
        except SchedulerError as exc:
            # The task is safe in the store; the reconciler recreates the missing schedule.
            log.warning("task %s: retry schedule not created (%s); reconciler will", task.id, exc)
        return False

    def _emit(self, event: str, task: Task) -> None:
        if self._on_event is not None:
            self._on_event(event, task)
