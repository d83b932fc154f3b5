"""The embedded scheduler's SQLite file: its schema, rows, and transactions.

Instants are stored as integer microseconds since the epoch, UTC.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import logging
import sqlite3
import threading
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from json.encoder import encode_basestring_ascii

from sendqueue.adapters.scheduler_rules import CheckedDue, wall_time
from sendqueue.adapters.sqlite_checkpoints import WalCheckpoints
from sendqueue.domain.errors import Conflict, InvalidField, SchedulerError
from sendqueue.domain.models import DeadLetter
from sendqueue.ports import Alarm, Clock, Schedule

__all__ = [
    "COLUMNS",
    "INSERT",
    "INSERT_SHARED",
    "IN_LIMIT",
    "SCHEMA",
    "SCHEMA_VERSION",
    "ScheduleFile",
    "conflict",
    "due_params",
    "due_rows_json",
    "from_us",
    "insert_params",
    "payload_json",
    "payload_text",
    "row_to_letter",
    "row_to_schedule",
    "sqlite_path",
    "to_us",
]

log = logging.getLogger("sendqueue.scheduler")

SCHEMA_VERSION = 1
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS schedules (
    name TEXT PRIMARY KEY,
    grp TEXT NOT NULL,
    at_local TEXT NOT NULL,
    timezone TEXT NOT NULL,
    payload TEXT NOT NULL,
    client_token TEXT NOT NULL,
    due_at INTEGER NOT NULL,
    max_retries INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL,
    lease_owner TEXT,
    lease_until INTEGER
);
CREATE INDEX IF NOT EXISTS schedules_due ON schedules (due_at, name);
CREATE INDEX IF NOT EXISTS schedules_group ON schedules (grp, name);
CREATE INDEX IF NOT EXISTS schedules_leased ON schedules (lease_until)
    WHERE lease_owner IS NOT NULL;
CREATE TABLE IF NOT EXISTS dead_letters (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    schedule_name TEXT NOT NULL,
    grp TEXT NOT NULL,
    timezone TEXT NOT NULL,
    payload TEXT NOT NULL,
    error TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    max_retries INTEGER NOT NULL,
    failed_at INTEGER NOT NULL
);
"""

COLUMNS = (
    "name, grp, at_local, timezone, payload, client_token, due_at, max_retries, attempts, "
    "created_at, lease_owner, lease_until"
)


def to_us(value: datetime) -> int:
    return (value - _EPOCH) // _MICRO


def from_us(value: int) -> datetime:
    return _EPOCH + value * _MICRO


def sqlite_path(url: str) -> str:
    for prefix in ("sqlite+pysqlite://", "sqlite://"):
        if url.startswith(prefix):
            rest = url[len(prefix) :]
            break
    else:
        raise InvalidField("scheduler_url", url, "expected sqlite:///FILE")
    if rest in ("", "/:memory:"):
        return ":memory:"
    if not rest.startswith("/") or rest == "/" or "?" in rest:
        raise InvalidField("scheduler_url", url, "expected sqlite:///FILE (no host, no query)")
    # sqlite:///relative.db and sqlite:////absolute.db, as SQLAlchemy spells them.
    return rest[1:]


INSERT = (
    "INSERT INTO schedules (name, grp, at_local, timezone, payload, client_token, "
    "due_at, max_retries, attempts, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)

#: :data:`INSERT` of a batch that shares its group, zone and retries (``?2``-``?4``; ``?5`` the
#: creation instant), its other values one JSON array per schedule (:func:`due_rows_json`, ``?1``):
#: the whole batch is one statement, which runs without Python's lock (see
#: ``EmbeddedScheduler.submit_many``). Names already there are skipped; the caller counts.
INSERT_SHARED = (
    "INSERT INTO schedules (name, grp, at_local, timezone, payload, client_token, due_at, "
    "max_retries, attempts, created_at) SELECT json_extract(value, '$[0]'), ?2, "
    "json_extract(value, '$[1]'), ?3, json_extract(value, '$[2]'), json_extract(value, '$[3]'), "
    "json_extract(value, '$[4]'), ?4, 0, ?5 FROM json_each(?1) WHERE true "
    "ON CONFLICT (name) DO NOTHING"
)

#: Names per ``IN (...)`` lookup: below SQLite's oldest limit on bound parameters (999).
IN_LIMIT = 900

#: Payloads as stored: ``json.dumps(payload, sort_keys=True)``, with one encoder for all calls.
payload_json = json.JSONEncoder(sort_keys=True).encode


_quote = encode_basestring_ascii


def payload_text(payload: Mapping[str, str]) -> str:
    """:data:`payload_json` of a checked payload (strings to strings), in a third less time:
    its string encoder called directly, without building an encoder per call (a property test
    holds the two equal)."""
    parts = []
    for key in sorted(payload):  # a loop, not a comprehension: no function frame per call
        parts.append(_quote(key) + ": " + _quote(payload[key]))
    return "{" + ", ".join(parts) + "}"


def due_params(item: CheckedDue, created_us: int) -> tuple[object, ...]:
    """:func:`insert_params` of a checked bulk item (``rules.check_due_many``), without the
    Schedule in between."""
    name, group, local, timezone, payload, token, retries, due = item
    return (
        name, group, wall_time(local).isoformat(), timezone, payload_text(payload), token,
        to_us(due), retries, 0, created_us,
    )  # fmt: skip


_compact_json = json.JSONEncoder(separators=(",", ":")).encode


def due_rows_json(checked: builtins.list[CheckedDue]) -> str:
    """The values :data:`INSERT_SHARED` reads per schedule, of checked bulk items, as the
    JSON array it binds: [name, wall time, payload, token, due instant] each."""
    return _compact_json(
        [
            [name, wall_time(local).isoformat(), payload_text(payload), token, to_us(due)]
            for name, _, local, _, payload, token, _, due in checked
        ]
    )


def insert_params(schedule: Schedule) -> tuple[object, ...]:
    assert schedule.created_at is not None
    return (
        schedule.name,
        schedule.group,
        schedule.at_local.isoformat(),
        schedule.timezone,
        payload_json(dict(schedule.payload)),
        schedule.client_token,
        to_us(schedule.due_at),
        schedule.max_retries,
        schedule.attempts,
        to_us(schedule.created_at),
    )


def conflict(name: str) -> Conflict:
    return Conflict(f"schedule {name!r} exists with another client token")


def row_to_schedule(row: sqlite3.Row) -> Schedule:
    return Schedule(
        name=row["name"],
        group=row["grp"],
        at_local=datetime.fromisoformat(row["at_local"]),
        timezone=row["timezone"],
        payload=json.loads(row["payload"]),
        client_token=row["client_token"],
        due_at=from_us(row["due_at"]),
        max_retries=row["max_retries"],
        attempts=row["attempts"],
        created_at=from_us(row["created_at"]),
    )


def row_to_letter(row: sqlite3.Row) -> DeadLetter:
    return DeadLetter(
        id=row["id"],
        schedule_name=row["schedule_name"],
        group=row["grp"],
        payload=json.loads(row["payload"]),
        error=row["error"],
        attempts=row["attempts"],
        failed_at=from_us(row["failed_at"]),
    )


class ScheduleFile:
    """The scheduler's SQLite file: one shared connection, its write transactions and reads.

    The first base of :class:`~sendqueue.adapters.embedded.scheduler.EmbeddedScheduler`, which
    opens the connection; backend failures raise :class:`SchedulerError`.
    """

    path: str
    clock: Clock
    alarm: Alarm
    _conn: sqlite3.Connection
    _lock: threading.RLock
    _busy_timeout: float
    _checkpoints: WalCheckpoints | None  # None for a database in memory (no log), or closed

    def _close_quietly(self) -> None:
        if self._checkpoints is not None:
            self._checkpoints.close()
        conn = getattr(self, "_conn", None)
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def _migrate(self) -> None:
        with self._write() as conn:
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', ?)",
                    (str(SCHEMA_VERSION),),
                )
            elif row["value"] != str(SCHEMA_VERSION):
                raise SchedulerError(
                    f"scheduler database {self.path!r} has schema version {row['value']}, "
                    f"this sendqueue understands {SCHEMA_VERSION}"
                )

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taking SQLite's write lock up front (no upgrade deadlocks)."""
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise SchedulerError(f"scheduler database: {exc}") from exc
            try:
                yield self._conn
            except sqlite3.Error as exc:
                self._rollback()
                raise SchedulerError(f"scheduler database: {exc}") from exc
            except BaseException:
                self._rollback()
                raise
            try:
                self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                self._rollback()
                raise SchedulerError(f"scheduler database: {exc}") from exc

    def _bulk_written(self, rows: int) -> None:
        """After a bulk write's commit of ``rows`` schedules: counted toward the checkpoint
        thread's next fold (under the lock: a closed file's count starts no thread)."""
        with self._lock:
            if self._checkpoints is not None:
                self._checkpoints.written(rows)

    def _rollback(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._conn.execute("ROLLBACK")

    def _read(self, sql: str, params: tuple[object, ...] = ()) -> builtins.list[sqlite3.Row]:
        with self._lock:
            try:
                return self._conn.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise SchedulerError(f"scheduler database: {exc}") from exc

    def _raise_alarm(self, letter: DeadLetter) -> None:
        try:
            self.alarm.raise_alarm(letter)
        except Exception:
            log.exception("raising the alarm for dead letter %s failed", letter.id)
