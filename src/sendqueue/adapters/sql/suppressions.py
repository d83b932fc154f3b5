"""The suppression list on SQL (:class:`SuppressionTables`, a base of
:class:`~sendqueue.adapters.sql.base.SqlTaskStore`): the same statements on both databases.

Insert-or-keep is ``INSERT ... ON CONFLICT DO NOTHING RETURNING email``: the rows returned are
the new ones, and a concurrent insert of the same address waits on its primary key and then
keeps the first row. Lookups are ``email IN (...)`` on the primary key, a chunk at a time.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sendqueue.adapters.sql import rows
from sendqueue.adapters.sql import schema as tables
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import check_limit
from sendqueue.domain.suppression import (
    SUPPRESSED_PREFIX,
    Suppression,
    SuppressionReason,
    first_entries,
)
from sendqueue.ports import ReadsTaskThenSuppression

__all__ = ["SuppressionTables"]

_S = tables.suppressions.c


def _entry(row: Sequence[Any]) -> Suppression:
    email, reason, task_id, at = row
    return Suppression(email, SuppressionReason(reason), task_id, at)


class SuppressionTables(ReadsTaskThenSuppression, ABC):
    """:class:`~sendqueue.ports.SuppressionList` over the store's transactions."""

    _insert: ClassVar[Any]

    @abstractmethod
    def _write(self, action: str) -> AbstractContextManager[Connection]:
        """A write transaction (see SqlTaskStore)."""

    @abstractmethod
    def _read(self, action: str) -> AbstractContextManager[Connection]:
        """A read-only connection (see SqlTaskStore)."""

    def suppress(self, entries: Sequence[Suppression]) -> int:
        """Insert-or-keep, in address order (two writers lock the keys in one order)."""
        first = first_entries(entries)
        if not first:
            return 0
        values = [
            {"email": e.email, "reason": e.reason.value, "task_id": e.task_id, "at": e.at}
            for e in sorted(first.values(), key=lambda e: e.email)
        ]
        added = 0
        with self._write("suppress addresses") as conn:
            for chunk in rows.chunks(values):
                statement = (
                    self._insert(tables.suppressions)
                    .values(list(chunk))
                    .on_conflict_do_nothing(index_elements=[_S.email])
                    .returning(_S.email)
                )
                added += len(conn.execute(statement).all())
        return added

    def unsuppress(self, email: str) -> bool:
        with self._write("unsuppress an address") as conn:
            return bool(
                conn.execute(sa.delete(tables.suppressions).where(_S.email == email)).rowcount
            )

    def suppressed(self, emails: Iterable[str]) -> dict[str, Suppression]:
        wanted = sorted(set(emails))
        if not wanted:
            return {}
        return {row[0]: _entry(row) for row in self._suppression_rows(wanted)}

    @abstractmethod
    def _suppression_rows(
        self, emails: Sequence[str]
    ) -> list[tuple[str, str, str | None, datetime]]:
        """The ``suppressions`` rows of ``emails`` (distinct, at least one), times aware UTC:
        on the driver's fast path, since the send worker looks one up before every send."""

    def list_suppressions(self, *, after: str | None = None, limit: int = 100) -> list[Suppression]:
        check_limit(limit)
        query = sa.select(tables.suppressions).order_by(_S.email).limit(limit)
        if after is not None:
            query = query.where(_S.email > after)
        with self._read("list suppressed addresses") as conn:
            return [_entry(row) for row in conn.execute(query)]

    def count_suppressions(self) -> int:
        with self._read("count suppressed addresses") as conn:
            return int(
                conn.execute(
                    sa.select(sa.func.count()).select_from(tables.suppressions)
                ).scalar_one()
            )

    def count_suppressed_tasks(self, campaign_id: str) -> int:
        """One count on the (campaign, state) index, the reason checked on its rows."""
        query = sa.select(sa.func.count()).where(
            tables.tasks.c.campaign_id == campaign_id,
            tables.tasks.c.state == TaskState.CANCELLED.value,
            tables.tasks.c.reason.startswith(SUPPRESSED_PREFIX, autoescape=True),
        )
        with self._read("count suppressed tasks") as conn:
            return int(conn.execute(query).scalar_one())
