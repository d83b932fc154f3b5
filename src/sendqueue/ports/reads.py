"""The read side's port: what a page or an API read needs from the store, in one call.

:class:`CampaignReads` is kept by every task store; the stores answer it from their own reads
(:mod:`sendqueue.adapters.campaign_reads`).
"""

from __future__ import annotations

from typing import Protocol

from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.reads import CampaignFigures, CampaignPage, TaskDetail, TaskListing

__all__ = ["CampaignReads"]


class CampaignReads(Protocol):
    """Reads that answer a view in one call. NotFound for an unknown campaign; InvalidField
    for a negative ``limit`` or a cursor out of range."""

    def campaign_figures(
        self,
        campaign_id: str,
        *,
        late_after: float,
        changes_since: int | None = None,
        steps: bool = False,
    ) -> CampaignFigures:
        """The campaign and its figures; ``late_after`` as in ``TaskStore.count_moves``. With
        ``changes_since`` (a change-log id), ``changed`` says whether the campaign's change
        log has entries after it. With ``steps``, its counts per step (``count_steps``: a
        read of every task on DynamoDB, so only views of one campaign ask)."""
        ...

    def all_campaign_figures(self, *, late_after: float) -> list[CampaignFigures]:
        """Every campaign with its figures, newest first (``list_campaigns``' order)."""
        ...

    def task_listing(
        self,
        campaign_id: str,
        *,
        state: TaskState | None = None,
        search: str | None = None,
        after: int = -1,
        limit: int = 100,
        step: int | None = None,
    ) -> TaskListing:
        """A page of the campaign's tasks as ``TaskStore.list_tasks`` gives it, whether more
        follow, and the senders the campaign and the page name."""
        ...

    def campaign_page(
        self,
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
        """``last_change_id``, read first, then :meth:`campaign_figures` (``steps`` as there)
        and :meth:`task_listing` of the campaign."""
        ...

    def task_detail(self, campaign_id: str, task_id: str) -> TaskDetail:
        """The campaign, its task ``task_id`` (None when unknown or another campaign's) and
        the sender the task names (absent when removed)."""
        ...
