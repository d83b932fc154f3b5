"""The task store's side tables, the same statements on both databases: change-log reads,
leases and counters (:class:`SideTables`, a base of
:class:`~sendqueue.adapters.sql.base.SqlTaskStore`).

The change log is read in id order. On PostgreSQL only settled entries are returned
(:meth:`PostgresTaskStore.changes_after
<sendqueue.adapters.sql.postgres.PostgresTaskStore.changes_after>`); SQLite serialises its
writers, so its ids commit in order.
"""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sendqueue.adapters.sql import rows
from sendqueue.adapters.sql import schema as tables
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.models import ChangeLogEntry, check_cursor, check_limit

__all__ = ["SideTables"]


class SideTables(ABC):
    """Change-log reads, leases and counters over the store's transactions."""

    #: The dialect's ``insert()`` (both spell ON CONFLICT the same way, through their own).
    _insert: ClassVar[Any]

    @abstractmethod
    def _write(self, action: str) -> AbstractContextManager[Connection]:
        """A write transaction (see SqlTaskStore)."""

    @abstractmethod
    def _read(self, action: str) -> AbstractContextManager[Connection]:
        """A read-only connection (see SqlTaskStore)."""

    # change log ------------------------------------------------------------------------------

    def changes_after(
        self, after_id: int, *, campaign_id: str | None = None, limit: int = 1000
    ) -> builtins.list[ChangeLogEntry]:
        return self._changes_after(after_id, campaign_id, limit, None)

    def _changes_after(
        self,
        after_id: int,
        campaign_id: str | None,
        limit: int,
        only: sa.ColumnElement[bool] | None,
    ) -> builtins.list[ChangeLogEntry]:
        """:meth:`changes_after`, with ``only`` as an extra condition on the rows."""
        check_limit(limit)
        check_cursor(after_id, field="after_id")
        query = sa.select(tables.change_log).where(tables.change_log.c.id > after_id)
        if only is not None:
            query = query.where(only)
        if campaign_id is not None:
            query = query.where(tables.change_log.c.campaign_id == campaign_id)
        query = query.order_by(tables.change_log.c.id).limit(limit)
        with self._read("read change log") as conn:
            found = conn.execute(query).all()
        return [rows.entry_from_row(row) for row in found]

    def last_change_id(self) -> int:
        with self._read("read change log") as conn:
            value = conn.execute(sa.select(sa.func.max(tables.change_log.c.id))).scalar()
        return int(value or 0)

    def newest_change_id(self) -> int:
        # SQLite: writers are serialised, so every committed entry is readable.
        return SideTables.last_change_id(self)

    # leases ----------------------------------------------------------------------------------

    def acquire_lease(self, name: str, owner: str, *, ttl_seconds: float, at: datetime) -> bool:
        """Take or renew the lease; it is free when missing or ``expires_at <= at``."""
        if ttl_seconds <= 0:
            raise InvalidField("ttl_seconds", ttl_seconds, "must be more than zero")
        statement = self._insert(tables.leases).values(
            name=name, owner=owner, expires_at=at + timedelta(seconds=ttl_seconds)
        )
        statement = statement.on_conflict_do_update(
            index_elements=[tables.leases.c.name],
            set_={"owner": statement.excluded.owner, "expires_at": statement.excluded.expires_at},
            where=sa.or_(tables.leases.c.owner == owner, tables.leases.c.expires_at <= at),
        ).returning(tables.leases.c.name)
        with self._write("acquire lease") as conn:
            return conn.execute(statement).first() is not None

    def release_lease(self, name: str, owner: str) -> None:
        with self._write("release lease") as conn:
            conn.execute(
                sa.delete(tables.leases).where(
                    tables.leases.c.name == name, tables.leases.c.owner == owner
                )
            )

    # counters --------------------------------------------------------------------------------

    def counter(self, name: str) -> int:
        _check_counter_name(name)
        query = sa.select(tables.counters.c.value).where(tables.counters.c.name == name)
        with self._read("read counter") as conn:
            value = conn.execute(query).scalar()
        return int(value or 0)

    def increment_counter(self, name: str) -> int:
        """One upsert: INSERT 1, or on conflict value + 1, RETURNING the new value."""
        _check_counter_name(name)
        statement = self._insert(tables.counters).values(name=name, value=1)
        statement = statement.on_conflict_do_update(
            index_elements=[tables.counters.c.name],
            set_={"value": tables.counters.c.value + 1},
        ).returning(tables.counters.c.value)
        with self._write("increment counter") as conn:
            return int(conn.execute(statement).scalar_one())


def _check_counter_name(name: str) -> None:
    if not name or len(name) > 200:
        raise InvalidField("name", name, "must be 1 to 200 characters")
