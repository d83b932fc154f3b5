"""The task store on SQLAlchemy Core: SQLite (the embedded default) and PostgreSQL (psycopg 3).

:class:`SqlTaskStore` implements :class:`sendqueue.ports.TaskStore`; the port's docstring is the
contract. How it keeps it:

- Every write runs in one transaction. On SQLite that transaction starts with
  ``BEGIN IMMEDIATE`` (:data:`~sendqueue.adapters.sql_schema.WRITE`), so writers queue on the
  busy timeout instead of deadlocking on a lock upgrade; readers never block (WAL).
- A task state change is ``UPDATE ... WHERE id = :id AND state = :expected RETURNING ...``
  followed by the change-log INSERT in the same transaction. A row that did not match logs
  nothing.
- On PostgreSQL, change-log ids must become visible in id order; see :meth:`_log`.
- Vendor exceptions are wrapped here: failures of the database become
  :class:`~sendqueue.domain.errors.StoreUnavailable`.

The store is safe to use from several threads (a connection pool, and on the hot paths a driver
connection per thread: see :meth:`SqlTaskStore._sqlite_connection` and
:meth:`SqlTaskStore._pg_checkout`) and from several processes on one database. Open it after
forking: an engine's pooled connections must not cross a fork.
"""

from __future__ import annotations

import builtins
import json
import sqlite3
import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from sendqueue.adapters import migrate
from sendqueue.adapters import sql_schema as schema
from sendqueue.adapters.sql_schema import WRITE, UtcDateTime, create_store_engine, sqlite_text
from sendqueue.domain.errors import (
    Conflict,
    IllegalTransition,
    InvalidField,
    NotFound,
    StoreUnavailable,
)
from sendqueue.domain.lifecycle import (
    CampaignState,
    TaskState,
    check_campaign_transition,
    check_task_transition,
)
from sendqueue.domain.models import (
    Campaign,
    ChangeLogEntry,
    Recipient,
    Task,
    TaskChanges,
    check_cursor,
    check_limit,
    checked_changes,
)
from sendqueue.domain.policy import SendingPolicy

try:  # the PostgreSQL fast paths use the driver directly; it is an optional dependency
    import psycopg
    import psycopg.types.json
    from psycopg import errors as pg_errors
except ImportError:  # pragma: no cover - the "postgres" extra not installed
    psycopg = None  # type: ignore[assignment]
    pg_errors = None  # type: ignore[assignment]

__all__ = ["CHANGE_LOG_LOCK_KEY", "CHUNK_SIZE", "SqlTaskStore"]

#: Rows per INSERT statement. 500 rows of the widest table stay far below both SQLite's (32766)
#: and PostgreSQL's (65535) limit on bound parameters.
CHUNK_SIZE = 500

#: pg_advisory_xact_lock key taken right before change-log rows are inserted ("sq" + 2).
CHANGE_LOG_LOCK_KEY = 0x7371_0002

#: Rows per statement of a PostgreSQL ``unnest`` insert (its parameters are arrays).
_UNNEST_CHUNK_SIZE = 5000


_T = TypeVar("_T")


def _chunks(items: Sequence[_T], size: int = CHUNK_SIZE) -> Iterator[Sequence[_T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _json_ready(field: str, value: object) -> None:
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise InvalidField(field, value, f"must be JSON-serialisable: {exc}") from exc


def _campaign(row: sa.Row[Any]) -> Campaign:
    m = row._mapping
    return Campaign(
        id=m["id"],
        name=m["name"],
        policy=SendingPolicy.from_dict(m["policy"]),
        from_addr=m["from_addr"],
        state=CampaignState(m["state"]),
        reply_to=m["reply_to"],
        recipient_count=m["recipient_count"],
        state_reason=m["state_reason"],
        checkpoint=m["checkpoint"],
        created_at=m["created_at"],
        updated_at=m["updated_at"],
    )


_STATES = {state.value: state for state in TaskState}


def _task(row: Sequence[Any]) -> Task:
    """A task from a row of the ``tasks`` columns in table order (``select(tasks)``)."""
    (
        id_, campaign_id, position, email, name, subject, text, html, send_at, state, token,
        attempts, claimed_at, sent_at, message_id, error, created_at, updated_at,
    ) = row  # fmt: skip
    # Positional: the provisioner and the reconciler read tasks by the hundred thousand, and
    # a lookup by name per column costs more than building the task.
    return Task(
        id_, campaign_id, position, email, name, subject, text, html, send_at, token,
        _STATES[state], attempts, claimed_at, sent_at, message_id, error, created_at, updated_at,
    )  # fmt: skip


def _sqlite_time(value: str | None) -> datetime | None:
    """Read what :func:`~sendqueue.adapters.sql_schema.sqlite_text` wrote."""
    return None if value is None else datetime.fromisoformat(value).replace(tzinfo=UTC)


def _sqlite_task(row: Sequence[Any]) -> Task:
    """:func:`_task` of a raw SQLite row (times still text)."""
    (
        id_, campaign_id, position, email, name, subject, text, html, send_at, state, token,
        attempts, claimed_at, sent_at, message_id, error, created_at, updated_at,
    ) = row  # fmt: skip
    return Task(
        id_, campaign_id, position, email, name, subject, text, html,
        datetime.fromisoformat(send_at).replace(tzinfo=UTC), token, _STATES[state], attempts,
        _sqlite_time(claimed_at), _sqlite_time(sent_at), message_id, error,
        datetime.fromisoformat(created_at).replace(tzinfo=UTC),
        datetime.fromisoformat(updated_at).replace(tzinfo=UTC),
    )  # fmt: skip


def _entry(row: sa.Row[Any]) -> ChangeLogEntry:
    m = row._mapping
    return ChangeLogEntry(
        id=m["id"],
        campaign_id=m["campaign_id"],
        task_id=m["task_id"],
        from_state=m["from_state"],
        to_state=m["to_state"],
        at=m["at"],
        note=m["note"],
    )


def _unnest_insert(
    conn: Connection,
    table: sa.Table,
    rows: Sequence[Mapping[str, Any]],
    *,
    returning: str | None = None,
) -> list[Any]:
    """PostgreSQL bulk insert: one array parameter per column, ``unnest`` server-side.

    A multi-row VALUES statement has a placeholder per value, and psycopg parses such long
    statements anew every time; arrays keep the statement short whatever the row count. Rows go
    in (and draw serial ids) in the given order. Conflicting rows are skipped (ON CONFLICT DO
    NOTHING); with ``returning`` the values of that column for the rows inserted come back.
    """
    dialect = conn.dialect
    columns = list(rows[0])
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
    for chunk in _chunks(rows, _UNNEST_CHUNK_SIZE):
        params = {c: [row[c] for row in chunk] for c in columns}
        for c in times:
            params[c] = [None if v is None else _aware_utc(v) for v in params[c]]
        result = conn.execute(statement, params)
        if returning is not None:
            out.extend(result.scalars())
    return out


_SQLITE_LOG_INSERT = (
    "INSERT INTO change_log (campaign_id, task_id, from_state, to_state, at, note)"
    " VALUES (?, ?, ?, ?, ?, ?)"
)

#: The ``None -> Pending`` entries of tasks just inserted, one per id of a JSON array, in its
#: order: SQLite builds them from the rows (no Python object per entry).
_SQLITE_LOG_CREATED = (
    "INSERT INTO change_log (campaign_id, task_id, from_state, to_state, at, note)"
    " SELECT t.campaign_id, t.id, NULL, ?, ?, NULL"
    " FROM json_each(?) AS j JOIN tasks AS t ON t.id = j.value ORDER BY j.key"
)

_SQLITE_TASK_COLUMNS = (
    "id, campaign_id, position, email, name, subject, text, html, send_at, state, token, "
    "attempts, claimed_at, sent_at, message_id, error, created_at, updated_at"
)

#: Values per ``IN (...)`` lookup: below SQLite's oldest limit on bound parameters (999).
_SQLITE_IN_LIMIT = 900


def _sqlite_insert_tasks(conn: Connection, tasks: Sequence[Task], at: datetime) -> list[str]:
    """SQLite bulk insert of the tasks whose id and (campaign, position) are free; returns the
    ids inserted.

    The caller holds SQLite's write lock (BEGIN IMMEDIATE), so the rows taken cannot change
    between the lookup (run only when the plain insert skipped a row) and the INSERT; the
    first of two tasks with one id or position wins, as with ON CONFLICT DO NOTHING. Rows go
    through the driver's executemany: SQLAlchemy's per-row parameter processing and RETURNING
    cost several times the INSERT itself.
    """
    stamp = sqlite_text(at)
    pending = TaskState.PENDING.value
    insert = (
        f"INSERT INTO tasks ({_SQLITE_TASK_COLUMNS}) VALUES ({', '.join('?' * 18)})"
        " ON CONFLICT DO NOTHING"
    )
    # The common case, a fresh chunk: insert everything at once and count the rows taken. Only
    # when some were skipped (a resumed run, a duplicate in the input) is it undone and redone
    # with the lookups below, which say which rows were skipped.
    conn.exec_driver_sql("SAVEPOINT sq_bulk_tasks")
    taken = conn.exec_driver_sql(
        insert,
        [
            (
                t.id,
                t.campaign_id,
                t.position,
                t.email,
                t.name,
                t.subject,
                t.text,
                t.html,
                sqlite_text(t.send_at),
                pending,
                t.token,
                t.attempts,
                sqlite_text(t.claimed_at),
                sqlite_text(t.sent_at),
                t.message_id,
                t.error,
                stamp,
                stamp,
            )
            for t in tasks
        ],
    ).rowcount
    if taken == len(tasks):
        conn.exec_driver_sql("RELEASE SAVEPOINT sq_bulk_tasks")
        return [t.id for t in tasks]
    conn.exec_driver_sql("ROLLBACK TO SAVEPOINT sq_bulk_tasks")
    conn.exec_driver_sql("RELEASE SAVEPOINT sq_bulk_tasks")
    taken_ids: set[str] = set()
    taken_positions: set[tuple[str, int]] = set()
    ids = [t.id for t in tasks]
    for start in range(0, len(ids), _SQLITE_IN_LIMIT):
        part = ids[start : start + _SQLITE_IN_LIMIT]
        marks = ", ".join("?" * len(part))
        taken_ids.update(
            row[0]
            for row in conn.exec_driver_sql(
                f"SELECT id FROM tasks WHERE id IN ({marks})", tuple(part)
            )
        )
    by_campaign: dict[str, list[int]] = {}
    for t in tasks:
        by_campaign.setdefault(t.campaign_id, []).append(t.position)
    for campaign_id, positions in by_campaign.items():
        for start in range(0, len(positions), _SQLITE_IN_LIMIT):
            some = positions[start : start + _SQLITE_IN_LIMIT]
            marks = ", ".join("?" * len(some))
            taken_positions.update(
                (campaign_id, row[0])
                for row in conn.exec_driver_sql(
                    f"SELECT position FROM tasks WHERE campaign_id = ? AND position IN ({marks})",
                    (campaign_id, *some),
                )
            )
    inserted: list[str] = []
    rows: list[tuple[object, ...]] = []
    for t in tasks:
        where = (t.campaign_id, t.position)
        if t.id in taken_ids or where in taken_positions:
            continue
        taken_ids.add(t.id)
        taken_positions.add(where)
        inserted.append(t.id)
        rows.append(
            (
                t.id, t.campaign_id, t.position, t.email, t.name, t.subject, t.text, t.html,
                sqlite_text(t.send_at), pending, t.token, t.attempts, sqlite_text(t.claimed_at),
                sqlite_text(t.sent_at), t.message_id, t.error, stamp, stamp,
            )
        )  # fmt: skip
    if rows:
        conn.exec_driver_sql(insert, rows)
    return inserted


_PG_TASK_COLUMNS = _SQLITE_TASK_COLUMNS

#: A task state change on PostgreSQL in one statement, so one round trip and (autocommit) its
#: own transaction: the CAS UPDATE, then the change-log lock, then the change-log INSERT, each
#: fed by the one before. ``locked`` reads the UPDATE's row, so the lock is taken only when a
#: row matched and only after its row lock (as _log requires); the INSERT reads ``locked``, so
#: its id is drawn only once the lock is held, and the lock is kept until the statement
#: commits. A data-modifying WITH runs to completion whether or not the query reads it.
_PG_TRANSITION = (
    "WITH moved AS (UPDATE tasks SET {sets} WHERE id = %s AND state = %s"
    f" RETURNING {_PG_TASK_COLUMNS}),"
    f" locked AS (SELECT campaign_id, id, pg_advisory_xact_lock({CHANGE_LOG_LOCK_KEY})"
    " FROM moved),"
    " logged AS (INSERT INTO change_log (campaign_id, task_id, from_state, to_state, at, note)"
    " SELECT campaign_id, id, %s, %s, %s::timestamptz, %s::text FROM locked)"
    f" SELECT {_PG_TASK_COLUMNS} FROM moved"
)

#: Tasks inserted in bulk with their ``None -> Pending`` entries, in one statement: the rows
#: (arrays, one per column, in id order) with ON CONFLICT DO NOTHING; then, once every row is
#: in (count(*) reads all of ``ins``, so every row lock is taken first), the change-log lock;
#: then one entry per inserted id, in the order of the second pair of arrays (input order).
#: The arrays go in binary (``%b``): psycopg quotes the elements of a text-format array in
#: Python, which cost more than the whole INSERT on the server.
_PG_INSERT_TASKS = (
    f"WITH ins AS (INSERT INTO tasks ({_PG_TASK_COLUMNS})"
    f" SELECT {_PG_TASK_COLUMNS} FROM unnest("
    "%b::varchar[], %b::varchar[], %b::integer[], %b::text[], %b::text[], %b::text[],"
    " %b::text[], %b::text[], %b::timestamptz[], %b::varchar[], %b::varchar[], %b::integer[],"
    " %b::timestamptz[], %b::timestamptz[], %b::text[], %b::text[], %b::timestamptz[],"
    " %b::timestamptz[])"
    f" WITH ORDINALITY AS u({_PG_TASK_COLUMNS}, sq_ordinal) ORDER BY sq_ordinal"
    " ON CONFLICT DO NOTHING RETURNING id),"
    f" locked AS (SELECT pg_advisory_xact_lock({CHANGE_LOG_LOCK_KEY}) AS held"
    " FROM (SELECT count(*) AS n FROM ins) AS c WHERE c.n > 0),"
    " logged AS (INSERT INTO change_log (campaign_id, task_id, from_state, to_state, at, note)"
    " SELECT e.campaign_id, e.id, NULL, %s, %b::timestamptz, NULL"
    " FROM unnest(%b::varchar[], %b::varchar[]) WITH ORDINALITY AS e(id, campaign_id, ord)"
    " JOIN ins ON ins.id = e.id CROSS JOIN locked ORDER BY e.ord RETURNING 1)"
    " SELECT count(*) FROM logged"
)


#: A campaign's checkpoint with its progress entry, in one statement (see _PG_TRANSITION).
_PG_CHECKPOINT_LOGGED = (
    "WITH saved AS (UPDATE campaigns SET checkpoint = %s, updated_at = %s WHERE id = %s"
    " RETURNING id),"
    f" locked AS (SELECT id, pg_advisory_xact_lock({CHANGE_LOG_LOCK_KEY}) FROM saved),"
    " logged AS (INSERT INTO change_log (campaign_id, task_id, from_state, to_state, at, note)"
    " SELECT id, NULL, NULL, 'progress', %s::timestamptz, %s::text FROM locked)"
    " SELECT count(*) FROM saved"
)


def _pg_time(value: datetime | None) -> datetime | None:
    """An aware datetime for a timestamptz parameter (ValueError for a naive one)."""
    if value is None or value.tzinfo is UTC:
        return value
    return _aware_utc(value)


def _aware_utc(value: datetime) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"naive datetime {value!r} where an aware one is required")
    return value.astimezone(UTC)


_PG_ERRORS: tuple[type[Exception], ...] = () if psycopg is None else (psycopg.Error,)

#: Errors after which a statement certainly did not run (or did not commit): the server
#: ended the session (pg_terminate_backend, a shutdown, a restart) before or while running it.
#: A write is retried once on a new connection only after one of these.
_PG_SESSION_ENDED: tuple[type[Exception], ...] = (
    ()
    if pg_errors is None
    else (pg_errors.AdminShutdown, pg_errors.CrashShutdown, pg_errors.CannotConnectNow)
)


@contextmanager
def _errors(action: str) -> Iterator[None]:
    """Map SQLAlchemy's (and the sqlite3 driver's) exceptions to sendqueue's at the adapter
    edge."""
    try:
        yield
    except sa_exc.DBAPIError as exc:
        raise StoreUnavailable(f"task store: {action} failed: {exc.orig}") from exc
    except sa_exc.StatementError as exc:
        # Raised while binding parameters, before the database saw anything: a bad argument
        # (e.g. a naive datetime) from the caller, not an outage.
        if isinstance(exc.orig, TypeError | ValueError):
            raise exc.orig from None
        raise StoreUnavailable(f"task store: {action} failed: {exc}") from exc
    except sa_exc.SQLAlchemyError as exc:
        raise StoreUnavailable(f"task store: {action} failed: {exc}") from exc
    except sqlite3.Error as exc:
        # From statements run on the driver's connection directly (the SQLite fast paths).
        raise StoreUnavailable(f"task store: {action} failed: {exc}") from exc
    except _PG_ERRORS as exc:
        # The same on PostgreSQL (psycopg's connection of the PostgreSQL fast paths).
        raise StoreUnavailable(f"task store: {action} failed: {exc}") from exc


class SqlTaskStore:
    """:class:`~sendqueue.ports.TaskStore` over SQLite or PostgreSQL.

    ``url`` is ``sqlite:///path/to/file.db`` or ``postgresql+psycopg://user@host:5432/db``
    (plain ``postgresql://`` means psycopg 3 too). With ``upgrade`` (the default) the schema is
    migrated to the newest revision on open; pass ``upgrade=False`` where ``sendqueue db
    upgrade`` is run explicitly. ``engine_options`` go to :func:`sqlalchemy.create_engine`
    (e.g. ``pool_size``). On PostgreSQL the hot paths keep up to ``pg_idle_connections``
    connections of their own open between calls, besides the engine's pool.
    """

    def __init__(
        self,
        url: str,
        *,
        upgrade: bool = True,
        engine_options: Mapping[str, Any] | None = None,
        pg_idle_connections: int = 4,
    ) -> None:
        # Creating the engine does not connect; an unreachable database shows on first use.
        self._engine: Engine = create_store_engine(url, **dict(engine_options or {}))
        self._writer = self._engine.execution_options(**WRITE)
        self._postgres = self._engine.dialect.name == "postgresql"
        self._write_lock: AbstractContextManager[object] = (
            nullcontext() if self._postgres else threading.Lock()
        )
        # SQLite fast paths: each thread's own driver connection (see _sqlite_connection).
        self._local = threading.local()
        self._own_lock = threading.Lock()
        # Per-thread driver connections (sqlite3 or psycopg), detached from the engine's pool.
        self._own: list[tuple[threading.Thread, Any]] = []
        self._generation = 0  # bumped by close(): connections of an older one are closed
        # PostgreSQL fast-path connections not in use (see _pg_checkout), at most this many.
        self._pg_idle: list[Any] = []
        self._pg_idle_max = pg_idle_connections
        if upgrade:
            try:
                migrate.upgrade_engine(self._engine)
            except BaseException:
                self._engine.dispose()
                raise

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine, for migrations and diagnostics."""
        return self._engine

    def __enter__(self) -> SqlTaskStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        # Like the engine's dispose(), this closes what is open; a later call opens anew.
        with self._own_lock:
            self._generation += 1
            own, self._own = self._own, []
            idle, self._pg_idle = self._pg_idle, []
        for db in [entry[1] for entry in own] + idle:
            with suppress(sqlite3.Error, *_PG_ERRORS):
                db.close()
        self._engine.dispose()

    # transactions ----------------------------------------------------------------------------

    @contextmanager
    def _write(self, action: str) -> Iterator[Connection]:
        # SQLite: this process's writers queue on a lock of ours. Waiting on BEGIN IMMEDIATE
        # instead means SQLite's busy handler, which sleeps in steps of up to 100 ms: with
        # four send threads that wait, not the writes, bounded the send rate. Other processes
        # still wait on the busy timeout.
        with self._write_lock, _errors(action), self._writer.begin() as conn:
            yield conn

    @contextmanager
    def _read(self, action: str) -> Iterator[Connection]:
        with _errors(action), self._engine.connect() as conn:
            yield conn

    # The send path's statements on SQLite (a task, a campaign's state, whether anything is
    # left, the claim and the finish with their change-log rows: seven per send) run on a
    # driver connection of the calling thread's own. Through SQLAlchemy each read also cost a
    # BEGIN and a ROLLBACK of its own, and each statement its execution-context and result
    # machinery: several times the statement.

    def _sqlite_connection(self) -> sqlite3.Connection:
        """This thread's own driver connection: opened by the engine (so with its pragmas),
        then detached from its pool, kept for the thread's life and closed by :meth:`close`.
        A pool checkout and return per statement cost more than the statement, all the more
        with four send threads queueing on the pool's lock."""
        cached: tuple[int, sqlite3.Connection] | None = getattr(self._local, "db", None)
        if cached is not None and cached[0] == self._generation:
            return cached[1]
        raw = self._engine.raw_connection()
        db = raw.driver_connection
        assert isinstance(db, sqlite3.Connection)
        raw.detach()
        self._local.db = (self._adopt(db), db)
        return db

    def _adopt(self, db: Any) -> int:
        """Keep ``db`` as the calling thread's own connection (closed by :meth:`close`);
        returns the generation it belongs to."""
        me = threading.current_thread()
        with self._own_lock:
            generation = self._generation
            # Threads come and go (a web server's, a pool's): close what dead ones left.
            dead = [entry for entry in self._own if not entry[0].is_alive()]
            self._own = [entry for entry in self._own if entry[0].is_alive()]
            self._own.append((me, db))
        for _thread, old in dead:
            with suppress(sqlite3.Error, *_PG_ERRORS):
                old.close()
        return generation

    @contextmanager
    def _sqlite_read(self, action: str) -> Iterator[sqlite3.Connection]:
        """The driver connection for single-statement reads (each its own transaction: the
        connection is in autocommit mode, see sql_schema)."""
        with _errors(action):
            yield self._sqlite_connection()

    @contextmanager
    def _sqlite_write(self, action: str) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction on the driver connection, queued on this
        process's writer lock as :meth:`_write` is."""
        with self._write_lock, _errors(action):
            db = self._sqlite_connection()
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

    # The same on PostgreSQL. Through SQLAlchemy every call checked a connection out of the
    # pool (with a pre-ping SELECT 1 round trip), and a write cost a BEGIN, the UPDATE, the
    # change-log lock, the change-log INSERT and a COMMIT: five round trips, each waiting on a
    # server that shares the cores. On a fast-path connection in autocommit mode, a read
    # is one statement and a state change one statement too (see _PG_TRANSITION), each its own
    # transaction; psycopg prepares a statement server-side once it has run a few times.
    # Without the pre-ping, a connection the server dropped is noticed by the first statement
    # on it: reads are then retried once on a new connection, writes only when the session had
    # certainly ended before they committed (_PG_SESSION_ENDED). A new connection comes from
    # the engine (its connect timeout, its pre-ping), so a store that is down still raises
    # StoreUnavailable at once.

    def _pg_open(self) -> Any:
        """A new psycopg connection from the engine (its connect timeout and pre-ping), then
        detached from its pool: autocommit, session time zone UTC."""
        raw = self._engine.raw_connection()
        try:
            db: Any = raw.driver_connection
            db.rollback()  # the pool's pre-ping left a transaction open
            db.autocommit = True
            # Times come back as datetime.UTC, as UtcDateTime gives them, with no conversion.
            db.execute("SET TIME ZONE 'UTC'")
        except BaseException:
            raw.invalidate()
            raise
        raw.detach()
        return db

    def _pg_checkout(self) -> tuple[int, Any]:
        """An idle fast-path connection (the most recently used), or a new one; with the
        generation it belongs to. Give it back with :meth:`_pg_checkin`."""
        with self._own_lock:
            generation = self._generation
            if self._pg_idle:
                return generation, self._pg_idle.pop()
        return generation, self._pg_open()

    def _pg_checkin(self, generation: int, db: Any) -> None:
        """Keep ``db`` for the next call, unless it broke, :meth:`close` ran since it was
        checked out, or ``pg_idle_connections`` are kept already: then close it. Idle ones
        are bounded, not one per thread: a web server's forty threads would otherwise each
        keep a connection open on a server that allows a hundred in all."""
        with self._own_lock:
            if (
                generation == self._generation
                and not db.closed
                and not db.broken
                and len(self._pg_idle) < self._pg_idle_max
            ):
                self._pg_idle.append(db)
                return
        with suppress(*_PG_ERRORS):
            db.close()

    def _pg_run(self, action: str, run: Callable[[Any], _T], *, write: bool = False) -> _T:
        """``run(connection)`` on a fast-path connection, once more on a new one when the old
        one turns out to be dead (for a write: only if it certainly did not commit)."""
        with _errors(action):
            generation, db = self._pg_checkout()
            try:
                return run(db)
            except _PG_ERRORS as exc:
                if not db.closed and not db.broken:
                    raise  # the statement failed, not the connection
                if write and not isinstance(exc, _PG_SESSION_ENDED):
                    raise
            finally:
                self._pg_checkin(generation, db)
            generation, db = generation, self._pg_open()
            try:
                return run(db)
            finally:
                self._pg_checkin(generation, db)

    def _insert(self) -> Any:
        # Both dialects spell ON CONFLICT the same way, but through their own insert().
        return postgresql.insert if self._postgres else sqlite.insert

    def _log(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """Append change-log rows inside the caller's transaction.

        PostgreSQL hands out BIGSERIAL ids when rows are inserted, not when they commit: with
        two writers, id 7 can commit before id 6, and a reader resuming with
        ``changes_after(6)`` (the live UI resumes its stream by id) would skip 6 forever. So
        every transaction that logs takes one transaction-scoped advisory lock right before its
        first change-log INSERT and keeps it until commit: ids are drawn and committed in the
        same order. It is taken last, after the row locks of the write it records, so holding
        it never waits on anything but the INSERT and the commit, and no lock cycle can form.
        The cost is that log-writing commits are serialised (not the work before them). SQLite
        needs nothing: BEGIN IMMEDIATE already serialises writers.
        """
        if not rows:
            return
        if self._postgres:
            conn.execute(
                sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": CHANGE_LOG_LOCK_KEY}
            )
            _unnest_insert(conn, schema.change_log, rows)
            return
        # The driver's executemany: SQLAlchemy's per-row parameter processing would cost
        # several times the INSERT itself when a campaign's tasks are logged in bulk.
        conn.exec_driver_sql(
            _SQLITE_LOG_INSERT,
            [
                (
                    r["campaign_id"],
                    r["task_id"],
                    r["from_state"],
                    r["to_state"],
                    sqlite_text(r["at"]),
                    r["note"],
                )
                for r in rows
            ],
        )

    def _require_campaign(self, conn: Connection, campaign_id: str) -> None:
        if self._postgres:
            found = conn.execute(
                sa.select(schema.campaigns.c.id).where(schema.campaigns.c.id == campaign_id)
            ).first()
        else:
            # Every list_tasks runs this (the worker's completion check once per send): the
            # driver's statement skips SQLAlchemy's per-call statement and result machinery.
            found = conn.exec_driver_sql(
                "SELECT id FROM campaigns WHERE id = ?", (campaign_id,)
            ).first()
        if found is None:
            raise NotFound("campaign", campaign_id)

    # campaigns -------------------------------------------------------------------------------

    def create_campaign(self, campaign: Campaign, recipients: Sequence[Recipient]) -> None:
        """Store the campaign and its recipients in one transaction, or nothing.

        ``recipient_count`` is stored as ``len(recipients)``. An existing id raises Conflict;
        two recipients with one position raise InvalidField (``position``).
        """
        _json_ready("checkpoint", campaign.checkpoint)
        campaign_row = {
            "id": campaign.id,
            "name": campaign.name,
            "policy": campaign.policy.to_dict(),
            "from_addr": campaign.from_addr,
            "reply_to": campaign.reply_to,
            "state": campaign.state.value,
            "state_reason": campaign.state_reason,
            "recipient_count": len(recipients),
            "checkpoint": None if campaign.checkpoint is None else dict(campaign.checkpoint),
            "created_at": campaign.created_at,
            "updated_at": campaign.updated_at,
        }
        rows = [
            {
                "campaign_id": campaign.id,
                "position": r.position,
                "email": r.email,
                "name": r.name,
                "subject": r.subject,
                "text": r.text,
                "html": r.html,
                "variables": dict(r.variables),
            }
            for r in recipients
        ]
        with self._write("create campaign") as conn:
            try:
                conn.execute(sa.insert(schema.campaigns), campaign_row)
            except sa_exc.IntegrityError as exc:
                raise Conflict(f"campaign {campaign.id!r} already exists") from exc
            try:
                for chunk in _chunks(rows):
                    conn.execute(sa.insert(schema.recipients), list(chunk))
            except sa_exc.IntegrityError as exc:
                seen: set[int] = set()
                for r in recipients:
                    if r.position in seen:
                        raise InvalidField(
                            "position", r.position, "each recipient needs its own position"
                        ) from exc
                    seen.add(r.position)
                raise InvalidField(
                    "recipients", campaign.id, f"rejected by the database: {exc.orig}"
                ) from exc

    def campaign_state(self, campaign_id: str) -> CampaignState:
        """Only the campaign's current state (NotFound for an unknown campaign).

        The send worker checks the state around every claim; this reads one column instead of
        building the whole campaign (its policy is JSON).
        """
        if self._postgres:
            rows = self._pg_run(
                "get campaign state",
                lambda db: db.execute(
                    "SELECT state FROM campaigns WHERE id = %s", (campaign_id,)
                ).fetchall(),
            )
            state = rows[0][0] if rows else None
        else:
            with self._sqlite_read("get campaign state") as db:
                rows = db.execute(
                    "SELECT state FROM campaigns WHERE id = ?", (campaign_id,)
                ).fetchall()
            state = rows[0][0] if rows else None
        if state is None:
            raise NotFound("campaign", campaign_id)
        return CampaignState(state)

    def get_campaign(self, campaign_id: str) -> Campaign:
        with self._read("get campaign") as conn:
            row = conn.execute(
                sa.select(schema.campaigns).where(schema.campaigns.c.id == campaign_id)
            ).first()
        if row is None:
            raise NotFound("campaign", campaign_id)
        return _campaign(row)

    def list_campaigns(self) -> list[Campaign]:
        with self._read("list campaigns") as conn:
            rows = conn.execute(
                sa.select(schema.campaigns).order_by(
                    schema.campaigns.c.created_at.desc(), schema.campaigns.c.id.desc()
                )
            ).all()
        return [_campaign(row) for row in rows]

    def set_campaign_state(
        self,
        campaign_id: str,
        expected: Collection[CampaignState],
        new: CampaignState,
        *,
        at: datetime,
        reason: str | None = None,
    ) -> bool:
        """CAS on the campaign state; every ``expected -> new`` must be a legal transition."""
        for state in expected:
            check_campaign_transition(state, new)
        with self._write("set campaign state") as conn:
            query = sa.select(schema.campaigns.c.state).where(schema.campaigns.c.id == campaign_id)
            if self._postgres:
                # SQLite's write lock already covers the row; PostgreSQL needs the row lock so
                # the logged from-state is the one replaced. FOR NO KEY UPDATE, not FOR UPDATE:
                # a task transition holding the change-log lock inserts a change_log row, whose
                # foreign key takes FOR KEY SHARE on this campaign; FOR UPDATE would block that
                # while we wait for the change-log lock, a deadlock.
                query = query.with_for_update(key_share=True)
            current = conn.execute(query).scalar_one_or_none()
            if current is None:
                raise NotFound("campaign", campaign_id)
            if CampaignState(current) not in expected:
                return False
            conn.execute(
                sa.update(schema.campaigns)
                .where(schema.campaigns.c.id == campaign_id)
                .values(state=new.value, state_reason=reason, updated_at=at)
            )
            self._log(
                conn,
                [
                    {
                        "campaign_id": campaign_id,
                        "task_id": None,
                        "from_state": current,
                        "to_state": new.value,
                        "at": at,
                        "note": reason,
                    }
                ],
            )
            return True

    def save_checkpoint(
        self,
        campaign_id: str,
        checkpoint: Mapping[str, object] | None,
        *,
        at: datetime,
        note: str | None = None,
    ) -> None:
        _json_ready("checkpoint", checkpoint)
        if self._postgres:
            self._pg_save_checkpoint(campaign_id, checkpoint, at, note)
            return
        with self._write("save checkpoint") as conn:
            result = conn.execute(
                sa.update(schema.campaigns)
                .where(schema.campaigns.c.id == campaign_id)
                .values(checkpoint=None if checkpoint is None else dict(checkpoint), updated_at=at)
            )
            if result.rowcount == 0:
                raise NotFound("campaign", campaign_id)
            if note is not None:
                self._log(
                    conn,
                    [
                        {
                            "campaign_id": campaign_id,
                            "task_id": None,
                            "from_state": None,
                            "to_state": "progress",
                            "at": at,
                            "note": note,
                        }
                    ],
                )

    def _pg_save_checkpoint(
        self,
        campaign_id: str,
        checkpoint: Mapping[str, object] | None,
        at: datetime,
        note: str | None,
    ) -> None:
        """:meth:`save_checkpoint` on PostgreSQL (the provisioner saves one per chunk): one
        statement, the progress entry (if any) logged as :data:`_PG_TRANSITION` logs."""
        value = None if checkpoint is None else psycopg.types.json.Json(dict(checkpoint))
        stamp = _pg_time(at)
        if note is None:
            sql = "UPDATE campaigns SET checkpoint = %s, updated_at = %s WHERE id = %s"
            args: tuple[object, ...] = (value, stamp, campaign_id)
        else:
            sql = _PG_CHECKPOINT_LOGGED
            args = (value, stamp, campaign_id, stamp, note)

        def run(db: Any) -> int:
            cursor = db.execute(sql, args)
            return int(cursor.fetchone()[0]) if note is not None else int(cursor.rowcount)

        if self._pg_run("save checkpoint", run, write=True) == 0:
            raise NotFound("campaign", campaign_id)

    # recipients ------------------------------------------------------------------------------

    def list_recipients(
        self, campaign_id: str, *, after: int = -1, limit: int = 1000
    ) -> list[Recipient]:
        check_limit(limit)
        check_cursor(after)
        if not self._postgres:
            with self._read("list recipients") as conn:
                self._require_campaign(conn, campaign_id)
                # The driver's cursor and rows (see list_tasks): provisioning reads every
                # recipient of a campaign once, and SQLAlchemy's result rows cost a third more.
                cursor = conn.connection.cursor()
                try:
                    cursor.execute(
                        "SELECT position, email, name, subject, text, html, variables "
                        "FROM recipients WHERE campaign_id = ? AND position > ? "
                        "ORDER BY position LIMIT ?",
                        (campaign_id, after, limit),
                    )
                    raw = cursor.fetchall()
                finally:
                    cursor.close()
                return [
                    Recipient(position, email, name, subject, text, html, json.loads(variables))
                    for position, email, name, subject, text, html, variables in raw
                ]
        # PostgreSQL: one statement on this thread's connection; the campaign is looked up only
        # when the page is empty (a recipient's campaign exists: a foreign key).
        sql = (
            "SELECT position, email, name, subject, text, html, variables FROM recipients"
            " WHERE campaign_id = %s AND position > %s ORDER BY position LIMIT %s"
        )

        def run(db: Any) -> list[Recipient]:
            rows = db.execute(sql, (campaign_id, after, limit)).fetchall()
            if not rows:
                found = db.execute("SELECT 1 FROM campaigns WHERE id = %s", (campaign_id,))
                if not found.fetchall():
                    raise NotFound("campaign", campaign_id)
            return [Recipient(*row) for row in rows]

        return self._pg_run("list recipients", run)

    # tasks -----------------------------------------------------------------------------------

    def insert_tasks(self, tasks: Sequence[Task], *, at: datetime) -> int:
        """Insert the tasks whose id (and campaign position) is free; log each ``None -> Pending``.

        Every task must be Pending (tasks are born Pending; IllegalTransition otherwise) and
        belong to an existing campaign (NotFound otherwise). ``created_at`` and ``updated_at``
        are set to ``at``.
        """
        if not tasks:
            return 0
        for task in tasks:
            if task.state is not TaskState.PENDING:
                raise IllegalTransition(
                    "task", "(new)", task.state.value, "tasks are created Pending"
                )
        if self._postgres and len(tasks) <= _UNNEST_CHUNK_SIZE:
            return self._pg_insert_tasks(tasks, at)
        with self._write("insert tasks") as conn:
            for campaign_id in sorted({t.campaign_id for t in tasks}):
                self._require_campaign(conn, campaign_id)
            inserted: set[str] = set()
            if not self._postgres:
                ids = _sqlite_insert_tasks(conn, tasks, at)
                if len(ids) == len(tasks):
                    # Every task inserted (a fresh provisioning chunk): the log entries, in
                    # input order, straight from the rows.
                    conn.exec_driver_sql(
                        _SQLITE_LOG_CREATED,
                        (TaskState.PENDING.value, sqlite_text(at), json.dumps(ids)),
                    )
                    return len(ids)
                inserted.update(ids)
            else:
                rows = [
                    {
                        "id": t.id,
                        "campaign_id": t.campaign_id,
                        "position": t.position,
                        "email": t.email,
                        "name": t.name,
                        "subject": t.subject,
                        "text": t.text,
                        "html": t.html,
                        "send_at": t.send_at,
                        "state": TaskState.PENDING.value,
                        "token": t.token,
                        "attempts": t.attempts,
                        "claimed_at": t.claimed_at,
                        "sent_at": t.sent_at,
                        "message_id": t.message_id,
                        "error": t.error,
                        "created_at": at,
                        "updated_at": at,
                    }
                    for t in tasks
                ]
                # Two provisioners inserting the same tasks wait on each other's uncommitted
                # rows; taking them in one global order (by id) means they cannot deadlock.
                rows.sort(key=lambda row: str(row["id"]))
                inserted.update(_unnest_insert(conn, schema.tasks, rows, returning="id"))
            entries = []
            for t in tasks:
                if t.id in inserted:
                    inserted.discard(t.id)  # a duplicate later in the input was not inserted
                    entries.append(
                        {
                            "campaign_id": t.campaign_id,
                            "task_id": t.id,
                            "from_state": None,
                            "to_state": TaskState.PENDING.value,
                            "at": at,
                            "note": None,
                        }
                    )
            self._log(conn, entries)
        return len(entries)

    def _pg_insert_tasks(self, tasks: Sequence[Task], at: datetime) -> int:
        """:meth:`insert_tasks` on PostgreSQL, one provisioning chunk: one statement
        (:data:`_PG_INSERT_TASKS`), so one round trip and one transaction."""
        stamp = _pg_time(at)
        pending = TaskState.PENDING.value
        # Two provisioners inserting the same tasks wait on each other's uncommitted rows;
        # taking them in one global order (by id) means they cannot deadlock.
        rows = [
            (
                t.id, t.campaign_id, t.position, t.email, t.name, t.subject, t.text, t.html,
                _pg_time(t.send_at), pending, t.token, t.attempts, _pg_time(t.claimed_at),
                _pg_time(t.sent_at), t.message_id, t.error, stamp, stamp,
            )
            for t in sorted(tasks, key=lambda t: t.id)
        ]  # fmt: skip
        columns = [list(column) for column in zip(*rows, strict=True)]
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
        params = (*columns, pending, stamp, log_ids, log_campaigns)

        def run(db: Any) -> int:
            try:
                row = db.execute(_PG_INSERT_TASKS, params).fetchone()
            except pg_errors.ForeignKeyViolation:
                found = {
                    r[0]
                    for r in db.execute(
                        "SELECT id FROM campaigns WHERE id = ANY(%s::varchar[])",
                        (sorted(set(log_campaigns)),),
                    )
                }
                missing = sorted(set(log_campaigns) - found)
                if not missing:
                    raise
                raise NotFound("campaign", missing[0]) from None
            return int(row[0])

        return self._pg_run("insert tasks", run, write=True)

    def get_task(self, task_id: str) -> Task | None:
        if not self._postgres:
            # The send path reads a task per send: the driver's row, converted here.
            with self._sqlite_read("get task") as db:
                rows = db.execute(
                    f"SELECT {_SQLITE_TASK_COLUMNS} FROM tasks WHERE id = ?", (task_id,)
                ).fetchall()
            return _sqlite_task(rows[0]) if rows else None
        sql = f"SELECT {_PG_TASK_COLUMNS} FROM tasks WHERE id = %s"

        def run(db: Any) -> Task | None:
            rows = db.execute(sql, (task_id,)).fetchall()
            return _task(rows[0]) if rows else None

        return self._pg_run("get task", run)

    def transition(
        self,
        task_id: str,
        expected: TaskState,
        new: TaskState,
        *,
        at: datetime,
        changes: TaskChanges | None = None,
        note: str | None = None,
    ) -> Task | None:
        check_task_transition(expected, new)
        values = checked_changes(changes)
        values.update(state=new.value, updated_at=at)
        if not self._postgres:
            # Converted before the write lock is taken: a naive datetime raises ValueError
            # here, as UtcDateTime's bind processing does on PostgreSQL.
            sets = ", ".join(f"{name} = ?" for name in values)
            params = tuple(
                sqlite_text(v) if isinstance(v, datetime) else v for v in values.values()
            )
            # Two writes per send go through here: the driver's statements and row (an UPDATE
            # whose SET list varies per call, and its change-log row) in one transaction.
            with self._sqlite_write("transition task") as db:
                rows = db.execute(
                    f"UPDATE tasks SET {sets} WHERE id = ? AND state = ?"
                    f" RETURNING {_SQLITE_TASK_COLUMNS}",
                    (*params, task_id, expected.value),
                ).fetchall()
                if not rows:
                    return None
                task = _sqlite_task(rows[0])
                db.execute(
                    _SQLITE_LOG_INSERT,
                    (task.campaign_id, task.id, expected.value, new.value, sqlite_text(at), note),
                )
            return task
        return self._pg_transition(task_id, expected, new, values, at, note)

    def _pg_transition(
        self,
        task_id: str,
        expected: TaskState,
        new: TaskState,
        values: Mapping[str, Any],
        at: datetime,
        note: str | None,
    ) -> Task | None:
        """:meth:`transition` on PostgreSQL: one statement (:data:`_PG_TRANSITION`)."""
        params = [_pg_time(v) if isinstance(v, datetime) else v for v in values.values()]
        sql = _PG_TRANSITION.format(sets=", ".join(f"{name} = %s" for name in values))
        args = (*params, task_id, expected.value, expected.value, new.value, _pg_time(at), note)

        def run(db: Any) -> Task | None:
            rows = db.execute(sql, args).fetchall()
            return _task(rows[0]) if rows else None

        return self._pg_run("transition task", run, write=True)

    def transition_all(
        self,
        campaign_id: str,
        expected: TaskState,
        new: TaskState,
        *,
        at: datetime,
        note: str | None = None,
    ) -> int:
        """Move every task of the campaign in ``expected`` to ``new``; one log entry each.

        The entries are written in position order. NotFound for an unknown campaign.
        """
        check_task_transition(expected, new)
        matching = (
            schema.tasks.c.campaign_id == campaign_id,
            schema.tasks.c.state == expected.value,
        )
        with self._write("transition tasks") as conn:
            self._require_campaign(conn, campaign_id)
            if self._postgres:
                return self._transition_all_postgres(conn, campaign_id, expected, new, at, note)
            # SQLite: BEGIN IMMEDIATE excludes every other writer, so the rows the INSERT ...
            # SELECT reads are exactly the rows the UPDATE then changes.
            source = (
                sa.select(
                    sa.literal(campaign_id, sa.String()),
                    schema.tasks.c.id,
                    sa.literal(expected.value, sa.String()),
                    sa.literal(new.value, sa.String()),
                    sa.literal(at, UtcDateTime()),
                    sa.literal(note, sa.Text()),
                )
                .where(*matching)
                .order_by(schema.tasks.c.position)
            )
            conn.execute(
                sa.insert(schema.change_log).from_select(
                    ["campaign_id", "task_id", "from_state", "to_state", "at", "note"], source
                )
            )
            result = conn.execute(
                sa.update(schema.tasks).where(*matching).values(state=new.value, updated_at=at)
            )
            return result.rowcount

    def _transition_all_postgres(
        self,
        conn: Connection,
        campaign_id: str,
        expected: TaskState,
        new: TaskState,
        at: datetime,
        note: str | None,
    ) -> int:
        # Under READ COMMITTED an INSERT ... SELECT followed by an UPDATE could log a task that a
        # concurrent worker moved in between. So the UPDATE goes first: it locks exactly the rows
        # it changes and RETURNING names them. They are kept server-side in a temporary table
        # (a campaign may have a million tasks), then the change-log lock is taken (last, as in
        # _log) and the entries are copied from there in one INSERT ... SELECT.
        conn.execute(
            sa.text("CREATE TEMPORARY TABLE sq_moved (id text, position integer) ON COMMIT DROP")
        )
        conn.execute(
            sa.text(
                "WITH moved AS ("
                " UPDATE tasks SET state = :new, updated_at = :at"
                " WHERE campaign_id = :campaign_id AND state = :expected"
                " RETURNING id, position)"
                " INSERT INTO sq_moved (id, position) SELECT id, position FROM moved"
            ).bindparams(sa.bindparam("at", type_=UtcDateTime())),
            {"new": new.value, "at": at, "campaign_id": campaign_id, "expected": expected.value},
        )
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": CHANGE_LOG_LOCK_KEY})
        result = conn.execute(
            sa.text(
                "INSERT INTO change_log (campaign_id, task_id, from_state, to_state, at, note)"
                " SELECT :campaign_id, id, :expected, :new, :at, :note"
                " FROM sq_moved ORDER BY position"
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

    def reschedule(self, updates: Sequence[tuple[str, datetime, str]], *, at: datetime) -> int:
        if not updates:
            return 0
        statement = (
            sa.update(schema.tasks)
            .where(
                schema.tasks.c.id == sa.bindparam("b_id"),
                schema.tasks.c.state == TaskState.PENDING.value,
            )
            .values(
                send_at=sa.bindparam("b_send_at", type_=UtcDateTime()),
                token=sa.bindparam("b_token"),
                updated_at=sa.bindparam("b_at", type_=UtcDateTime()),
            )
        )
        params = [
            {"b_id": task_id, "b_send_at": send_at, "b_token": token, "b_at": at}
            # In id order, so two concurrent reschedules take their row locks in one order.
            for task_id, send_at, token in sorted(updates, key=lambda u: u[0])
        ]
        updated = 0
        with self._write("reschedule tasks") as conn:
            for chunk in _chunks(params):
                updated += conn.execute(statement, list(chunk)).rowcount
        return updated

    def list_tasks(
        self,
        campaign_id: str,
        *,
        state: TaskState | None = None,
        search: str | None = None,
        after: int = -1,
        limit: int = 100,
    ) -> list[Task]:
        """A page in position order; ``search`` is a case-insensitive substring of the address
        (``%`` and ``_`` match themselves). NotFound for an unknown campaign."""
        check_limit(limit)
        check_cursor(after)
        query = sa.select(schema.tasks).where(
            schema.tasks.c.campaign_id == campaign_id, schema.tasks.c.position > after
        )
        if state is not None:
            query = query.where(schema.tasks.c.state == state.value)
        if search and "\x00" in search:
            # No address holds a NUL (the importer refuses control characters), and PostgreSQL
            # refuses one in any text parameter: nothing matches, on either database.
            query = query.where(sa.false())
        elif search:
            query = query.where(schema.tasks.c.email.icontains(search, autoescape=True))
        query = query.order_by(schema.tasks.c.position).limit(limit)
        with self._read("list tasks") as conn:
            self._require_campaign(conn, campaign_id)
            if self._postgres or search:
                rows = conn.execute(query).all()
                return [_task(row) for row in rows]
            # SQLite, the provisioner's and the reconciler's pages: the driver's rows, converted
            # here, at a third of the cost of SQLAlchemy's per-column result processing.
            sql = f"SELECT {_SQLITE_TASK_COLUMNS} FROM tasks WHERE campaign_id = ? AND position > ?"
            params: tuple[object, ...] = (campaign_id, after)
            if state is not None:
                sql += " AND state = ?"
                params += (state.value,)
            raw = conn.exec_driver_sql(sql + " ORDER BY position LIMIT ?", (*params, limit))
            return [_sqlite_task(row) for row in raw]

    def has_unfinished_tasks(self, campaign_id: str) -> bool:
        """Whether any task of the campaign is Pending or Running (False for an unknown one).

        The send worker asks this after every send, and only when the answer is no does it run
        the campaign service's completion check (which asks again before its state change).
        """
        open_states = (TaskState.PENDING.value, TaskState.RUNNING.value)
        if not self._postgres:
            with self._sqlite_read("check unfinished tasks") as db:
                rows = db.execute(
                    "SELECT 1 FROM tasks WHERE campaign_id = ? AND state IN (?, ?) LIMIT 1",
                    (campaign_id, *open_states),
                ).fetchall()
            return bool(rows)
        rows = self._pg_run(
            "check unfinished tasks",
            lambda db: db.execute(
                "SELECT 1 FROM tasks WHERE campaign_id = %s AND state IN (%s, %s) LIMIT 1",
                (campaign_id, *open_states),
            ).fetchall(),
        )
        return bool(rows)

    def due_tasks(
        self,
        state: TaskState,
        *,
        before: datetime,
        after: tuple[datetime, str] | None = None,
        limit: int = 1000,
    ) -> list[Task]:
        check_limit(limit)
        query = sa.select(schema.tasks).where(
            schema.tasks.c.state == state.value, schema.tasks.c.send_at < before
        )
        if after is not None:
            send_at, task_id = after
            query = query.where(
                sa.or_(
                    schema.tasks.c.send_at > send_at,
                    sa.and_(schema.tasks.c.send_at == send_at, schema.tasks.c.id > task_id),
                )
            )
        query = query.order_by(schema.tasks.c.send_at, schema.tasks.c.id).limit(limit)
        with self._read("list due tasks") as conn:
            rows = conn.execute(query).all()
        return [_task(row) for row in rows]

    def stale_running(self, *, claimed_before: datetime, limit: int = 1000) -> list[Task]:
        check_limit(limit)
        query = (
            sa.select(schema.tasks)
            .where(
                schema.tasks.c.state == TaskState.RUNNING.value,
                schema.tasks.c.claimed_at < claimed_before,
            )
            .order_by(schema.tasks.c.claimed_at, schema.tasks.c.id)
            .limit(limit)
        )
        with self._read("list stale tasks") as conn:
            rows = conn.execute(query).all()
        return [_task(row) for row in rows]

    def count_tasks(self, campaign_id: str) -> dict[TaskState, int]:
        """Tasks per state, every state present. NotFound for an unknown campaign."""
        query = (
            sa.select(schema.tasks.c.state, sa.func.count())
            .where(schema.tasks.c.campaign_id == campaign_id)
            .group_by(schema.tasks.c.state)
        )
        with self._read("count tasks") as conn:
            self._require_campaign(conn, campaign_id)
            rows = conn.execute(query).all()
        counts = dict.fromkeys(TaskState, 0)
        for state, count in rows:
            counts[TaskState(state)] = count
        return counts

    # change log ------------------------------------------------------------------------------

    def changes_after(
        self, after_id: int, *, campaign_id: str | None = None, limit: int = 1000
    ) -> builtins.list[ChangeLogEntry]:
        check_limit(limit)
        check_cursor(after_id, field="after_id")
        query = sa.select(schema.change_log).where(schema.change_log.c.id > after_id)
        if campaign_id is not None:
            query = query.where(schema.change_log.c.campaign_id == campaign_id)
        query = query.order_by(schema.change_log.c.id).limit(limit)
        with self._read("read change log") as conn:
            rows = conn.execute(query).all()
        return [_entry(row) for row in rows]

    def last_change_id(self) -> int:
        with self._read("read change log") as conn:
            value = conn.execute(sa.select(sa.func.max(schema.change_log.c.id))).scalar()
        return int(value or 0)

    # leases ----------------------------------------------------------------------------------

    def acquire_lease(self, name: str, owner: str, *, ttl_seconds: float, at: datetime) -> bool:
        """Take or renew the lease; it is free when missing or ``expires_at <= at``."""
        if ttl_seconds <= 0:
            raise InvalidField("ttl_seconds", ttl_seconds, "must be more than zero")
        statement = self._insert()(schema.leases).values(
            name=name, owner=owner, expires_at=at + timedelta(seconds=ttl_seconds)
        )
        statement = statement.on_conflict_do_update(
            index_elements=[schema.leases.c.name],
            set_={"owner": statement.excluded.owner, "expires_at": statement.excluded.expires_at},
            where=sa.or_(schema.leases.c.owner == owner, schema.leases.c.expires_at <= at),
        ).returning(schema.leases.c.name)
        with self._write("acquire lease") as conn:
            return conn.execute(statement).first() is not None

    def release_lease(self, name: str, owner: str) -> None:
        with self._write("release lease") as conn:
            conn.execute(
                sa.delete(schema.leases).where(
                    schema.leases.c.name == name, schema.leases.c.owner == owner
                )
            )
