"""What the Webhooks page shows: each endpoint with its last delivery (:func:`endpoint_rows`),
and one endpoint's delivery log of the last 7 days a page at a time (:func:`delivery_page`,
paged by the log's cursors: "Older attempts" carries the cursor of the next page).

Both read through :class:`~sendqueue.services.webhooks.WebhookService`, so secrets arrive
masked; times are shown in ``SENDQUEUE_DEFAULT_TIMEZONE`` with the zone's abbreviation.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime, timedelta
from typing import Any

from sendqueue.domain.webhooks import DELIVERY_LOG_DAYS, EventType
from sendqueue.services.reading.views import iso
from sendqueue.services.webhooks import DeliveryView, WebhookService, WebhookView
from sendqueue.web.times import human_time

__all__ = [
    "LOG_PAGE_SIZE",
    "delivery_page",
    "delivery_row",
    "endpoint_row",
    "endpoint_rows",
    "event_types",
]

#: Attempts in one page of the delivery log.
LOG_PAGE_SIZE = 25


def event_types() -> list[str]:
    """Every event type an endpoint may filter on, in the enum's order."""
    return [t.value for t in EventType]


def delivery_row(view: DeliveryView, zone: str) -> dict[str, Any]:
    """One attempt as a row: its fields, its time as text and for ``<time datetime>``, and its
    result in words ("200", "500: server error", "no answer: timed out")."""
    row = asdict(view)
    if view.ok:
        result = f"{view.status}" if view.status is not None else "ok"
    elif view.status is not None:
        result = f"{view.status}: {view.error}"
    else:
        result = f"no answer: {view.error}"
    row.update(at_iso=iso(view.at), at_text=human_time(view.at, zone), result=result)
    return row


def endpoint_row(service: WebhookService, view: WebhookView, zone: str) -> dict[str, Any]:
    """An endpoint with its last attempt (None when it has had none) and its times as text."""
    last = service.deliveries(view.id, limit=1).deliveries
    return {
        "hook": view,
        "last": delivery_row(last[0], zone) if last else None,
        "failing_since": human_time(view.failing_since, zone),
        "retry_at": human_time(view.retry_at, zone),
        "previous_expires": human_time(view.previous_secret_expires_at, zone),
        "created": human_time(view.created_at, zone),
    }


def endpoint_rows(service: WebhookService, zone: str) -> list[dict[str, Any]]:
    """Every endpoint, oldest first, as :func:`endpoint_row`."""
    return [endpoint_row(service, view, zone) for view in service.list()]


def delivery_page(
    service: WebhookService, endpoint_id: str, before: str | None, now: datetime, zone: str
) -> dict[str, Any]:
    """A page of the endpoint's attempts of the last 7 days, newest first: the
    :data:`LOG_PAGE_SIZE` older than the cursor ``before`` (None: the newest). ``rows``,
    ``before``, ``next`` (the cursor of the older page; None at the end), ``size``,
    ``failed`` (a failed attempt is on the page, so "Redeliver all failed" has something to
    send) and ``failed_since`` (the ISO start of the 7 days, the body of that redelivery)."""
    since = now - timedelta(days=DELIVERY_LOG_DAYS)
    page = service.deliveries(endpoint_id, limit=LOG_PAGE_SIZE, before=before, since=since)
    recent = page.deliveries
    return {
        "rows": [delivery_row(d, zone) for d in recent],
        "before": before,
        "next": page.next,
        "size": LOG_PAGE_SIZE,
        "failed": any(not d.ok for d in recent),
        "failed_since": iso(since),
    }
