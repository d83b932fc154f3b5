"""The :class:`~sendqueue.ports.reads.CampaignReads` port answered from a store's own reads, for
every task store: a mixin, :class:`ComposedCampaignReads`.

It sits at the top of ``adapters`` rather than in one adapter's package because the SQL,
DynamoDB and in-memory stores share it, as the schedulers share
:mod:`sendqueue.adapters.scheduler_rules`; the import contracts let adapters and
:mod:`sendqueue.testing` import it, and ports hold only protocols and value types.

Each call's reads run inside the store's ``_read_together()``: the SQL store runs them on one
connection (one snapshot on SQLite), the in-memory one under its lock; DynamoDB has no
multi-item snapshot, so its reads run one after another. A task read by id takes the SQL
stores' fast path, a connection of its own: :meth:`~ComposedCampaignReads.task_detail` reads
the campaign, then the task, then its sender, and shows them as read.
"""

from __future__ import annotations

from collections.abc import Collection
from contextlib import AbstractContextManager, nullcontext, suppress
from typing import Protocol

from sendqueue.domain.errors import NotFound
from sendqueue.domain.lifecycle import CampaignState, TaskOutcome, TaskState
from sendqueue.domain.models import Campaign, ChangeLogEntry, Task, check_limit
from sendqueue.domain.reads import (
    CampaignFigures,
    CampaignPage,
    StepCounts,
    TaskDetail,
    TaskListing,
    whole_positions,
)
from sendqueue.domain.senders import Sender

__all__ = ["NEXT_SEND_PAGE", "ComposedCampaignReads"]

#: Pending tasks looked at for the next send. Sends are planned in position order, so the
#: first Pending task is nearly always the next; a task retried after a transient error may be
#: later than the ones after it, which looking at a page of them covers.
NEXT_SEND_PAGE = 100

_SENDING = frozenset({CampaignState.ACTIVE, CampaignState.PROVISIONING})


class _StoreReads(Protocol):
    """The store's own reads :class:`ComposedCampaignReads` is built from."""

    def _read_together(self) -> AbstractContextManager[object]: ...

    def get_campaign(self, campaign_id: str) -> Campaign: ...

    def list_campaigns(self) -> list[Campaign]: ...

    def count_tasks(self, campaign_id: str) -> dict[TaskState, int]: ...

    def count_moves(self, campaign_id: str, *, late_after: float) -> tuple[int, int]: ...

    def count_steps(self, campaign_id: str) -> dict[int, StepCounts]: ...

    def count_suppressed_tasks(self, campaign_id: str) -> int: ...

    def count_outcomes(self, campaign_id: str) -> dict[TaskOutcome, int]: ...

    def list_tasks(
        self,
        campaign_id: str,
        *,
        state: TaskState | None = None,
        search: str | None = None,
        after: int = -1,
        limit: int = 100,
        step: int | None = None,
    ) -> list[Task]: ...

    def get_task(self, task_id: str) -> Task | None: ...

    def get_sender(self, sender_id: str) -> Sender: ...

    def list_senders(self) -> list[Sender]: ...

    def changes_after(
        self, after_id: int, *, campaign_id: str | None = None, limit: int = 1000
    ) -> list[ChangeLogEntry]: ...

    def last_change_id(self) -> int: ...


class ComposedCampaignReads:
    """:class:`~sendqueue.ports.reads.CampaignReads` from the store's own reads (see the module
    docstring)."""

    def _read_together(self) -> AbstractContextManager[object]:
        """What the reads of one call run inside; nothing by default."""
        return nullcontext()

    def campaign_figures(
        self: _StoreReads,
        campaign_id: str,
        *,
        late_after: float,
        changes_since: int | None = None,
        steps: bool = False,
    ) -> CampaignFigures:
        with self._read_together():
            campaign = self.get_campaign(campaign_id)
            return _figures(self, campaign, late_after, changes_since, steps=steps)

    def all_campaign_figures(self: _StoreReads, *, late_after: float) -> list[CampaignFigures]:
        with self._read_together():
            return [_figures(self, c, late_after, None) for c in self.list_campaigns()]

    def task_listing(
        self: _StoreReads,
        campaign_id: str,
        *,
        state: TaskState | None = None,
        search: str | None = None,
        after: int = -1,
        limit: int = 100,
        step: int | None = None,
    ) -> TaskListing:
        check_limit(limit)
        with self._read_together():
            campaign = self.get_campaign(campaign_id)
            return _listing(self, campaign, state, search, after, limit, step)

    def campaign_page(
        self: _StoreReads,
        campaign_id: str,
        *,
        late_after: float,
        state: TaskState | None = None,
        search: str | None = None,
        after: int = -1,
        limit: int = 100,
        changes_since: int | None = None,
        step: int | None = None,
        steps: bool = False,
    ) -> CampaignPage:
        check_limit(limit)
        with self._read_together():
            last_change = self.last_change_id()
            campaign = self.get_campaign(campaign_id)
            listing = _listing(self, campaign, state, search, after, limit, step)
            figures = _figures(self, campaign, late_after, changes_since, steps=steps)
        return CampaignPage(last_change_id=last_change, figures=figures, listing=listing)

    def task_detail(self: _StoreReads, campaign_id: str, task_id: str) -> TaskDetail:
        with self._read_together():
            campaign = self.get_campaign(campaign_id)
            task = self.get_task(task_id)
            if task is None or task.campaign_id != campaign_id:
                return TaskDetail(campaign=campaign, task=None)
            senders: dict[str, Sender] = {}
            if task.sender_id is not None:
                with suppress(NotFound):  # removed since: the task names it by address
                    senders[task.sender_id] = self.get_sender(task.sender_id)
        return TaskDetail(campaign=campaign, task=task, senders=senders)


def _figures(
    store: _StoreReads,
    campaign: Campaign,
    late_after: float,
    changes_since: int | None,
    *,
    steps: bool = False,
) -> CampaignFigures:
    moved, late = store.count_moves(campaign.id, late_after=late_after)
    next_send = None
    if campaign.state in _SENDING:
        pending = store.list_tasks(campaign.id, state=TaskState.PENDING, limit=NEXT_SEND_PAGE)
        next_send = min((t.send_at for t in pending), default=None)
    changed = None
    if changes_since is not None:
        changed = bool(store.changes_after(changes_since, campaign_id=campaign.id, limit=1))
    return CampaignFigures(
        campaign=campaign,
        counts=store.count_tasks(campaign.id),
        moved=moved,
        late=late,
        suppressed=store.count_suppressed_tasks(campaign.id),
        outcomes=store.count_outcomes(campaign.id),
        next_send_at=next_send,
        changed=changed,
        steps=store.count_steps(campaign.id) if steps else None,
    )


def _listing(
    store: _StoreReads,
    campaign: Campaign,
    state: TaskState | None,
    search: str | None,
    after: int,
    limit: int,
    step: int | None,
) -> TaskListing:
    page = store.list_tasks(
        campaign.id, state=state, search=search, after=after, limit=limit + 1, step=step
    )
    more = len(page) > limit
    sequence = step is None and len(campaign.steps) > 1
    tasks = whole_positions(page[:limit], more=more, sequence=sequence)
    wanted = {*campaign.sender_ids, *(t.sender_id for t in tasks if t.sender_id)}
    return TaskListing(
        campaign=campaign,
        tasks=tasks,
        more=more,
        senders=_senders(store, wanted),
    )


def _senders(store: _StoreReads, wanted: Collection[str]) -> dict[str, Sender]:
    # One read of every sender rather than one per id: a deployment has a handful.
    if not wanted:
        return {}
    return {s.id: s for s in store.list_senders() if s.id in wanted}
