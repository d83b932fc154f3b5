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
  thread waits for the exact due time before invoking (why: docs/performance.md). Nothing
  fires before its due time. A schedule claimed ahead is read again right before its invocation
  (on the fire thread's own connection, which never waits for the dispatcher's writes) and
  skipped if it was deleted or replaced meanwhile: a delete before the due time still
  cancels it. Once invoked, it is in flight as before (a delete does not stop it).
  If the process dies, the lease expires and another dispatcher fires the schedule again:
  delivery is at-least-once. An expired lease counts as a failed attempt, so a target that
  kills its process every time ends in the dead-letter queue instead of looping.
- At most ``concurrency`` targets run at once, on ``concurrency`` daemon threads that live as
  long as the dispatcher: a target keeps per-thread state (the SMTP mailer's connection)
  from one invocation to the next. While all of them are busy, up to as many more due
  schedules wait leased in the dispatcher's queue: it claims in batches (once the queue is
  down to one per thread), so a send costs a fraction of a claim's transaction. A process
  that dies holds those leases too: when they expire, each counts as a failed attempt, as
  for the ones that ran (a started invocation is not written down, which would cost the
  write per send the batches save); the reconciler schedules again a dead letter's task.
- A target that returns deletes its schedule. On the dispatcher's fire threads the delete
  is deferred to the dispatcher's next transaction (the claim that refills the freed slots, or
  the release on shutdown), so a send costs no write of its own on this file; the lease keeps
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
import json
import os
import random
import socket
import sqlite3
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import cast

from sendqueue.adapters import scheduler_rules as rules
from sendqueue.adapters.alarm import LoggingAlarm
from sendqueue.adapters.clock import SystemClock
from sendqueue.adapters.embedded.dispatcher import Dispatcher
from sendqueue.adapters.embedded.store import (
    COLUMNS,
    IN_LIMIT,
    INSERT,
    INSERT_SHARED,
    SCHEMA_VERSION,
    conflict,
    due_params,
    due_rows_json,
    from_us,
    insert_params,
    row_to_letter,
    row_to_schedule,
    sqlite_path,
    to_us,
)
from sendqueue.adapters.scheduler_rules import CheckedDue
from sendqueue.adapters.sqlite_checkpoints import WalCheckpoints
from sendqueue.domain.errors import Conflict, NotFound, SchedulerError
from sendqueue.domain.models import DeadLetter, new_token
from sendqueue.ports import Alarm, Clock, DueArgs, Schedule

__all__ = ["SCHEMA_VERSION", "EmbeddedScheduler"]


class _NamesTaken(Exception):
    """A submitted batch met a name that exists: its write is undone."""


def _raise(exc: Exception) -> builtins.list[Conflict | None]:
    raise exc


def _answered(
    write: Callable[[], builtins.list[Conflict | None]],
) -> Callable[[], builtins.list[Conflict | None]]:
    """A wait for a batch written now: its answer, or its SchedulerError raised at the wait."""
    try:
        done = write()
    except SchedulerError as exc:
        failed = exc
        return lambda: _raise(failed)
    return lambda: done


class EmbeddedScheduler(Dispatcher):
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
        self.path = sqlite_path(url)
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
        # submit_many's one thread (in order), started by its first write
        self._writes = ThreadPoolExecutor(1, thread_name_prefix="scheduler-writer")
        self._own_socket: str | None = None
        self._sender: socket.socket | None = None
        self.wake_dir = self._wake_dir(wake_path)
        # Bulk writes' log folded on a thread of its own; a database in memory has no log.
        self._checkpoints = None if self.path == ":memory:" else WalCheckpoints(self.path)
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
            # Fold the log back every ~40 MB, not every 4 MB (SQLite's default): each fold costs
            # two fsyncs, and a provisioning run writes a schedule per email; the log is cut
            # back to 4 MB once folded (as the task store does, adapters/sql/schema.py).
            self._conn.execute("PRAGMA wal_autocheckpoint = 10000")
            self._conn.execute(f"PRAGMA journal_size_limit = {4 * 1024 * 1024}")
            self._migrate()
        except sqlite3.Error as exc:
            self._close_quietly()
            raise SchedulerError(f"cannot open scheduler database {self.path!r}: {exc}") from exc
        except SchedulerError:
            self._close_quietly()
            raise

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
                f"SELECT {COLUMNS} FROM schedules WHERE name = ?", (name,)
            ).fetchone()
            if row is not None:
                if row["client_token"] == client_token:
                    return row_to_schedule(row)
                raise conflict(name)
            self._insert(conn, schedule)
        self._wake(schedule.due_at)
        return schedule

    def create_many(self, items: Sequence[DueArgs]) -> builtins.list[Conflict | None]:
        """:meth:`create` for many schedules in one transaction (:class:`~sendqueue.ports.
        BulkScheduler`).

        Each item holds the positional arguments of :meth:`create` with the instant the
        schedule is due in place of its wall time (:data:`~sendqueue.ports.DueArgs`). The
        result has one entry per item, in order: None where the schedule now exists as asked
        (made here, or there already with the same token), a :class:`Conflict` where the name
        is held with another token (returned, not raised, so one clash does not lose the
        batch). A repeated name within the batch behaves as two calls. InvalidField and
        SchedulerError are raised and nothing is written. Provisioning a campaign makes one
        call per chunk instead of one transaction per schedule; its rows are built from the
        checked items, with no Schedule object per item.
        """
        return self._create_checked(rules.check_due_many(items))

    def submit_many(self, items: Sequence[DueArgs]) -> Callable[[], builtins.list[Conflict | None]]:
        """:meth:`create_many` with its write on this scheduler's writer thread
        (:class:`~sendqueue.ports.BackgroundBulkScheduler`): the items are checked and their
        values built here, and the caller goes on while SQLite writes them.

        The write is one statement (:data:`INSERT_SHARED`), which sqlite3 runs without
        Python's lock: an ``executemany`` there would take the lock back after every row, and
        wait for it each time while the caller's thread runs Python. Only a batch of new,
        distinct names that shares its group, zone and retries goes that way (a provisioning
        chunk); if a name turns out to exist, the write is undone and :meth:`create_many`'s
        path runs when the caller waits. Any other batch is written before this returns (its
        SchedulerError raised at the wait, as the port says).
        """
        checked = rules.check_due_many(items)
        first = checked[0] if checked else None
        if (
            first is None
            or any((c[1], c[3], c[6]) != (first[1], first[3], first[6]) for c in checked)
            or len({c[0] for c in checked}) != len(checked)
        ):
            return _answered(lambda: self._create_checked(checked))
        shared = (first[1], first[3], first[6], to_us(self.clock.now()))
        first_due = min(c[7] for c in checked)
        try:
            written = self._writes.submit(
                self._insert_shared, due_rows_json(checked), shared, len(checked), first_due
            )
        except RuntimeError:  # closed: no more writes
            closed = SchedulerError(f"scheduler database {self.path!r} is closed")
            return lambda: _raise(closed)

        def wait() -> builtins.list[Conflict | None]:
            if written.result():
                return [None] * len(checked)
            return self._create_checked(checked)  # some name exists: looked up, here

        return wait

    def _create_checked(self, checked: Sequence[CheckedDue]) -> builtins.list[Conflict | None]:
        """:meth:`create_many` of checked items."""
        if not checked:
            return []
        created_us = to_us(self.clock.now())
        rows = [due_params(item, created_us) for item in checked]
        with self._write() as conn:
            if self._insert_new(conn, rows):
                out: builtins.list[Conflict | None] = [None] * len(rows)
                fresh = rows
            else:
                out, fresh = self._insert_checked(conn, rows)
        self._bulk_written(len(fresh))
        if fresh:
            self._wake(from_us(min(cast(int, row[6]) for row in fresh)))  # its due_at
        return out

    def _insert_shared(
        self, values: str, shared: tuple[str, str, int, int], count: int, first_due: datetime
    ) -> bool:
        """On the writer thread: insert :meth:`submit_many`'s batch if every name is new, and
        wake the dispatchers; otherwise insert nothing and return False."""
        group, zone, retries, created_us = shared
        try:
            with self._write() as conn:
                taken = conn.execute(
                    INSERT_SHARED, (values, group, zone, retries, created_us)
                ).rowcount
                if taken != count:
                    raise _NamesTaken
        except _NamesTaken:
            return False
        self._bulk_written(count)
        self._wake(first_due)
        return True

    @staticmethod
    def _insert_new(conn: sqlite3.Connection, rows: Sequence[tuple[object, ...]]) -> bool:
        """Insert ``rows`` (:func:`due_params`) if every name is new (the common case: a
        fresh provisioning chunk) and say so; otherwise insert nothing and return False. One
        statement, no lookup: the rows taken are counted, and a skipped one undoes the batch."""
        if len({row[0] for row in rows}) != len(rows):
            return False
        conn.execute("SAVEPOINT sq_bulk_schedules")
        taken = conn.executemany(INSERT + " ON CONFLICT (name) DO NOTHING", rows).rowcount
        if taken != len(rows):
            conn.execute("ROLLBACK TO SAVEPOINT sq_bulk_schedules")
        conn.execute("RELEASE SAVEPOINT sq_bulk_schedules")
        return taken == len(rows)

    @staticmethod
    def _insert_checked(
        conn: sqlite3.Connection, rows: Sequence[tuple[object, ...]]
    ) -> tuple[builtins.list[Conflict | None], builtins.list[tuple[object, ...]]]:
        """:meth:`create_many`'s results when some names exist or repeat: looked up first.
        Inserts the rows whose name is free (the first of a repeated one), and returns them
        too."""
        held: dict[object, object] = {}  # name -> client token, stored or inserted here
        names = [row[0] for row in rows]
        for start in range(0, len(names), IN_LIMIT):
            part = names[start : start + IN_LIMIT]
            marks = ", ".join("?" * len(part))
            held.update(
                conn.execute(
                    f"SELECT name, client_token FROM schedules WHERE name IN ({marks})", part
                ).fetchall()
            )
        out: builtins.list[Conflict | None] = []
        fresh: builtins.list[tuple[object, ...]] = []
        for row in rows:
            name, token = row[0], row[5]
            if name not in held:
                held[name] = token
                fresh.append(row)
                out.append(None)
            else:
                out.append(None if held[name] == token else conflict(str(name)))
        conn.executemany(INSERT, fresh)
        return out, fresh

    def _insert(self, conn: sqlite3.Connection, schedule: Schedule) -> None:
        conn.execute(INSERT, insert_params(schedule))

    def delete(self, name: str) -> None:
        rules.check_name(name)
        with self._write() as conn:
            conn.execute("DELETE FROM schedules WHERE name = ?", (name,))

    def get(self, name: str) -> Schedule | None:
        rules.check_name(name)
        rows = self._read(f"SELECT {COLUMNS} FROM schedules WHERE name = ?", (name,))
        return row_to_schedule(rows[0]) if rows else None

    def list(self, group: str, *, after: str | None = None, limit: int = 1000) -> list[Schedule]:
        rules.check_group(group)
        rules.check_limit(limit)
        rows = self._read(
            f"SELECT {COLUMNS} FROM schedules WHERE grp = ? AND name > ? ORDER BY name LIMIT ?",
            (group, after or "", limit),
        )
        return [row_to_schedule(row) for row in rows]

    def dead_letters(self, *, limit: int = 1000) -> builtins.list[DeadLetter]:
        """Dead letters, oldest first."""
        rules.check_limit(limit)
        rows = self._read("SELECT * FROM dead_letters ORDER BY seq LIMIT ?", (limit,))
        return [row_to_letter(row) for row in rows]

    def dead_letter(self, dead_letter_id: str) -> DeadLetter | None:
        rows = self._read("SELECT * FROM dead_letters WHERE id = ?", (dead_letter_id,))
        return row_to_letter(rows[0]) if rows else None

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
                f"SELECT {COLUMNS} FROM schedules WHERE name = ?", (letter["schedule_name"],)
            ).fetchone()
            if existing is not None:
                return row_to_schedule(existing)
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
        self._writes.shutdown(wait=True)  # submitted writes end before the connection does
        with self._lock:
            checkpoints, self._checkpoints = self._checkpoints, None
            if checkpoints is not None:
                checkpoints.close()  # its thread never takes this lock
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            if self._sender is not None:
                self._sender.close()
                self._sender = None

    def __enter__(self) -> EmbeddedScheduler:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
