"""Read models of the web app: a campaign with its next send, a sender, a plan.

Shapes extend :mod:`sendqueue.services.reading.views` (the CLI's ``--json``), so the API and the CLI
agree. The pages use these functions too, so a page and the API never disagree. What they show
is read through :class:`sendqueue.services.reading.queries.Queries` (the timeline too:
:class:`~sendqueue.services.reading.queries.TimelineCache`, re-exported here).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sendqueue.domain.planner import DaySummary
from sendqueue.domain.policy import SendingPolicy
from sendqueue.domain.reads import CampaignFigures
from sendqueue.domain.senders import Sender
from sendqueue.services.campaigns.preview import STEPS_NOTE, PlanSummary
from sendqueue.services.feedback.mailboxes import SenderMailboxes, mailbox_dict
from sendqueue.services.reading.queries import (
    TimelineCache,
    TimelineFunction,
    campaign_fields,
    campaign_timeline,
)
from sendqueue.services.reading.views import iso
from sendqueue.services.senders.service import USAGE_DAYS, SenderService, SenderView
from sendqueue.web.schemas import (
    CampaignDetail,
    Plan,
    PlanDay,
    PlanSend,
    PlanStep,
    PlanStepDay,
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
    "campaign_detail",
    "campaign_timeline",
    "sender_detail",
    "sender_out",
    "summary_view",
]

#: A plan lists at most this many sends; ``days`` always covers all of them.
PLAN_SENDS_SHOWN = 1000


def campaign_detail(figures: CampaignFigures) -> CampaignDetail:
    """``campaign show --json`` plus ``next_send_at``."""
    return CampaignDetail(**campaign_fields(figures), next_send_at=iso(figures.next_send_at))


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
    if summary.steps:
        out.steps = [
            PlanStep(
                step=load.step,
                after=load.after,
                count=load.count,
                days=[PlanStepDay(day=day.isoformat(), count=n) for day, n in load.days],
            )
            for load in summary.steps
        ]
        out.steps_note = STEPS_NOTE
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
