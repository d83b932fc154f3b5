"""The webhooks' store on SQL (:class:`WebhookTables`, a base of
:class:`~sendqueue.adapters.sql.base.SqlTaskStore`): the same statements on both databases
(the driver's parameter marks and id lists aside).

Endpoints are one row each (filters as JSON lists), changed with one ``UPDATE ... RETURNING``;
the delivery log is appended with the driver's executemany, read through its index (endpoint,
id) newest first and pruned through its index on ``at``. Removing an endpoint deletes its log
in the same transaction. The tasks of a pass's events are three columns read in one
statement.

Dead letters are relayed in one transaction per call: ``INSERT ... ON CONFLICT DO NOTHING
RETURNING`` of their markers (``dead_letter_relays``) says which are new (a concurrent relay
of the same letter waits on its primary key, then keeps the first row), and only those get
their change-log entries, in the same transaction.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sendqueue.adapters.sql import rows
from sendqueue.adapters.sql import schema as tables
from sendqueue.adapters.sql.schema import sqlite_text
from sendqueue.domain.errors import Conflict
from sendqueue.domain.models import check_limit, utc
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

__all__ = ["WebhookTables"]

_E = tables.webhook_endpoints.c
_D = tables.webhook_deliveries.c
#: The delivery log's cursors name SQL row ids (the same on SQLite and PostgreSQL).
_CURSOR_KIND = "sql"
_R = tables.dead_letter_relays.c
_T = tables.tasks.c

_INSERT_DELIVERY = (
    "INSERT INTO webhook_deliveries (endpoint_id, event_id, event_type, at, attempt,"
    " latency_ms, status, error, redelivery) VALUES ({mark}, {mark}, {mark}, {mark}, {mark},"
    " {mark}, {mark}, {mark}, {mark})"
)


def _endpoint(row: Any) -> WebhookEndpoint:
    m = row._mapping
    return WebhookEndpoint(
        id=m["id"],
        url=m["url"],
        created_at=m["created_at"],
        secret=m["secret"],
        event_types=tuple(m["event_types"] or ()),
        campaign_ids=tuple(m["campaign_ids"] or ()),
        enabled=bool(m["enabled"]),
        disabled_reason=m["disabled_reason"],
        previous_secret=m["previous_secret"],
        previous_secret_expires_at=m["previous_secret_expires_at"],
        cursor=int(m["cursor"]),
        attempts=int(m["attempts"]),
        retry_at=m["retry_at"],
        failing_since=m["failing_since"],
    )


def _values(values: dict[str, Any]) -> dict[str, Any]:
    for key in ("event_types", "campaign_ids"):
        if key in values:
            values[key] = list(values[key])
    return values


def _record(row: Any) -> DeliveryRecord:
    m = row._mapping
    return DeliveryRecord(
        endpoint_id=m["endpoint_id"],
        event_id=m["event_id"],
        event_type=m["event_type"],
        at=m["at"],
        attempt=int(m["attempt"]),
        latency_ms=int(m["latency_ms"]),
        status=m["status"],
        error=m["error"],
        redelivery=bool(m["redelivery"]),
        cursor=delivery_cursor(_CURSOR_KIND, m["endpoint_id"], str(m["id"])),
    )


class WebhookTables(ABC):
    """:class:`~sendqueue.ports.webhooks.WebhookStore` over the store's transactions."""

    _insert: ClassVar[Any]
    #: The SQLAlchemy dialect name of the store (see SqlTaskStore).
    dialect: ClassVar[str]

    @abstractmethod
    def _write(self, action: str) -> AbstractContextManager[Connection]:
        """A write transaction (see SqlTaskStore)."""

    @abstractmethod
    def _read(self, action: str) -> AbstractContextManager[Connection]:
        """A read-only connection (see SqlTaskStore)."""

    @abstractmethod
    def _log(self, conn: Connection, entries: Sequence[Mapping[str, Any]]) -> None:
        """Append change-log rows inside the caller's transaction (see SqlTaskStore)."""

    def relay_dead_letters(self, letters: Sequence[RelayedLetter]) -> list[str]:
        given: dict[str, RelayedLetter] = {}
        for letter in letters:
            given.setdefault(letter.letter_id, letter)
        if not given:
            return []
        # In letter-id order: two relays lock the markers' keys in one order.
        markers = [
            {"letter_id": r.letter_id, "task_id": r.task_id, "failed_at": r.at}
            for r in sorted(given.values(), key=lambda r: r.letter_id)
        ]
        with self._write("relay dead letters") as conn:
            new: set[str] = set()
            for chunk in rows.chunks(markers):
                statement = (
                    self._insert(tables.dead_letter_relays)
                    .values(list(chunk))
                    .on_conflict_do_nothing(index_elements=[_R.letter_id])
                    .returning(_R.letter_id)
                )
                new.update(conn.execute(statement).scalars())
            fresh = [r for r in given.values() if r.letter_id in new]
            found = self._task_states(conn, sorted({r.task_id for r in fresh}))
            logged = [r for r in fresh if r.task_id in found]
            entries = [
                rows.log_row(
                    found[r.task_id][0], r.task_id, found[r.task_id][1], DEAD_LETTER, r.at, r.error
                )
                for r in logged
            ]
            if entries:
                self._log(conn, entries)
        return [r.letter_id for r in logged]

    @staticmethod
    def _task_states(conn: Connection, task_ids: Sequence[str]) -> dict[str, tuple[str, str]]:
        """Task id -> (campaign, state) of those that exist, read in the caller's transaction."""
        found: dict[str, tuple[str, str]] = {}
        for chunk in rows.chunks(task_ids):
            query = sa.select(_T.id, _T.campaign_id, _T.state).where(_T.id.in_(chunk))
            for row in conn.execute(query):
                found[row.id] = (row.campaign_id, row.state)
        return found

    def event_tasks(self, task_ids: Collection[str]) -> dict[str, EventTask]:
        # Three columns in one statement, the ids one parameter (a JSON array on SQLite, an
        # array on PostgreSQL): whole tasks cost a delivery pass more than its statements.
        if not task_ids:
            return {}
        sqlite = self.dialect == "sqlite"
        where = "id IN (SELECT value FROM json_each(?))" if sqlite else "id = ANY(%s)"
        ids: object = json.dumps(list(task_ids)) if sqlite else list(task_ids)
        with self._read("read the tasks of webhook events") as conn:
            found = conn.exec_driver_sql(
                f"SELECT id, email, sender, message_id FROM tasks WHERE {where}", (ids,)
            ).fetchall()
        return {row[0]: EventTask(row[1], row[2], row[3]) for row in found}

    def add_endpoint(self, endpoint: WebhookEndpoint) -> None:
        values = _values(
            {
                "id": endpoint.id,
                "url": endpoint.url,
                "event_types": endpoint.event_types,
                "campaign_ids": endpoint.campaign_ids,
                "enabled": endpoint.enabled,
                "disabled_reason": endpoint.disabled_reason,
                "created_at": utc(endpoint.created_at),
                "secret": endpoint.secret,
                "previous_secret": endpoint.previous_secret,
                "previous_secret_expires_at": endpoint.previous_secret_expires_at,
                "cursor": endpoint.cursor,
                "attempts": endpoint.attempts,
                "retry_at": endpoint.retry_at,
                "failing_since": endpoint.failing_since,
            }
        )
        with self._write("add a webhook endpoint") as conn:
            found = conn.execute(sa.select(_E.id).where(_E.id == endpoint.id)).first()
            if found is not None:
                raise Conflict(f"webhook {endpoint.id!r} already exists")
            conn.execute(sa.insert(tables.webhook_endpoints).values(values))

    def get_endpoint(self, endpoint_id: str) -> WebhookEndpoint | None:
        query = sa.select(tables.webhook_endpoints).where(_E.id == endpoint_id)
        with self._read("get a webhook endpoint") as conn:
            row = conn.execute(query).first()
        return None if row is None else _endpoint(row)

    def list_endpoints(self) -> list[WebhookEndpoint]:
        query = sa.select(tables.webhook_endpoints).order_by(_E.created_at, _E.id)
        with self._read("list webhook endpoints") as conn:
            return [_endpoint(row) for row in conn.execute(query)]

    def update_endpoint(self, endpoint_id: str, changes: EndpointChanges) -> WebhookEndpoint | None:
        values = _values(checked_endpoint_changes(changes))
        if not values:
            return self.get_endpoint(endpoint_id)
        statement = (
            sa.update(tables.webhook_endpoints)
            .where(_E.id == endpoint_id)
            .values(values)
            .returning(tables.webhook_endpoints)
        )
        with self._write("update a webhook endpoint") as conn:
            row = conn.execute(statement).first()
        return None if row is None else _endpoint(row)

    def remove_endpoint(self, endpoint_id: str) -> bool:
        with self._write("remove a webhook endpoint") as conn:
            conn.execute(sa.delete(tables.webhook_deliveries).where(_D.endpoint_id == endpoint_id))
            gone = conn.execute(
                sa.delete(tables.webhook_endpoints).where(_E.id == endpoint_id).returning(_E.id)
            ).first()
        return gone is not None

    def record_deliveries(self, records: Sequence[DeliveryRecord]) -> None:
        # The driver's executemany of plain tuples: SQLAlchemy's per-row parameter processing
        # cost more than the INSERT (a delivery pass writes one row per event; benchmark 15).
        if not records:
            return
        sqlite = self.dialect == "sqlite"
        values = [
            (
                r.endpoint_id, r.event_id, r.event_type,
                sqlite_text(r.at) if sqlite else utc(r.at), r.attempt, r.latency_ms, r.status,
                r.error, r.redelivery,
            )
            for r in records
        ]  # fmt: skip
        statement = _INSERT_DELIVERY.format(mark="?" if sqlite else "%s")
        with self._write("record webhook deliveries") as conn:
            conn.exec_driver_sql(statement, values)

    def deliveries(
        self, endpoint_id: str, *, limit: int = 100, before: str | None = None
    ) -> list[DeliveryRecord]:
        check_limit(limit)
        query = (
            sa.select(tables.webhook_deliveries)
            .where(_D.endpoint_id == endpoint_id)
            .order_by(_D.id.desc())
            .limit(limit)
        )
        if before is not None:
            row_id = delivery_cursor_id(before, store=_CURSOR_KIND, endpoint_id=endpoint_id)
            query = query.where(_D.id < row_id)
        with self._read("read webhook deliveries") as conn:
            return [_record(row) for row in conn.execute(query)]

    def failed_since(self, endpoint_id: str, since: datetime) -> list[str]:
        query = (
            sa.select(_D.event_id, sa.func.min(_D.id).label("first"))
            .where(_D.endpoint_id == endpoint_id, _D.at >= utc(since), _D.error.is_not(None))
            .group_by(_D.event_id)
            .order_by("first")
        )
        with self._read("read failed webhook deliveries") as conn:
            return [row.event_id for row in conn.execute(query)]

    def prune_deliveries(self, before: datetime) -> int:
        statement = sa.delete(tables.webhook_deliveries).where(_D.at < utc(before))
        with self._write("prune webhook deliveries") as conn:
            return int(conn.execute(statement).rowcount or 0)
