"""The webhooks' ports: what a store keeps for them (:class:`WebhookStore`), how a delivery
goes out (:class:`WebhookTransport`) and the alarm a disabled endpoint raises
(:class:`WebhookAlarm`). Every name is importable from :mod:`sendqueue.ports` too."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from sendqueue.domain.webhooks import (
    DeliveryRecord,
    EndpointChanges,
    EventTask,
    RelayedLetter,
    WebhookEndpoint,
)

__all__ = [
    "EndpointChanges",
    "WebhookAlarm",
    "WebhookResponse",
    "WebhookStore",
    "WebhookTransport",
]


class WebhookStore(Protocol):
    """What webhooks keep. Every task store implements it, in the same database.

    Contract:

    - ``add_endpoint`` stores a new endpoint; an id already stored is a
      :class:`~sendqueue.domain.errors.Conflict` and changes nothing.
    - ``get_endpoint`` returns it or None; ``list_endpoints`` all of them, oldest first (then
      by id).
    - ``update_endpoint`` sets the given fields (an unknown key is ``InvalidField("changes")``)
      and returns the endpoint as stored, or None for an unknown id (nothing written).
    - ``remove_endpoint`` deletes the endpoint and its delivery log; False when unknown.
    - ``record_deliveries`` appends attempts to the delivery log.
    - ``deliveries`` reads one endpoint's log newest first, at most ``limit`` (an unknown
      endpoint reads as []), each attempt with its opaque ``cursor``; with ``before`` (such a
      cursor) only the attempts strictly older than that one. Paging is by the store's unique
      key of an attempt (SQL: the row id; DynamoDB: the sort key; the fake: its position),
      never by time alone, so attempts of the same instant are each read once. A cursor of
      another store or endpoint, or no cursor at all, is ``InvalidField("before")``.
      ``failed_since`` reads the distinct event ids of its failed attempts at or after
      ``since``, oldest attempt first.
    - ``prune_deliveries`` deletes every attempt before ``before``; returns how many.
    - ``relay_dead_letters`` copies dead letters into the change log, once per letter id: a
      letter relayed before (by this process or any other) is left alone; for each other one a
      marker keyed by its id and its entry are written in one transaction (the task's
      campaign, ``from_state`` the task's state now, ``to_state``
      :data:`~sendqueue.domain.webhooks.DEAD_LETTER`, ``note`` the error, ``at`` its failure
      time). A letter of an unknown task gets its marker alone (no entry, not looked at
      again). Returns the ids of the letters whose entries this call wrote, in the order
      given. Two calls racing on one letter write one entry. SQL writes every marker and
      entry of a call in one transaction, reading the tasks in it; DynamoDB up to 49 letters
      per TransactWriteItems, logging the states it read just before.
    - ``event_tasks`` reads what event bodies say of some tasks (recipient, sender,
      Message-ID), as current as ``TaskStore.get_tasks`` reads them, by id (an unknown id is
      left out), in one batch of reads: a delivery pass asks for the tasks of up to 500
      events at once.
    - An unreachable backend raises :class:`~sendqueue.domain.errors.StoreUnavailable`.
    """

    def add_endpoint(self, endpoint: WebhookEndpoint) -> None: ...

    def get_endpoint(self, endpoint_id: str) -> WebhookEndpoint | None: ...

    def list_endpoints(self) -> list[WebhookEndpoint]: ...

    def update_endpoint(
        self, endpoint_id: str, changes: EndpointChanges
    ) -> WebhookEndpoint | None: ...

    def remove_endpoint(self, endpoint_id: str) -> bool: ...

    def record_deliveries(self, records: Sequence[DeliveryRecord]) -> None: ...

    def deliveries(
        self, endpoint_id: str, *, limit: int = 100, before: str | None = None
    ) -> list[DeliveryRecord]: ...

    def failed_since(self, endpoint_id: str, since: datetime) -> list[str]: ...

    def prune_deliveries(self, before: datetime) -> int: ...

    def relay_dead_letters(self, letters: Sequence[RelayedLetter]) -> list[str]: ...

    def event_tasks(self, task_ids: Collection[str]) -> dict[str, EventTask]: ...


@dataclass(frozen=True)
class WebhookResponse:
    """A 2xx answer: its status and how long it took."""

    status: int
    latency_ms: int


class WebhookTransport(Protocol):
    """POSTs one delivery.

    Contract: ``post`` sends ``body`` with ``headers`` to ``url`` and returns the 2xx answer;
    anything else raises :class:`~sendqueue.domain.errors.WebhookDeliveryFailed` with a short
    sanitized reason (and the status when one came back): a target whose address is refused
    (checked on the literal IP and on every DNS answer, the connection made to the checked
    address), no connection, a timeout, a 3xx (redirects are not followed), 4xx or 5xx. A
    response body is read to at most 64 KB and never returned or logged.
    """

    def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> WebhookResponse: ...


@runtime_checkable
class WebhookAlarm(Protocol):
    """An alarm that can say an endpoint was disabled (after 24 h of failed deliveries)."""

    def webhook_disabled(self, endpoint_id: str, url: str, reason: str) -> None: ...
