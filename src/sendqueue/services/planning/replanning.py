"""Moving emails to free slots: the catch-up re-plan after an outage, and the slots of retries.

A send never leaves the campaign's policy (docs/guarantees.md). When an email is overdue
(more than ``max_lateness`` past its send time, or its window closed), the campaign's remaining
Pending emails are re-planned from now with :func:`~sendqueue.domain.slots.free_slots`: what
was already sent (Finished) or is being sent (Running) on each local day counts against
``per_day``, and no two sends come closer than half the planned spacing. A retry (transient,
stale, retry-failed) takes the first free slot with every other booked email of the campaign,
Pending ones included, kept as it is.

A later step of a sequence (``Task.step`` > 1) due after now is not re-planned: its send
time is the first free slot after its delay from the step before, and moving it to now would
send it right after that step. It counts as booked, like a sent email; one already due is
re-planned with the rest (its delay has passed).

In a catch-up the Pending emails due right now and not late are not all kept: they would all
fire at once, a burst. At most one is kept (the earliest), and only when nothing was sent or is
being sent within half the spacing of now; the others take free slots like the rest.

A re-plan runs under a per-campaign lease in the store, so two processes that trigger it at
once do not interleave (the loser returns at once, or waits a bounded time when it asks to);
each move is a compare-and-set on the task's state and token, and it is idempotent: run again,
it moves nothing. Retries choose their slot and write it under the same lease, so two retries
(or a retry and a re-plan) at once cannot take one free slot twice.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from datetime import time as dt_time

from sendqueue.domain import transitions
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import MAX_STEP, Campaign, Move, Task, new_token
from sendqueue.domain.slots import free_slots, in_policy, nominal_spacing
from sendqueue.domain.transitions import TaskChange
from sendqueue.domain.wording import plural
from sendqueue.ports import Clock, LeasedCampaignTasks, Tasks
from sendqueue.services.config import ServiceConfig
from sendqueue.services.planning.capacity import CapacityPlanner, uses_capacity
from sendqueue.services.scheduling.schedules import ScheduleWriter
from sendqueue.services.task_changes import apply_change

__all__ = ["FIRING_SLACK", "RETRY_LEASE_WAIT", "Replanner", "iter_tasks"]

log = logging.getLogger(__name__)

#: A local day starts at most this long before any instant in it (a 25-hour DST day, and a
#: margin): what was booked since then is all a re-plan from now has to look at.
_DAY_BACK = timedelta(hours=26)
#: Tasks per reschedule call and schedule batch.
_CHUNK = 1000
#: The first span of booked sends a retry slot is looked for in; each next one is 8x longer.
_FIRST_SPAN = timedelta(days=2)
#: Between two tries at a re-plan lease held elsewhere, when the caller waits for it.
_LEASE_POLL = 0.05
#: How long a retry waits for the campaign's lease before it takes its slot without it (a
#: re-plan of a very large campaign can hold it longer; blocking a worker thread is worse).
RETRY_LEASE_WAIT = 10.0


#: How long after its send time (beyond the layer's firing precision) a healthy worker may take
#: to fire and claim a send; a send later than that is late (the worker checks it for
#: neighbours, and a worker starting re-plans it).
FIRING_SLACK = timedelta(seconds=2)
#: Tasks per page when reading a campaign's tasks.
_PAGE = 1000


def iter_tasks(
    store: Tasks, campaign_id: str, state: TaskState | None = None, page: int = _PAGE
) -> Iterator[Task]:
    """Every task of a campaign (optionally in one state), paged by position.

    A recipient of a sequence has a task per step at one position, so a full page may end
    between them: its last position is held back and read again at the start of the next."""
    if page <= MAX_STEP:
        raise ValueError(f"a page holds more than one recipient's {MAX_STEP} steps")
    after = -1
    while True:
        batch = store.list_tasks(campaign_id, state=state, after=after, limit=page)
        if len(batch) < page:
            yield from batch
            return
        last = batch[-1].position
        yield from (t for t in batch if t.position != last)
        after = last - 1


def _counted_from(campaign: Campaign, not_before: datetime) -> datetime:
    """The earliest instant whose booking can count against a slot at or after ``not_before``:
    the start of its local day (``per_day``), or half the spacing before it, whichever is
    earlier, less an hour for a midnight a DST change moves. A follow-up due tomorrow then
    reads none of today's sends."""
    local = not_before.astimezone(campaign.policy.zone).date()
    midnight = datetime.combine(local, dt_time(0), tzinfo=campaign.policy.zone)
    gap = nominal_spacing(campaign.policy) / 2
    return min(midnight.astimezone(UTC), not_before - gap) - timedelta(hours=1)


class Replanner:
    """See the module docstring."""

    def __init__(
        self,
        store: LeasedCampaignTasks,
        writer: ScheduleWriter,
        clock: Clock,
        config: ServiceConfig,
        *,
        capacity: CapacityPlanner,
    ) -> None:
        self._store = store
        self._writer = writer
        self._clock = clock
        self._config = config
        self._capacity = capacity

    def replan_pending(
        self,
        campaign: Campaign,
        *,
        reason: str,
        schedule_all: bool,
        firing: str | None = None,
        fire_within: timedelta = timedelta(0),
        wait: float = 0.0,
        level: int = logging.WARNING,
    ) -> int | None:
        """Move the campaign's Pending tasks (read in position order once the lease is held)
        onto the first free slots from now; returns how many moved, or None when another
        process holds the campaign's re-plan lease (for longer than ``wait`` seconds).

        Moved tasks get a new schedule (the old one is replaced: same name, new token); with
        ``schedule_all`` the unmoved ones get theirs too (resume: a pause deleted them).
        ``firing`` names a task whose schedule has just fired (the worker gave it back): it is
        never the one kept to fire now, and the one kept gets its schedule made again, as it
        may be a task given back the same way. ``fire_within``: how long after now the kept
        one may fire (a worker starting re-plans every campaign before its dispatcher fires
        anything); the moved ones keep half the spacing from then too, or the worker would find
        the kept one, late, too close to the first one moved and re-plan the campaign again.
        One line at ``level`` says how many moved and why (``reason``); the schedules replaced
        log nothing above DEBUG.
        """
        with self.lease(campaign.id, wait=wait) as held:
            if not held:
                log.info("campaign %s is being re-planned elsewhere", campaign.id)
                return None
            pending = list(iter_tasks(self._store, campaign.id, TaskState.PENDING))
            moved = self._replan(campaign, pending, reason, schedule_all, firing, fire_within)
        if moved:
            log.log(level, "campaign %s: moved %s: %s", campaign.id, plural(moved, "email"), reason)
        return moved

    @contextmanager
    def lease(self, campaign_id: str, *, wait: float) -> Iterator[bool]:
        """Hold the campaign's re-plan lease for the block (True), or yield False when another
        process holds it for longer than ``wait`` seconds. Not re-entrant."""
        owner = new_token()
        name = f"replan:{campaign_id}"
        ttl = self._config.reconcile_lease_seconds
        deadline = time.monotonic() + wait
        while not self._store.acquire_lease(name, owner, ttl_seconds=ttl, at=self._clock.now()):
            if time.monotonic() >= deadline:
                yield False
                return
            time.sleep(_LEASE_POLL)
        try:
            yield True
        finally:
            self._store.release_lease(name, owner)

    def _keep_one(
        self, campaign: Campaign, pending: Sequence[Task], fixed: Sequence[datetime], now: datetime,
        firing: str | None,
    ) -> Task | None:  # fmt: skip
        """The one Pending task a catch-up leaves to fire now, if any: the earliest due now and
        not late (its schedule fires now; moving it would make a re-plan a moment later move
        everything again), when now is inside the policy and no send went out, or is going
        out, within half the spacing of now. The others due now would fire with it: moved."""
        if not in_policy(campaign.policy, now):
            return None
        gap = nominal_spacing(campaign.policy) / 2
        if any(abs(when - now) < gap for when in fixed):
            return None
        lateness = timedelta(seconds=self._config.max_lateness)
        due = [
            t
            for t in pending
            if t.send_at <= now and now - t.send_at <= lateness and t.id != firing
        ]
        return min(due, key=lambda t: (t.send_at, t.position)) if due else None

    def _replan(
        self,
        campaign: Campaign,
        pending: Sequence[Task],
        reason: str,
        schedule_all: bool,
        firing: str | None,
        fire_within: timedelta,
    ) -> int:
        now = self._clock.now()
        policy = campaign.policy
        zone = policy.zone
        # A later step due in the future waits for its delay: it stays (module docstring).
        waiting = self._waiting_steps(campaign, pending, now, schedule_all)
        pending = [t for t in pending if t.id not in waiting]
        # Pending tasks are what is re-planned; what went out, or is going out, is fixed. A
        # resume (``schedule_all``: a pause deleted every schedule) re-plans all from now.
        fixed = [
            when
            for state, when in self._store.booked(campaign.id, since=now - _DAY_BACK)
            if state is not TaskState.PENDING
        ]
        fixed += [t.send_at for t in waiting.values()]
        if uses_capacity(campaign):
            # Over the senders' books, each task keeping its sender and zone; every one is
            # booked again (services/planning/capacity.py). None is kept to fire now: a moved send
            # never comes closer than half the spacing to a fixed one, so none bursts.
            keep = None
            movable = list(pending)
            slots = self._capacity.place(campaign, movable, not_before=now, fixed=fixed)
        else:
            keep = None if schedule_all else self._keep_one(campaign, pending, fixed, now, firing)
            spaced = fixed
            if keep is not None:
                # it goes out now: the moved sends keep half the spacing away from now (and
                # from its latest fire). (Not from a moment later: a re-plan run again soon
                # after must find the same slots.)
                fixed.append(now)
                spaced = [*fixed, now + fire_within] if fire_within else fixed
            per_day: Counter[date] = Counter(when.astimezone(zone).date() for when in fixed)
            movable = [t for t in pending if keep is None or t.id != keep.id]
            slots = free_slots(policy, len(movable), now=now, booked_per_day=per_day, booked=spaced)
        moves: list[Move] = []
        scheduled: list[Task] = [keep] if keep is not None and firing is not None else []
        if schedule_all:
            scheduled += waiting.values()
        for task, slot in zip(movable, slots, strict=True):
            if task.send_at != slot:
                move = transitions.move(task, slot)
                moves.append(move)
                scheduled.append(replace(task, send_at=slot, token=move.new_token))
            elif schedule_all:
                scheduled.append(task)
        moved = 0
        for start in range(0, len(moves), _CHUNK):
            chunk = moves[start : start + _CHUNK]
            done = self._store.reschedule(chunk, at=self._clock.now(), reason=reason)
            moved += done
            if done < len(chunk) and uses_capacity(campaign):
                self._rebook_unmoved(chunk)
        self._schedule(campaign, scheduled, {m.task_id for m in moves})
        return moved

    def _waiting_steps(
        self, campaign: Campaign, pending: Sequence[Task], now: datetime, schedule_all: bool
    ) -> dict[str, Task]:
        """The Pending later steps of sequences due after ``now``, by id: their time is the
        first free slot after their delay from the step before, which moving them to now would
        cut short. On a resume (the pause freed their sender bookings) one whose slot was taken
        meanwhile is not among them: it is re-planned with the rest."""
        waiting = {t.id: t for t in pending if t.step > 1 and t.send_at > now}
        if schedule_all and uses_capacity(campaign):
            waiting = {i: t for i, t in waiting.items() if self._capacity.book_in_place(t)}
        return waiting

    def _rebook_unmoved(self, moves: Sequence[Move]) -> None:
        """The slots were booked before the moves; a task claimed (or cancelled) between the
        read and its move kept its time: its booking goes back to it (or is freed)."""
        current = self._store.get_tasks([m.task_id for m in moves])
        for move in moves:
            task = current.get(move.task_id)
            if task is None or task.send_at == move.send_at:
                continue
            self._capacity.settle(task)

    def _schedule(self, campaign: Campaign, tasks: Sequence[Task], moved: set[str]) -> None:
        # A task claimed between the read and its move kept its token: the schedule made here
        # for it then carries a token it does not hold, and the worker skips it as stale. A
        # moved task's old schedule holds its name under the old token: replaced, as expected.
        for start in range(0, len(tasks), _CHUNK):
            report = self._writer.ensure_many(tasks[start : start + _CHUNK], moved=moved)
            if report.failed:
                log.warning(
                    "%s could not be created for %s; the reconciler will retry",
                    plural(len(report.failed), "schedule"),
                    campaign.id,
                )

    def retry_slots(
        self,
        campaign: Campaign,
        count: int,
        *,
        not_before: datetime,
        exclude: Iterable[datetime],
        tasks: Sequence[Task] = (),
    ) -> list[datetime]:
        """The first ``count`` free slots at or after ``not_before``, every email the campaign
        has booked (sent, being sent, or Pending) kept where it is; ``exclude`` names booked
        instants that are the retried tasks' own (their failed claims), which do not count.

        Booked sends are read for a growing span (two days, then 8x longer, then all), so a
        retry in a large campaign does not read all of it when a slot is near. A campaign with
        senders or local time needs the retried ``tasks`` (``count`` of them): each keeps its
        sender and zone, and its new slot is booked.
        """
        if uses_capacity(campaign):
            if len(tasks) != count:
                raise ValueError("a campaign with senders retries named tasks")
            instants = [
                when for _, when in self._store.booked(campaign.id, since=not_before - _DAY_BACK)
            ]
            for own in exclude:
                if own in instants:
                    instants.remove(own)
            return self._capacity.place(campaign, tasks, not_before=not_before, fixed=instants)
        zone = campaign.policy.zone
        since = _counted_from(campaign, not_before)
        span: timedelta | None = _FIRST_SPAN
        while True:
            until = None if span is None else not_before + span
            found = self._store.booked(campaign.id, since=since, until=until)
            instants = [when for _, when in found]
            for own in exclude:
                if own in instants:
                    instants.remove(own)
            per_day: Counter[date] = Counter(when.astimezone(zone).date() for when in instants)
            slots = free_slots(
                campaign.policy, count, now=not_before, booked_per_day=per_day, booked=instants
            )
            # A slot past the span read might collide with a booking not read: read further.
            if until is None or slots[-1] < until - _DAY_BACK:
                return slots
            span = span * 8 if span is not None and span < timedelta(days=400) else None

    def retry_in_free_slots(
        self,
        campaign: Campaign,
        tasks: Sequence[Task],
        retry: Callable[[Task, datetime], TaskChange | None],
        *,
        not_before: datetime,
        exclude: Iterable[datetime] = (),
        at: datetime | None = None,
    ) -> list[Task | None]:
        """Retry each of ``tasks`` into a free slot (:meth:`retry_slots`), chosen and written
        under the campaign's lease so no other retry takes it too (without the lease after
        :data:`RETRY_LEASE_WAIT`, rather than block). ``retry`` gives a task's change for its
        slot (:func:`~sendqueue.domain.transitions.retry_into`; None: left as it is), applied at
        ``at`` (default: now). Each task as it went back, or None where nothing was applied."""
        back: list[Task | None] = []
        with self.lease(campaign.id, wait=RETRY_LEASE_WAIT) as held:
            if not held:
                slots_taken = plural(len(tasks), "retry slot")
                log.info("campaign %s: %s taken without its lease", campaign.id, slots_taken)
            slots = (
                self.retry_slots(
                    campaign, len(tasks), not_before=not_before, exclude=exclude, tasks=tasks
                )
                if tasks
                else []
            )
            for task, slot in zip(tasks, slots, strict=True):
                change = retry(task, slot)
                when = self._clock.now() if at is None else at
                back.append(None if change is None else apply_change(self._store, change, at=when))
        return back

    def overdue_campaigns(
        self, now: datetime, *, late: timedelta | None = None
    ) -> dict[str, datetime]:
        """Active campaigns with a Pending task more than ``late`` (default ``max_lateness``)
        past its send time: campaign id -> the earliest such send time."""
        if late is None:
            late = timedelta(seconds=self._config.max_lateness)
        before = now - late
        found: dict[str, datetime] = {}
        states: dict[str, CampaignState] = {}
        cursor: tuple[datetime, str] | None = None
        while True:
            page = self._store.due_tasks(TaskState.PENDING, before=before, after=cursor)
            for task in page:
                cid = task.campaign_id
                if cid not in states:
                    states[cid] = self._store.campaign_state(cid)
                if states[cid] is CampaignState.ACTIVE and cid not in found:
                    found[cid] = task.send_at
            if len(page) < 1000:
                return found
            cursor = (page[-1].send_at, page[-1].id)
