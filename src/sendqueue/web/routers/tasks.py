"""``/api/campaigns/{id}/tasks``: the campaign's emails, a page at a time, and cancelling one."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import MAX_CURSOR
from sendqueue.domain.steps import MAX_STEPS
from sendqueue.services.reading.queries import senders_of
from sendqueue.services.reading.views import TaskView
from sendqueue.web.deps import CampaignsDep, QueriesDep
from sendqueue.web.schemas import READ_ERRORS, WRITE_ERRORS, TaskPage, error_responses

__all__ = ["router"]

router = APIRouter(prefix="/api/campaigns/{campaign_id}/tasks", tags=["tasks"])


def _task_state(value: str | None) -> TaskState | None:
    if value is None or not value.strip():
        return None
    return TaskState.parse(value)


@router.get("", responses=error_responses(*READ_ERRORS, 404))
def list_tasks(
    campaign_id: str,
    queries: QueriesDep,
    state: Annotated[str | None, Query(max_length=20, description="a task state")] = None,
    search: Annotated[
        str | None, Query(max_length=254, description="part of the address, any case")
    ] = None,
    after: Annotated[
        int, Query(ge=-1, le=MAX_CURSOR, description="the cursor: `next` of the last page")
    ] = -1,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    step: Annotated[
        int | None, Query(ge=1, le=MAX_STEPS, description="only this step's emails (1: first)")
    ] = None,
) -> TaskPage:
    """A page of the campaign's emails in position order (``step``: one step's): one store
    read; a sequence's page may hold up to 9 more, to end with a whole recipient."""
    listing = queries.recipient_tasks(
        campaign_id,
        state=_task_state(state),
        search=search or None,
        after=after,
        limit=limit,
        step=step,
    )
    campaign = listing.campaign
    # a paused campaign's Pending emails have no send time until it resumes
    paused = campaign.state is CampaignState.PAUSED
    senders = senders_of(listing)
    return TaskPage(
        tasks=[
            TaskView.of(
                t, campaign_paused=paused, from_addr=campaign.from_addr, sender=senders.of(t)
            )
            for t in listing.tasks
        ],
        next=listing.tasks[-1].position if listing.more and listing.tasks else None,
    )


@router.post("/{task_id}/cancel", responses=error_responses(*WRITE_ERRORS, 404, 409))
def cancel_task(
    campaign_id: str, task_id: str, queries: QueriesDep, campaigns: CampaignsDep
) -> TaskView:
    """Cancel one Pending email and delete its schedule; 409 if it is past Pending."""
    campaign, _ = queries.task(task_id, campaign_id)
    cancelled = campaigns.cancel_task(task_id)
    # the view reads the campaign's From and senders, which cancelling leaves as they were
    sender = queries.sender_of(campaign, cancelled)
    return TaskView.of(cancelled, from_addr=campaign.from_addr, sender=sender)
