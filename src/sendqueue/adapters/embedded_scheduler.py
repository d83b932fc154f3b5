"""The embedded execution layer: one-time schedules in their own SQLite file, and a dispatcher.

:class:`EmbeddedScheduler` is both the :class:`~sendqueue.ports.Scheduler` and the
:class:`~sendqueue.ports.Dispatcher` of a single machine. Its file is separate from the task
store on purpose: the two can drift apart as they do in production, and the reconciler repairs
that drift the same way everywhere.

How it fires:

- The dispatcher (:meth:`EmbeddedScheduler.run`) sleeps until the next due schedule, never on
  a fixed poll. A ``create`` in the same process that adds an earlier schedule wakes it through
  a condition variable. A ``create`` in another process (the CLI provisioning while the worker
  runs) wakes it with a datagram on a Unix socket in the wake directory (``<db>.wake/``, one
  socket per running dispatcher; best effort). No single sleep is longer than ``max_sleep``
  (30 s), a safety net should a wake-up datagram be lost.
- A due schedule is leased (``lease_owner``/``lease_until``, a conditional write in a
  ``BEGIN IMMEDIATE`` transaction) before its target runs, and the lease is renewed while it
  runs. The dispatcher claims ``lookahead`` (25 ms) ahead: it wakes that much before the next
  due time and leases what falls due within it (as many as it has free slots), and the fire
  thread waits for the exact due time before invoking, so the transaction (and a WAL
  checkpoint it may run) is not paid between the due time and the invocation. Nothing fires
  before its due time. A schedule claimed ahead is read again right before its invocation
  (on the fire thread's own connection, which never waits for the dispatcher's writes) and
  skipped if it was deleted or replaced meanwhile: a delete before the due time still
  cancels it. Once invoked, it is in flight as before (a delete does not stop it).
  If the process dies, the lease expires and another dispatcher fires the schedule again:
  delivery is at-least-once. An expired lease counts as a failed attempt, so a target that
  kills its process every time ends in the dead-letter queue instead of looping.
- At most ``concurrency`` targets run at once, on ``concurrency`` daemon threads that live as
  long as the dispatcher: a target keeps per-thread state (the SMTP mailer's connection)
  from one invocation to the next.
- A target that returns deletes its schedule. On the dispatcher's fire threads the delete
  is deferred to the dispatcher's next transaction (the claim that refills the freed slot, or
  the release on shutdown), so a send costs one write on this file, not two; the lease keeps
  the schedule from firing again meanwhile, and should the process die before that write,
  the lease expires and it fires again (at-least-once, as when a delete fails). A target
  that raises is retried after an exponential, jittered backoff (``retry_backoff`` doubling
  up to ``max_backoff``) while attempts remain, then moved to the dead letters, and the alarm
  is raised. Every write after the target is conditional on our lease: if the schedule was
  deleted or replaced (same name, new token) meanwhile, the newer state wins.
- Setting ``stop`` makes the dispatcher take nothing new, wait up to ``shutdown_timeout`` for
  running targets, release the leases of what it claimed but did not start, and return.

Several processes may share one file (WAL, ``busy_timeout``, writes in ``BEGIN IMMEDIATE``).
Instants are stored as integer microseconds since the epoch, UTC.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import hashlib
import json
import logging
import os
import queue
import random
import secrets
import socket
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sendqueue.adapters import scheduler_rules as rules
from sendqueue.adapters.alarm import LoggingAlarm
from sendqueue.clock import SystemClock
from sendqueue.domain.errors import Conflict, InvalidField, NotFound, SchedulerError
from sendqueue.domain.models import DeadLetter, new_token
from sendqueue.ports import Alarm, Clock, Schedule, Target

__all__ = ["SCHEMA_VERSION", "EmbeddedScheduler"]

log = logging.getLogger("sendqueue.scheduler")

SCHEMA_VERSION = 1
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)
_SUN_PATH_MAX = 100  # sockaddr_un.sun_path is 104..108 bytes; keep a margin
_WATCH_INTERVAL = 0.2  # how quickly a set ``stop`` event is noticed

_SCHEMA = """
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

_COLUMNS = (
    "name, grp, at_local, timezone, payload, client_token, due_at, max_retries, attempts, "
    "created_at, lease_owner, lease_until"
)


def _us(value: datetime) -> int:
    return (value - _EPOCH) // _MICRO


def _dt(value: int) -> datetime:
    return _EPOCH + value * _MICRO


def _sqlite_path(url: str) -> str:
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


_INSERT = (
    "INSERT INTO schedules (name, grp, at_local, timezone, payload, client_token, "
    "due_at, max_retries, attempts, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)

#: Names per ``IN (...)`` lookup: below SQLite's oldest limit on bound parameters (999).
_IN_LIMIT = 900

#: Payloads as stored: ``json.dumps(payload, sort_keys=True)``, whose per-call set-up (a new
#: encoder for every call with a keyword argument) cost more than the encoding when a
#: campaign's schedules are written in bulk.
_payload_json = json.JSONEncoder(sort_keys=True).encode


def _insert_params(schedule: Schedule) -> tuple[object, ...]:
    assert schedule.created_at is not None
    return (
        schedule.name,
        schedule.group,
        schedule.at_local.isoformat(),
        schedule.timezone,
        _payload_json(dict(schedule.payload)),
        schedule.client_token,
        _us(schedule.due_at),
        schedule.max_retries,
        schedule.attempts,
        _us(schedule.created_at),
    )


def _conflict(name: str) -> Conflict:
    return Conflict(f"schedule {name!r} exists with another client token")


#: What the dispatcher hands a fire thread: the schedule, the event set once its invocation
#: ended, and whether it was claimed before its due time (see ``lookahead``).
_Job = tuple[Schedule, threading.Event, bool]


def _row_to_schedule(row: sqlite3.Row) -> Schedule:
    return Schedule(
        name=row["name"],
        group=row["grp"],
        at_local=datetime.fromisoformat(row["at_local"]),
        timezone=row["timezone"],
        payload=json.loads(row["payload"]),
        client_token=row["client_token"],
        due_at=_dt(row["due_at"]),
        max_retries=row["max_retries"],
        attempts=row["attempts"],
        created_at=_dt(row["created_at"]),
    )


def _row_to_letter(row: sqlite3.Row) -> DeadLetter:
    return DeadLetter(
        id=row["id"],
        schedule_name=row["schedule_name"],
        group=row["grp"],
        payload=json.loads(row["payload"]),
        error=row["error"],
        attempts=row["attempts"],
        failed_at=_dt(row["failed_at"]),
    )


class EmbeddedScheduler:
    """Scheduler and Dispatcher on a SQLite file of their own (see the module docstring).

    ``url`` is ``sqlite:///FILE`` (``sqlite://`` for a private in-memory database, which only
    this instance sees). ``alarm`` defaults to a :class:`~sendqueue.adapters.alarm.LoggingAlarm`
    without webhook. ``wake_path`` overrides the wake directory (by default ``<FILE>.wake``, or
    a directory in the temp dir named after the file when that path is too long for a socket).
    Backend failures raise :class:`~sendqueue.domain.errors.SchedulerError`.
    """

    firing_precision = 0.0  # exact: fires at due_at (see the Scheduler port)
    runs_reconciler = False  # the worker process runs its own reconciler loop

    def __init__(
        self,
        url: str,
        *,
        clock: Clock | None = None,
        alarm: Alarm | None = None,
        concurrency: int = 4,
        lease_seconds: float = 60.0,
        retry_backoff: float = 5.0,
        max_backoff: float = 300.0,
        wake_path: str | os.PathLike[str] | None = None,
        max_sleep: float = 30.0,
        shutdown_timeout: float = 30.0,
        busy_timeout: float = 10.0,
        seed: int | None = None,
        lookahead: float = 0.025,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if lease_seconds <= 0 or max_sleep <= 0 or shutdown_timeout < 0 or busy_timeout < 0:
            raise ValueError("lease_seconds and max_sleep must be > 0, timeouts >= 0")
        if retry_backoff < 0 or max_backoff < retry_backoff:
            raise ValueError("need 0 <= retry_backoff <= max_backoff")
        if not 0 <= lookahead <= min(1.0, lease_seconds / 3):
            raise ValueError("lookahead must be between 0 and min(1 s, lease_seconds / 3)")
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.alarm: Alarm = alarm if alarm is not None else LoggingAlarm()
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self.retry_backoff = retry_backoff
        self.max_backoff = max_backoff
        self.max_sleep = max_sleep
        self.shutdown_timeout = shutdown_timeout
        self.path = _sqlite_path(url)
        # A private in-memory database cannot be read from a second connection, which the
        # check of a schedule claimed ahead needs (see _still_ours): no claiming ahead there.
        self.lookahead = 0.0 if self.path == ":memory:" else lookahead
        self._busy_timeout = busy_timeout
        self._rng = random.Random(seed)
        self._lock = threading.RLock()
        self._cond = threading.Condition()
        self._wake_seq = 0
        self._sleep_until: datetime | None = None  # when the local dispatcher wakes next
        self._running = False
        # Schedules whose invocation on a fire thread succeeded, (name, lease owner), to be
        # deleted by the dispatcher's next transaction; appended to only while it runs.
        self._succeeded: list[tuple[str, str]] = []
        self._succeeded_lock = threading.Lock()
        self._deferring = False
        self._own_socket: str | None = None
        self._sender: socket.socket | None = None
        self.wake_dir = self._wake_dir(wake_path)
        try:
            self._conn = sqlite3.connect(
                self.path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
            )
            self._conn.row_factory = sqlite3.Row
            self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
            if self.path != ":memory:":
                self._conn.execute("PRAGMA journal_mode = WAL")
            # WAL with synchronous=NORMAL cannot corrupt, but a power cut may lose the last
            # commits; the reconciler re-creates lost schedules, and provisioning stays fast.
            self._conn.execute("PRAGMA synchronous = NORMAL")
            self._migrate()
        except sqlite3.Error as exc:
            self._close_quietly()
            raise SchedulerError(f"cannot open scheduler database {self.path!r}: {exc}") from exc
        except SchedulerError:
            self._close_quietly()
            raise

    # ----------------------------------------------------------------- plumbing
    def _close_quietly(self) -> None:
        conn = getattr(self, "_conn", None)
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def _migrate(self) -> None:
        with self._write() as conn:
            for statement in _SCHEMA.split(";"):
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

    def _rollback(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._conn.execute("ROLLBACK")

    def _read(self, sql: str, params: tuple[object, ...] = ()) -> builtins.list[sqlite3.Row]:
        with self._lock:
            try:
                return self._conn.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise SchedulerError(f"scheduler database: {exc}") from exc

    # ----------------------------------------------------------------- Scheduler
    def create(
        self,
        name: str,
        group: str,
        at_local: datetime,
        timezone: str,
        payload: Mapping[str, str],
        client_token: str,
        max_retries: int = 2,
    ) -> Schedule:
        schedule = rules.build_schedule(
            name,
            group,
            at_local,
            timezone,
            payload,
            client_token,
            max_retries,
            created_at=self.clock.now(),
        )
        with self._write() as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM schedules WHERE name = ?", (name,)
            ).fetchone()
            if row is not None:
                if row["client_token"] == client_token:
                    return _row_to_schedule(row)
                raise _conflict(name)
            self._insert(conn, schedule)
        self._wake(schedule.due_at)
        return schedule

    def create_many(
        self, items: Sequence[tuple[str, str, datetime, str, Mapping[str, str], str, int]]
    ) -> builtins.list[Schedule | Conflict]:
        """:meth:`create` for many schedules in one transaction (not part of the port).

        Each item holds the positional arguments of :meth:`create`. The result has one entry
        per item, in order: the new schedule, the existing one (same name and token), or a
        :class:`Conflict` (same name, another token), which is returned, not raised, so one
        clash does not lose the batch. A repeated name within the batch behaves as two calls.
        InvalidField and SchedulerError are raised and nothing is written. Provisioning a
        campaign makes one call per chunk instead of one transaction per schedule.
        """
        now = self.clock.now()
        schedules = [rules.build_schedule(*item, created_at=now) for item in items]
        if not schedules:
            return []
        with self._write() as conn:
            if self._insert_new(conn, schedules):
                out: builtins.list[Schedule | Conflict] = list(schedules)
                created = schedules
            else:
                out, created = self._insert_checked(conn, schedules)
        if created:
            self._wake(min(s.due_at for s in created))
        return out

    @staticmethod
    def _insert_new(conn: sqlite3.Connection, schedules: Sequence[Schedule]) -> bool:
        """Insert ``schedules`` if every name is new (the common case: a fresh provisioning
        chunk) and say so; otherwise insert nothing and return False. One statement, no
        lookup: the rows taken are counted, and a skipped one undoes the batch."""
        if len({s.name for s in schedules}) != len(schedules):
            return False
        conn.execute("SAVEPOINT sq_bulk_schedules")
        taken = conn.executemany(
            _INSERT + " ON CONFLICT (name) DO NOTHING", [_insert_params(s) for s in schedules]
        ).rowcount
        if taken != len(schedules):
            conn.execute("ROLLBACK TO SAVEPOINT sq_bulk_schedules")
        conn.execute("RELEASE SAVEPOINT sq_bulk_schedules")
        return taken == len(schedules)

    @staticmethod
    def _insert_checked(
        conn: sqlite3.Connection, schedules: Sequence[Schedule]
    ) -> tuple[builtins.list[Schedule | Conflict], builtins.list[Schedule]]:
        """:meth:`create_many`'s results when some names exist or repeat: looked up first."""
        out: builtins.list[Schedule | Conflict] = []
        created: dict[str, Schedule] = {}
        existing: dict[str, tuple[str, sqlite3.Row]] = {}
        names = [s.name for s in schedules]
        for start in range(0, len(names), _IN_LIMIT):
            part = names[start : start + _IN_LIMIT]
            marks = ", ".join("?" * len(part))
            for row in conn.execute(
                f"SELECT {_COLUMNS} FROM schedules WHERE name IN ({marks})", part
            ):
                existing[row["name"]] = (row["client_token"], row)
        fresh: builtins.list[Schedule] = []
        for schedule in schedules:
            found = created.get(schedule.name)
            if found is not None:
                same = found.client_token == schedule.client_token
                out.append(found if same else _conflict(schedule.name))
            elif schedule.name in existing:
                token, row = existing[schedule.name]
                same = token == schedule.client_token
                out.append(_row_to_schedule(row) if same else _conflict(schedule.name))
            else:
                created[schedule.name] = schedule
                fresh.append(schedule)
                out.append(schedule)
        conn.executemany(_INSERT, [_insert_params(s) for s in fresh])
        return out, fresh

    def _insert(self, conn: sqlite3.Connection, schedule: Schedule) -> None:
        conn.execute(_INSERT, _insert_params(schedule))

    def delete(self, name: str) -> None:
        rules.check_name(name)
        with self._write() as conn:
            conn.execute("DELETE FROM schedules WHERE name = ?", (name,))

    def get(self, name: str) -> Schedule | None:
        rules.check_name(name)
        rows = self._read(f"SELECT {_COLUMNS} FROM schedules WHERE name = ?", (name,))
        return _row_to_schedule(rows[0]) if rows else None

    def list(self, group: str, *, after: str | None = None, limit: int = 1000) -> list[Schedule]:
        rules.check_group(group)
        rules.check_limit(limit)
        rows = self._read(
            f"SELECT {_COLUMNS} FROM schedules WHERE grp = ? AND name > ? ORDER BY name LIMIT ?",
            (group, after or "", limit),
        )
        return [_row_to_schedule(row) for row in rows]

    def dead_letters(self, *, limit: int = 1000) -> builtins.list[DeadLetter]:
        """Dead letters, oldest first."""
        rules.check_limit(limit)
        rows = self._read("SELECT * FROM dead_letters ORDER BY seq LIMIT ?", (limit,))
        return [_row_to_letter(row) for row in rows]

    def redrive(self, dead_letter_id: str) -> Schedule:
        """Re-create the letter's schedule, due now, with a fresh token; remove the letter.

        If a schedule of that name exists already (the reconciler re-created it, say), the
        letter is removed and that schedule returned: the work is scheduled once, not twice.
        """
        now = self.clock.now()
        with self._write() as conn:
            letter = conn.execute(
                "SELECT * FROM dead_letters WHERE id = ?", (dead_letter_id,)
            ).fetchone()
            if letter is None:
                raise NotFound("dead letter", dead_letter_id)
            conn.execute("DELETE FROM dead_letters WHERE id = ?", (dead_letter_id,))
            existing = conn.execute(
                f"SELECT {_COLUMNS} FROM schedules WHERE name = ?", (letter["schedule_name"],)
            ).fetchone()
            if existing is not None:
                return _row_to_schedule(existing)
            schedule = Schedule(
                name=letter["schedule_name"],
                group=letter["grp"],
                at_local=rules.local_now(now, letter["timezone"]),
                timezone=letter["timezone"],
                payload=json.loads(letter["payload"]),
                client_token=new_token(),
                due_at=now,
                max_retries=letter["max_retries"],
                created_at=now,
            )
            self._insert(conn, schedule)
        self._wake(schedule.due_at)
        return schedule

    def leases(self) -> dict[str, str]:
        """Schedules currently leased (expired leases included): name -> lease owner."""
        rows = self._read(
            "SELECT name, lease_owner FROM schedules WHERE lease_owner IS NOT NULL ORDER BY name"
        )
        return {row["name"]: row["lease_owner"] for row in rows}

    def close(self) -> None:
        with self._lock:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            if self._sender is not None:
                self._sender.close()
                self._sender = None

    def __enter__(self) -> EmbeddedScheduler:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ----------------------------------------------------------------- firing
    def fire_due(self, target: Target) -> int:
        """Invoke every schedule due at ``clock.now()``, once, in due order, on this thread.

        The same leases, retries, dead letters and alarm as :meth:`run`, without threads or
        sleeping: for tests on a fake clock. Returns how many invocations were made.
        """
        owner = self._new_owner()
        claimed = self._claim(owner, self.clock.now(), limit=None)
        fired = 0
        try:
            for schedule in claimed:
                fired += 1
                self._invoke(schedule, target, owner)
        finally:
            if fired < len(claimed):
                self._release(owner, {s.name for s in claimed[fired:]})
        return fired

    def run(self, target: Target, stop: threading.Event) -> None:
        """Fire due schedules against ``target`` until ``stop`` is set (the Dispatcher port)."""
        with self._lock:
            if self._running:
                raise RuntimeError("this EmbeddedScheduler is already dispatching")
            self._running = True
        with self._succeeded_lock:
            self._deferring = True
        owner = self._new_owner()
        done = threading.Event()
        listener = self._bind_wake_socket()
        watcher = threading.Thread(
            target=self._watch, args=(stop, done, listener), name="sendqueue-wake", daemon=True
        )
        watcher.start()
        in_flight: dict[str, threading.Event] = {}  # name -> set when its invocation ended
        jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        for n in range(self.concurrency):
            threading.Thread(
                target=self._fire_loop,
                args=(jobs, target, owner, stop),
                name=f"sendqueue-fire-{n}",
                daemon=True,  # a target hung past shutdown_timeout must not keep the process
            ).start()
        renew_every = self.lease_seconds / 3
        next_renew = time.monotonic() + renew_every
        error_pause = 0.5
        try:
            while not stop.is_set():
                seq = self._seq()
                for name in [n for n, ended in in_flight.items() if ended.is_set()]:
                    del in_flight[name]
                timeout = self.max_sleep
                try:
                    if in_flight and time.monotonic() >= next_renew:
                        self._renew(owner)
                        next_renew = time.monotonic() + renew_every
                    free = self.concurrency - len(in_flight)
                    if free > 0:
                        now = self.clock.now()
                        claimed = self._claim(owner, now, limit=free, ahead=self.lookahead)
                        if stop.is_set():
                            self._release(owner, {s.name for s in claimed})
                            break
                        for schedule in claimed:
                            ended = threading.Event()
                            jobs.put((schedule, ended, schedule.due_at > now))
                            in_flight[schedule.name] = ended
                        if len(claimed) == free:
                            continue
                        upcoming = self._next_available(owner)
                        if upcoming is not None:
                            wait = (upcoming - self.clock.now()).total_seconds()
                            timeout = min(timeout, wait)
                    if in_flight:
                        timeout = min(timeout, next_renew - time.monotonic())
                    error_pause = 0.5
                except SchedulerError as exc:
                    log.error("dispatcher: %s; retrying in %.1f s", exc, error_pause)
                    timeout, error_pause = error_pause, min(error_pause * 2, self.max_sleep)
                if timeout > 0:
                    self._sleep(seq, timeout)
        finally:
            try:
                self._drain(owner, in_flight)
            finally:
                for _ in range(self.concurrency):
                    jobs.put(None)  # the fire threads end once their invocation returns
                done.set()
                watcher.join(timeout=5)
                self._unbind_wake_socket(listener)
                with self._cond:
                    self._sleep_until = None
                with self._lock:
                    self._running = False

    def _fire_loop(
        self,
        jobs: queue.SimpleQueue[_Job | None],
        target: Target,
        owner: str,
        stop: threading.Event,
    ) -> None:
        """One of the dispatcher's fire threads: invoke what it hands over, until told to end.

        A schedule claimed ahead of its due time (``lookahead``) is waited for here, so the
        claim's transaction is not between the due time and the invocation; it is invoked
        only once due, only if ``stop`` is still unset (else its lease is released with the
        others on shutdown), and only if it is still ours: a schedule deleted or replaced
        after the claim but before its due time does not fire, as if it had not been claimed.
        The event is set (and the dispatcher notified) once the invocation has ended (or was
        skipped): the dispatcher then counts the slot as free.
        """
        reader: sqlite3.Connection | None = None
        try:
            while (job := jobs.get()) is not None:
                schedule, ended, ahead = job
                try:
                    if ahead:
                        if not self._wait_until_due(schedule, stop):
                            continue
                        if reader is None:
                            reader = self._reader()
                        if not self._still_ours(reader, schedule, owner):
                            continue
                    self._invoke(schedule, target, owner, defer_delete=True)
                finally:
                    ended.set()
                    self._notify()
        finally:
            if reader is not None:
                with contextlib.suppress(sqlite3.Error):
                    reader.close()

    def _wait_until_due(self, schedule: Schedule, stop: threading.Event) -> bool:
        """Wait until ``schedule`` is due (never return early); False if ``stop`` was set."""
        while not stop.is_set():
            left = (schedule.due_at - self.clock.now()).total_seconds()
            if left <= 0:
                return True
            stop.wait(left)
        return False

    def _reader(self) -> sqlite3.Connection:
        """A fire thread's own read connection: in WAL mode, its reads never wait for the
        dispatcher's write transactions (nor for the lock on the shared connection)."""
        reader = sqlite3.connect(self.path, timeout=self._busy_timeout, isolation_level=None)
        reader.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
        return reader

    def _still_ours(self, reader: sqlite3.Connection, schedule: Schedule, owner: str) -> bool:
        """Is ``schedule`` still there, unchanged and leased by us? On a database error, say
        yes: the claim stands, as for a schedule claimed when due (at-least-once)."""
        try:
            row = reader.execute(
                "SELECT 1 FROM schedules WHERE name = ? AND lease_owner = ? "
                "AND client_token = ? AND due_at = ?",
                (schedule.name, owner, schedule.client_token, _us(schedule.due_at)),
            ).fetchone()
        except sqlite3.Error as exc:
            log.warning("schedule %s: cannot re-check it before firing: %s", schedule.name, exc)
            return True
        if row is None:
            log.info("schedule %s was deleted or replaced after being claimed", schedule.name)
        return row is not None

    def _drain(self, owner: str, in_flight: dict[str, threading.Event]) -> None:
        """Let running targets finish (bounded), then release what we still hold."""
        deadline = time.monotonic() + self.shutdown_timeout
        renew_every = self.lease_seconds / 3
        next_renew = time.monotonic() + renew_every
        while True:
            seq = self._seq()
            running = {n for n, ended in in_flight.items() if not ended.is_set()}
            left = deadline - time.monotonic()
            if not running or left <= 0:
                break
            if time.monotonic() >= next_renew:
                with contextlib.suppress(SchedulerError):
                    self._renew(owner)
                next_renew = time.monotonic() + renew_every
            self._sleep(seq, min(left, max(0.01, next_renew - time.monotonic())))
        if running:
            # Still running: keep their leases, so nobody fires them twice while they finish;
            # should this process die now, they fire again when the leases expire.
            log.warning(
                "dispatcher stopped with %d invocation(s) still running: %s",
                len(running),
                ", ".join(sorted(running)),
            )
        with self._succeeded_lock:
            # Invocations that end from now on (past the shutdown timeout) delete at once.
            self._deferring = False
        try:
            self._release(owner, None, keep=running)  # deletes the deferred ones first
        except SchedulerError as exc:
            log.error("dispatcher: could not release leases on shutdown: %s", exc)

    def _invoke(
        self, schedule: Schedule, target: Target, owner: str, *, defer_delete: bool = False
    ) -> None:
        try:
            target(dict(schedule.payload))
        except Exception as exc:
            try:
                letter = self._record_failure(schedule, owner, exc)
            except SchedulerError as db_exc:
                log.error("schedule %s failed, and recording it failed: %s", schedule.name, db_exc)
                return
            if letter is not None:
                self._raise_alarm(letter)
        else:
            if defer_delete:
                with self._succeeded_lock:
                    if self._deferring:
                        self._succeeded.append((schedule.name, owner))
                        return
            try:
                self._record_success(schedule, owner)
            except SchedulerError as db_exc:
                # The lease will expire and the schedule fire again: at-least-once.
                log.error("schedule %s ran, but deleting it failed: %s", schedule.name, db_exc)

    def _raise_alarm(self, letter: DeadLetter) -> None:
        try:
            self.alarm.raise_alarm(letter)
        except Exception:
            log.exception("raising the alarm for dead letter %s failed", letter.id)

    # ----------------------------------------------------------------- lease bookkeeping
    def _new_owner(self) -> str:
        return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"

    def _claim(
        self, owner: str, now: datetime, *, limit: int | None, ahead: float = 0.0
    ) -> builtins.list[Schedule]:
        """Lease up to ``limit`` schedules due by ``now`` + ``ahead`` seconds (None: all), in
        due order. The lease covers the wait until the due time, then ``lease_seconds``."""
        now_us = _us(now)
        horizon_us = _us(now + timedelta(seconds=ahead))
        until = _us(now + timedelta(seconds=ahead + self.lease_seconds))
        claimed: builtins.list[Schedule] = []
        letters: builtins.list[DeadLetter] = []
        with self._write_deleting_succeeded() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM schedules WHERE due_at <= ? "
                "AND (lease_owner IS NULL OR (lease_until <= ? AND lease_owner != ?)) "
                "ORDER BY due_at, name LIMIT ?",
                (horizon_us, now_us, owner, -1 if limit is None else limit),
            ).fetchall()
            for row in rows:
                schedule = _row_to_schedule(row)
                if row["lease_owner"] is not None:
                    # The invocation that held this lease never finished: count it as failed.
                    schedule = replace(schedule, attempts=schedule.attempts + 1)
                    if schedule.attempts > schedule.max_retries:
                        error = (
                            f"LeaseExpired: the invocation by {row['lease_owner']} did not "
                            "finish before its lease expired (did the process die?)"
                        )
                        letters.append(self._bury(conn, schedule, error, now))
                        continue
                conn.execute(
                    "UPDATE schedules SET lease_owner = ?, lease_until = ?, attempts = ? "
                    "WHERE name = ?",
                    (owner, until, schedule.attempts, schedule.name),
                )
                claimed.append(schedule)
        for letter in letters:
            self._raise_alarm(letter)
        return claimed

    def _bury(
        self, conn: sqlite3.Connection, schedule: Schedule, error: str, now: datetime
    ) -> DeadLetter:
        """Move ``schedule`` to the dead letters (inside the caller's transaction)."""
        letter = DeadLetter(
            id="dl-" + secrets.token_hex(8),
            schedule_name=schedule.name,
            group=schedule.group,
            payload=dict(schedule.payload),
            error=error,
            attempts=schedule.attempts,
            failed_at=now,
        )
        conn.execute(
            "INSERT INTO dead_letters (id, schedule_name, grp, timezone, payload, error, "
            "attempts, max_retries, failed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                letter.id,
                letter.schedule_name,
                letter.group,
                schedule.timezone,
                _payload_json(dict(letter.payload)),
                letter.error,
                letter.attempts,
                schedule.max_retries,
                _us(now),
            ),
        )
        conn.execute("DELETE FROM schedules WHERE name = ?", (schedule.name,))
        log.error(
            "schedule %s moved to the dead letters after %d attempt(s): %s",
            schedule.name,
            letter.attempts,
            error,
        )
        return letter

    @contextlib.contextmanager
    def _write_deleting_succeeded(self) -> Iterator[sqlite3.Connection]:
        """:meth:`_write`, whose transaction first deletes the schedules whose deferred
        invocations succeeded (see the module docstring); if it fails, they wait for the
        next one."""
        with self._succeeded_lock:
            taken, self._succeeded = self._succeeded, []
        try:
            with self._write() as conn:
                for name, owner in taken:
                    gone = conn.execute(
                        "DELETE FROM schedules WHERE name = ? AND lease_owner = ?", (name, owner)
                    ).rowcount
                    if not gone:
                        log.info(
                            "schedule %s ran but was deleted, replaced or re-leased meanwhile",
                            name,
                        )
                yield conn
        except BaseException:
            if taken:
                with self._succeeded_lock:
                    self._succeeded[:0] = taken
            raise

    def _record_success(self, schedule: Schedule, owner: str) -> None:
        with self._write() as conn:
            gone = conn.execute(
                "DELETE FROM schedules WHERE name = ? AND lease_owner = ?", (schedule.name, owner)
            ).rowcount
        if not gone:
            log.info(
                "schedule %s ran but was deleted, replaced or re-leased meanwhile", schedule.name
            )

    def _record_failure(self, schedule: Schedule, owner: str, exc: Exception) -> DeadLetter | None:
        now = self.clock.now()
        with self._write() as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM schedules WHERE name = ? AND lease_owner = ?",
                (schedule.name, owner),
            ).fetchone()
            if row is None:
                return None  # deleted or replaced while it ran: nothing left to retry
            current = _row_to_schedule(row)
            attempts = current.attempts + 1
            if attempts > current.max_retries:
                return self._bury(
                    conn, replace(current, attempts=attempts), rules.error_text(exc), now
                )
            delay = rules.retry_delay(attempts, self.retry_backoff, self.max_backoff, self._rng)
            conn.execute(
                "UPDATE schedules SET attempts = ?, due_at = ?, lease_owner = NULL, "
                "lease_until = NULL WHERE name = ?",
                (attempts, _us(now + delay), schedule.name),
            )
        log.warning(
            "schedule %s failed (attempt %d of %d), retrying in %.1f s: %s",
            schedule.name,
            attempts,
            current.max_retries + 1,
            delay.total_seconds(),
            rules.error_text(exc),
        )
        return None

    def _renew(self, owner: str) -> None:
        until = _us(self.clock.now() + timedelta(seconds=self.lease_seconds))
        with self._write() as conn:
            conn.execute(
                "UPDATE schedules SET lease_until = ? WHERE lease_owner = ?", (until, owner)
            )

    def _release(
        self, owner: str, names: set[str] | None, *, keep: set[str] | frozenset[str] = frozenset()
    ) -> None:
        """Give up our leases on ``names`` (None: all of ours) except ``keep``."""
        with self._write_deleting_succeeded() as conn:
            rows = conn.execute(
                "SELECT name FROM schedules WHERE lease_owner = ?", (owner,)
            ).fetchall()
            release = [
                (r["name"],)
                for r in rows
                if (names is None or r["name"] in names) and r["name"] not in keep
            ]
            conn.executemany(
                "UPDATE schedules SET lease_owner = NULL, lease_until = NULL WHERE name = ?",
                release,
            )
        if release:
            self._notify()

    def _next_available(self, owner: str) -> datetime | None:
        """When the next schedule becomes claimable: ``lookahead`` before the earliest free
        due time, or the earliest expiry of someone else's lease."""
        free = self._read(
            "SELECT due_at FROM schedules WHERE lease_owner IS NULL ORDER BY due_at LIMIT 1"
        )
        held = self._read(
            "SELECT lease_until FROM schedules WHERE lease_owner IS NOT NULL "
            "AND lease_owner != ? ORDER BY lease_until LIMIT 1",
            (owner,),
        )
        ahead = timedelta(seconds=self.lookahead)
        times = [_dt(r[0]) - ahead for r in free] + [_dt(r[0]) for r in held]
        return min(times) if times else None

    # ----------------------------------------------------------------- waking up
    def _seq(self) -> int:
        with self._cond:
            return self._wake_seq

    def _notify(self) -> None:
        with self._cond:
            self._wake_seq += 1
            self._cond.notify_all()

    def _sleep(self, seq: int, timeout: float) -> None:
        """Wait up to ``timeout`` seconds, unless something happened since ``seq`` was read."""
        with self._cond:
            if self._wake_seq != seq:
                return
            self._sleep_until = self.clock.now() + timedelta(seconds=timeout)
            self._cond.wait(timeout)
            self._sleep_until = None

    def _wake(self, due: datetime) -> None:
        """A schedule due at ``due`` was added: wake whichever dispatcher would sleep past it."""
        with self._cond:
            # Not asleep (None) may mean "about to sleep on a next-due time read before this
            # schedule existed": bumping the sequence makes that sleep return at once.
            if self._sleep_until is None or due < self._sleep_until:
                self._wake_seq += 1
                self._cond.notify_all()
        if self.wake_dir is None:
            return
        # Another process's dispatcher never sleeps longer than max_sleep; only a schedule due
        # before then can need it earlier.
        if due - self.clock.now() > timedelta(seconds=self.max_sleep):
            return
        self._send_wakeups()

    def _wake_dir(self, wake_path: str | os.PathLike[str] | None) -> Path | None:
        if wake_path is not None:
            return Path(wake_path)
        if self.path == ":memory:" or not hasattr(socket, "AF_UNIX"):
            return None
        real = os.path.realpath(self.path)
        beside = Path(real + ".wake")
        if len(os.fsencode(beside)) + 24 <= _SUN_PATH_MAX:
            return beside
        digest = hashlib.sha256(os.fsencode(real)).hexdigest()[:20]
        return Path(tempfile.gettempdir()) / f"sendqueue-wake-{digest}"

    def _send_wakeups(self) -> None:
        assert self.wake_dir is not None
        try:
            entries = [e for e in os.scandir(self.wake_dir) if e.name.endswith(".sock")]
        except OSError:
            return  # no dispatcher has ever run here
        with self._lock:
            if self._sender is None:
                try:
                    self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                    self._sender.setblocking(False)
                except OSError:
                    return
            sender = self._sender
        for entry in entries:
            if entry.name == self._own_socket:
                continue
            try:
                sender.sendto(b"w", entry.path)
            except OSError as exc:
                # ECONNREFUSED: nobody is bound any more (its process died): tidy up.
                # EAGAIN/ENOBUFS: the dispatcher has wake-ups queued already; that is enough.
                if exc.errno == errno.ECONNREFUSED:
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)

    def _bind_wake_socket(self) -> socket.socket | None:
        if self.wake_dir is None:
            return None
        name = f"{os.getpid()}-{secrets.token_hex(4)}.sock"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            try:
                self.wake_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
                listener.bind(str(self.wake_dir / name))
            except FileNotFoundError:
                # Another dispatcher removed the empty directory between our mkdir and bind.
                self.wake_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
                listener.bind(str(self.wake_dir / name))
        except OSError as exc:
            listener.close()
            log.warning(
                "dispatcher: no wake-up socket in %s (%s); other processes' new schedules "
                "are noticed within %.0f s",
                self.wake_dir,
                exc,
                self.max_sleep,
            )
            return None
        listener.settimeout(_WATCH_INTERVAL)
        self._own_socket = name
        # Probing every socket there removes those left by killed processes (ECONNREFUSED);
        # live dispatchers merely wake up once for nothing.
        self._send_wakeups()
        return listener

    def _unbind_wake_socket(self, listener: socket.socket | None) -> None:
        if listener is None:
            return
        name, self._own_socket = self._own_socket, None
        listener.close()
        if self.wake_dir is not None and name is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.wake_dir / name)
            with contextlib.suppress(OSError):
                self.wake_dir.rmdir()  # only succeeds when no other dispatcher is bound there

    def _watch(
        self, stop: threading.Event, done: threading.Event, listener: socket.socket | None
    ) -> None:
        """Turn wake-up datagrams and a set ``stop`` into notifications of the dispatcher."""
        while not done.is_set():
            if stop.is_set():
                self._notify()
                if done.wait(_WATCH_INTERVAL):
                    return
                continue
            if listener is None:
                stop.wait(_WATCH_INTERVAL)
                continue
            try:
                listener.recv(16)
            except TimeoutError:
                continue
            except OSError:
                if done.is_set():
                    return
                listener = None  # broken socket: fall back to watching ``stop``
                continue
            self._notify()
