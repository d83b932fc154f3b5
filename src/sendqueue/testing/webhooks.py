"""The in-memory :class:`~sendqueue.ports.webhooks.WebhookStore`, a base of the in-memory task
store (it shares the store's lock and its simulated outages)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from datetime import datetime

from sendqueue.domain.errors import Conflict
from sendqueue.domain.models import Task, check_limit, utc
from sendqueue.domain.webhooks import (
    DEAD_LETTER,
    DeliveryRecord,
    EndpointChanges,
    EventTask,
    RelayedLetter,
    WebhookEndpoint,
    checked_endpoint_changes,
    delivery_cursor,
    delivery_cursor_id,
)
from sendqueue.testing.guard import guarded

__all__ = ["InMemoryWebhooks"]

_CURSOR_KIND = "memory"
#: Positions of logged attempts, increasing in write order (never reused, as SQL row ids).
_POSITIONS = itertools.count(1)


class InMemoryWebhooks:
    """:class:`~sendqueue.ports.webhooks.WebhookStore` in memory."""

    _lock: threading.RLock
    _available: bool
    _tasks: dict[str, Task]
    # The task store's change-log append (campaign, task, from, to, at, note).
    _append: Callable[[str, str | None, str | None, str, datetime, str | None], None]

    def __init__(self) -> None:
        self._endpoints: dict[str, WebhookEndpoint] = {}
        self._deliveries: list[DeliveryRecord] = []
        # Dead letters relayed into the change log: letter id -> task id.
        self._relayed: dict[str, str] = {}

    @guarded
    def add_endpoint(self, endpoint: WebhookEndpoint) -> None:
        if endpoint.id in self._endpoints:
            raise Conflict(f"webhook {endpoint.id!r} already exists")
        self._endpoints[endpoint.id] = endpoint

    @guarded
    def get_endpoint(self, endpoint_id: str) -> WebhookEndpoint | None:
        return self._endpoints.get(endpoint_id)

    @guarded
    def list_endpoints(self) -> list[WebhookEndpoint]:
        return sorted(self._endpoints.values(), key=lambda e: (e.created_at, e.id))

    @guarded
    def update_endpoint(self, endpoint_id: str, changes: EndpointChanges) -> WebhookEndpoint | None:
        values = checked_endpoint_changes(changes)
        endpoint = self._endpoints.get(endpoint_id)
        if endpoint is None:
            return None
        updated = replace(endpoint, **values)
        self._endpoints[endpoint_id] = updated
        return updated

    @guarded
    def remove_endpoint(self, endpoint_id: str) -> bool:
        if self._endpoints.pop(endpoint_id, None) is None:
            return False
        self._deliveries = [d for d in self._deliveries if d.endpoint_id != endpoint_id]
        return True

    @guarded
    def record_deliveries(self, records: Sequence[DeliveryRecord]) -> None:
        # a stored attempt's ``cursor`` holds its bare position; reads hand out the opaque one
        self._deliveries.extend(
            replace(r, at=utc(r.at), cursor=str(next(_POSITIONS))) for r in records
        )

    @guarded
    def deliveries(
        self, endpoint_id: str, *, limit: int = 100, before: str | None = None
    ) -> list[DeliveryRecord]:
        check_limit(limit)
        below = None
        if before is not None:
            below = delivery_cursor_id(before, store=_CURSOR_KIND, endpoint_id=endpoint_id)
        found = [
            d
            for d in reversed(self._deliveries)
            if d.endpoint_id == endpoint_id and (below is None or int(d.cursor or 0) < below)
        ][:limit]
        return [
            replace(d, cursor=delivery_cursor(_CURSOR_KIND, endpoint_id, d.cursor or ""))
            for d in found
        ]

    @guarded
    def failed_since(self, endpoint_id: str, since: datetime) -> list[str]:
        since = utc(since)
        out: dict[str, None] = {}
        for d in self._deliveries:
            if d.endpoint_id == endpoint_id and not d.ok and d.at >= since:
                out.setdefault(d.event_id)
        return list(out)

    @guarded
    def prune_deliveries(self, before: datetime) -> int:
        before = utc(before)
        kept = [d for d in self._deliveries if d.at >= before]
        pruned = len(self._deliveries) - len(kept)
        self._deliveries = kept
        return pruned

    @guarded
    def relay_dead_letters(self, letters: Sequence[RelayedLetter]) -> list[str]:
        logged: list[str] = []
        for letter in letters:
            if letter.letter_id in self._relayed:
                continue
            self._relayed[letter.letter_id] = letter.task_id
            task = self._tasks.get(letter.task_id)
            if task is None:
                continue
            state = task.state.value
            self._append(task.campaign_id, task.id, state, DEAD_LETTER, letter.at, letter.error)
            logged.append(letter.letter_id)
        return logged

    @guarded
    def event_tasks(self, task_ids: Collection[str]) -> dict[str, EventTask]:
        return {i: EventTask.of(self._tasks[i]) for i in task_ids if i in self._tasks}
