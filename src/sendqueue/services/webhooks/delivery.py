"""Delivering events to webhook endpoints, in order and at least once.

Each endpoint has a cursor: the change-log id delivered up to. A pass (:meth:`WebhookDelivery.
run_pass`) takes, per enabled endpoint and under the store lease ``webhook:<id>``, the next
batch of change-log entries after its cursor (one read), maps them to events
(:func:`~sendqueue.domain.webhooks.event_of`), skips those its filters leave out, and posts the
rest one by one, in order. The first failure stops the endpoint: its head event blocks the
rest until it is delivered, retried after ``retry_base`` seconds doubling up to ``retry_cap``.
When it has kept failing for ``give_up_after`` seconds the endpoint is disabled, with the
reason, and the alarm says so. Every attempt goes to the delivery log (kept 7 days).

The cursor is saved after each batch and at a failure, so a process killed mid-batch
delivers the batch's delivered events again after its restart: at least once, with the same
``webhook-id`` (the event id is the change id's). An endpoint posts for at most
``turn`` seconds in a pass (then its place is saved and the next endpoint's turn comes), and
a worker that lost an endpoint's lease mid-batch stops and saves nothing: the worker that took
the lease over owns the cursor.

Before it reads, a pass runs the dead-letter relay (throttled by the relay itself), so the
``dead_letter`` events of letters no alarm relayed are in the change log it reads
(:mod:`sendqueue.services.webhooks.dead_letters`). A relay that fails is logged and the pass
goes on: the next one tries again.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Protocol

from sendqueue.domain.errors import SchedulerError, StoreUnavailable, WebhookDeliveryFailed
from sendqueue.domain.models import ChangeLogEntry
from sendqueue.domain.webhook_safety import signed_headers
from sendqueue.domain.webhooks import (
    DELIVERY_LOG_DAYS,
    DeliveryRecord,
    EventTask,
    WebhookEndpoint,
    WebhookEvent,
    backoff,
    event_body,
    event_of,
)
from sendqueue.ports import ChangeLog, Clock, Leases
from sendqueue.ports.webhooks import (
    EndpointChanges,
    WebhookAlarm,
    WebhookStore,
    WebhookTransport,
)
from sendqueue.services.webhooks.dead_letters import DeadLetterRelay

__all__ = ["ChangesUnderLease", "DeliveryPolicy", "PassReport", "WebhookDelivery"]

log = logging.getLogger(__name__)


class ChangesUnderLease(ChangeLog, Leases, Protocol):
    """What delivery reads of the task store: the change log, under each endpoint's lease."""


@dataclass(frozen=True)
class DeliveryPolicy:
    """How deliveries are retried and read."""

    retry_base: float = 5.0
    retry_cap: float = 3600.0
    give_up_after: float = 86400.0
    batch: int = 500
    lease_seconds: float = 35.0
    """How long an endpoint's lease holds without renewal: a killed worker's endpoints are
    taken over after it. Renewed during a pass at a third of it."""
    turn: float = 10.0
    """Seconds one endpoint may post for in a pass before the next endpoint's turn (its place
    saved, the pass reports ``full``), so a slow receiver does not hold up the others."""


@dataclass
class PassReport:
    """What one pass did: events delivered, attempts failed, endpoints disabled."""

    delivered: int = 0
    failed: int = 0
    disabled: int = 0
    full: bool = False
    """Some endpoint had more to read than one batch: run again at once."""


class WebhookDelivery:
    """Posts events to endpoints (see the module docstring)."""

    def __init__(
        self,
        store: WebhookStore,
        tasks: ChangesUnderLease,
        transport: WebhookTransport,
        clock: Clock,
        *,
        alarm: WebhookAlarm | None = None,
        policy: DeliveryPolicy | None = None,
        owner: str | None = None,
        relay: DeadLetterRelay | None = None,
    ) -> None:
        self._store = store
        self._tasks = tasks
        self._transport = transport
        self._clock = clock
        self._alarm = alarm
        self._policy = policy or DeliveryPolicy()
        self._owner = owner or f"webhooks-{uuid.uuid4().hex[:12]}"
        self._pruned_at: datetime | None = None
        self._relay = relay

    def run_pass(self, stop: threading.Event | None = None) -> PassReport:
        """One pass over every enabled endpoint whose retry time has come (the dead-letter
        relay first)."""
        self._relay_dead_letters()
        report = PassReport()
        now = self._clock.now()
        endpoints = self._store.list_endpoints()
        # One read says whether anything is new: an idle pass takes no lease (no write).
        end = self._tasks.last_change_id() if endpoints else 0
        for endpoint in endpoints:
            if stop is not None and stop.is_set():
                break
            if not endpoint.enabled or endpoint.cursor >= end:
                continue
            if endpoint.retry_at is not None and now < endpoint.retry_at:
                continue
            name = f"webhook:{endpoint.id}"
            lease = _Lease(self._tasks, self._clock, name, self._owner, self._policy.lease_seconds)
            if not lease.renew():
                continue
            try:
                self._endpoint_pass(endpoint, report, stop, lease)
            finally:
                lease.release()
        self._prune(now)
        return report

    def _relay_dead_letters(self) -> None:
        if self._relay is None:
            return
        try:
            self._relay.run()
        except (SchedulerError, StoreUnavailable) as exc:
            log.warning("dead letters not relayed this pass (the next one tries again): %s", exc)
        except Exception:  # delivering what the change log holds goes on
            log.exception("dead letters not relayed this pass (the next one tries again)")

    def send(
        self,
        endpoint: WebhookEndpoint,
        event: WebhookEvent,
        task: EventTask | None,
        attempt: int,
        *,
        redelivery: bool = False,
    ) -> DeliveryRecord:
        """Post one event now; the attempt as the log keeps it (nothing is saved here)."""
        body = event_body(event, task)
        at = self._clock.now()
        headers = signed_headers(endpoint.signing_secrets(at), event.id, int(at.timestamp()), body)
        started = time.monotonic()
        status: int | None
        try:
            answer = self._transport.post(endpoint.url, body, headers)
        except WebhookDeliveryFailed as exc:
            error: str | None = exc.reason[:200]
            status = exc.status
        else:
            error, status = None, answer.status
        latency = int((time.monotonic() - started) * 1000)
        return DeliveryRecord(
            endpoint.id, event.id, event.type.value, at, attempt, latency, status, error, redelivery
        )

    def tasks_of(self, entries: Sequence[ChangeLogEntry]) -> dict[str, EventTask]:
        """What the bodies of some entries' events say of their tasks, in one read."""
        ids = {e.task_id for e in entries if e.task_id is not None}
        return self._store.event_tasks(ids) if ids else {}

    def _endpoint_pass(
        self,
        endpoint: WebhookEndpoint,
        report: PassReport,
        stop: threading.Event | None,
        lease: _Lease,
    ) -> None:
        # Read again under the lease: another process may have moved it meanwhile.
        current = self._store.get_endpoint(endpoint.id)
        if current is None or not current.enabled:
            return
        entries = self._tasks.changes_after(current.cursor, limit=self._policy.batch)
        if not entries:
            return
        report.full = report.full or len(entries) >= self._policy.batch
        events = [(entry, event_of(entry)) for entry in entries]
        tasks = self.tasks_of([e for e, ev in events if ev is not None])
        records: list[DeliveryRecord] = []
        cursor = current.cursor
        turn_ends = time.monotonic() + self._policy.turn
        try:
            for entry, event in events:
                if not lease.hold():
                    return  # another worker took it over: its cursor is that worker's now
                if stop is not None and stop.is_set():
                    break
                if time.monotonic() >= turn_ends:
                    report.full = True  # the other endpoints' turns, then this one's again
                    break
                if event is None or not current.wants(event.type, entry.campaign_id):
                    cursor = entry.id
                    continue
                record = self.send(
                    current, event, tasks.get(entry.task_id or ""), 1 + current.attempts
                )
                records.append(record)
                if not record.ok:
                    report.failed += 1
                    self._failed(current, cursor, record, report)
                    return
                report.delivered += 1
                cursor = entry.id
                if current.attempts:
                    current = replace(current, attempts=0, retry_at=None, failing_since=None)
            self._advance(current.id, cursor)
        finally:
            if records:
                self._store.record_deliveries(records)

    def _advance(self, endpoint_id: str, cursor: int) -> None:
        changes: EndpointChanges = {
            "cursor": cursor,
            "attempts": 0,
            "retry_at": None,
            "failing_since": None,
        }
        self._store.update_endpoint(endpoint_id, changes)

    def _failed(
        self, endpoint: WebhookEndpoint, cursor: int, record: DeliveryRecord, report: PassReport
    ) -> None:
        now = record.at
        attempts = endpoint.attempts + 1
        since = endpoint.failing_since or now
        policy = self._policy
        if (now - since).total_seconds() >= policy.give_up_after:
            reason = (
                f"deliveries failed for {policy.give_up_after:.0f} s since "
                f"{since.isoformat(timespec='seconds')}: {record.error}"
            )
            self._store.update_endpoint(
                endpoint.id,
                {
                    "cursor": cursor,
                    "enabled": False,
                    "disabled_reason": reason,
                    "attempts": attempts,
                    "retry_at": None,
                    "failing_since": since,
                },
            )
            report.disabled += 1
            if self._alarm is not None:
                self._alarm.webhook_disabled(endpoint.id, endpoint.url, reason)
            else:
                log.error("webhook %s disabled: %s", endpoint.id, reason)
            return
        wait = backoff(attempts, base=policy.retry_base, cap=policy.retry_cap)
        self._store.update_endpoint(
            endpoint.id,
            {
                "cursor": cursor,
                "attempts": attempts,
                "retry_at": now + timedelta(seconds=wait),
                "failing_since": since,
            },
        )
        log.warning(
            "webhook %s: %s attempt %d failed (%s); next in %.1f s",
            endpoint.id,
            record.event_id,
            attempts,
            record.error,
            wait,
        )

    def _prune(self, now: datetime) -> None:
        # The log is pruned at most once an hour per process.
        if self._pruned_at is not None and now - self._pruned_at < timedelta(hours=1):
            return
        self._pruned_at = now
        self._store.prune_deliveries(now - timedelta(days=DELIVERY_LOG_DAYS))


class _Lease:
    """An endpoint's store lease, renewed at a third of its time (monotonic clock)."""

    def __init__(self, tasks: Leases, clock: Clock, name: str, owner: str, ttl: float) -> None:
        self.ttl = ttl
        self._tasks = tasks
        self._clock = clock
        self._name = name
        self._owner = owner
        self._renewed = 0.0

    def renew(self) -> bool:
        at = self._clock.now()
        held = self._tasks.acquire_lease(self._name, self._owner, ttl_seconds=self.ttl, at=at)
        self._renewed = time.monotonic()
        return held

    def hold(self) -> bool:
        """Still ours: renewed when a third of its time has passed."""
        if time.monotonic() - self._renewed < self.ttl / 3:
            return True
        return self.renew()

    def release(self) -> None:
        self._tasks.release_lease(self._name, self._owner)
