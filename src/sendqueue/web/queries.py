"""Read models of the web app: a campaign with its next send, its per-day timeline, a plan.

Shapes extend :mod:`sendqueue.services.views` (the CLI's ``--json``), so the API and the CLI
agree. The pages use these functions too, so a page and the API never disagree.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import Campaign
from sendqueue.domain.planner import per_day_summary
from sendqueue.domain.policy import SendingPolicy
from sendqueue.ports import Clock, TaskStore
from sendqueue.services.views import campaign_dict, iso

__all__ = [
    "PLAN_SENDS_SHOWN",
    "TimelineCache",
    "TimelineFunction",
    "campaign_view",
    "next_send_at",
    "plan_view",
]

#: A plan lists at most this many sends; ``days`` always covers all of them.
PLAN_SENDS_SHOWN = 1000

# States whose timeline may be the plan from now rather than the tasks.
_PLANNED_FROM_NOW = frozenset({CampaignState.DRAFT, CampaignState.PROVISIONING})
# Pending tasks looked at for the next send. Sends are planned in position order, so the first
# Pending task is nearly always the next; a task retried after a transient error may be later
# than the ones after it, which looking at a page of them covers.
_NEXT_SEND_PAGE = 100


def next_send_at(store: TaskStore, campaign: Campaign) -> datetime | None:
    """When the campaign sends next: the earliest planned Pending email, while it is sending."""
    if campaign.state not in {CampaignState.ACTIVE, CampaignState.PROVISIONING}:
        return None
    pending = store.list_tasks(campaign.id, state=TaskState.PENDING, limit=_NEXT_SEND_PAGE)
    return min((t.send_at for t in pending), default=None)


def campaign_view(store: TaskStore, campaign: Campaign) -> dict[str, Any]:
    """``campaign show --json`` plus ``next_send_at``."""
    data = campaign_dict(campaign, store.count_tasks(campaign.id))
    data["next_send_at"] = iso(next_send_at(store, campaign))
    return data


def plan_view(
    policy: SendingPolicy,
    sends: Sequence[datetime],
    *,
    emails: Sequence[str] | None = None,
    duplicates: int = 0,
) -> dict[str, Any]:
    """A plan as the preview routes return it (docs/api.md)."""
    zone = policy.zone
    rows: list[dict[str, Any]] = []
    for index, when in enumerate(sends[:PLAN_SENDS_SHOWN]):
        row: dict[str, Any] = {
            "index": index,
            "send_at": iso(when),
            "local": when.astimezone(zone).isoformat(),
        }
        if emails is not None and index < len(emails):
            row["email"] = emails[index]
        rows.append(row)
    return {
        "policy_text": policy.describe(),
        "timezone": policy.timezone,
        "count": len(sends),
        "duplicates": duplicates,
        "sends": rows,
        "days": [
            {
                "day": day.day.isoformat(),
                "count": day.count,
                "first": day.first.isoformat(),
                "last": day.last.isoformat(),
            }
            for day in per_day_summary(sends, policy.timezone)
        ],
    }


#: ``(store, campaign, now) -> [{"day", "planned", "done"}, ...]``: what the chart draws.
TimelineFunction = Callable[[TaskStore, Campaign, datetime], list[dict[str, Any]]]


class TimelineCache:
    """A campaign's per-day timeline, kept until the campaign's change log moves.

    Computing it reads every task, so the result is kept: a cheap ``changes_after(marker,
    campaign_id=..., limit=1)`` tells whether anything changed since. Before provisioning has
    made tasks a timeline is the plan from now, so for drafts and provisioning campaigns it is
    kept for the current minute at most. ``compute`` is the one definition of a timeline
    (:func:`sendqueue.web.pages.campaign_timeline`), so the page and the API agree.
    """

    def __init__(
        self, store: TaskStore, clock: Clock, compute: TimelineFunction, *, size: int = 64
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
