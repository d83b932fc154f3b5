"""The procrastinate execution layer: one-time schedules as procrastinate jobs on PostgreSQL.

:class:`ProcrastinateScheduler` is the :class:`~sendqueue.ports.Scheduler` and the
:class:`~sendqueue.ports.Dispatcher` of a fleet: any number of worker processes, on any number
of machines, share one PostgreSQL database (the task store's).
``SENDQUEUE_EXECUTION=procrastinate`` selects it.

How a schedule maps onto procrastinate:

- One job of the task ``sendqueue.fire`` per schedule. Its queue is the schedule's group, its
  queueing lock the schedule's name, ``scheduled_at`` the UTC instant of ``at_local`` in
  ``timezone`` (:func:`~sendqueue.adapters.scheduler_rules.due_at`), and its arguments hold
  everything else (payload, token, wall-clock time, zone, max_retries, created_at), so ``get``
  and ``list`` rebuild the :class:`~sendqueue.ports.Schedule` from procrastinate's own table.
- Parking: a schedule due more than ``horizon`` seconds (300) ahead waits in
  ``sendqueue_parked_schedules`` with the same arguments, and the periodic task
  ``sendqueue.promote`` (every ``horizon / 5`` seconds) defers it as a job once it is within
  the horizon. The reason is procrastinate's fetch: a poll that finds nothing due walks every
  waiting job (measured: 24-40 ms a poll with 20,000 waiting jobs, 40-110 ms with 100,000),
  so a campaign planned weeks ahead would make every idle poll of every worker that dear.
  Parked, the waiting set holds only the next few minutes of sends. ``get`` and ``list``
  read both places in one statement.
- A schedule exists while it is parked, or its job is ``todo``, or ``doing`` without an abort
  request.
  ``create`` checks that under a transaction-scoped advisory lock on the name, so the same name
  and token are idempotent and another token is a Conflict; procrastinate's unique index on
  waiting queueing locks backs it up. ``delete`` cancels a waiting job (deleted outright) and
  asks a running one to abort, which marks it deleted: whatever it then returns, it is neither
  retried nor dead-lettered, and a schedule created anew under the same name meanwhile
  survives it.
- The job's priority is minus its due time in seconds (since 2020), so procrastinate, which
  fetches by priority, fetches overdue jobs in due order and finds a due job at the head of its
  ``(priority, id)`` index.
- A successful job is deleted (the worker runs with ``delete_jobs="successful"``). A failed one
  is retried ``max_retries`` times (a per-schedule argument) with the shared exponential,
  jittered backoff (:func:`~sendqueue.adapters.scheduler_rules.retry_delay`) through a
  procrastinate retry strategy; the last failure is written to ``sendqueue_dead_letters`` (a
  table of this adapter, next to procrastinate's), the job ends ``failed`` in procrastinate, and
  the alarm is raised. The table keeps what procrastinate does not: the error text, the time
  zone and the time of failure. ``redrive`` defers a new job due now and deletes the letter
  and the failed job.
- Stalled jobs: a worker sends a heartbeat every ``stalled_after / 3`` seconds. The periodic
  task ``sendqueue.recover_stalled`` (de-duplicated across workers like every procrastinate
  periodic task) finds ``doing`` jobs whose worker has been silent for ``stalled_after`` seconds
  (or that have run longer than ``invocation_timeout``) and fires them again at once, counting
  the lost run as a failed attempt; one out of attempts goes to the dead letters. Delivery is
  at-least-once: the send worker's claim (Pending -> Running) and the reconciler's stale policy
  keep a second run from sending twice.
- The reconciler runs as the periodic task ``sendqueue.reconcile`` every
  ``reconcile_interval`` seconds (rounded to a cron step), once per tick across all workers; it
  invokes the target with ``{"kind": "reconcile"}``.

Timing: procrastinate finds due jobs by polling (``poll_interval``, 0.5 s by default instead of
procrastinate's 5 s); LISTEN/NOTIFY wakes workers at once for jobs deferred due now. With
several workers polling independently, a job waits at most ``poll_interval`` past its due time
before some worker fetches it, when a worker has a free slot.

Instants written by this adapter (created_at, retry and failure times) come from its clock;
procrastinate's fetch compares ``scheduled_at`` with the database server's ``now()``. Keep the
clocks of the workers and of the database in sync (NTP). Backend failures raise
:class:`~sendqueue.domain.errors.SchedulerError`.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import os
import random
import re
import secrets
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import psycopg
import psycopg_pool
from packaging.version import InvalidVersion, Version
from procrastinate import (
    App,
    BaseRetryStrategy,
    JobContext,
    PsycopgConnector,
    RetryDecision,
    SyncPsycopgConnector,
    sql,
)
from procrastinate import __version__ as PROCRASTINATE_VERSION
from procrastinate import exceptions as procrastinate_errors
from procrastinate import jobs as procrastinate_jobs
from procrastinate.manager import JobManager
from procrastinate.schema import SchemaManager
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from sendqueue.adapters import scheduler_rules as rules
from sendqueue.adapters.alarm import LoggingAlarm
from sendqueue.clock import SystemClock
from sendqueue.domain.errors import Conflict, InvalidField, NotFound, SchedulerError
from sendqueue.domain.models import DeadLetter, new_token
from sendqueue.ports import Alarm, Clock, Schedule, Target

__all__ = [
    "FIRE_TASK",
    "PERIODIC_QUEUE",
    "PROMOTE_TASK",
    "RECONCILE_TASK",
    "RECOVER_TASK",
    "ProcrastinateScheduler",
    "conninfo_from_url",
    "cron_every",
    "schema_version",
    "upgrade_schema",
]

log = logging.getLogger("sendqueue.scheduler.procrastinate")

FIRE_TASK = "sendqueue.fire"
RECONCILE_TASK = "sendqueue.reconcile"
RECOVER_TASK = "sendqueue.recover_stalled"
PROMOTE_TASK = "sendqueue.promote"
#: The queue of the periodic tasks; schedules live in queues named after their group.
PERIODIC_QUEUE = "sendqueue.periodic"

_PRIORITY_EPOCH = datetime(2020, 1, 1, tzinfo=UTC)
_INT4 = 2**31 - 1
_WATCH_INTERVAL = 0.1  # how quickly a set ``stop`` event is noticed
# pg_advisory_lock key serialising schema upgrades ("sq" + 3); the store's keys are 1 and 2.
_SCHEMA_LOCK_KEY = 0x7371_0003
_MIGRATION_FILE = re.compile(r"(\d+)\.(\d+)\.(\d+)_(\d+)_.*\.sql")

_JOB_COLUMNS = (
    "j.id, j.queue_name, j.task_name, j.args, j.scheduled_at, j.attempts, j.status, "
    "j.abort_requested"
)
# A parked schedule read with the column names of a job row (it has no job yet).
_PARKED_COLUMNS = (
    "0::bigint AS id, p.grp AS queue_name, 'sendqueue.fire'::varchar AS task_name, p.args, "
    "p.due_at AS scheduled_at, 0 AS attempts, 'todo'::procrastinate_job_status AS status, "
    "false AS abort_requested"
)
# A schedule is a todo job, or a doing job nobody asked to abort (deleted while it runs).
_LIVE = "(j.status = 'todo' OR (j.status = 'doing' AND NOT j.abort_requested))"

# Which procrastinate version's schema the database has (procrastinate records none itself).
_META_SCHEMA = """
CREATE TABLE IF NOT EXISTS sendqueue_procrastinate_schema (
    id integer PRIMARY KEY CHECK (id = 1),
    version text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""
_SENDQUEUE_SCHEMA = """
CREATE TABLE IF NOT EXISTS sendqueue_dead_letters (
    seq bigserial PRIMARY KEY,
    id text NOT NULL UNIQUE,
    job_id bigint UNIQUE,
    schedule_name text NOT NULL,
    grp text NOT NULL,
    timezone text NOT NULL,
    payload jsonb NOT NULL,
    max_retries integer NOT NULL,
    error text NOT NULL,
    attempts integer NOT NULL,
    failed_at timestamptz NOT NULL
);
-- Schedules due beyond the horizon wait here, not in procrastinate (see the module docstring).
CREATE TABLE IF NOT EXISTS sendqueue_parked_schedules (
    name text PRIMARY KEY,
    grp text NOT NULL,
    due_at timestamptz NOT NULL,
    args jsonb NOT NULL
);
CREATE INDEX IF NOT EXISTS sendqueue_parked_due_idx ON sendqueue_parked_schedules (due_at);
CREATE INDEX IF NOT EXISTS sendqueue_parked_group_idx
    ON sendqueue_parked_schedules (grp, name COLLATE "C");
-- get() and create() look a schedule up by name, list() pages a group by name: both only
-- among live jobs, which procrastinate's own indexes do not cover.
CREATE INDEX IF NOT EXISTS sendqueue_jobs_live_name_idx
    ON procrastinate_jobs (queueing_lock)
    WHERE status IN ('todo', 'doing');
CREATE INDEX IF NOT EXISTS sendqueue_jobs_live_group_idx
    ON procrastinate_jobs (queue_name, queueing_lock COLLATE "C")
    WHERE status IN ('todo', 'doing');
-- procrastinate's fetch scans its (priority, id) index and filters on scheduled_at <= now():
-- with many waiting jobs of which few are due, this index lets the planner look up the due
-- ones instead (measured: 20,000 waiting jobs, an idle fetch 12 ms -> 1.6 ms).
CREATE INDEX IF NOT EXISTS sendqueue_jobs_todo_scheduled_idx
    ON procrastinate_jobs (scheduled_at)
    WHERE status = 'todo';
"""


# --------------------------------------------------------------------------- helpers
def conninfo_from_url(url: str) -> str:
    """The libpq URI of a SQLAlchemy-style PostgreSQL URL (``postgresql+psycopg://...``)."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix) :]
    raise InvalidField(
        "database_url", url, "the procrastinate execution layer needs postgresql+psycopg://..."
    )


def cron_every(seconds: float) -> str:
    """A cron line firing about every ``seconds``, on boundaries every worker agrees on.

    Cron steps must divide the minute, hour or day, so the interval is rounded down to the
    nearest step that does (45 s -> every 30 s, 25 min -> every 20 min); a day or more is
    once a day at midnight UTC. The sixth field is seconds (procrastinate's extension).
    """
    if seconds <= 0:
        raise ValueError("the interval must be positive")
    whole = max(1, round(seconds))

    def step(units: int, limit: int) -> int:
        return max(d for d in range(1, limit + 1) if limit % d == 0 and d <= max(1, units))

    if whole < 60:
        return f"* * * * * */{step(whole, 60)}"
    if whole < 3600:
        return f"*/{step(round(whole / 60), 60)} * * * *"
    if whole < 86400:
        return f"0 */{step(round(whole / 3600), 24)} * * *"
    return "0 0 * * *"


def _priority(due: datetime) -> int:
    seconds = int((due - _PRIORITY_EPOCH).total_seconds())
    return max(-_INT4, min(_INT4, -seconds))


def _utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


def _args(schedule: Schedule) -> dict[str, Any]:
    assert schedule.created_at is not None
    return {
        "name": schedule.name,
        "group": schedule.group,
        "at_local": schedule.at_local.isoformat(),
        "timezone": schedule.timezone,
        "payload": dict(schedule.payload),
        "client_token": schedule.client_token,
        "max_retries": schedule.max_retries,
        "created_at": schedule.created_at.isoformat(),
    }


@dataclass(frozen=True)
class _Job:
    """The columns of a ``sendqueue.fire`` job this adapter reads."""

    id: int
    queue: str
    task_name: str
    args: Mapping[str, Any]
    scheduled_at: datetime | None
    attempts: int
    abort_requested: bool = False

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> _Job:
        return cls(
            id=row["id"],
            queue=row["queue_name"],
            task_name=row["task_name"],
            args=row["args"],
            scheduled_at=row["scheduled_at"],
            attempts=row["attempts"],
            abort_requested=row["abort_requested"],
        )

    @classmethod
    def from_procrastinate(cls, job: procrastinate_jobs.Job) -> _Job:
        assert job.id is not None
        return cls(
            id=job.id,
            queue=job.queue,
            task_name=job.task_name,
            args=job.task_kwargs,
            scheduled_at=job.scheduled_at,
            attempts=job.attempts,
            abort_requested=job.abort_requested,
        )

    def schedule(self) -> Schedule:
        args = self.args
        due = self.scheduled_at
        return Schedule(
            name=args["name"],
            group=self.queue,
            at_local=datetime.fromisoformat(args["at_local"]),
            timezone=args["timezone"],
            payload=dict(args["payload"]),
            client_token=args["client_token"],
            due_at=_utc(due) if due is not None else datetime.fromisoformat(args["created_at"]),
            max_retries=int(args["max_retries"]),
            attempts=self.attempts,
            created_at=datetime.fromisoformat(args["created_at"]),
        )


@dataclass(frozen=True)
class _Outcome:
    """What an invocation leaves for procrastinate to write: ``done`` and ``gone`` delete the
    job, ``retry`` puts it back at ``retry_at``, ``buried`` marks it failed."""

    kind: Literal["done", "gone", "retry", "buried"]
    retry_at: datetime | None = None
    letter: DeadLetter | None = None


class _RetryLater(Exception):
    """Raised out of a fire job whose target failed with attempts left."""

    def __init__(self, message: str, at: datetime) -> None:
        super().__init__(message)
        self.at = at


class _DeadLettered(Exception):
    """Raised out of a fire job whose target failed for the last time (already recorded)."""


class _FireRetry(BaseRetryStrategy):
    """The retry decisions of ``sendqueue.fire``: the adapter decides, procrastinate writes.

    A failure of the adapter's own bookkeeping (not of the target) is retried soon: firing
    again is safe (delivery is at-least-once), losing the schedule is not.
    """

    def __init__(self, bookkeeping_retry: float) -> None:
        self.bookkeeping_retry = bookkeeping_retry

    def get_retry_decision(
        self, *, exception: BaseException, job: procrastinate_jobs.Job
    ) -> RetryDecision | None:
        if isinstance(exception, _RetryLater):
            return RetryDecision(retry_at=exception.at, priority=_priority(exception.at))
        if isinstance(exception, _DeadLettered):
            return None
        at = datetime.now(UTC) + timedelta(seconds=self.bookkeeping_retry)
        return RetryDecision(retry_at=at, priority=_priority(at))


# --------------------------------------------------------------------------- schema
def _migrations() -> list[tuple[Version, int, Path]]:
    found: list[tuple[Version, int, Path]] = []
    for path in Path(SchemaManager.get_migrations_path()).iterdir():
        match = _MIGRATION_FILE.fullmatch(path.name)
        if match is not None:
            major, minor, patch, seq = (int(g) for g in match.groups())
            found.append((Version(f"{major}.{minor}.{patch}"), seq, path))
    return sorted(found, key=lambda item: (item[0], item[1]))


def schema_version(url: str) -> str | None:
    """The procrastinate version whose schema the database at ``url`` has; None if none."""
    try:
        with psycopg.connect(conninfo_from_url(url), connect_timeout=10) as conn:
            table = conn.execute(
                "SELECT to_regclass('sendqueue_procrastinate_schema') IS NOT NULL"
            ).fetchone()
            if table is None or not table[0]:
                return None
            row = conn.execute("SELECT version FROM sendqueue_procrastinate_schema").fetchone()
    except psycopg.Error as exc:
        raise SchedulerError(f"procrastinate schema: cannot read its version: {exc}") from exc
    return None if row is None else str(row[0])


def upgrade_schema(url: str) -> str:
    """Install or upgrade procrastinate's schema and this adapter's tables; returns the version.

    A database without procrastinate gets procrastinate's ``schema.sql`` (the installed
    version's). A database with an older recorded version gets procrastinate's migration files
    newer than that version, in order, each in its own transaction (some add enum values, which
    a later statement of the same transaction could not use). Idempotent; concurrent runs wait
    for each other on an advisory lock. Stop the workers before upgrading across versions
    whose migrations are marked ``pre``/``post`` (docs/deploy-postgres.md).
    """
    target = Version(PROCRASTINATE_VERSION)
    try:
        with psycopg.connect(conninfo_from_url(url), connect_timeout=10, autocommit=True) as conn:
            conn.execute("SELECT pg_advisory_lock(%s)", (_SCHEMA_LOCK_KEY,))
            try:
                return str(_upgrade_locked(conn, target))
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (_SCHEMA_LOCK_KEY,))
    except psycopg.Error as exc:
        raise SchedulerError(f"procrastinate schema upgrade failed: {exc}") from exc


def _upgrade_locked(conn: psycopg.Connection[Any], target: Version) -> Version:
    installed_row = conn.execute("SELECT to_regclass('procrastinate_jobs') IS NOT NULL").fetchone()
    installed = bool(installed_row and installed_row[0])
    with conn.transaction():
        conn.execute(_META_SCHEMA)
        row = conn.execute("SELECT version FROM sendqueue_procrastinate_schema").fetchone()
    recorded: Version | None = None
    if row is not None:
        try:
            recorded = Version(str(row[0]))
        except InvalidVersion:
            recorded = None
    if not installed:
        with conn.transaction():
            # psycopg sends a query without parameters as it is: no placeholder parsing.
            conn.execute(SchemaManager.get_schema())
            _record(conn, target)
        recorded = target
    elif recorded is None:
        # Installed by other means (``procrastinate schema --apply``): assume this version's.
        log.warning("procrastinate's schema was not installed by sendqueue; assuming %s", target)
        with conn.transaction():
            _record(conn, target)
        recorded = target
    elif recorded > target:
        raise SchedulerError(
            f"the database has procrastinate's schema {recorded}, newer than the installed "
            f"procrastinate {target}; upgrade the sendqueue installation"
        )
    for version, _, path in _migrations():
        if recorded < version <= target:
            log.info("applying procrastinate migration %s", path.name)
            with conn.transaction():
                conn.execute(path.read_text(encoding="utf-8"))
    if recorded < target:
        with conn.transaction():
            _record(conn, target)
    with conn.transaction():
        conn.execute(_SENDQUEUE_SCHEMA)
    return target


def _record(conn: psycopg.Connection[Any], version: Version) -> None:
    conn.execute(
        "INSERT INTO sendqueue_procrastinate_schema (id, version) VALUES (1, %s) "
        "ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version, applied_at = now()",
        (str(version),),
    )


# --------------------------------------------------------------------------- the adapter
class ProcrastinateScheduler:
    """Scheduler and Dispatcher on procrastinate (see the module docstring).

    ``url`` is the PostgreSQL database (``postgresql+psycopg://...``, the task store's). With
    ``upgrade`` (the default) procrastinate's schema and this adapter's tables are installed or
    upgraded on open. ``pool_size`` bounds the connections of the synchronous side (create,
    delete, get, list: at most ``provision_concurrency`` calls run at once); the dispatcher opens
    ``concurrency + 2`` more plus one LISTEN connection while it runs. ``reconcile_interval``
    None registers no reconciler task; ``recover_interval`` defaults to ``stalled_after / 2``.
    Schedules due more than ``horizon`` seconds from now are parked (see the module docstring).
    """

    firing_precision = 0.0  # exact: fires at due_at (see the Scheduler port)

    #: The reconciler runs as a procrastinate periodic task (once per tick across all workers),
    #: so a worker process must not run its own loop too.
    runs_reconciler = True

    def __init__(
        self,
        url: str,
        *,
        clock: Clock | None = None,
        alarm: Alarm | None = None,
        concurrency: int = 4,
        retry_backoff: float = 5.0,
        max_backoff: float = 300.0,
        poll_interval: float = 0.5,
        stalled_after: float = 60.0,
        invocation_timeout: float = 900.0,
        reconcile_interval: float | None = 1800.0,
        recover_interval: float | None = None,
        horizon: float = 300.0,
        pool_size: int = 10,
        connect_timeout: float = 10.0,
        shutdown_timeout: float = 30.0,
        upgrade: bool = True,
        seed: int | None = None,
    ) -> None:
        if concurrency < 1 or pool_size < 1:
            raise ValueError("concurrency and pool_size must be at least 1")
        if min(poll_interval, stalled_after, invocation_timeout) <= 0 or horizon < 5:
            raise ValueError(
                "poll_interval, stalled_after and invocation_timeout must be > 0, horizon >= 5"
            )
        self.url = url
        self.clock: Clock = clock or SystemClock()
        self.alarm: Alarm = alarm if alarm is not None else LoggingAlarm()
        self.concurrency = concurrency
        self.retry_backoff = retry_backoff
        self.max_backoff = max_backoff
        self.poll_interval = poll_interval
        self.stalled_after = stalled_after
        self.invocation_timeout = invocation_timeout
        self.reconcile_interval = reconcile_interval
        self.recover_interval = recover_interval or max(1.0, stalled_after / 2)
        self.horizon = horizon
        self.shutdown_timeout = shutdown_timeout
        self._conninfo = conninfo_from_url(url)
        self._connect_timeout = connect_timeout
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._running = False
        if upgrade:
            upgrade_schema(url)
        self._pool: psycopg_pool.ConnectionPool[psycopg.Connection[Any]] = (
            psycopg_pool.ConnectionPool(
                self._conninfo,
                min_size=1,
                max_size=pool_size,
                timeout=connect_timeout,
                open=False,
                name="sendqueue-scheduler",
                kwargs={"connect_timeout": int(connect_timeout)},
                check=psycopg_pool.ConnectionPool.check_connection,
            )
        )
        try:
            self._pool.open(wait=True, timeout=connect_timeout)
        except psycopg_pool.PoolTimeout as exc:
            self._pool.close()
            raise SchedulerError(f"procrastinate scheduler: cannot connect: {exc}") from exc
        self._connector = SyncPsycopgConnector()
        self._connector.open(self._pool)
        self._manager = JobManager(self._connector)

    # ----------------------------------------------------------------- plumbing
    @contextlib.contextmanager
    def _tx(self, action: str) -> Iterator[psycopg.Connection[Any]]:
        """One transaction on a pooled connection; backend errors become SchedulerError."""
        try:
            with self._pool.connection() as conn:
                yield conn
        except (psycopg.Error, procrastinate_errors.ConnectorException) as exc:
            # PoolTimeout is a psycopg.OperationalError: a saturated or unreachable server.
            raise SchedulerError(f"procrastinate scheduler: {action} failed: {exc}") from exc

    @staticmethod
    def _rows(
        conn: psycopg.Connection[Any], query: str, params: Mapping[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(query, params)
            return cur.fetchall()

    @staticmethod
    def _lock_name(conn: psycopg.Connection[Any], name: str) -> None:
        # Serialises create/delete/redrive of one name: the live-job check and the insert
        # become one step for sendqueue's writers.
        conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", ("sendqueue.schedule:" + name,)
        )

    def _existing(self, conn: psycopg.Connection[Any], name: str) -> Schedule | None:
        """The schedule named ``name``: a live job, or a parked schedule."""
        rows = self._rows(
            conn,
            f"SELECT {_JOB_COLUMNS} FROM procrastinate_jobs j WHERE j.queueing_lock = %(name)s "
            f"AND j.status IN ('todo', 'doing') AND j.task_name = %(task)s AND {_LIVE} "
            "ORDER BY j.id DESC LIMIT 1",
            {"name": name, "task": FIRE_TASK},
        )
        if rows:
            return _Job.from_row(rows[0]).schedule()
        rows = self._rows(
            conn,
            f"SELECT {_PARKED_COLUMNS} FROM sendqueue_parked_schedules p WHERE p.name = %(name)s",
            {"name": name},
        )
        return _Job.from_row(rows[0]).schedule() if rows else None

    def _place(self, conn: psycopg.Connection[Any], schedule: Schedule, now: datetime) -> None:
        """A job when due within the horizon, otherwise a parked schedule."""
        if schedule.due_at <= now + timedelta(seconds=self.horizon):
            self._defer(conn, schedule)
            return
        conn.execute(
            "INSERT INTO sendqueue_parked_schedules (name, grp, due_at, args) "
            "VALUES (%s, %s, %s, %s)",
            (schedule.name, schedule.group, schedule.due_at, Jsonb(_args(schedule))),
        )

    def promote(self, now: datetime | None = None, *, batch: int = 500) -> int:
        """Defer the parked schedules due within the horizon of ``now`` (default: the clock's)
        as procrastinate jobs. Returns how many. The periodic task ``sendqueue.promote`` runs it
        every ``horizon / 5`` seconds."""
        until = (now or self.clock.now()) + timedelta(seconds=self.horizon)
        moved = 0
        while True:
            with self._tx("promote parked schedules") as conn:
                names = [
                    row["name"]
                    for row in self._rows(
                        conn,
                        "SELECT name FROM sendqueue_parked_schedules WHERE due_at <= %(until)s "
                        "ORDER BY due_at LIMIT %(batch)s",
                        {"until": until, "batch": batch},
                    )
                ]
                if not names:
                    return moved
                # Name locks first, in one order, as create/delete/redrive take them: the row
                # then cannot change under us, and no lock cycle can form.
                for name in sorted(names):
                    self._lock_name(conn, name)
                rows = self._rows(
                    conn,
                    "DELETE FROM sendqueue_parked_schedules p WHERE p.name = ANY(%(names)s) "
                    f"AND p.due_at <= %(until)s RETURNING {_PARKED_COLUMNS}",
                    {"names": names, "until": until},
                )
                for row in rows:
                    self._defer(conn, _Job.from_row(row).schedule())
                moved += len(rows)

    def _defer(self, conn: psycopg.Connection[Any], schedule: Schedule) -> None:
        job = procrastinate_jobs.Job(
            queue=schedule.group,
            lock=None,
            queueing_lock=schedule.name,
            task_name=FIRE_TASK,
            task_kwargs=_args(schedule),
            scheduled_at=schedule.due_at,
            priority=_priority(schedule.due_at),
        )
        try:
            self._manager.defer_job(job, connection=conn)
        except procrastinate_errors.AlreadyEnqueued as exc:
            raise Conflict(f"schedule {schedule.name!r} is waiting already") from exc

    def _finish(
        self, conn: psycopg.Connection[Any], job_id: int, status: str, *, delete: bool
    ) -> None:
        self._connector.execute_query_all_with_connection(
            conn, query=sql.queries["finish_job"], job_id=job_id, status=status, delete_job=delete
        )

    def _retry(self, conn: psycopg.Connection[Any], job_id: int, at: datetime) -> None:
        self._connector.execute_query_all_with_connection(
            conn,
            query=sql.queries["retry_job"],
            job_id=job_id,
            retry_at=at,
            new_priority=_priority(at),
            new_queue_name=None,
            new_lock=None,
        )

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
        with self._tx("create") as conn:
            self._lock_name(conn, name)
            found = self._existing(conn, name)
            if found is not None:
                if found.client_token == client_token:
                    return found
                raise Conflict(f"schedule {name!r} exists with another client token")
            self._place(conn, schedule, self.clock.now())
        return schedule

    def delete(self, name: str) -> None:
        rules.check_name(name)
        with self._tx("delete") as conn:
            self._lock_name(conn, name)
            conn.execute("DELETE FROM sendqueue_parked_schedules WHERE name = %s", (name,))
            rows = self._rows(
                conn,
                "SELECT j.id FROM procrastinate_jobs j WHERE j.queueing_lock = %(name)s "
                f"AND j.status IN ('todo', 'doing') AND j.task_name = %(task)s AND {_LIVE}",
                {"name": name, "task": FIRE_TASK},
            )
            for row in rows:
                # A waiting job is deleted; a running one gets an abort request, which this
                # adapter reads as "deleted" when the invocation ends.
                self._manager.cancel_job_by_id(
                    row["id"], abort=True, delete_job=True, connection=conn
                )

    def get(self, name: str) -> Schedule | None:
        rules.check_name(name)
        with self._tx("get") as conn:
            return self._existing(conn, name)

    def list(self, group: str, *, after: str | None = None, limit: int = 1000) -> list[Schedule]:
        rules.check_group(group)
        rules.check_limit(limit)
        with self._tx("list") as conn:
            # One statement, so one snapshot: a schedule promoted meanwhile is seen once.
            rows = self._rows(
                conn,
                f'(SELECT {_JOB_COLUMNS}, j.queueing_lock COLLATE "C" AS sort_name '
                "FROM procrastinate_jobs j "
                f"WHERE j.queue_name = %(group)s AND j.status IN ('todo', 'doing') "
                f"AND j.task_name = %(task)s AND {_LIVE} "
                'AND (%(after)s::text IS NULL OR j.queueing_lock COLLATE "C" > %(after)s) '
                'ORDER BY j.queueing_lock COLLATE "C" LIMIT %(limit)s) '
                f'UNION ALL (SELECT {_PARKED_COLUMNS}, p.name COLLATE "C" '
                "FROM sendqueue_parked_schedules p "
                "WHERE p.grp = %(group)s "
                'AND (%(after)s::text IS NULL OR p.name COLLATE "C" > %(after)s) '
                'ORDER BY p.name COLLATE "C" LIMIT %(limit)s) '
                "ORDER BY sort_name LIMIT %(limit)s",
                {"group": group, "task": FIRE_TASK, "after": after, "limit": limit},
            )
        return [_Job.from_row(row).schedule() for row in rows]

    def dead_letters(self, *, limit: int = 1000) -> builtins.list[DeadLetter]:
        rules.check_limit(limit)
        with self._tx("list dead letters") as conn:
            rows = self._rows(
                conn,
                "SELECT id, schedule_name, grp, payload, error, attempts, failed_at "
                "FROM sendqueue_dead_letters ORDER BY seq LIMIT %(limit)s",
                {"limit": limit},
            )
        return [
            DeadLetter(
                id=row["id"],
                schedule_name=row["schedule_name"],
                group=row["grp"],
                payload=dict(row["payload"]),
                error=row["error"],
                attempts=row["attempts"],
                failed_at=_utc(row["failed_at"]),
            )
            for row in rows
        ]

    def redrive(self, dead_letter_id: str) -> Schedule:
        now = self.clock.now()
        with self._tx("redrive") as conn:
            rows = self._rows(
                conn,
                "SELECT * FROM sendqueue_dead_letters WHERE id = %(id)s FOR UPDATE",
                {"id": dead_letter_id},
            )
            if not rows:
                raise NotFound("dead letter", dead_letter_id)
            letter = rows[0]
            name = letter["schedule_name"]
            self._lock_name(conn, name)
            existing = self._existing(conn, name)
            if existing is not None:
                schedule = existing  # recreated meanwhile (e.g. by the reconciler)
            else:
                schedule = Schedule(
                    name=name,
                    group=letter["grp"],
                    at_local=rules.local_now(now, letter["timezone"]),
                    timezone=letter["timezone"],
                    payload=dict(letter["payload"]),
                    client_token=new_token(),
                    due_at=now,
                    max_retries=letter["max_retries"],
                    created_at=now,
                )
                self._defer(conn, schedule)
            conn.execute("DELETE FROM sendqueue_dead_letters WHERE id = %s", (dead_letter_id,))
            if letter["job_id"] is not None:
                conn.execute(
                    "DELETE FROM procrastinate_jobs WHERE id = %s AND status = 'failed'",
                    (letter["job_id"],),
                )
        return schedule

    def close(self) -> None:
        with contextlib.suppress(psycopg.Error):
            self._pool.close()

    def __enter__(self) -> ProcrastinateScheduler:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ----------------------------------------------------------------- invocations
    def _invoke(self, job: _Job, target: Target) -> _Outcome:
        """Run ``target`` for a claimed fire job and decide what becomes of the job.

        The decision for a failure is taken under a row lock on the job: a schedule deleted
        while its invocation ran (abort requested) or taken from us (no longer doing) is left
        alone, neither retried nor dead-lettered.
        """
        schedule = job.schedule()
        try:
            target(dict(schedule.payload))
        except Exception as exc:
            return self._after_failure(job, schedule, exc)
        return _Outcome("done")

    def _after_failure(self, job: _Job, schedule: Schedule, exc: Exception) -> _Outcome:
        now = self.clock.now()
        error = rules.error_text(exc)
        with self._tx("record a failure") as conn:
            rows = self._rows(
                conn,
                "SELECT status, abort_requested FROM procrastinate_jobs WHERE id = %(id)s "
                "FOR UPDATE",
                {"id": job.id},
            )
            if not rows or rows[0]["status"] != "doing" or rows[0]["abort_requested"]:
                log.info("schedule %s failed after it was deleted: not retried", schedule.name)
                return _Outcome("gone")
            attempts = job.attempts + 1
            if attempts <= schedule.max_retries:
                delay = rules.retry_delay(attempts, self.retry_backoff, self.max_backoff, self._rng)
                log.warning(
                    "schedule %s failed (attempt %d of %d), retrying in %.1f s: %s",
                    schedule.name,
                    attempts,
                    schedule.max_retries + 1,
                    delay.total_seconds(),
                    error,
                )
                return _Outcome("retry", retry_at=now + delay)
            letter = self._bury(conn, job.id, schedule, attempts, error, now)
        return _Outcome("buried", letter=letter)

    def _bury(
        self,
        conn: psycopg.Connection[Any],
        job_id: int,
        schedule: Schedule,
        attempts: int,
        error: str,
        now: datetime,
    ) -> DeadLetter | None:
        """Record the dead letter of ``job_id`` (once: None if it was recorded before)."""
        letter = DeadLetter(
            id="dl-" + secrets.token_hex(8),
            schedule_name=schedule.name,
            group=schedule.group,
            payload=dict(schedule.payload),
            error=error,
            attempts=attempts,
            failed_at=now,
        )
        rows = self._rows(
            conn,
            "INSERT INTO sendqueue_dead_letters (id, job_id, schedule_name, grp, timezone, "
            "payload, max_retries, error, attempts, failed_at) VALUES (%(id)s, %(job_id)s, "
            "%(name)s, %(grp)s, %(tz)s, %(payload)s, %(max_retries)s, %(error)s, %(attempts)s, "
            "%(failed_at)s) ON CONFLICT (job_id) DO NOTHING RETURNING id",
            {
                "id": letter.id,
                "job_id": job_id,
                "name": letter.schedule_name,
                "grp": letter.group,
                "tz": schedule.timezone,
                "payload": Jsonb(dict(letter.payload)),
                "max_retries": schedule.max_retries,
                "error": error,
                "attempts": attempts,
                "failed_at": now,
            },
        )
        if not rows:
            return None
        log.error(
            "schedule %s moved to the dead letters after %d attempt(s): %s",
            schedule.name,
            attempts,
            error,
        )
        return letter

    def _raise_alarm(self, letter: DeadLetter | None) -> None:
        if letter is None:
            return
        try:
            self.alarm.raise_alarm(letter)
        except Exception:
            log.exception("raising the alarm for dead letter %s failed", letter.id)

    def _fire_in_worker(self, job: procrastinate_jobs.Job, target: Target) -> None:
        """The body of the ``sendqueue.fire`` task: procrastinate writes the outcome."""
        outcome = self._invoke(_Job.from_procrastinate(job), target)
        if outcome.kind == "retry":
            assert outcome.retry_at is not None
            raise _RetryLater(f"retry at {outcome.retry_at.isoformat()}", outcome.retry_at)
        if outcome.kind == "buried":
            self._raise_alarm(outcome.letter)
            raise _DeadLettered("moved to the dead letters")

    def fire_due(self, target: Target) -> int:
        """Invoke every schedule due at ``clock.now()``, once, in due order, on this thread.

        The same decisions (retry, dead letter, alarm, deleted-while-running) as the worker,
        without a worker: for tests on a fake clock. The claim compares with this adapter's
        clock, not the database's ``now()``, so it cannot use procrastinate's fetch function;
        it sets the columns that function sets, and the outcome is written with procrastinate's
        finish and retry functions. Returns how many invocations were made.
        """
        now = self.clock.now()
        self.promote(now)
        with self._tx("fire due schedules") as conn:
            worker_id = self._rows(conn, sql.queries["register_worker"])[0]["worker_id"]
        try:
            with self._tx("claim due schedules") as conn:
                rows = self._rows(
                    conn,
                    "WITH due AS (SELECT id FROM procrastinate_jobs WHERE task_name = %(task)s "
                    "AND status = 'todo' AND scheduled_at <= %(now)s FOR UPDATE SKIP LOCKED) "
                    "UPDATE procrastinate_jobs j SET status = 'doing', worker_id = %(worker)s "
                    f"FROM due WHERE j.id = due.id RETURNING {_JOB_COLUMNS}",
                    {"task": FIRE_TASK, "now": now, "worker": worker_id},
                )
            claimed = sorted(
                (_Job.from_row(row) for row in rows),
                key=lambda j: (j.scheduled_at or now, j.id),
            )
            fired = 0
            try:
                for job in claimed:
                    fired += 1
                    self._apply(job, self._invoke(job, target))
            finally:
                if fired < len(claimed):
                    with self._tx("release unfired schedules") as conn:
                        conn.execute(
                            "UPDATE procrastinate_jobs SET status = 'todo', worker_id = NULL "
                            "WHERE id = ANY(%s) AND status = 'doing'",
                            ([j.id for j in claimed[fired:]],),
                        )
        finally:
            with self._tx("unregister") as conn:
                self._rows(conn, sql.queries["unregister_worker"], {"worker_id": worker_id})
        return fired

    def _apply(self, job: _Job, outcome: _Outcome) -> None:
        try:
            with self._tx("record an invocation") as conn:
                if outcome.kind == "retry":
                    assert outcome.retry_at is not None
                    self._retry(conn, job.id, outcome.retry_at)
                else:
                    status = "failed" if outcome.kind == "buried" else "succeeded"
                    self._finish(conn, job.id, status, delete=status == "succeeded")
        except SchedulerError as exc:
            log.error("schedule job %d: recording the outcome failed: %s", job.id, exc)
        if outcome.kind == "buried":
            self._raise_alarm(outcome.letter)

    def recover_stalled(self) -> int:
        """Fire again the jobs of dead workers (or running past ``invocation_timeout``).

        A stalled fire job counts as a failed attempt: with attempts left it is due again now,
        otherwise it goes to the dead letters. A stalled job that was deleted meanwhile is
        dropped. Returns how many jobs were recovered.
        """
        now = self.clock.now()
        letters: builtins.list[DeadLetter | None] = []
        with self._tx("recover stalled jobs") as conn:
            rows = self._rows(
                conn,
                f"SELECT {_JOB_COLUMNS}, j.worker_id FROM procrastinate_jobs j "
                "LEFT JOIN procrastinate_workers w ON w.id = j.worker_id "
                "WHERE j.status = 'doing' AND (w.id IS NULL "
                "OR w.last_heartbeat < now() - make_interval(secs => %(stalled)s) "
                "OR (SELECT max(e.at) FROM procrastinate_events e WHERE e.job_id = j.id "
                "AND e.type = 'started') < now() - make_interval(secs => %(timeout)s)) "
                "FOR UPDATE OF j SKIP LOCKED",
                {"stalled": self.stalled_after, "timeout": self.invocation_timeout},
            )
            for row in rows:
                job = _Job.from_row(row)
                if job.task_name != FIRE_TASK:
                    self._retry(conn, job.id, now)
                    continue
                if job.abort_requested:
                    self._finish(conn, job.id, "succeeded", delete=True)
                    continue
                schedule = job.schedule()
                attempts = job.attempts + 1
                if attempts > schedule.max_retries:
                    error = (
                        f"Stalled: worker {row['worker_id']} stopped sending heartbeats, or the "
                        f"invocation ran past {self.invocation_timeout:g} s (did it die?)"
                    )
                    letters.append(self._bury(conn, job.id, schedule, attempts, error, now))
                    self._finish(conn, job.id, "failed", delete=False)
                else:
                    log.warning(
                        "schedule %s: its worker stopped (attempt %d of %d); firing it again",
                        schedule.name,
                        attempts,
                        schedule.max_retries + 1,
                    )
                    self._retry(conn, job.id, now)
        for letter in letters:
            self._raise_alarm(letter)
        return len(rows)

    # ----------------------------------------------------------------- Dispatcher
    def run(self, target: Target, stop: threading.Event) -> None:
        """Run a procrastinate worker in this thread until ``stop`` is set (Dispatcher port).

        The worker's event loop runs here; each invocation of ``target`` runs on a thread of
        the loop's executor, at most ``concurrency`` at once. When the worker fails (database
        unreachable), it is started again after a growing pause; its running jobs, if any,
        are recovered as stalled ones.
        """
        with self._lock:
            if self._running:
                raise RuntimeError("this ProcrastinateScheduler is already dispatching")
            self._running = True
        pause = 0.5
        try:
            while not stop.is_set():
                started = time.monotonic()
                why = "it stopped by itself"
                try:
                    asyncio.run(self._serve(target, stop))
                except Exception as exc:
                    why = f"{type(exc).__name__}: {exc}"
                if stop.is_set():
                    break
                if time.monotonic() - started > 60:
                    pause = 0.5  # it ran for a while: not a crash loop
                log.error(
                    "dispatcher: procrastinate worker failed (%s); restart in %.1f s", why, pause
                )
                stop.wait(pause)
                pause = min(pause * 2, 30.0)
        finally:
            with self._lock:
                self._running = False

    def _worker_app(self, target: Target) -> App:
        app = App(
            connector=PsycopgConnector(
                conninfo=self._conninfo,
                min_size=1,
                max_size=self.concurrency + 2,
                timeout=self._connect_timeout,
                name="sendqueue-worker",
                kwargs={"connect_timeout": int(self._connect_timeout)},
            ),
            periodic_defaults={
                "max_delay": max(
                    self.reconcile_interval or 0.0, self.recover_interval, self.horizon
                )
            },
        )

        def fire(context: JobContext, /, **_: Any) -> None:
            self._fire_in_worker(context.job, target)

        app.task(name=FIRE_TASK, pass_context=True, retry=_FireRetry(self.retry_backoff))(fire)

        def recover(timestamp: int) -> None:
            try:
                recovered = self.recover_stalled()
            except SchedulerError as exc:
                log.error("recovering stalled jobs failed: %s", exc)
                return
            if recovered:
                log.warning("recovered %d stalled job(s)", recovered)

        recover_task = app.task(name=RECOVER_TASK, queue=PERIODIC_QUEUE)(recover)
        app.periodic(cron=cron_every(self.recover_interval), periodic_id="recover")(recover_task)

        def promote(timestamp: int) -> None:
            try:
                self.promote()
            except SchedulerError as exc:  # the next tick tries again, well before due
                log.error("promoting parked schedules failed: %s", exc)

        promote_task = app.task(name=PROMOTE_TASK, queue=PERIODIC_QUEUE)(promote)
        app.periodic(cron=cron_every(self.horizon / 5), periodic_id="promote")(promote_task)

        if self.reconcile_interval is not None:

            def reconcile(timestamp: int) -> None:
                log.info("reconciler pass for tick %d in process %d", timestamp, os.getpid())
                try:
                    target({"kind": "reconcile"})
                except Exception:  # the next tick runs again; a failed job would pile up
                    log.exception("reconciler pass for tick %d failed", timestamp)

            reconcile_task = app.task(name=RECONCILE_TASK, queue=PERIODIC_QUEUE)(reconcile)
            app.periodic(cron=cron_every(self.reconcile_interval), periodic_id="reconcile")(
                reconcile_task
            )
        return app

    async def _serve(self, target: Target, stop: threading.Event) -> None:
        app = self._worker_app(target)
        async with app.open_async():
            worker = asyncio.create_task(
                app.run_worker_async(
                    name="sendqueue",
                    concurrency=self.concurrency,
                    fetch_job_polling_interval=self.poll_interval,
                    # Our targets are synchronous and ignore abort requests: no need to poll.
                    abort_job_polling_interval=60.0,
                    listen_notify=True,
                    delete_jobs="successful",
                    install_signal_handlers=False,
                    update_heartbeat_interval=max(0.5, self.stalled_after / 3),
                    stalled_worker_timeout=self.stalled_after,
                    shutdown_graceful_timeout=self.shutdown_timeout,
                )
            )
            while not stop.is_set() and not worker.done():
                await asyncio.wait({worker}, timeout=_WATCH_INTERVAL)
            if worker.done():
                # Raises what stopped it; returns when a side task (heartbeat, listener) failed.
                worker.result()
                return
            # Cancelling run_worker_async is procrastinate's graceful stop: nothing new is
            # fetched, running jobs get shutdown_graceful_timeout to finish.
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
