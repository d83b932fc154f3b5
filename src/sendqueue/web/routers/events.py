"""``/api/campaigns/{id}/events``: the campaign's change log as Server-Sent Events."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query
from starlette.concurrency import run_in_threadpool

from sendqueue.domain.errors import InvalidField
from sendqueue.domain.models import MAX_CURSOR
from sendqueue.web.deps import BrokerDep, QueriesDep
from sendqueue.web.errors import RETRY_AFTER_SECONDS, HttpProblem
from sendqueue.web.schemas import READ_ERRORS, error_responses
from sendqueue.web.stream import EventStreamResponse, TooManyClients

__all__ = ["router"]

router = APIRouter()


def _resume_point(last_event_id: str | None, after: int | None) -> int | None:
    # A browser reconnects to the URL it first opened, ?after= included, and says where it
    # got to in Last-Event-ID: the header wins.
    if last_event_id is not None and last_event_id.strip():
        text = last_event_id.strip()
        # isascii: str.isdigit() is also true for "²", which int() refuses.
        if not (text.isascii() and text.isdigit()) or int(text) > MAX_CURSOR:
            raise InvalidField("Last-Event-ID", last_event_id, "expected a change id")
        return int(text)
    return after


@router.get(
    "/api/campaigns/{campaign_id}/events",
    tags=["campaigns"],
    response_class=EventStreamResponse,
    status_code=200,
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "change events"},
        **error_responses(*READ_ERRORS, 404, json_only=True),
    },
)
async def events(
    campaign_id: str,
    queries: QueriesDep,
    broker: BrokerDep,
    after: Annotated[
        int | None, Query(ge=0, le=MAX_CURSOR, description="resume after this change id")
    ] = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> EventStreamResponse:
    """Server-Sent Events of the campaign's change log (see docs/api.md)."""
    start = _resume_point(last_event_id, after)
    await run_in_threadpool(queries.campaign_of, campaign_id)
    try:
        sub = await broker.subscribe(campaign_id, start)
    except TooManyClients as exc:
        raise HttpProblem(
            503,
            f"too many live streams: {exc}; fall back to polling",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        ) from exc
    return EventStreamResponse(broker.frames(sub))
