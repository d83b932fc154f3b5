"""The plan of a stored campaign, as its preview shows it (each recipient's zone too).

A campaign without local time is planned by :func:`~sendqueue.domain.planner.plan`, every
window read in the campaign's timezone: its summary has one :class:`ZoneDays`, the campaign's
zone, even when recipients carry a ``timezone`` of their own (those are stored, not used;
:attr:`PlanSummary.local_time` says so). A local-time campaign is planned by
:func:`~sendqueue.domain.capacity.plan_with_senders` with each recipient's zone, as
provisioning plans it: every send inside the windows on the wall clock of its recipient's zone
(the campaign's for a recipient without one), ``per_day`` counted per local day of the
campaign's timezone. Its summary counts the sends per day twice: ``days`` per local day of the
campaign's timezone (what ``per_day`` limits), ``zones`` per zone, each in that zone's own
local days (what each recipient sees).

:meth:`Previews.planned_sends` is the one place a preview plans; a campaign with senders is
planned there too (the capacity planner plugs in at that seam). :class:`CampaignPreviews` is
the service the CLI, the API and the pages call: it keeps the recent summaries.
"""

from __future__ import annotations

import heapq
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import MappingProxyType

from sendqueue.domain.capacity import plan_with_senders
from sendqueue.domain.models import Campaign, Recipient
from sendqueue.domain.planner import DaySummary, per_day_summary, per_zone_day_summary, plan
from sendqueue.domain.policy import SendingPolicy
from sendqueue.domain.sender_fields import SenderFields
from sendqueue.domain.step_load import StepLoad, step_loads
from sendqueue.ports import Campaigns, Clock
from sendqueue.services.campaigns.creation import Draft
from sendqueue.services.planning.capacity import CapacityPlanner

__all__ = [
    "PREVIEW_CACHE_SIZE",
    "PREVIEW_SENDS",
    "STEPS_NOTE",
    "CampaignPreviews",
    "PlanSummary",
    "Previews",
    "ZoneDays",
    "sequence_loads",
    "summarize",
]

_PAGE = 1000
#: Sends a plan summary lists one by one; campaign plans it keeps (least recently used go).
PREVIEW_SENDS = 1000
PREVIEW_CACHE_SIZE = 16
#: What a preview says of a sequence's load per day and step.
STEPS_NOTE = (
    "An estimate: step 1 as planned, each later step at its earliest time after the step "
    "before, as if no one answered; capacity (per_day, sender caps) is not counted."
)
_NO_VARIABLES: MappingProxyType[str, str] = MappingProxyType({})


@dataclass(frozen=True)
class ZoneDays:
    """The sends to the recipients of one zone, per local day of that zone."""

    zone: str
    """An IANA zone: a recipient's own, or the campaign's for recipients without one."""
    days: tuple[DaySummary, ...]
    """Per local calendar day of ``zone`` (``first`` and ``last`` in ``zone``), in date order."""
    count: int
    """Sends to this zone's recipients (the sum of ``days``)."""


@dataclass(frozen=True)
class PlanSummary:
    """What a preview of a stored campaign shows: the count, the first sends with their
    addresses, and the sends per local day, of the campaign and of each recipient zone."""

    count: int
    first: tuple[datetime, ...]
    """The first sends (:data:`PREVIEW_SENDS` of them), in time order; at equal instants, in
    recipient order."""
    emails: tuple[str, ...]
    """The addresses of those sends, in the same order."""
    days: tuple[DaySummary, ...]
    """Per local day of the campaign's timezone: what ``per_day`` limits."""
    zones: tuple[ZoneDays, ...] = ()
    """Per recipient zone, each counted in its own local days: the campaign's zone first,
    then the others by name. A campaign without local time has one, the campaign's zone."""
    local_time: bool = False
    """Whether the windows are read in each recipient's zone; when False, recipients' own
    zones (a ``timezone`` column) are stored but not used."""
    first_zones: tuple[str, ...] = ()
    """The zone each of the ``first`` sends is planned in (its recipient's, or the
    campaign's), in the same order: where its local time is read."""
    first_senders: tuple[str, ...] = ()
    """Who each of the ``first`` sends goes out from, ``Name <address>``: its planned sender,
    or the campaign's From; in the same order."""
    steps: tuple[StepLoad, ...] = ()
    """A sequence's expected sends per local day of the campaign's timezone and step, as if
    no one answered and capacity did not count (:func:`sequence_loads`); empty for a
    campaign of one email."""


class Previews:
    """Plans a stored campaign from a given instant, reading its recipients from the store.
    Stateless apart from the store; the caller caches (:class:`CampaignPreviews`)."""

    def __init__(self, store: Campaigns, capacity: CapacityPlanner | None = None) -> None:
        self._store = store
        self._capacity = capacity

    def summary(self, campaign: Campaign, start: datetime, *, shown: int) -> PlanSummary:
        """The campaign's plan from ``start`` as a :class:`PlanSummary` listing its first
        ``shown`` sends.

        A campaign planned as a whole by ``plan`` reads only the addresses it shows; one whose
        plan depends on its recipients (local time, senders) reads every recipient's address
        and zone once (not the bodies).
        """
        if not _needs_recipients(campaign):
            sends = plan(campaign.policy, campaign.recipient_count, now=start)
            first = min(shown, len(sends))
            listed = self._store.list_recipients(campaign.id, limit=max(1, first))
            return _plain(campaign, sends, [r.email for r in listed][:first], shown)
        recipients = self._addressees(campaign.id)
        sends = self.planned_sends(campaign, recipients, start)
        senders = self.planned_senders(campaign, recipients)
        return summarize(campaign, recipients, sends, shown=shown, senders=senders)

    def unsaved(
        self,
        campaign: Campaign,
        count: int,
        first_emails: Sequence[str],
        recipients: Callable[[], Iterable[Recipient]],
        start: datetime,
        *,
        shown: int,
    ) -> PlanSummary:
        """:meth:`summary` of a campaign not stored yet (a draft being previewed): ``count``
        recipients, the addresses of the first ones, and all of them on demand (read only
        when the plan depends on who they are)."""
        if not _needs_recipients(campaign):
            sends = plan(campaign.policy, count, now=start)
            return _plain(campaign, sends, first_emails, shown)
        slim = [Recipient(r.position, r.email, timezone=r.timezone) for r in recipients()]
        sends = self.planned_sends(campaign, slim, start)
        senders = self.planned_senders(campaign, slim)
        return summarize(campaign, slim, sends, shown=shown, senders=senders)

    def pairs(self, campaign: Campaign, now: datetime) -> list[tuple[Recipient, datetime]]:
        """Every recipient of the campaign with its send instant planned from ``now``, in
        recipient order."""
        recipients: list[Recipient] = []
        after = -1
        while True:
            batch = self._store.list_recipients(campaign.id, after=after, limit=_PAGE)
            recipients.extend(batch)
            if len(batch) < _PAGE:
                break
            after = batch[-1].position
        sends = self.planned_sends(campaign, recipients, now)
        return list(zip(recipients, sends, strict=True))

    def planned_sends(
        self, campaign: Campaign, recipients: Sequence[Recipient], start: datetime
    ) -> list[datetime]:
        """The seam every preview plans through: the send instant of each of ``recipients``
        (the campaign's, in position order), ``out[i]`` for ``recipients[i]``, from ``start``.

        ``recipients`` may be slim (only ``position``, ``email`` and ``timezone`` are read).
        A local-time campaign is planned with each recipient's zone, the campaign's ``per_day``
        per local day of its timezone; one with senders over their books as they are now
        (their caps, gaps and what other campaigns booked; nothing is booked); any other by
        ``plan``.
        """
        policy = campaign.policy
        if campaign.sender_ids and self._capacity is not None:
            return self._capacity.preview(
                campaign, [(r.email, r.timezone) for r in recipients], start=start
            )
        if campaign.local_time:
            return plan_with_senders(
                policy,
                [None] * len(recipients),
                {},
                now=start,
                zones=[r.timezone for r in recipients],
            )
        return plan(policy, len(recipients), now=start)

    def planned_senders(self, campaign: Campaign, recipients: Sequence[Recipient]) -> list[str]:
        """Who each of ``recipients`` would get its email from, ``Name <address>`` (one string
        per sender, shared): its planned sender, or the campaign's From."""
        from_shown = SenderFields.of_from(campaign.from_addr).shown
        if not campaign.sender_ids or self._capacity is None:
            return [from_shown] * len(recipients)
        chosen, senders = self._capacity.preview_senders(campaign, [r.email for r in recipients])
        shown = {sid: SenderFields.of_sender(s).shown for sid, s in senders.items()}
        return [from_shown if sid is None else shown[sid] for sid in chosen]

    def _addressees(self, campaign_id: str) -> list[Recipient]:
        """Every recipient of the campaign with only its position, address and zone (a zone's
        name held once), in position order."""
        names: dict[str, str] = {}
        out: list[Recipient] = []
        after = -1
        while True:
            batch = self._store.list_recipients(campaign_id, after=after, limit=_PAGE)
            for r in batch:
                zone = r.timezone
                if zone is not None:
                    zone = names.setdefault(zone, zone)
                out.append(Recipient(r.position, r.email, variables=_NO_VARIABLES, timezone=zone))
            if len(batch) < _PAGE:
                return out
            after = batch[-1].position


class CampaignPreviews:
    """The planned sends of a stored campaign or of a draft, from now."""

    def __init__(self, store: Campaigns, capacity: CapacityPlanner, clock: Clock) -> None:
        self._store = store
        self._capacity = capacity
        self._clock = clock
        self._previews: OrderedDict[tuple[object, ...], PlanSummary] = OrderedDict()
        self._previews_lock = threading.Lock()

    def preview_summary(self, campaign_id: str) -> PlanSummary:
        """The plan of a stored campaign from now, as a summary: cached per campaign.

        Planning a million sends takes seconds, and a page asks again and again. The key holds
        everything the plan depends on: the campaign (its state and ``updated_at`` change on
        every write), its policy and recipient count, and "now" rounded up to the minute; the
        plan starts at that minute, so each send is at most a minute later than planned from
        the exact instant. Provisioning drops the campaign's entries.

        A local-time campaign is planned in each recipient's zone; the summary counts its
        sends per day of the campaign's timezone (``days``) and per recipient zone in that
        zone's days (``zones``); see the module docstring.
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
            campaign.steps,
            start,
        )
        with self._previews_lock:
            cached = self._previews.get(key)
            if cached is not None:
                self._previews.move_to_end(key)
                return cached
        summary = Previews(self._store, self._capacity).summary(
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
            sender_ids=draft.sender_ids, local_time=draft.local_time, steps=draft.steps,
        )  # fmt: skip
        imported = draft.imported
        return Previews(self._store, self._capacity).unsaved(
            campaign, imported.count, imported.first_emails, imported.recipients,
            self._clock.now(), shown=PREVIEW_SENDS,
        )  # fmt: skip

    def forget(self, campaign_id: str) -> None:
        """Drop the summaries kept for a campaign (it has started provisioning)."""
        with self._previews_lock:
            for key in [k for k in self._previews if k[0] == campaign_id]:
                del self._previews[key]

    def preview(self, campaign_id: str) -> list[tuple[Recipient, datetime]]:
        """The plan for the campaign's recipients from now: (recipient, send instant) pairs,
        in recipient order (a local-time campaign's sends are in each recipient's zone, so
        not in time order)."""
        campaign = self._store.get_campaign(campaign_id)
        return Previews(self._store, self._capacity).pairs(campaign, self._clock.now())


def _next_minute(now: datetime) -> datetime:
    floor = now.replace(second=0, microsecond=0)
    return floor if floor == now else floor + timedelta(minutes=1)


def summarize(
    campaign: Campaign,
    recipients: Sequence[Recipient],
    sends: Sequence[datetime],
    *,
    shown: int,
    senders: Sequence[str] = (),
) -> PlanSummary:
    """The :class:`PlanSummary` of a plan that depends on its recipients: ``sends[i]`` is
    the send instant of ``recipients[i]`` (in position order, as
    :meth:`Previews.planned_sends` returns them), ``senders[i]`` who it goes out from (as
    :meth:`Previews.planned_senders` names them; none: not listed). The first ``shown``
    sends are listed in time order (sends of different zones or senders interleave), equal
    instants by position."""
    default = campaign.policy.timezone
    zones = [r.timezone for r in recipients] if campaign.local_time else [None] * len(sends)
    order = heapq.nsmallest(shown, range(len(sends)), key=sends.__getitem__)
    by_zone = per_zone_day_summary(sends, zones, default)
    return PlanSummary(
        count=len(sends),
        first=tuple(sends[i] for i in order),
        emails=tuple(recipients[i].email for i in order),
        days=tuple(per_day_summary(sends, default)),
        zones=tuple(
            ZoneDays(zone, tuple(zd), sum(d.count for d in zd)) for zone, zd in by_zone.items()
        ),
        local_time=campaign.local_time,
        first_zones=tuple(zones[i] or default for i in order),
        first_senders=tuple(senders[i] for i in order) if senders else (),
        steps=sequence_loads(campaign, sends, zones if campaign.local_time else None),
    )


def _plain(
    campaign: Campaign, sends: Sequence[datetime], emails: Sequence[str], shown: int
) -> PlanSummary:
    """The summary of a plan by ``plan`` (recipient order is time order; one zone)."""
    default = campaign.policy.timezone
    first = sends[:shown]
    days = tuple(per_day_summary(sends, default))
    sender = SenderFields.of_from(campaign.from_addr).shown  # no senders: the From sends all
    return PlanSummary(
        count=len(sends),
        first=tuple(first),
        emails=tuple(emails[: len(first)]),
        days=days,
        zones=(ZoneDays(default, days, len(sends)),),
        local_time=False,
        first_zones=(default,) * len(first),
        first_senders=(sender,) * len(first),
        steps=sequence_loads(campaign, sends),
    )


def sequence_loads(
    campaign: Campaign, sends: Sequence[datetime], zones: Sequence[str | None] | None = None
) -> tuple[StepLoad, ...]:
    """A sequence's expected sends per local day of its timezone and step: step 1 as
    planned (``sends[i]``, read in ``zones[i]`` for local time), every later step at its
    earliest instant after the one before, as if no one answered (an estimate that ignores
    capacity: :mod:`sendqueue.domain.step_load`). Empty for a campaign of one email."""
    if len(campaign.steps) < 2:
        return ()
    return step_loads(campaign.policy, campaign.steps, sends, zones)


def _needs_recipients(campaign: Campaign) -> bool:
    """Whether the plan depends on who the recipients are (their zones, their senders)."""
    return campaign.local_time or bool(campaign.sender_ids)
