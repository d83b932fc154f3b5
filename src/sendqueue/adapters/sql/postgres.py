"""The task store on PostgreSQL (psycopg 3): :class:`PostgresTaskStore`.

The send path's and the provisioner's statements run on a psycopg connection of
:class:`~sendqueue.adapters.sql.pool.FastPathPool` in autocommit mode, each call one statement
and so one round trip and one transaction (a state change with its change-log row included);
everything else goes through SQLAlchemy Core (:class:`~sendqueue.adapters.sql.base.SqlTaskStore`).
Why: docs/performance.md, "SQL store: why the code looks this way".
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection

from sendqueue.adapters.sql import rows, sending
from sendqueue.adapters.sql import schema as tables
from sendqueue.adapters.sql.base import SqlTaskStore
from sendqueue.adapters.sql.errors import mapped_errors
from sendqueue.adapters.sql.pool import FastPathPool
from sendqueue.adapters.sql.rows import INSERT_COLUMNS, TASK_COLUMNS, task_from_row
from sendqueue.adapters.sql.schema import UtcDateTime
from sendqueue.adapters.sql.sidetables import SideTables
from sendqueue.adapters.sql.signal import (
    PgListener,
    PgNotifier,
    pg_notifier,
    release_pg_notifier,
)
from sendqueue.domain.errors import NotFound
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import (
    ChangeLogEntry,
    Recipient,
    Task,
    check_cursor,
    check_limit,
    utc,
)
from sendqueue.domain.sendclaim import SendClaim, SendFinish
from sendqueue.domain.senders import Booking
from sendqueue.domain.suppression import Suppression, SuppressionReason, key_of_normalized

try:  # the driver is the optional "postgres" extra
    import psycopg.types.json
    from psycopg import errors as pg_errors
except ImportError:  # pragma: no cover - the "postgres" extra not installed
    psycopg = None  # type: ignore[assignment]
    pg_errors = None  # type: ignore[assignment]

__all__ = ["PostgresTaskStore"]

#: Rows per statement of an ``unnest`` insert (its parameters are arrays).
_UNNEST_CHUNK_SIZE = 5000

#: Change-log entries a reader may return: ids below the horizon, i.e. of transactions older
#: than the statement snapshot's xmin, which have all ended. Ids are ordered by (writing
#: transaction, rank in it), so nothing can commit behind a reader's cursor (migration 0004;
#: docs/performance-history.md, "the change log without a global lock").
_SETTLED = tables.change_log.c.id < sa.func.sq_change_log_horizon()

#: A task state change in one statement: the CAS UPDATE, then the change-log INSERT of the row
#: it matched (none if none did). The entry's id and xid are the columns' defaults.
_TRANSITION = (
    "WITH moved AS (UPDATE tasks SET {sets} WHERE id = %s AND state = %s"
    f" RETURNING {TASK_COLUMNS}),"
    " logged AS (INSERT INTO change_log (campaign_id, task_id, from_state, to_state, at, note)"
    " SELECT campaign_id, id, %s, %s, %s::timestamptz, %s::text FROM moved)"
    f" SELECT {TASK_COLUMNS} FROM moved"
)

#: Tasks inserted in bulk with their ``None -> Pending`` entries (``None -> Cancelled`` noted
#: with the reason), in one statement: the rows (binary arrays, one per column, in id order;
#: ON CONFLICT DO NOTHING), then one entry per inserted id in input order.
_INSERT_TASKS = (
    f"WITH ins AS (INSERT INTO tasks ({INSERT_COLUMNS})"
    f" SELECT {INSERT_COLUMNS} FROM unnest("
    "%b::varchar[], %b::varchar[], %b::integer[], %b::text[], %b::text[], %b::text[],"
    " %b::text[], %b::text[], %b::timestamptz[], %b::varchar[], %b::varchar[], %b::integer[],"
    " %b::timestamptz[], %b::timestamptz[], %b::text[], %b::text[], %b::timestamptz[],"
    " %b::timestamptz[], %b::timestamptz[], %b::integer[], %b::text[], %b::text[],"
    " %b::varchar[], %b::text[], %b::timestamptz[], %b::varchar[], %b::text[], %b::text[],"
    " %b::integer[], %b::varchar[])"
    f" WITH ORDINALITY AS u({INSERT_COLUMNS}, sq_ordinal) ORDER BY sq_ordinal"
    " ON CONFLICT DO NOTHING RETURNING id, state, reason),"
    " logged AS (INSERT INTO change_log (campaign_id, task_id, from_state, to_state, at, note)"
    " SELECT e.campaign_id, e.id, NULL, ins.state, %b::timestamptz,"
    " CASE WHEN ins.state = %s THEN ins.reason END"
    " FROM unnest(%b::varchar[], %b::varchar[]) WITH ORDINALITY AS e(id, campaign_id, ord)"
    " JOIN ins ON ins.id = e.id ORDER BY e.ord RETURNING 1)"
    " SELECT count(*) FROM logged"
)

#: The send worker's first read in one statement: the task, and the suppression entry of its
#: address. The join lower-cases ASCII letters only (``translate``, whatever the database's
#: locale); an address with other letters is looked up again with Python's ``casefold``.
_TASK_AND_SUPPRESSION = (
    "SELECT {columns}, s.email, s.reason, s.task_id, s.at FROM tasks t"
    " LEFT JOIN suppressions s ON s.email = translate(t.email,"
    " 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz')"
    " WHERE t.id = %s"
).format(columns=", ".join(f"t.{c.strip()}" for c in TASK_COLUMNS.split(",")))
_TASK_WIDTH = len(TASK_COLUMNS.split(","))

#: A campaign's checkpoint with its progress entry, in one statement (as :data:`_TRANSITION`).
_CHECKPOINT_LOGGED = (
    "WITH saved AS (UPDATE campaigns SET checkpoint = %s, updated_at = %s WHERE id = %s"
    " RETURNING id),"
    " logged AS (INSERT INTO change_log (campaign_id, task_id, from_state, to_state, at, note)"
    " SELECT id, NULL, NULL, 'progress', %s::timestamptz, %s::text FROM saved)"
    " SELECT count(*) FROM saved"
)

_T = TypeVar("_T")


def _time(value: datetime | None) -> datetime | None:
    """An aware datetime for a timestamptz parameter (ValueError for a naive one)."""
    if value is None or value.tzinfo is UTC:
        return value
    return utc(value)


def _unnest_insert(
    conn: Connection,
    table: sa.Table,
    new_rows: Sequence[Mapping[str, Any]],
    *,
    returning: str | None = None,
) -> list[Any]:
    """Bulk insert: one array parameter per column, ``unnest`` server-side (a short statement
    whatever the row count). Rows go in (and draw serial ids) in the given order; conflicting
    ones are skipped. With ``returning``, that column of the rows inserted comes back."""
    dialect = conn.dialect
    columns = list(new_rows[0])
    names = ", ".join(f'"{c}"' for c in columns)
    arrays = ", ".join(
        f"CAST(:{c} AS {table.c[c].type.compile(dialect=dialect)}[])" for c in columns
    )
    sql = (
        f"INSERT INTO {table.name} ({names}) SELECT {names} FROM unnest({arrays})"
        f" WITH ORDINALITY AS u({names}, sq_ordinal) ORDER BY sq_ordinal"
        " ON CONFLICT DO NOTHING"
    )
    if returning is not None:
        sql += f' RETURNING "{returning}"'
    statement = sa.text(sql)
    times = [c for c in columns if isinstance(table.c[c].type, UtcDateTime)]
    out: list[Any] = []
    for chunk in rows.chunks(new_rows, _UNNEST_CHUNK_SIZE):
        params = {c: [row[c] for row in chunk] for c in columns}
        for c in times:
            params[c] = [None if v is None else utc(v) for v in params[c]]
        result = conn.execute(statement, params)
        if returning is not None:
            out.extend(result.scalars())
    return out


def _task_params(t: Task, at: datetime) -> dict[str, Any]:
    """The ``tasks`` row of a new task, for :func:`_unnest_insert`."""
    return {
        "id": t.id,
        "campaign_id": t.campaign_id,
        "position": t.position,
        "email": t.email,
        "name": t.name,
        "subject": t.subject,
        "text": t.text,
        "html": t.html,
        "send_at": t.send_at,
        "state": t.state.value,
        "token": t.token,
        "attempts": t.attempts,
        "claimed_at": t.claimed_at,
        "sent_at": t.sent_at,
        "message_id": t.message_id,
        "error": t.error,
        "created_at": at,
        "updated_at": at,
        "planned_at": t.planned_at or t.send_at,
        "moves": t.moves,
        "moved_reason": t.moved_reason,
        "reason": t.reason,
        "outcome": None if t.outcome is None else t.outcome.value,
        "outcome_detail": t.outcome_detail,
        "outcome_at": t.outcome_at,
        "sender_id": t.sender_id,
        "sender": t.sender,
        "timezone": t.timezone,
        "step": t.step,
        "email_key": key_of_normalized(t.email),
    }


class PostgresTaskStore(SqlTaskStore):
    """:class:`~sendqueue.ports.TaskStore` on PostgreSQL (``postgresql+psycopg://...``; plain
    ``postgresql://`` means psycopg 3 too).

    The fast paths keep up to ``pg_idle_connections`` connections of their own open between
    calls, besides the engine's pool.
    """

    dialect = "postgresql"
    _insert = staticmethod(postgresql.insert)

    def __init__(
        self,
        url: str,
        *,
        upgrade: bool = True,
        engine_options: Mapping[str, Any] | None = None,
        pg_idle_connections: int = 4,
    ) -> None:
        super().__init__(url, upgrade=upgrade, engine_options=engine_options)
        self._connections = FastPathPool(self._engine, pg_idle_connections)
        self._signal = PgListener(self._connections.open)
        self._notifier: PgNotifier | None = pg_notifier(
            self._engine.url.render_as_string(hide_password=False), self._connections.open
        )

    @property
    def change_signal(self) -> PgListener:
        """Wakes readers on the commits of every store on the database (each notifies after
        its writes), through one listening connection (:mod:`sendqueue.adapters.sql.signal`)."""
        return self._signal

    def close(self) -> None:
        notifier, self._notifier = self._notifier, None
        if notifier is not None:
            release_pg_notifier(notifier)
        self._signal.close()
        self._connections.close()
        super().close()

    @contextmanager
    def _write(self, action: str) -> Iterator[Connection]:
        with super()._write(action) as conn:
            yield conn
        self._poke()  # committed

    def _run(self, action: str, run: Callable[[Any], _T], *, write: bool = False) -> _T:
        """``run(connection)`` on a fast-path connection (see FastPathPool.run); a write
        pokes the notifier once it is done (each statement commits by itself)."""
        with mapped_errors(action):
            done = self._connections.run(run, write=write)
        if write:
            self._poke()
        return done

    def _poke(self) -> None:
        if self._notifier is not None:  # None once closed
            self._notifier.poke()

    def _log(self, conn: Connection, entries: Sequence[Mapping[str, Any]]) -> None:
        """No lock: the id (``sq_change_log_id()``, migration 0004) orders entries by writing
        transaction, and readers return only entries of ended transactions (:data:`_SETTLED`)."""
        if entries:
            _unnest_insert(conn, tables.change_log, entries)

    def _current_campaign_state(self, conn: Connection, campaign_id: str) -> str | None:
        # The row lock makes the logged from-state the one replaced. FOR NO KEY UPDATE, not FOR
        # UPDATE: a change-log INSERT's foreign key takes FOR KEY SHARE on this row (deadlock).
        query = (
            sa.select(tables.campaigns.c.state)
            .where(tables.campaigns.c.id == campaign_id)
            .with_for_update(key_share=True)
        )
        return conn.execute(query).scalar_one_or_none()

    # campaigns -------------------------------------------------------------------------------

    def campaign_state(self, campaign_id: str) -> CampaignState:
        found = self._run(
            "get campaign state",
            lambda db: db.execute(
                "SELECT state FROM campaigns WHERE id = %s", (campaign_id,)
            ).fetchall(),
        )
        if not found or found[0][0] is None:
            raise NotFound("campaign", campaign_id)
        return CampaignState(found[0][0])

    def save_checkpoint(
        self,
        campaign_id: str,
        checkpoint: Mapping[str, object] | None,
        *,
        at: datetime,
        note: str | None = None,
    ) -> None:
        rows.json_ready("checkpoint", checkpoint)
        value = None if checkpoint is None else psycopg.types.json.Json(dict(checkpoint))
        stamp = _time(at)
        if note is None:
            sql = "UPDATE campaigns SET checkpoint = %s, updated_at = %s WHERE id = %s"
            args: tuple[object, ...] = (value, stamp, campaign_id)
        else:
            sql = _CHECKPOINT_LOGGED
            args = (value, stamp, campaign_id, stamp, note)

        def run(db: Any) -> int:
            cursor = db.execute(sql, args)
            return int(cursor.fetchone()[0]) if note is not None else int(cursor.rowcount)

        if self._run("save checkpoint", run, write=True) == 0:
            raise NotFound("campaign", campaign_id)

    # recipients ------------------------------------------------------------------------------

    def list_recipients(
        self, campaign_id: str, *, after: int = -1, limit: int = 1000
    ) -> list[Recipient]:
        check_limit(limit)
        check_cursor(after)
        # The campaign is looked up only when the page is empty (a recipient's campaign exists).
        sql = (
            "SELECT position, email, name, subject, text, html, variables, timezone"
            " FROM recipients"
            " WHERE campaign_id = %s AND position > %s ORDER BY position LIMIT %s"
        )

        def run(db: Any) -> list[Recipient]:
            found = db.execute(sql, (campaign_id, after, limit)).fetchall()
            if not found:
                campaign = db.execute("SELECT 1 FROM campaigns WHERE id = %s", (campaign_id,))
                if not campaign.fetchall():
                    raise NotFound("campaign", campaign_id)
            return [Recipient(*row) for row in found]

        return self._run("list recipients", run)

    # tasks -----------------------------------------------------------------------------------

    def _insert_tasks(
        self, tasks: Sequence[Task], at: datetime, bookings: Sequence[Booking]
    ) -> int:
        if len(tasks) <= _UNNEST_CHUNK_SIZE:
            return self._insert_chunk(tasks, at, bookings)
        # In one global order (by id), so two provisioners inserting the same tasks cannot
        # deadlock on each other's uncommitted rows.
        new_rows = sorted((_task_params(t, at) for t in tasks), key=lambda r: r["id"])
        with self._write("insert tasks") as conn:
            for campaign_id in sorted({t.campaign_id for t in tasks}):
                self._require_campaign(conn, campaign_id)
            self._book(conn, bookings)
            inserted = _unnest_insert(conn, tables.tasks, new_rows, returning="id")
            entries = rows.created_entries(tasks, inserted, at)
            self._log(conn, entries)
        return len(entries)

    def _insert_chunk(
        self, tasks: Sequence[Task], at: datetime, bookings: Sequence[Booking]
    ) -> int:
        """:meth:`insert_tasks` of one provisioning chunk: one statement (:data:`_INSERT_TASKS`),
        on the fast path's connection, or with ``bookings`` in their transaction."""
        stamp = _time(at)
        # In id order, as in _insert_tasks.
        params = [
            (
                t.id, t.campaign_id, t.position, t.email, t.name, t.subject, t.text, t.html,
                _time(t.send_at), t.state.value, t.token, t.attempts, _time(t.claimed_at),
                _time(t.sent_at), t.message_id, t.error, stamp, stamp,
                _time(t.planned_at or t.send_at), t.moves, t.moved_reason, t.reason,
                None if t.outcome is None else t.outcome.value, t.outcome_detail,
                _time(t.outcome_at), t.sender_id, t.sender, t.timezone, t.step,
                key_of_normalized(t.email),
            )
            for t in sorted(tasks, key=lambda t: t.id)
        ]  # fmt: skip
        columns = [list(column) for column in zip(*params, strict=True)]
        # One entry per inserted id, for its first task in the input (a later duplicate of an
        # id is skipped by ON CONFLICT, the sort being stable).
        seen: set[str] = set()
        log_ids: list[str] = []
        log_campaigns: list[str] = []
        for t in tasks:
            if t.id not in seen:
                seen.add(t.id)
                log_ids.append(t.id)
                log_campaigns.append(t.campaign_id)
        args = (*columns, stamp, TaskState.CANCELLED.value, log_ids, log_campaigns)

        def not_found(db: Any) -> NotFound | None:
            """NotFound for the first campaign of the tasks that does not exist."""
            found = {
                r[0]
                for r in db.execute(
                    "SELECT id FROM campaigns WHERE id = ANY(%s::varchar[])",
                    (sorted(set(log_campaigns)),),
                )
            }
            missing = sorted(set(log_campaigns) - found)
            return NotFound("campaign", missing[0]) if missing else None

        def run(db: Any) -> int:
            try:
                row = db.execute(_INSERT_TASKS, args).fetchone()
            except pg_errors.ForeignKeyViolation:
                if (error := not_found(db)) is None:
                    raise
                raise error from None
            return int(row[0])

        if not bookings:
            return self._run("insert tasks", run, write=True)
        with self._write("insert tasks") as conn:
            for campaign_id in sorted(set(log_campaigns)):
                self._require_campaign(conn, campaign_id)
            self._book(conn, bookings)
            # The same statement on the driver's connection, inside this transaction, in a
            # savepoint: a row refused for its campaign (deleted meanwhile) leaves the
            # transaction able to look the campaign up.
            db: Any = conn.connection.driver_connection
            try:
                with db.transaction():
                    return int(db.execute(_INSERT_TASKS, args).fetchone()[0])
            except pg_errors.ForeignKeyViolation:
                if (error := not_found(db)) is None:
                    raise
                raise error from None

    def task_and_suppression(self, task_id: str) -> tuple[Task | None, Suppression | None]:
        def run(db: Any) -> tuple[Task | None, Suppression | None]:
            found = db.execute(_TASK_AND_SUPPRESSION, (task_id,)).fetchall()
            if not found:
                return None, None
            row = found[0]
            task = task_from_row(row[:_TASK_WIDTH])
            email, reason, task_ref, at = row[_TASK_WIDTH:]
            if email is not None:
                return task, Suppression(email, SuppressionReason(reason), task_ref, at)
            return task, None

        task, entry = self._run("get task", run)
        if task is not None and entry is None and not task.email.isascii():
            key = key_of_normalized(task.email)
            entry = self.suppressed([key]).get(key)
        return task, entry

    def _suppression_rows(
        self, emails: Sequence[str]
    ) -> list[tuple[str, str, str | None, datetime]]:
        sql = "SELECT email, reason, task_id, at FROM suppressions WHERE email = ANY(%s::varchar[])"

        def run(db: Any) -> list[tuple[str, str, str | None, datetime]]:
            out: list[tuple[str, str, str | None, datetime]] = []
            for part in rows.chunks(emails, _UNNEST_CHUNK_SIZE):
                out += [
                    (email, reason, task, at.astimezone(UTC))
                    for email, reason, task, at in db.execute(sql, (list(part),))
                ]
            return out

        return self._run("look up suppressed addresses", run)

    def get_task(self, task_id: str) -> Task | None:
        sql = f"SELECT {TASK_COLUMNS} FROM tasks WHERE id = %s"

        def run(db: Any) -> Task | None:
            found = db.execute(sql, (task_id,)).fetchall()
            return task_from_row(found[0]) if found else None

        return self._run("get task", run)

    def get_tasks(self, task_ids: Collection[str]) -> dict[str, Task]:
        sql = f"SELECT {TASK_COLUMNS} FROM tasks WHERE id = ANY(%b::varchar[])"

        def run(db: Any) -> dict[str, Task]:
            found = db.execute(sql, (list(task_ids),)).fetchall()
            return {task.id: task for task in map(task_from_row, found)}

        return self._run("get tasks", run)

    def _transition(
        self,
        task_id: str,
        expected: TaskState,
        new: TaskState,
        values: Mapping[str, Any],
        at: datetime,
        note: str | None,
    ) -> Task | None:
        params = [_time(v) if isinstance(v, datetime) else v for v in values.values()]
        sql = _TRANSITION.format(sets=", ".join(f"{name} = %s" for name in values))
        args = (*params, task_id, expected.value, expected.value, new.value, _time(at), note)

        def run(db: Any) -> Task | None:
            found = db.execute(sql, args).fetchall()
            return task_from_row(found[0]) if found else None

        return self._run("transition task", run, write=True)

    def claim_for_send(
        self,
        task_id: str,
        *,
        token: str | None,
        at: datetime,
        due_by: datetime,
        not_before: datetime | None = None,
    ) -> SendClaim:
        def run(db: Any) -> SendClaim:
            return sending.pg_claim(
                db, task_id, token=token, at=at, due_by=due_by, not_before=not_before
            )

        return self._run("claim a task", run, write=True)

    def finish_send(
        self,
        task_id: str,
        *,
        at: datetime,
        message_id: str,
        slot: datetime | None = None,
        follow_up: bool = False,
    ) -> SendFinish:
        def run(db: Any) -> SendFinish:
            return sending.pg_finish(
                db, task_id, at=at, message_id=message_id, slot=slot, follow_up=follow_up
            )

        return self._run("finish a send", run, write=True)

    def _transition_all(
        self,
        conn: Connection,
        campaign_id: str,
        expected: TaskState,
        new: TaskState,
        at: datetime,
        note: str | None,
    ) -> int:
        # One statement: exactly the rows the UPDATE moved are logged (READ COMMITTED), in
        # position order.
        result = conn.execute(
            sa.text(
                "WITH moved AS ("
                " UPDATE tasks SET state = :new, updated_at = :at"
                " WHERE campaign_id = :campaign_id AND state = :expected"
                " RETURNING id, position)"
                " INSERT INTO change_log (campaign_id, task_id, from_state, to_state, at, note)"
                " SELECT :campaign_id, id, :expected, :new, :at, :note"
                " FROM moved ORDER BY position"
            ).bindparams(
                sa.bindparam("at", type_=UtcDateTime()), sa.bindparam("note", type_=sa.Text())
            ),
            {
                "campaign_id": campaign_id,
                "expected": expected.value,
                "new": new.value,
                "at": at,
                "note": note,
            },
        )
        return result.rowcount

    def has_unfinished_tasks(self, campaign_id: str) -> bool:
        found = self._run(
            "check unfinished tasks",
            lambda db: db.execute(
                sending.PG_UNFINISHED,
                (campaign_id, TaskState.PENDING.value, TaskState.RUNNING.value, campaign_id),
            ).fetchone(),
        )
        return bool(found[0])

    # change log ------------------------------------------------------------------------------

    def changes_after(
        self, after_id: int, *, campaign_id: str | None = None, limit: int = 1000
    ) -> list[ChangeLogEntry]:
        """Only settled entries (:data:`_SETTLED`): an entry of a transaction still in flight,
        or behind one, shows once that transaction ends."""
        return self._changes_after(after_id, campaign_id, limit, _SETTLED)

    def newest_change_id(self) -> int:
        """The newest committed id, settled or not (past :meth:`last_change_id` while a
        transaction in flight holds the horizon back)."""
        return SideTables.last_change_id(self)

    def last_change_id(self) -> int:
        """The newest settled id: the highest a reader of :meth:`changes_after` can be handed."""
        query = (
            sa.select(tables.change_log.c.id)
            .where(_SETTLED)
            .order_by(tables.change_log.c.id.desc())
            .limit(1)
        )
        with self._read("read change log") as conn:
            value = conn.execute(query).scalar()
        return int(value or 0)
