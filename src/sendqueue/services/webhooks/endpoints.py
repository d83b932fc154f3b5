"""The webhook endpoints' use cases (:class:`WebhookService`), shared by ``sendqueue webhook``,
``/api/webhooks`` and the Webhooks page.

Contract:

- ``add(url, events=, campaigns=)`` checks every field first (InvalidField naming ``url``,
  ``events`` or ``campaigns``, which must name campaigns that exist; nothing stored on a
  refusal) and stores an enabled endpoint
  whose cursor is the change log's current end: it receives the events made from then on.
  It returns :class:`WebhookCreated`, the only time the secret is shown in clear.
- ``list()``, ``get(id)``: :class:`WebhookView` (secrets masked); an unknown id is NotFound.
- ``update(id, url=, events=, campaigns=, enabled=)`` changes what is given (None: kept).
  Enabling a disabled endpoint clears its reason and its failure count: its head event is
  tried again at once, and the events it missed meanwhile follow in order. Disabling keeps
  the cursor.
- ``remove(id)`` deletes it and its delivery log (NotFound when unknown).
- ``rotate_secret(id)`` makes a new secret (returned once); the old one keeps signing, beside
  the new one, for 24 h.
- ``redeliver(id, event_ids=, failed_since=)`` sends the named events (``evt_<change id>``),
  or those whose attempts failed at or after ``failed_since``, again now, out of band: same
  ids, the endpoint's cursor and retry state untouched, each attempt logged as a redelivery.
  An event id that names no event (no such change, or a change that makes no event) is
  InvalidField naming ``events`` and nothing is sent.
- ``deliveries(id, limit=, before=, since=)``: a page of the delivery log, newest first (7
  days are kept): at most ``limit`` attempts older than the cursor ``before`` (None: from the
  newest), and ``next``, the cursor of the page after it, None when no older attempt is left.
  With ``since`` the log ends at its first attempt before that time (the Webhooks page hides
  those older than 7 days that wait for their prune). A cursor not of this endpoint's log is
  InvalidField naming ``before``.
"""

from __future__ import annotations

import builtins
import itertools
from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from sendqueue.domain.errors import InvalidField, NotFound
from sendqueue.domain.models import check_limit
from sendqueue.domain.webhooks import (
    PREVIOUS_SECRET_VALID,
    WebhookEndpoint,
    WebhookEvent,
    change_id_of,
    check_campaign_ids,
    check_event_types,
    check_url,
    event_of,
    new_endpoint_id,
    new_secret,
)
from sendqueue.ports import Campaigns, ChangeLog, Clock
from sendqueue.ports.webhooks import EndpointChanges, WebhookStore
from sendqueue.services.webhooks.delivery import WebhookDelivery
from sendqueue.services.webhooks.views import (
    DeliveryPage,
    DeliveryView,
    WebhookCreated,
    WebhookView,
)

__all__ = ["MAX_REDELIVER", "ChangesOfCampaigns", "WebhookService"]


class ChangesOfCampaigns(ChangeLog, Campaigns, Protocol):
    """What the endpoints' service reads of the task store: the change log (a new endpoint's
    position, a redelivered event) and the campaigns an endpoint filters on."""


#: The most events one redelivery sends.
MAX_REDELIVER = 1000


class WebhookService:
    """Endpoints, their secrets, redelivery and the delivery log (see the module docstring)."""

    def __init__(
        self,
        store: WebhookStore,
        tasks: ChangesOfCampaigns,
        clock: Clock,
        delivery: WebhookDelivery,
        *,
        production: bool,
    ) -> None:
        self._store = store
        self._tasks = tasks
        self._clock = clock
        self._delivery = delivery
        self._production = production

    def add(
        self, url: str, *, events: Sequence[str] = (), campaigns: Sequence[str] = ()
    ) -> WebhookCreated:
        endpoint = WebhookEndpoint(
            id=new_endpoint_id(),
            url=check_url(url, production=self._production),
            created_at=self._clock.now(),
            secret=new_secret(),
            event_types=check_event_types(list(events)),
            campaign_ids=self._campaigns(campaigns),
            cursor=self._tasks.last_change_id(),
        )
        self._store.add_endpoint(endpoint)
        return WebhookCreated(self._view(endpoint), endpoint.secret)

    def list(self) -> list[WebhookView]:
        return [self._view(e) for e in self._store.list_endpoints()]

    def get(self, endpoint_id: str) -> WebhookView:
        return self._view(self._require(endpoint_id))

    def update(
        self,
        endpoint_id: str,
        *,
        url: str | None = None,
        events: Sequence[str] | None = None,
        campaigns: Sequence[str] | None = None,
        enabled: bool | None = None,
    ) -> WebhookView:
        endpoint = self._require(endpoint_id)
        changes: EndpointChanges = {}
        if url is not None:
            changes["url"] = check_url(url, production=self._production)
        if events is not None:
            changes["event_types"] = check_event_types(list(events))
        if campaigns is not None:
            changes["campaign_ids"] = self._campaigns(campaigns)
        if enabled is True and not endpoint.enabled:
            changes.update(
                {
                    "enabled": True,
                    "disabled_reason": None,
                    "attempts": 0,
                    "retry_at": None,
                    "failing_since": None,
                }
            )
        elif enabled is False and endpoint.enabled:
            changes.update({"enabled": False, "disabled_reason": "disabled by a user"})
        return self._view(self._saved(endpoint_id, changes))

    def remove(self, endpoint_id: str) -> None:
        if not self._store.remove_endpoint(endpoint_id):
            raise NotFound("webhook", endpoint_id)

    def rotate_secret(self, endpoint_id: str) -> WebhookCreated:
        endpoint = self._require(endpoint_id)
        secret = new_secret()
        updated = self._saved(
            endpoint_id,
            {
                "secret": secret,
                "previous_secret": endpoint.secret,
                "previous_secret_expires_at": self._clock.now() + PREVIOUS_SECRET_VALID,
            },
        )
        return WebhookCreated(self._view(updated), secret)

    def redeliver(
        self,
        endpoint_id: str,
        *,
        event_ids: Sequence[str] = (),
        failed_since: datetime | None = None,
    ) -> builtins.list[DeliveryView]:
        endpoint = self._require(endpoint_id)
        if bool(event_ids) == (failed_since is not None):
            raise InvalidField(
                "events", list(event_ids), "name event ids or failed_since, exactly one of them"
            )
        if failed_since is not None:
            event_ids = self._store.failed_since(endpoint_id, failed_since)
        if len(event_ids) > MAX_REDELIVER:
            raise InvalidField("events", len(event_ids), f"at most {MAX_REDELIVER} at once")
        events = [self._event(value) for value in event_ids]
        tasks = self._delivery.tasks_of([e.change for e in events])
        records = []
        for event in events:
            task = tasks.get(event.change.task_id or "")
            records.append(self._delivery.send(endpoint, event, task, 1, redelivery=True))
        if records:
            self._store.record_deliveries(records)
        return [DeliveryView.of(r) for r in records]

    def deliveries(
        self,
        endpoint_id: str,
        *,
        limit: int = 100,
        before: str | None = None,
        since: datetime | None = None,
    ) -> DeliveryPage:
        check_limit(limit)
        self._require(endpoint_id)
        # one attempt more than asked for says whether an older page exists
        found = self._store.deliveries(endpoint_id, limit=limit + 1, before=before)
        if since is not None:
            found = list(itertools.takewhile(lambda r: r.at >= since, found))
        page = found[:limit]
        more = len(found) > limit and bool(page)
        return DeliveryPage(
            deliveries=[DeliveryView.of(r) for r in page],
            next=page[-1].cursor if more else None,
        )

    def _event(self, value: str) -> WebhookEvent:
        change_id = change_id_of(value)
        found = self._tasks.changes_after(change_id - 1, limit=1)
        event = event_of(found[0]) if found and found[0].id == change_id else None
        if event is None:
            raise InvalidField("events", value, "names no event")
        return event

    def _campaigns(self, ids: Sequence[str]) -> tuple[str, ...]:
        """The filter's campaign ids, each a campaign's (InvalidField naming ``campaigns``):
        a mistyped one would hear nothing, and the cursor would move past what it missed."""
        checked = check_campaign_ids(list(ids))
        for campaign_id in checked:
            try:
                self._tasks.get_campaign(campaign_id)
            except NotFound:
                raise InvalidField("campaigns", campaign_id, "names no campaign") from None
        return checked

    def _require(self, endpoint_id: str) -> WebhookEndpoint:
        endpoint = self._store.get_endpoint(endpoint_id)
        if endpoint is None:
            raise NotFound("webhook", endpoint_id)
        return endpoint

    def _saved(self, endpoint_id: str, changes: EndpointChanges) -> WebhookEndpoint:
        updated = self._store.update_endpoint(endpoint_id, changes)
        if updated is None:
            raise NotFound("webhook", endpoint_id)
        return updated

    def _view(self, endpoint: WebhookEndpoint) -> WebhookView:
        return WebhookView.of(endpoint, self._clock.now())
