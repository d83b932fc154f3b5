"""The task store on SQLite, the embedded default: :class:`SqliteTaskStore`.

The send path's transactions (the claim and the finish, :mod:`~sendqueue.adapters.sql.sending`:
two per send) and the change log's pages (the live
stream's and the webhook deliveries' reads) run on a ``sqlite3`` connection of the calling
thread's own, and bulk inserts as the driver's multi-row statements; everything else goes
through SQLAlchemy Core (:class:`~sendqueue.adapters.sql.base.SqlTaskStore`). Why:
docs/performance.md, "SQL store: why the code looks this way". Checkpoints of the log run
on a thread of their own (:mod:`~sendqueue.adapters.sqlite_checkpoints`).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import Connection

from sendqueue.adapters.sql import rows, sending
from sendqueue.adapters.sql import schema as tables
from sendqueue.adapters.sql.base import SqlTaskStore
from sendqueue.adapters.sql.errors import mapped_errors
from sendqueue.adapters.sql.rows import (
    TASK_COLUMNS,
    JsonVariables,
)
from sendqueue.adapters.sql.schema import UtcDateTime, sqlite_text
from sendqueue.adapters.sql.signal import sqlite_signal
from sendqueue.adapters.sql.sqlite_inserts import IN_LIMIT, insert_tasks
from sendqueue.adapters.sqlite_checkpoints import WalCheckpoints
from sendqueue.domain.errors import NotFound
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import (
    ChangeLogEntry,
    Recipient,
    Task,
    check_cursor,
    check_limit,
    recipient_of,
)
from sendqueue.domain.sendclaim import SendClaim, SendFinish
from sendqueue.domain.senders import Booking
from sendqueue.ports.changes import ChangeSignal

__all__ = ["SqliteTaskStore"]

_LOG_INSERT = (
    "INSERT INTO change_log (campaign_id, task_id, from_state, to_state, at, note)"
    " VALUES (?, ?, ?, ?, ?, ?)"
)

#: The ``None -> <state>`` entries of tasks just inserted (a Cancelled one noted with its
#: reason), one per id of a JSON array, in its order: SQLite builds them from the rows (no
#: Python object per entry).
_LOG_CREATED = (
    "INSERT INTO change_log (campaign_id, task_id, from_state, to_state, at, note)"
    " SELECT t.campaign_id, t.id, NULL, t.state, ?, CASE WHEN t.state = ? THEN t.reason END"
    " FROM json_each(?) AS j JOIN tasks AS t ON t.id = j.value ORDER BY j.key"
)

_LOG_COLUMNS = "id, campaign_id, task_id, from_state, to_state, at, note"


#: A task from a driver row, its times still text.
_task = rows.task_from_text_row


class SqliteTaskStore(SqlTaskStore):
    """:class:`~sendqueue.ports.TaskStore` on a SQLite file (``sqlite:///path/to/file.db``).

    This process's writers queue on a lock of the store's own before ``BEGIN IMMEDIATE``
    (other processes wait on SQLite's busy timeout). Each thread's fast-path connection is
    closed by :meth:`close` or when a later thread finds its owner dead.
    """

    dialect = "sqlite"
    _insert = staticmethod(sqlite_dialect.insert)

    def __init__(
        self,
        url: str,
        *,
        upgrade: bool = True,
        engine_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._write_lock = threading.Lock()
        self._local = threading.local()
        self._own_lock = threading.Lock()
        # Each thread's driver connection, detached from the engine's pool.
        self._own: list[tuple[threading.Thread, sqlite3.Connection]] = []
        self._generation = 0  # bumped by close(): connections of an older one are closed
        super().__init__(url, upgrade=upgrade, engine_options=engine_options)
        database = self._engine.url.database
        self._signal = sqlite_signal(os.path.realpath(database) if database else None)
        self._checkpoints = WalCheckpoints(database or "")

    @property
    def change_signal(self) -> ChangeSignal:
        """Wakes readers after each write this process commits to the file (most append
        changes; a spurious wake costs one read), and on other processes' commits
        (:mod:`sendqueue.adapters.sql.signal`)."""
        return self._signal

    def close(self) -> None:
        # A write under way ends first; one that comes after reopens, as every call does
        # (and its bulk rows may start the checkpoint thread again, for the next close()).
        with self._write_lock:
            self._checkpoints.close()
        with self._own_lock:
            self._generation += 1
            own, self._own = self._own, []
        for _thread, db in own:
            with suppress(sqlite3.Error):
                db.close()
        super().close()

    # transactions ----------------------------------------------------------------------------

    @contextmanager
    def _write(self, action: str, *, bulk_rows: int = 0) -> Iterator[Connection]:
        """A write transaction; one that adds ``bulk_rows`` (a provisioning chunk's tasks)
        counts them toward the checkpoint thread's next fold."""
        # Our lock, not SQLite's busy handler (it sleeps in steps of up to 100 ms).
        with self._write_lock:
            with super()._write(action) as conn:
                yield conn
            if bulk_rows:  # under the lock: close() stops the thread before or after this
                self._checkpoints.written(bulk_rows)
        self._signal.changed()  # committed, and the lock released

    def _connection(self) -> sqlite3.Connection:
        """This thread's own driver connection: opened by the engine (so with its pragmas),
        then detached from its pool, kept for the thread's life and closed by :meth:`close`."""
        cached: tuple[int, sqlite3.Connection] | None = getattr(self._local, "db", None)
        if cached is not None and cached[0] == self._generation:
            return cached[1]
        raw = self._engine.raw_connection()
        db = raw.driver_connection
        assert isinstance(db, sqlite3.Connection)
        raw.detach()
        self._local.db = (self._adopt(db), db)
        return db

    def _adopt(self, db: sqlite3.Connection) -> int:
        """Keep ``db`` as the calling thread's own connection; returns its generation."""
        me = threading.current_thread()
        with self._own_lock:
            generation = self._generation
            # Threads come and go (a web server's, a pool's): close what dead ones left.
            dead = [entry for entry in self._own if not entry[0].is_alive()]
            self._own = [entry for entry in self._own if entry[0].is_alive()]
            self._own.append((me, db))
        for _thread, old in dead:
            with suppress(sqlite3.Error):
                old.close()
        return generation

    @contextmanager
    def _fast_read(self, action: str) -> Iterator[sqlite3.Connection]:
        """The driver connection for single-statement reads (autocommit: see schema)."""
        with mapped_errors(action):
            yield self._connection()

    @contextmanager
    def _fast_write(self, action: str) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction on the driver connection, queued on this
        process's writer lock as :meth:`_write` is."""
        with self._write_lock, mapped_errors(action):
            db = self._connection()
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                with suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
                raise
            try:
                db.execute("COMMIT")
            except sqlite3.Error:
                with suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
                raise
        self._signal.changed()

    def _log(self, conn: Connection, entries: Sequence[Mapping[str, Any]]) -> None:
        # BEGIN IMMEDIATE already serialises writers, so ids commit in order. The driver's
        # executemany: SQLAlchemy's per-row processing costs more than the INSERT.
        if not entries:
            return
        conn.exec_driver_sql(
            _LOG_INSERT,
            [
                (
                    r["campaign_id"],
                    r["task_id"],
                    r["from_state"],
                    r["to_state"],
                    sqlite_text(r["at"]),
                    r["note"],
                )
                for r in entries
            ],
        )

    def _require_campaign(self, conn: Connection, campaign_id: str) -> None:
        # Every list_tasks runs this (the worker's completion check): the driver's statement.
        found = conn.exec_driver_sql(
            "SELECT id FROM campaigns WHERE id = ?", (campaign_id,)
        ).first()
        if found is None:
            raise NotFound("campaign", campaign_id)

    # campaigns -------------------------------------------------------------------------------

    def campaign_state(self, campaign_id: str) -> CampaignState:
        with self._fast_read("get campaign state") as db:
            found = db.execute("SELECT state FROM campaigns WHERE id = ?", (campaign_id,))
            state = found.fetchall()
        if not state or state[0][0] is None:
            raise NotFound("campaign", campaign_id)
        return CampaignState(state[0][0])

    def save_checkpoint(
        self,
        campaign_id: str,
        checkpoint: Mapping[str, object] | None,
        *,
        at: datetime,
        note: str | None = None,
    ) -> None:
        # The driver's statements: provisioning saves one a chunk, and SQLAlchemy's compiled
        # UPDATE cost more than the write.
        text = None if checkpoint is None else rows.json_ready("checkpoint", dict(checkpoint))
        stamp = sqlite_text(at)  # ValueError for a naive time, as the other writes
        with self._fast_write("save checkpoint") as db:
            saved = db.execute(
                "UPDATE campaigns SET checkpoint = ?, updated_at = ? WHERE id = ?",
                (text, stamp, campaign_id),
            )
            if saved.rowcount == 0:
                raise NotFound("campaign", campaign_id)
            if note is not None:
                db.execute(_LOG_INSERT, (campaign_id, None, None, "progress", stamp, note))

    # recipients ------------------------------------------------------------------------------

    def list_recipients(
        self, campaign_id: str, *, after: int = -1, limit: int = 1000
    ) -> list[Recipient]:
        check_limit(limit)
        check_cursor(after)
        # The driver's statements: provisioning reads every recipient once. A page with rows
        # proves the campaign exists (recipients go with it); only an empty one asks.
        with self._fast_read("list recipients") as db:
            raw = db.execute(
                "SELECT position, email, name, subject, text, html, variables, timezone "
                "FROM recipients WHERE campaign_id = ? AND position > ? "
                "ORDER BY position LIMIT ?",
                (campaign_id, after, limit),
            ).fetchall()
            if (
                not raw
                and not db.execute(
                    "SELECT 1 FROM campaigns WHERE id = ?", (campaign_id,)
                ).fetchall()
            ):
                raise NotFound("campaign", campaign_id)
        return [
            recipient_of(
                position, email, name, subject, text, html, JsonVariables(variables), timezone
            )
            for position, email, name, subject, text, html, variables, timezone in raw
        ]

    # tasks -----------------------------------------------------------------------------------

    def _insert_tasks(
        self, tasks: Sequence[Task], at: datetime, bookings: Sequence[Booking]
    ) -> int:
        with self._write("insert tasks", bulk_rows=len(tasks)) as conn:
            for campaign_id in sorted({t.campaign_id for t in tasks}):
                self._require_campaign(conn, campaign_id)
            self._book(conn, bookings)
            ids = insert_tasks(conn, tasks, at)
            if len(ids) == len(tasks):
                # Every task inserted (a fresh provisioning chunk): the entries, in input
                # order, straight from the rows.
                conn.exec_driver_sql(
                    _LOG_CREATED, (sqlite_text(at), TaskState.CANCELLED.value, json.dumps(ids))
                )
                return len(ids)
            entries = rows.created_entries(tasks, ids, at)
            self._log(conn, entries)
        return len(entries)

    def get_task(self, task_id: str) -> Task | None:
        with self._fast_read("get task") as db:
            found = db.execute(
                f"SELECT {TASK_COLUMNS} FROM tasks WHERE id = ?", (task_id,)
            ).fetchall()
        return _task(found[0]) if found else None

    def get_tasks(self, task_ids: Collection[str]) -> dict[str, Task]:
        """One statement over a JSON array of the ids (no limit on bound parameters)."""
        with self._fast_read("get tasks") as db:
            found = db.execute(
                f"SELECT {TASK_COLUMNS} FROM tasks WHERE id IN (SELECT value FROM json_each(?))",
                (json.dumps(list(task_ids)),),
            ).fetchall()
        return {task.id: task for task in map(_task, found)}

    def _transition(
        self,
        task_id: str,
        expected: TaskState,
        new: TaskState,
        values: Mapping[str, Any],
        at: datetime,
        note: str | None,
    ) -> Task | None:
        # Converted before the write lock is taken: a naive datetime raises ValueError here,
        # as UtcDateTime's bind processing does on PostgreSQL.
        sets = ", ".join(f"{name} = ?" for name in values)
        params = tuple(sqlite_text(v) if isinstance(v, datetime) else v for v in values.values())
        with self._fast_write("transition task") as db:
            found = db.execute(
                f"UPDATE tasks SET {sets} WHERE id = ? AND state = ? RETURNING {TASK_COLUMNS}",
                (*params, task_id, expected.value),
            ).fetchall()
            if not found:
                return None
            task = _task(found[0])
            db.execute(
                _LOG_INSERT,
                (task.campaign_id, task.id, expected.value, new.value, sqlite_text(at), note),
            )
        return task

    def claim_for_send(
        self,
        task_id: str,
        *,
        token: str | None,
        at: datetime,
        due_by: datetime,
        not_before: datetime | None = None,
    ) -> SendClaim:
        sqlite_text(at)  # a naive time raises ValueError before the write lock is taken
        with self._fast_write("claim a task") as db:
            return sending.sqlite_claim(
                db, _task, task_id, token=token, at=at, due_by=due_by, not_before=not_before
            )

    def finish_send(
        self,
        task_id: str,
        *,
        at: datetime,
        message_id: str,
        slot: datetime | None = None,
        follow_up: bool = False,
    ) -> SendFinish:
        sqlite_text(at)
        with self._fast_write("finish a send") as db:
            return sending.sqlite_finish(
                db, _task, task_id, at=at, message_id=message_id, slot=slot, follow_up=follow_up
            )

    def _transition_all(
        self,
        conn: Connection,
        campaign_id: str,
        expected: TaskState,
        new: TaskState,
        at: datetime,
        note: str | None,
    ) -> int:
        # BEGIN IMMEDIATE excludes every other writer, so the rows the INSERT ... SELECT reads
        # are exactly the rows the UPDATE then changes.
        matching = (
            tables.tasks.c.campaign_id == campaign_id,
            tables.tasks.c.state == expected.value,
        )
        source = (
            sa.select(
                sa.literal(campaign_id, sa.String()),
                tables.tasks.c.id,
                sa.literal(expected.value, sa.String()),
                sa.literal(new.value, sa.String()),
                sa.literal(at, UtcDateTime()),
                sa.literal(note, sa.Text()),
            )
            .where(*matching)
            .order_by(tables.tasks.c.position)
        )
        conn.execute(
            sa.insert(tables.change_log).from_select(
                ["campaign_id", "task_id", "from_state", "to_state", "at", "note"], source
            )
        )
        result = conn.execute(
            sa.update(tables.tasks).where(*matching).values(state=new.value, updated_at=at)
        )
        return result.rowcount

    def _page_of_tasks(
        self,
        conn: Connection,
        campaign_id: str,
        state: TaskState | None,
        search: str | None,
        after: int,
        limit: int,
        step: int | None,
    ) -> list[Task]:
        if search:
            return super()._page_of_tasks(conn, campaign_id, state, search, after, limit, step)
        # The provisioner's and the reconciler's pages: the driver's rows, converted here.
        sql = f"SELECT {TASK_COLUMNS} FROM tasks WHERE campaign_id = ? AND position > ?"
        params: tuple[object, ...] = (campaign_id, after)
        if state is not None:
            sql += " AND state = ?"
            params += (state.value,)
        if step is not None:
            sql += " AND step = ?"
            params += (step,)
        raw = conn.exec_driver_sql(sql + " ORDER BY position LIMIT ?", (*params, limit))
        return [_task(row) for row in raw]

    def _suppression_rows(
        self, emails: Sequence[str]
    ) -> list[tuple[str, str, str | None, datetime]]:
        out: list[tuple[str, str, str | None, datetime]] = []
        with self._fast_read("look up suppressed addresses") as db:
            for part in rows.chunks(emails, IN_LIMIT):
                marks = ", ".join("?" * len(part))
                found = db.execute(
                    f"SELECT email, reason, task_id, at FROM suppressions WHERE email IN ({marks})",
                    tuple(part),
                ).fetchall()
                out += [
                    (email, reason, task, datetime.fromisoformat(at).replace(tzinfo=UTC))
                    for email, reason, task, at in found
                ]
        return out

    def _sticky_rows(self, recipients: Sequence[str]) -> dict[str, str]:
        # The driver's own statement: provisioning asks for every recipient, a chunk at a
        # time, and an expanding IN compiled by SQLAlchemy per call cost three times as much.
        out: dict[str, str] = {}
        with self._fast_read("read sticky senders") as db:
            for part in rows.chunks(recipients, IN_LIMIT):
                marks = ", ".join("?" * len(part))
                out.update(
                    db.execute(
                        "SELECT recipient, sender_id FROM sender_contacts "
                        f"WHERE recipient IN ({marks})",
                        tuple(part),
                    ).fetchall()
                )
        return out

    def has_unfinished_tasks(self, campaign_id: str) -> bool:
        with self._fast_read("check unfinished tasks") as db:
            found = db.execute(
                "SELECT EXISTS (SELECT 1 FROM tasks WHERE campaign_id = ? AND state IN (?, ?))"
                " OR EXISTS (SELECT 1 FROM tasks WHERE campaign_id = ? AND follow_up = 1)",
                (campaign_id, TaskState.PENDING.value, TaskState.RUNNING.value, campaign_id),
            ).fetchone()
        return bool(found[0])

    # change log ------------------------------------------------------------------------------

    def changes_after(
        self, after_id: int, *, campaign_id: str | None = None, limit: int = 1000
    ) -> list[ChangeLogEntry]:
        # The driver's statement: the live stream and every webhook delivery pass read the log
        # page after page, and SQLAlchemy's row processing cost more than the query.
        check_limit(limit)
        check_cursor(after_id, field="after_id")
        sql = f"SELECT {_LOG_COLUMNS} FROM change_log WHERE id > ?"
        params: tuple[object, ...] = (after_id,)
        if campaign_id is not None:
            sql += " AND campaign_id = ?"
            params += (campaign_id,)
        with self._fast_read("read change log") as db:
            found = db.execute(sql + " ORDER BY id LIMIT ?", (*params, limit)).fetchall()
        return [
            ChangeLogEntry(id_, campaign, task, before, after, rows.text_when(at), note)
            for id_, campaign, task, before, after, at, note in found
        ]
