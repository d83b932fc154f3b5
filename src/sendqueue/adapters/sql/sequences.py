"""The SQL stores' sequence edits (:class:`~sendqueue.ports.SequenceEdits`) and follow-up
marks (:class:`~sendqueue.ports.FollowUpMarks`), the same
statements on both databases (:class:`SequenceTables`, a base of
:class:`~sendqueue.adapters.sql.base.SqlTaskStore`).

The steps' compare-and-set compares the stored steps in Python, then updates the row only
while its ``updated_at`` is still the one read: one statement decides, on SQLite and on
PostgreSQL under read committed alike.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sendqueue.adapters.sql import rows
from sendqueue.adapters.sql import schema as tables
from sendqueue.domain.errors import NotFound
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import Task, utc
from sendqueue.domain.steps import Step, check_steps, steps_from_data, steps_to_data
from sendqueue.domain.transitions import Rerender

__all__ = ["SequenceTables"]

#: Re-rendered tasks written per transaction (each an UPDATE): short transactions, short locks.
_RERENDER_CHUNK = 200


class SequenceTables(ABC):
    """``replace_steps``, ``rerender`` and the follow-up marks over the store's transactions."""

    #: The SQLAlchemy dialect name (see SqlTaskStore).
    dialect: ClassVar[str]

    @abstractmethod
    def _write(self, action: str) -> AbstractContextManager[Connection]:
        """A write transaction (see SqlTaskStore)."""

    @abstractmethod
    def _read(self, action: str) -> AbstractContextManager[Connection]:
        """A read (see SqlTaskStore)."""

    @abstractmethod
    def _log(self, conn: Connection, entries: Sequence[Mapping[str, Any]]) -> None:
        """Append change-log rows inside the caller's transaction (see SqlTaskStore)."""

    def follow_ups_due(self, campaign_id: str, *, limit: int = 500) -> list[Task]:
        # The driver's statement through the marks' partial index: a batch reads hundreds of
        # whole tasks, and SQLAlchemy's processing of 29 columns cost most of the read.
        sqlite = self.dialect == "sqlite"
        mark, marked = ("?", "follow_up = 1") if sqlite else ("%s", "follow_up")
        sql = (
            f"SELECT {rows.TASK_COLUMNS} FROM tasks WHERE campaign_id = {mark} AND {marked}"
            f" ORDER BY position, step LIMIT {mark}"
        )
        with self._read("read follow-up marks") as conn:
            found = conn.exec_driver_sql(sql, (campaign_id, limit)).all()
        convert = rows.task_from_text_row if sqlite else rows.task_from_row
        return [convert(row) for row in found]

    def follow_ups_made(self, campaign_id: str, task_ids: Collection[str]) -> int:
        t = tables.tasks.c
        cleared = 0
        for part in rows.chunks(sorted(set(task_ids))):  # a batch's marks in one write
            with self._write("clear follow-up marks") as conn:
                done = conn.execute(
                    sa.update(tables.tasks)
                    .where(t.campaign_id == campaign_id, t.id.in_(part), t.follow_up)
                    .values(follow_up=False)
                )
                cleared += done.rowcount
        return cleared

    def replace_steps(
        self, campaign_id: str, expected: Sequence[Step], steps: Sequence[Step], *, at: datetime
    ) -> bool:
        data = steps_to_data(check_steps(steps))
        c = tables.campaigns.c
        with self._write("replace a campaign's steps") as conn:
            row = conn.execute(sa.select(c.steps, c.updated_at).where(c.id == campaign_id)).first()
            if row is None:
                raise NotFound("campaign", campaign_id)
            if steps_from_data(row.steps) != tuple(expected):
                return False
            done = conn.execute(
                sa.update(tables.campaigns)
                .where(c.id == campaign_id, c.updated_at == row.updated_at)
                .values(steps=data, updated_at=utc(at))
            )
            return bool(done.rowcount)

    def rerender(self, changes: Sequence[Rerender], *, at: datetime, note: str) -> int:
        at = utc(at)
        t = tables.tasks.c
        pending = TaskState.PENDING.value
        applied = 0
        # In id order, so two writers take their row locks in one order.
        ordered = sorted(changes, key=lambda r: r.task_id)
        for start in range(0, len(ordered), _RERENDER_CHUNK):
            with self._write("re-render tasks") as conn:
                entries = []
                for change in ordered[start : start + _RERENDER_CHUNK]:
                    done = conn.execute(
                        sa.update(tables.tasks)
                        .where(t.id == change.task_id, t.state == pending, t.token == change.token)
                        .values(
                            subject=change.subject,
                            text=change.text,
                            html=change.html,
                            updated_at=at,
                        )
                    )
                    if done.rowcount:
                        entries.append(
                            rows.log_row(
                                change.campaign_id, change.task_id, pending, pending, at, note
                            )
                        )
                if entries:
                    self._log(conn, entries)
                applied += len(entries)
        return applied
