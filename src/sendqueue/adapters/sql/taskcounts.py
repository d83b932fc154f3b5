"""The task store's counts and sweeps over the tasks table, the same statements on both
databases (:class:`TaskCounts`, a base of :class:`~sendqueue.adapters.sql.base.SqlTaskStore`):
the moved and late emails of a campaign, its tasks per step, the Running tasks claimed too long
ago, and the instants a campaign has booked."""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from typing import ClassVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sendqueue.adapters.sql import rows
from sendqueue.adapters.sql import schema as tables
from sendqueue.adapters.sql.schema import sqlite_text
from sendqueue.domain.lifecycle import TaskOutcome, TaskState
from sendqueue.domain.models import Task, check_limit, utc
from sendqueue.domain.reads import StepCounts

__all__ = ["TaskCounts"]


class TaskCounts(ABC):
    """Counts and sweeps of tasks, read over the store's connections."""

    #: The SQLAlchemy dialect name (see SqlTaskStore).
    dialect: ClassVar[str]

    @abstractmethod
    def _read(self, action: str) -> AbstractContextManager[Connection]:
        """A read-only connection (see SqlTaskStore)."""

    def count_moves(self, campaign_id: str, *, late_after: float) -> tuple[int, int]:
        t = tables.tasks.c
        if self.dialect == "sqlite":
            # times are text on SQLite: julianday() reads them (days, as a float)
            late_by = (sa.func.julianday(t.sent_at) - sa.func.julianday(t.send_at)) * 86_400.0
            is_late: sa.ColumnElement[bool] = late_by > late_after
        else:
            is_late = t.sent_at - t.send_at > timedelta(seconds=late_after)
        query = sa.select(
            sa.func.count().filter(t.moves > 0),
            sa.func.count().filter(sa.and_(t.state == TaskState.FINISHED.value, is_late)),
        ).where(t.campaign_id == campaign_id)
        with self._read("count moved tasks") as conn:
            moved, late = conn.execute(query).one()
        return int(moved), int(late)

    def count_steps(self, campaign_id: str) -> dict[int, StepCounts]:
        t = tables.tasks.c
        query = (
            sa.select(t.step, t.state, t.outcome, sa.func.count())
            .where(t.campaign_id == campaign_id)
            .group_by(t.step, t.state, t.outcome)
        )
        with self._read("count tasks per step") as conn:
            found = conn.execute(query).all()
        return StepCounts.tally(
            (int(step), TaskState(state), TaskOutcome(outcome) if outcome else None, int(n))
            for step, state, outcome, n in found
        )

    def stale_running(self, *, claimed_before: datetime, limit: int = 1000) -> builtins.list[Task]:
        check_limit(limit)
        query = (
            sa.select(tables.tasks)
            .where(
                tables.tasks.c.state == TaskState.RUNNING.value,
                tables.tasks.c.claimed_at < claimed_before,
            )
            .order_by(tables.tasks.c.claimed_at, tables.tasks.c.id)
            .limit(limit)
        )
        with self._read("list stale tasks") as conn:
            found = conn.execute(query).all()
        return [rows.task_from_row(row) for row in found]

    def booked(
        self, campaign_id: str, *, since: datetime, until: datetime | None = None
    ) -> list[tuple[TaskState, datetime]]:
        # The driver's statement, one instant per row chosen in SQL: a follow-up's slot search
        # reads its whole due day, and SQLAlchemy's row processing cost more than the query.
        sqlite = self.dialect == "sqlite"
        mark = "?" if sqlite else "%s"
        bound: Callable[[datetime], object] = sqlite_text if sqlite else utc
        times = [since] if until is None else [since, until]

        def within(column: str) -> str:
            return f"{column} >= {mark}" + ("" if until is None else f" AND {column} < {mark}")

        done, going, due = (
            f"'{s.value}'" for s in (TaskState.FINISHED, TaskState.RUNNING, TaskState.PENDING)
        )
        sql = (
            f"SELECT state, CASE state WHEN {done} THEN sent_at WHEN {going} THEN claimed_at"
            f" ELSE send_at END FROM tasks WHERE campaign_id = {mark} AND ("
            f"(state = {done} AND {within('sent_at')})"
            f" OR (state = {going} AND {within('claimed_at')})"
            f" OR (state = {due} AND {within('send_at')}))"
        )
        args = (campaign_id, *[bound(t) for t in times * 3])
        with self._read("list booked sends") as conn:
            found = conn.exec_driver_sql(sql, args).all()
        states = rows.STATES
        if sqlite:  # naive UTC text (UtcDateTime)
            return [(states[s], rows.text_when(w)) for s, w in found]
        return [(states[s], w.astimezone(UTC)) for s, w in found]
