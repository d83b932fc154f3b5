"""The feedback store on SQL (:class:`FeedbackTables`, a base of
:class:`~sendqueue.adapters.sql.base.SqlTaskStore`): the same statements on both databases.

- ``set_outcome`` is one conditional ``UPDATE ... RETURNING`` (Finished, another outcome, and
  for ``accepted`` none yet) and, when it matched, the change-log INSERT, in one transaction.
- ``tasks_for`` reads ``tasks.email_key`` (the compared form written at insert, migration 0006)
  through its index ``(email_key, state)``.
- Soft bounces are insert-or-keep on their primary key (address, message key), then a count.
- A recipient's return date (migration 0013) is one upsert on (campaign, position) whose
  ``WHERE`` lets only a notice at least as new as the kept one replace it.
- A mailbox cursor is one upsert whose ``WHERE`` lets it move only forward within one
  UIDVALIDITY, so two pollers saving at once keep the higher position.
- A mailbox's pass state (migration 0008) lives on its cursor row: an upsert that adds to
  ``messages_read``. A row made by a pass before any position (its first pass failed) has
  UIDVALIDITY 0, which no server uses (RFC 3501: a non-zero number), and reads as no cursor.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import date, datetime
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sendqueue.adapters.sql import rows
from sendqueue.adapters.sql import schema as tables
from sendqueue.domain.feedback import UNVERIFIED_NOTE, MailboxState, outcome_note
from sendqueue.domain.lifecycle import TaskOutcome, TaskState
from sendqueue.domain.models import Task, check_limit, utc

__all__ = ["FeedbackTables"]

_T = tables.tasks.c
_B = tables.soft_bounces.c
_C = tables.feedback_cursors.c
_A = tables.away_dates.c
_FINISHED = TaskState.FINISHED.value


class FeedbackTables(ABC):
    """:class:`~sendqueue.ports.FeedbackStore` over the store's transactions."""

    _insert: ClassVar[Any]

    @abstractmethod
    def _write(self, action: str) -> AbstractContextManager[Connection]:
        """A write transaction (see SqlTaskStore)."""

    @abstractmethod
    def _read(self, action: str) -> AbstractContextManager[Connection]:
        """A read-only connection (see SqlTaskStore)."""

    @abstractmethod
    def _log(self, conn: Connection, entries: Sequence[Mapping[str, Any]]) -> None:
        """Append change-log rows inside the caller's transaction (see SqlTaskStore)."""

    def set_outcome(
        self, task_id: str, outcome: TaskOutcome, *, detail: str | None, at: datetime
    ) -> Task | None:
        at = utc(at)
        outcome = TaskOutcome(outcome)
        conditions = [
            _T.id == task_id,
            _T.state == _FINISHED,
            sa.or_(_T.outcome.is_(None), _T.outcome != outcome.value),
        ]
        if outcome is TaskOutcome.ACCEPTED:
            conditions.append(_T.outcome.is_(None))  # accepted never replaces another outcome
        statement = (
            sa.update(tables.tasks)
            .where(*conditions)
            .values(outcome=outcome.value, outcome_detail=detail, outcome_at=at, updated_at=at)
            .returning(tables.tasks)
        )
        with self._write("set a task's outcome") as conn:
            found = conn.execute(statement).first()
            if found is None:
                return None
            task = rows.task_from_row(found)
            note = outcome_note(outcome, detail or "")
            entry = rows.log_row(task.campaign_id, task.id, _FINISHED, _FINISHED, at, note)
            self._log(conn, [entry])
        return task

    def note_unverified_reply(self, task_id: str, *, detail: str, at: datetime) -> Task | None:
        at = utc(at)
        statement = (
            sa.update(tables.tasks)
            .where(
                _T.id == task_id,
                _T.state == _FINISHED,
                _T.outcome == TaskOutcome.ACCEPTED.value,
                _T.outcome_detail.is_(None),  # the first note is kept
            )
            .values(outcome_detail=detail, updated_at=at)
            .returning(tables.tasks)
        )
        with self._write("note an unverified reply") as conn:
            found = conn.execute(statement).first()
            if found is None:
                return None
            task = rows.task_from_row(found)
            entry = rows.log_row(
                task.campaign_id, task.id, _FINISHED, _FINISHED, at, UNVERIFIED_NOTE
            )
            self._log(conn, [entry])
        return task

    def tasks_for(
        self, email: str, *, states: Collection[TaskState], limit: int = 1000
    ) -> list[Task]:
        check_limit(limit)
        wanted = sorted({TaskState(s).value for s in states})
        if not wanted or limit == 0:
            return []
        query = (
            sa.select(tables.tasks)
            .where(_T.email_key == email, _T.state.in_(wanted))
            .order_by(_T.send_at.desc(), _T.id.desc())
            .limit(limit)
        )
        with self._read("list an address's tasks") as conn:
            return [rows.task_from_row(row) for row in conn.execute(query)]

    def record_soft_bounce(self, email: str, key: str, *, at: datetime, since: datetime) -> int:
        statement = (
            self._insert(tables.soft_bounces)
            .values(email=email, key=key, at=utc(at))
            .on_conflict_do_nothing(index_elements=[_B.email, _B.key])
        )
        count = sa.select(sa.func.count()).where(_B.email == email, _B.at >= utc(since))
        with self._write("record a soft bounce") as conn:
            conn.execute(statement)
            return int(conn.execute(count).scalar_one())

    def set_away(self, campaign_id: str, position: int, until: date, *, at: datetime) -> None:
        statement = self._insert(tables.away_dates).values(
            campaign_id=campaign_id, position=position, until=until, at=utc(at)
        )
        statement = statement.on_conflict_do_update(
            index_elements=[_A.campaign_id, _A.position],
            set_={"until": statement.excluded.until, "at": statement.excluded.at},
            where=_A.at <= statement.excluded.at,
        )
        with self._write("keep a return date") as conn:
            conn.execute(statement)

    def away_dates(self, campaign_id: str, positions: Collection[int]) -> dict[int, date]:
        found: dict[int, date] = {}
        with self._read("read return dates") as conn:
            for part in rows.chunks(sorted(set(positions))):
                query = sa.select(_A.position, _A.until).where(
                    _A.campaign_id == campaign_id, _A.position.in_(part)
                )
                found.update((int(p), u) for p, u in conn.execute(query).all())
        return found

    def away_until(self, campaign_id: str, position: int) -> date | None:
        query = sa.select(_A.until).where(_A.campaign_id == campaign_id, _A.position == position)
        with self._read("read a return date") as conn:
            found = conn.execute(query).scalar_one_or_none()
        return found if isinstance(found, date) else None

    def feedback_cursor(self, mailbox: str) -> tuple[int, int] | None:
        query = sa.select(_C.uidvalidity, _C.uid).where(_C.mailbox == mailbox)
        with self._read("read a feedback cursor") as conn:
            found = conn.execute(query).first()
        if found is None or int(found[0]) == 0:  # 0: a pass was kept, no position yet
            return None
        return int(found[0]), int(found[1])

    def save_feedback_cursor(self, mailbox: str, uidvalidity: int, uid: int) -> None:
        statement = self._insert(tables.feedback_cursors).values(
            mailbox=mailbox, uidvalidity=uidvalidity, uid=uid
        )
        statement = statement.on_conflict_do_update(
            index_elements=[_C.mailbox],
            set_={"uidvalidity": statement.excluded.uidvalidity, "uid": statement.excluded.uid},
            # Forward only within one UIDVALIDITY; another one replaces the position.
            where=sa.or_(
                _C.uidvalidity != statement.excluded.uidvalidity, _C.uid < statement.excluded.uid
            ),
        )
        with self._write("save a feedback cursor") as conn:
            conn.execute(statement)

    def record_mailbox_pass(
        self, mailbox: str, *, at: datetime, messages: int, error: str | None
    ) -> None:
        state = {"polled_at": utc(at), "last_error": error}
        statement = self._insert(tables.feedback_cursors).values(
            mailbox=mailbox, uidvalidity=0, uid=0, messages_read=messages, **state
        )
        statement = statement.on_conflict_do_update(
            index_elements=[_C.mailbox],
            set_={**state, "messages_read": _C.messages_read + messages},
        )
        with self._write("record a mailbox's pass") as conn:
            conn.execute(statement)

    def mailbox_states(self, mailboxes: Collection[str]) -> dict[str, MailboxState]:
        names = sorted(set(mailboxes))
        if not names:
            return {}
        query = sa.select(_C.mailbox, _C.polled_at, _C.messages_read, _C.last_error).where(
            _C.mailbox.in_(names), _C.polled_at.is_not(None)
        )
        with self._read("read mailbox states") as conn:
            return {
                row.mailbox: MailboxState(
                    row.mailbox, row.polled_at, int(row.messages_read), row.last_error
                )
                for row in conn.execute(query)
            }

    def count_outcomes(self, campaign_id: str) -> dict[TaskOutcome, int]:
        """One count per outcome on the campaign's rows (its ``campaign_id`` indexes)."""
        query = (
            sa.select(_T.outcome, sa.func.count())
            .where(_T.campaign_id == campaign_id, _T.outcome.is_not(None))
            .group_by(_T.outcome)
        )
        with self._read("count outcomes") as conn:
            return {TaskOutcome(outcome): int(n) for outcome, n in conn.execute(query)}
