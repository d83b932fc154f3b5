"""The read side: what the pages, the API and the CLI show, each view read in one store call
where the store has one for it (:class:`~sendqueue.ports.reads.CampaignReads`).

:class:`Queries` is what the web routes and the CLI read through; they never hold the store.
Its shapes are :mod:`sendqueue.domain.reads` and the views of
:mod:`sendqueue.services.reading.views`.
A campaign's per-day timeline reads every task, so :class:`TimelineCache` keeps it until the
campaign's change log moves; the campaign's read tells whether it did. The same pass counts
the tasks per step, state and outcome (:class:`Tally`), what a sequence's funnel is made from
(:func:`~sendqueue.domain.funnel.step_funnel`).
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol

from sendqueue.domain import reads
from sendqueue.domain.errors import NoSendingDay, NotFound
from sendqueue.domain.funnel import StepCounts
from sendqueue.domain.lifecycle import CampaignState, TaskOutcome, TaskState
from sendqueue.domain.models import Campaign, Task
from sendqueue.domain.planner import per_day_summary, plan
from sendqueue.domain.reads import CampaignFigures, CampaignPage, TaskListing
from sendqueue.domain.sender_fields import SenderFields
from sendqueue.domain.steps import MAX_STEPS
from sendqueue.ports import Clock, SenderStore, TaskStore
from sendqueue.ports.reads import CampaignReads
from sendqueue.services.planning.replanning import iter_tasks
from sendqueue.services.reading.views import LATE_SECONDS, CampaignView
from sendqueue.services.senders.sender_of import SendersOf

__all__ = [
    "CampaignFigures",
    "CampaignPage",
    "Queries",
    "QueryStore",
    "Tally",
    "TaskListing",
    "TimelineCache",
    "TimelineFunction",
    "campaign_fields",
    "campaign_json",
    "campaign_tally",
    "campaign_timeline",
    "senders_of",
]

# States whose timeline may be the plan from now rather than the tasks.
_PLANNED_FROM_NOW = frozenset({CampaignState.DRAFT, CampaignState.PROVISIONING})
_PAGE = 1000

#: A day of a timeline: ``{"day": "2026-03-02", "planned": 40, "done": 12}``.
Timeline = list[dict[str, Any]]


@dataclass(frozen=True)
class Tally:
    """What one pass over a campaign's tasks counts: its timeline and its tasks per step,
    state and outcome."""

    timeline: Timeline
    steps: StepCounts


class QueryStore(TaskStore, CampaignReads, Protocol):
    """The task store as the read side sees it: its reads and its one-call views."""


def campaign_fields(figures: CampaignFigures) -> dict[str, Any]:
    """The :class:`CampaignView` field values of ``figures`` (``campaign show --json``)."""
    return CampaignView.fields_of(
        figures.campaign,
        figures.counts,
        (figures.moved, figures.late),
        figures.suppressed,
        figures.outcomes,
        steps=figures.steps,
    )


def campaign_json(figures: CampaignFigures) -> dict[str, Any]:
    """``campaign show --json``: what :func:`~sendqueue.services.reading.views.campaign_dict`
    gives."""
    return CampaignView(**campaign_fields(figures)).as_json()


def senders_of(listing: TaskListing) -> SendersOf:
    """The senders of a listing's tasks, from what the listing read."""
    return SendersOf.known(listing.campaign, listing.senders)


def _tasks_of(store: TaskStore, campaign_id: str) -> Iterator[Task]:
    return iter_tasks(store, campaign_id, page=_PAGE)


def campaign_timeline(store: TaskStore, campaign: Campaign, now: datetime) -> Timeline:
    """The timeline of :func:`campaign_tally`."""
    return campaign_tally(store, campaign, now).timeline


def campaign_tally(store: TaskStore, campaign: Campaign, now: datetime) -> Tally:
    """Planned and done emails per local day (the campaign's zone), in day order, and the
    tasks per (step, state, outcome).

    ``planned`` counts every task that is not cancelled by the local day of its send time;
    ``done`` counts the Finished ones by the local day they were sent. Before provisioning has
    created any task, the plan from ``now`` stands in for the tasks (``done`` is 0).
    """
    zone = campaign.policy.zone
    planned: Counter[str] = Counter()
    done: Counter[str] = Counter()
    steps: Counter[tuple[int, TaskState, TaskOutcome | None]] = Counter()
    seen = False
    for task in _tasks_of(store, campaign.id):
        seen = True
        steps[(task.step, task.state, task.outcome)] += 1
        if task.state is not TaskState.CANCELLED:
            planned[task.send_at.astimezone(zone).date().isoformat()] += 1
        if task.state is TaskState.FINISHED and task.sent_at is not None:
            done[task.sent_at.astimezone(zone).date().isoformat()] += 1
    if not seen and campaign.state in _PLANNED_FROM_NOW:
        try:
            sends = plan(campaign.policy, campaign.recipient_count, now=now)
        except NoSendingDay:
            return Tally([], steps)
        for day in per_day_summary(sends, campaign.policy.timezone):
            planned[day.day.isoformat()] = day.count
    days = sorted(set(planned) | set(done))
    timeline = [{"day": d, "planned": planned.get(d, 0), "done": done.get(d, 0)} for d in days]
    return Tally(timeline, steps)


#: ``(store, campaign, now) -> [{"day", "planned", "done"}, ...]``: what the chart draws.
TimelineFunction = Callable[[TaskStore, Campaign, datetime], Timeline]
#: ``(store, campaign, now) -> Tally``: what :class:`TimelineCache` keeps.
TallyFunction = Callable[[TaskStore, Campaign, datetime], Tally]


class TimelineCache:
    """A campaign's per-day timeline, kept until the campaign's change log moves.

    Computing it reads every task, so the result is kept with the change-log id read before
    computing (its marker). A caller that read whether the campaign changed since
    :meth:`marker` passes that as ``changed``; else a cheap ``changes_after(marker,
    campaign_id=..., limit=1)`` tells. Before provisioning has made tasks a timeline is the
    plan from now, so for drafts and provisioning campaigns it is kept for the current minute
    at most. ``compute`` is the one definition of a timeline (:func:`campaign_timeline` unless
    told otherwise), so the page and the API agree.
    """

    def __init__(
        self,
        store: TaskStore,
        clock: Clock,
        compute: TallyFunction = campaign_tally,
        *,
        size: int = 64,
    ) -> None:
        self._store = store
        self._clock = clock
        self._compute = compute
        self._size = size
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[int, str, Tally]] = OrderedDict()

    def marker(self, campaign_id: str) -> int | None:
        """The change-log id the campaign's kept timeline was computed at; None: none kept."""
        with self._lock:
            cached = self._entries.get(campaign_id)
        return cached[0] if cached is not None else None

    def get(
        self,
        campaign: Campaign,
        *,
        since: int | None = None,
        changed: bool | None = None,
        head: int | None = None,
    ) -> Timeline:
        """The campaign's timeline: :meth:`tally`'s."""
        return self.tally(campaign, since=since, changed=changed, head=head).timeline

    def tally(
        self,
        campaign: Campaign,
        *,
        since: int | None = None,
        changed: bool | None = None,
        head: int | None = None,
    ) -> Tally:
        """The campaign's timeline and step counts. ``changed``: whether its change log moved
        after ``since`` (what :meth:`marker` said), read by the caller; ``head``: the store's
        ``last_change_id`` read before anything else, which a recount is marked with."""
        now = self._clock.now()
        minute = now.strftime("%Y-%m-%dT%H:%M")
        with self._lock:
            cached = self._entries.get(campaign.id)
        if cached is not None and not (campaign.state in _PLANNED_FROM_NOW and cached[1] != minute):
            marker = cached[0]
            if changed is not None and since == marker:
                if not changed:
                    return cached[2]
            elif not self._store.changes_after(marker, campaign_id=campaign.id, limit=1):
                return cached[2]
        # Taken before reading, so a change made while reading makes the next call recount.
        marker = head if head is not None else self._store.last_change_id()
        tally = self._compute(self._store, campaign, now)
        with self._lock:
            self._entries[campaign.id] = (marker, minute, tally)
            self._entries.move_to_end(campaign.id)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return tally


class Queries:
    """Every read the pages, the API and the CLI make (see the module docstring)."""

    def __init__(self, store: QueryStore, senders: SenderStore, timelines: TimelineCache) -> None:
        self._store = store
        self._senders = senders
        self.timelines = timelines

    @classmethod
    def over(cls, store: QueryStore, senders: SenderStore, clock: Clock) -> Queries:
        """The read side of ``store``, with its own timeline cache."""
        return cls(store, senders, TimelineCache(store, clock))

    def campaigns(self) -> list[CampaignFigures]:
        """Every campaign with its figures, newest first: one store call."""
        return self._store.all_campaign_figures(late_after=LATE_SECONDS)

    def campaign(self, campaign_id: str, *, steps: bool = False) -> CampaignFigures:
        """One campaign with its figures (``steps``: and its counts per step): one store
        call."""
        return self._store.campaign_figures(campaign_id, late_after=LATE_SECONDS, steps=steps)

    def figures_for(self, campaign: Campaign, *, steps: bool = False) -> CampaignFigures:
        """The figures of ``campaign`` as a control returned it (its state as it left it,
        though a background run may have moved on since): one store call."""
        figures = self._store.campaign_figures(campaign.id, late_after=LATE_SECONDS, steps=steps)
        return replace(figures, campaign=campaign)

    def campaign_with_timeline(self, campaign_id: str) -> tuple[CampaignFigures, Tally]:
        """One campaign with its figures and counts per step, its timeline and its funnel's
        counts: one store call while the kept tally is current. The counts per step come from
        the tally's pass over the tasks, not from a second count in the store."""
        since = self.timelines.marker(campaign_id)
        figures = self._store.campaign_figures(
            campaign_id, late_after=LATE_SECONDS, changes_since=since
        )
        tally = self.timelines.tally(figures.campaign, since=since, changed=figures.changed)
        rows = ((step, state, outcome, n) for (step, state, outcome), n in tally.steps.items())
        return replace(figures, steps=reads.StepCounts.tally(rows)), tally

    def tasks(
        self,
        campaign_id: str,
        *,
        state: TaskState | None = None,
        search: str | None = None,
        after: int = -1,
        limit: int = 100,
        step: int | None = None,
    ) -> TaskListing:
        """A page of the campaign's tasks with their senders (``step``: that step's only): one
        store call."""
        return self._store.task_listing(
            campaign_id, state=state, search=search, after=after, limit=limit, step=step
        )

    def recipient_tasks(
        self,
        campaign_id: str,
        *,
        state: TaskState | None = None,
        search: str | None = None,
        after: int = -1,
        limit: int = 100,
        step: int | None = None,
    ) -> TaskListing:
        """:meth:`tasks`, but a page never ends between one recipient's steps, so the last
        task's position is a safe cursor for the next page: when more follow, a sequence's
        last recipient is read to its end (at most ``MAX_STEPS - 1`` tasks past ``limit``, one
        store call more)."""
        listing = self.tasks(
            campaign_id, state=state, search=search, after=after, limit=limit, step=step
        )
        if not listing.more or not listing.tasks or step is not None:
            return listing
        if len(listing.campaign.steps) <= 1:
            return listing  # one task per recipient
        last = listing.tasks[-1].position
        if listing.tasks[0].position != last:
            return listing  # the store's listing left a cut last recipient for the next page
        rest = self._store.list_tasks(
            campaign_id, state=state, search=search, after=last - 1, limit=MAX_STEPS
        )
        seen = {task.id for task in listing.tasks}
        extra = [task for task in rest if task.position == last and task.id not in seen]
        more = len(rest) == MAX_STEPS or any(task.position > last for task in rest)
        return replace(listing, tasks=[*listing.tasks, *extra], more=more)

    def campaign_page(
        self,
        campaign_id: str,
        *,
        state: TaskState | None = None,
        search: str | None = None,
        after: int = -1,
        limit: int = 100,
        step: int | None = None,
    ) -> tuple[CampaignPage, Tally]:
        """What the campaign page shows, with its timeline and step counts: one store call
        while the kept tally is current."""
        since = self.timelines.marker(campaign_id)
        page = self._store.campaign_page(
            campaign_id,
            late_after=LATE_SECONDS,
            state=state,
            search=search,
            after=after,
            limit=limit,
            changes_since=since,
            step=step,
        )
        figures = page.figures
        tally = self.timelines.tally(
            figures.campaign, since=since, changed=figures.changed, head=page.last_change_id
        )
        return page, tally

    def campaign_of(self, campaign_id: str) -> Campaign:
        """The campaign alone; NotFound if unknown."""
        return self._store.get_campaign(campaign_id)

    def all_campaigns(self) -> list[Campaign]:
        """Every campaign without figures, newest first."""
        return self._store.list_campaigns()

    def task(
        self, task_id: str, campaign_id: str | None = None, *, noun: str = "task"
    ) -> tuple[Campaign, Task]:
        """A task and its campaign; NotFound (of ``noun``) when the task is unknown or, with
        ``campaign_id``, of another campaign."""
        found = self._store.get_task(task_id)
        if found is None or (campaign_id is not None and found.campaign_id != campaign_id):
            raise NotFound(noun, task_id)
        return self._store.get_campaign(found.campaign_id), found

    def email(self, campaign_id: str, task_id: str) -> tuple[Campaign, Task, SenderFields]:
        """A campaign's email and the sender it goes out from: one store call. NotFound of the
        campaign first, then of the ``email``."""
        detail = self._store.task_detail(campaign_id, task_id)
        if detail.task is None:
            raise NotFound("email", task_id)
        sender = SendersOf.known(detail.campaign, detail.senders).of(detail.task)
        return detail.campaign, detail.task, sender

    def sender_of(self, campaign: Campaign, task: Task) -> SenderFields:
        """The sender ``task``'s email goes out from (:class:`SendersOf`)."""
        return SendersOf(self._senders, campaign).of(task)

    def task_pages(
        self, campaign_id: str, *, state: TaskState | None = None, page: int = _PAGE
    ) -> Iterator[TaskListing]:
        """Every task of the campaign, a listing at a time (each one store call)."""
        after = -1
        while True:
            listing = self.tasks(campaign_id, state=state, after=after, limit=page)
            yield listing
            if not listing.more or not listing.tasks:
                return
            after = listing.tasks[-1].position

    def last_change_id(self) -> int:
        """The store's ``last_change_id``: whether it answers (``/healthz``)."""
        return self._store.last_change_id()
