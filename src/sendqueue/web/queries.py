"""Read models of the web app: a campaign with its next send, its per-day timeline, a plan.

Shapes extend :mod:`sendqueue.services.views` (the CLI's ``--json``), so the API and the CLI
agree. The pages use these functions too, so a page and the API never disagree.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sendqueue.domain.errors import NoSendingDay
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import Campaign
from sendqueue.domain.planner import DaySummary, per_day_summary, plan
from sendqueue.domain.policy import SendingPolicy
from sendqueue.domain.senders import Sender
from sendqueue.ports import Clock, Tasks, TaskStore
from sendqueue.services.mailboxes import SenderMailboxes, mailbox_dict
from sendqueue.services.previews import PlanSummary
from sendqueue.services.replanning import iter_tasks
from sendqueue.services.senders import USAGE_DAYS, SenderService, SenderView
from sendqueue.services.views import (
    CampaignCounts,
    CampaignView,
    campaign_moves,
    campaign_outcomes,
    campaign_suppressed,
    iso,
)
from sendqueue.web.schemas import (
    CampaignDetail,
    Plan,
    PlanDay,
    PlanSend,
    PlanZone,
    SenderDetail,
    SenderMailbox,
    SenderOut,
    SenderUsageDay,
)
from sendqueue.web.times import zone_names

__all__ = [
    "PLAN_SENDS_SHOWN",
    "TimelineCache",
    "TimelineFunction",
    "campaign_timeline",
    "campaign_view",
    "next_send_at",
    "sender_detail",
    "sender_out",
    "summary_view",
]

#: A plan lists at most this many sends; ``days`` always covers all of them.
PLAN_SENDS_SHOWN = 1000

# States whose timeline may be the plan from now rather than the tasks.
_PLANNED_FROM_NOW = frozenset({CampaignState.DRAFT, CampaignState.PROVISIONING})
# Pending tasks looked at for the next send. Sends are planned in position order, so the first
# Pending task is nearly always the next; a task retried after a transient error may be later
# than the ones after it, which looking at a page of them covers.
_NEXT_SEND_PAGE = 100


def next_send_at(store: Tasks, campaign: Campaign) -> datetime | None:
    """When the campaign sends next: the earliest planned Pending email, while it is sending."""
    if campaign.state not in {CampaignState.ACTIVE, CampaignState.PROVISIONING}:
        return None
    pending = store.list_tasks(campaign.id, state=TaskState.PENDING, limit=_NEXT_SEND_PAGE)
    return min((t.send_at for t in pending), default=None)


def campaign_view(store: CampaignCounts, campaign: Campaign) -> CampaignDetail:
    """``campaign show --json`` plus ``next_send_at``."""
    fields = CampaignView.fields_of(
        campaign,
        store.count_tasks(campaign.id),
        campaign_moves(store, campaign),
        campaign_suppressed(store, campaign),
        campaign_outcomes(store, campaign),
    )
    return CampaignDetail(**fields, next_send_at=iso(next_send_at(store, campaign)))


def sender_out(sender: Sender) -> SenderOut:
    """A sender as the API shows it: :class:`SenderView`'s form, the transport masked."""
    return SenderOut(**SenderView.of(sender).as_dict())


def sender_detail(
    senders: SenderService,
    sender: Sender,
    *,
    days: int = USAGE_DAYS,
    mailboxes: SenderMailboxes | None = None,
) -> SenderDetail:
    """A sender with its usage per local day from today (``sender show --json``), and with
    ``mailboxes`` its own mailbox's state."""
    usage = senders.usage(sender.id, days=days)
    state = mailboxes.states_of([sender]).get(sender.id) if mailboxes is not None else None
    return SenderDetail(
        mailbox=SenderMailbox.model_validate(mailbox_dict(state)) if state else None,
        **SenderView.of(sender).as_dict(),
        usage=[
            SenderUsageDay(date=d.date.isoformat(), planned=d.planned, sent=d.sent, cap=d.cap)
            for d in usage
        ],
    )


def summary_view(policy: SendingPolicy, summary: PlanSummary, *, duplicates: int = 0) -> Plan:
    """A plan's :class:`PlanSummary` (a stored campaign's or a draft's) as the preview routes
    return it (docs/api.md): its first sends in time order, each with the zone its windows
    are read in, its sends per day and per recipient zone, and the abbreviations of those
    zones for whoever shows the times (:func:`~sendqueue.web.times.zone_names`)."""
    shown = summary.first[:PLAN_SENDS_SHOWN]
    out = _plan(policy, summary.count, shown, summary.emails, summary.days, duplicates)
    out.policy_text = policy.describe(local_time=summary.local_time)
    out.local_time = summary.local_time
    for send, zone in zip(out.sends, summary.first_zones, strict=False):
        send.zone = zone
    for send, sender in zip(out.sends, summary.first_senders, strict=False):
        send.sender = sender
    out.zones = [
        PlanZone(zone=z.zone, count=z.count, days=[_plan_day(d) for d in z.days])
        for z in summary.zones
    ]
    out.zone_names = zone_names([policy.timezone, *(z.zone for z in summary.zones)])
    return out


def _plan_day(day: DaySummary) -> PlanDay:
    return PlanDay(
        day=day.day.isoformat(),
        count=day.count,
        first=day.first.isoformat(),
        last=day.last.isoformat(),
    )


def _plan(
    policy: SendingPolicy,
    count: int,
    shown: Sequence[datetime],
    emails: Sequence[str] | None,
    days: Sequence[DaySummary],
    duplicates: int,
) -> Plan:
    zone = policy.zone
    rows: list[PlanSend] = []
    for index, when in enumerate(shown):
        email = emails[index] if emails is not None and index < len(emails) else None
        rows.append(
            PlanSend(
                index=index,
                send_at=iso(when),
                local=when.astimezone(zone).isoformat(),
                email=email,
            )
        )
    return Plan(
        policy_text=policy.describe(),
        timezone=policy.timezone,
        count=count,
        duplicates=duplicates,
        sends=rows,
        days=[_plan_day(day) for day in days],
    )


def campaign_timeline(store: TaskStore, campaign: Campaign, now: datetime) -> list[dict[str, Any]]:
    """Planned and done emails per local day (the campaign's zone), in day order.

    ``planned`` counts every task that is not cancelled by the local day of its send time;
    ``done`` counts the Finished ones by the local day they were sent. Before provisioning has
    created any task, the plan from ``now`` stands in for the tasks (``done`` is 0).
    """
    zone = campaign.policy.zone
    planned: Counter[str] = Counter()
    done: Counter[str] = Counter()
    seen = False
    for task in iter_tasks(store, campaign.id):
        seen = True
        if task.state is not TaskState.CANCELLED:
            planned[task.send_at.astimezone(zone).date().isoformat()] += 1
        if task.state is TaskState.FINISHED and task.sent_at is not None:
            done[task.sent_at.astimezone(zone).date().isoformat()] += 1
    if not seen and campaign.state in {CampaignState.DRAFT, CampaignState.PROVISIONING}:
        try:
            sends = plan(campaign.policy, campaign.recipient_count, now=now)
        except NoSendingDay:
            return []
        for day in per_day_summary(sends, campaign.policy.timezone):
            planned[day.day.isoformat()] = day.count
    days = sorted(set(planned) | set(done))
    return [{"day": d, "planned": planned.get(d, 0), "done": done.get(d, 0)} for d in days]


#: ``(store, campaign, now) -> [{"day", "planned", "done"}, ...]``: what the chart draws.
TimelineFunction = Callable[[TaskStore, Campaign, datetime], list[dict[str, Any]]]


class TimelineCache:
    """A campaign's per-day timeline, kept until the campaign's change log moves.

    Computing it reads every task, so the result is kept: a cheap ``changes_after(marker,
    campaign_id=..., limit=1)`` tells whether anything changed since. Before provisioning has
    made tasks a timeline is the plan from now, so for drafts and provisioning campaigns it is
    kept for the current minute at most. ``compute`` is the one definition of a timeline
    (:func:`campaign_timeline` unless told otherwise), so the page and the API agree.
    """

    def __init__(
        self,
        store: TaskStore,
        clock: Clock,
        compute: TimelineFunction = campaign_timeline,
        *,
        size: int = 64,
    ) -> None:
        self._store = store
        self._clock = clock
        self._compute = compute
        self._size = size
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[int, str, list[dict[str, Any]]]] = OrderedDict()

    def get(self, campaign: Campaign) -> list[dict[str, Any]]:
        now = self._clock.now()
        minute = now.strftime("%Y-%m-%dT%H:%M")
        with self._lock:
            cached = self._entries.get(campaign.id)
        if cached is not None and self._fresh(campaign, cached[0], cached[1], minute):
            return cached[2]
        # Taken before reading, so a change made while reading makes the next call recount.
        marker = self._store.last_change_id()
        days = self._compute(self._store, campaign, now)
        with self._lock:
            self._entries[campaign.id] = (marker, minute, days)
            self._entries.move_to_end(campaign.id)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return days

    def _fresh(self, campaign: Campaign, marker: int, minute: str, now_minute: str) -> bool:
        if campaign.state in _PLANNED_FROM_NOW and minute != now_minute:
            return False
        return not self._store.changes_after(marker, campaign_id=campaign.id, limit=1)
