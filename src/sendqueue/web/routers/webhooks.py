"""``/api/webhooks``: webhook endpoints, thin routes over
:class:`~sendqueue.services.webhooks.WebhookService` (the one ``sendqueue webhook`` uses).

A signing secret is in a response twice only: the ``201`` of ``POST /api/webhooks`` and the
answer of ``POST /api/webhooks/{id}/rotate-secret``; everywhere else it is masked.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from sendqueue.domain.errors import InvalidField
from sendqueue.domain.models import utc
from sendqueue.services.webhooks import MAX_REDELIVER
from sendqueue.web.deps import WebhooksDep
from sendqueue.web.schemas import (
    READ_ERRORS,
    WRITE_ERRORS,
    DeliveryList,
    DeliveryOut,
    DeliveryPageOut,
    WebhookList,
    WebhookOut,
    WebhookRemoved,
    WebhookWithSecret,
    error_responses,
)

__all__ = ["NewWebhook", "Redelivery", "WebhookChanges", "router"]

router = APIRouter(prefix="/api/webhooks", tags=["webhooks"])

_EVENTS = "event types it receives (email.sent, email.failed, ...); empty: every type"
_CAMPAIGNS = "campaign ids it hears about; empty: every campaign"


class NewWebhook(BaseModel):
    """The body of ``POST /api/webhooks``."""

    model_config = ConfigDict(extra="forbid")
    url: str = Field(max_length=2000, description="https:// (http:// too outside production)")
    events: list[str] = Field(default_factory=list, max_length=50, description=_EVENTS)
    campaigns: list[str] = Field(default_factory=list, max_length=1000, description=_CAMPAIGNS)


class WebhookChanges(BaseModel):
    """The body of ``PATCH /api/webhooks/{id}``: only the fields given change. Enabling a
    disabled endpoint clears its failures; its missed events follow in order."""

    model_config = ConfigDict(extra="forbid")
    url: str | None = Field(None, max_length=2000)
    events: list[str] | None = Field(None, max_length=50, description=_EVENTS)
    campaigns: list[str] | None = Field(None, max_length=1000, description=_CAMPAIGNS)
    enabled: bool | None = None


class Redelivery(BaseModel):
    """The body of ``POST /api/webhooks/{id}/redeliver``: event ids, or ``failed_since``."""

    model_config = ConfigDict(extra="forbid")
    events: list[str] = Field(
        default_factory=list, max_length=MAX_REDELIVER, description="event ids (evt_...)"
    )
    failed_since: datetime | None = Field(
        None, description="every event whose attempt failed at or after this time"
    )


@router.get("", responses=error_responses(*READ_ERRORS))
def list_webhooks(webhooks: WebhooksDep) -> WebhookList:
    """Every endpoint, oldest first; secrets masked."""
    return WebhookList(webhooks=[WebhookOut.of(v) for v in webhooks.list()])


@router.post("", status_code=201, responses=error_responses(*WRITE_ERRORS))
def add_webhook(body: NewWebhook, webhooks: WebhooksDep, response: Response) -> WebhookWithSecret:
    """Add an endpoint: it receives the events made from now on. The signing secret is in
    this answer only; 422 naming the field for a bad value (nothing is stored)."""
    made = webhooks.add(body.url, events=body.events, campaigns=body.campaigns)
    response.headers["Location"] = f"/api/webhooks/{made.endpoint.id}"
    return WebhookWithSecret.created(made)


@router.get("/{endpoint_id}", responses=error_responses(*READ_ERRORS, 404))
def get_webhook(endpoint_id: str, webhooks: WebhooksDep) -> WebhookOut:
    """One endpoint with its delivery state."""
    return WebhookOut.of(webhooks.get(endpoint_id))


@router.patch("/{endpoint_id}", responses=error_responses(*WRITE_ERRORS, 404))
def update_webhook(endpoint_id: str, body: WebhookChanges, webhooks: WebhooksDep) -> WebhookOut:
    """Change the fields given; a bad one is a 422 naming it and nothing changes."""
    if not body.model_fields_set:
        raise InvalidField("body", {}, "give at least one field to change")
    for name in sorted(body.model_fields_set):
        if getattr(body, name) is None:  # null would change nothing: leave the field out
            raise InvalidField(name, None, "must not be null (leave it out to keep it)")
    view = webhooks.update(
        endpoint_id,
        url=body.url,
        events=body.events,
        campaigns=body.campaigns,
        enabled=body.enabled,
    )
    return WebhookOut.of(view)


@router.delete("/{endpoint_id}", responses=error_responses(*WRITE_ERRORS, 404))
def remove_webhook(endpoint_id: str, webhooks: WebhooksDep) -> WebhookRemoved:
    """Delete an endpoint and its delivery log."""
    webhooks.remove(endpoint_id)
    return WebhookRemoved(removed=endpoint_id)


@router.post("/{endpoint_id}/rotate-secret", responses=error_responses(*WRITE_ERRORS, 404))
def rotate_secret(endpoint_id: str, webhooks: WebhooksDep) -> WebhookWithSecret:
    """A new signing secret, in this answer only; the old one signs too for 24 h."""
    return WebhookWithSecret.created(webhooks.rotate_secret(endpoint_id))


@router.post("/{endpoint_id}/redeliver", responses=error_responses(*WRITE_ERRORS, 404))
def redeliver(endpoint_id: str, body: Redelivery, webhooks: WebhooksDep) -> DeliveryList:
    """Send the named events (or those failed since a time) again now, with their ids; the
    endpoint's own order and retries are untouched. The attempts are the answer."""
    since = None
    if body.failed_since is not None:
        try:
            since = utc(body.failed_since)
        except ValueError:
            reason = "must be a time with its offset, e.g. 2026-12-04T10:00Z"
            raise InvalidField("failed_since", str(body.failed_since), reason) from None
    sent = webhooks.redeliver(endpoint_id, event_ids=body.events, failed_since=since)
    return DeliveryList(deliveries=[DeliveryOut.of(d) for d in sent])


@router.get("/{endpoint_id}/deliveries", responses=error_responses(*READ_ERRORS, 404))
def deliveries(
    endpoint_id: str,
    webhooks: WebhooksDep,
    limit: Annotated[int, Query(ge=1, le=1000, description="newest first")] = 100,
    before: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=400,
            description="the cursor: `next` of the previous page (attempts older than it)",
        ),
    ] = None,
) -> DeliveryPageOut:
    """A page of the endpoint's delivery log, newest first (7 days are kept), and `next`, the
    cursor of the older page; 422 naming `before` for a cursor not of this endpoint's log."""
    return DeliveryPageOut.of(webhooks.deliveries(endpoint_id, limit=limit, before=before))
