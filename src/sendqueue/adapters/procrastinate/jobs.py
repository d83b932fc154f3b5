"""How a one-time schedule maps onto procrastinate's jobs, and every statement on its tables.

- One job of the task ``sendqueue.fire`` per schedule. Its queue is the schedule's group, its
  queueing lock the schedule's name, ``scheduled_at`` the UTC instant of ``at_local`` in
  ``timezone`` (:func:`~sendqueue.adapters.scheduler_rules.due_at`), and its arguments hold
  everything else (payload, token, wall-clock time, zone, max_retries, created_at), so ``get``
  and ``list`` rebuild the :class:`~sendqueue.ports.Schedule` from procrastinate's own table.
- Parking: a schedule due more than ``horizon`` seconds ahead waits in
  ``sendqueue_parked_schedules`` with the same arguments until :meth:`Jobs.promote` defers it
  (why: docs/performance.md, "procrastinate layer"). ``get`` and ``list`` read both places.
- A schedule exists while it is parked, or its job is ``todo``, or ``doing`` without an abort
  request. Writers of one name serialise on a transaction-scoped advisory lock on it
  (:meth:`Jobs.lock_name`; a batch takes its names' in one statement, :meth:`Jobs.lock_names`);
  procrastinate's unique index on waiting queueing locks backs it up.
- The job's priority is minus its due time in seconds (since 2020): procrastinate fetches by
  priority, so overdue jobs come in due order.

:class:`Jobs` uses procrastinate's :class:`~procrastinate.manager.JobManager` where it offers
the operation on a given connection (defer, batch defer, cancel) and procrastinate's own
queries through its connector (finish, retry, worker registration); the rest is raw SQL, each
place saying why. Backend failures raise :class:`~sendqueue.domain.errors.SchedulerError`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import psycopg_pool
from procrastinate import SyncPsycopgConnector, sql
from procrastinate import exceptions as procrastinate_errors
from procrastinate import jobs as procrastinate_jobs
from procrastinate.manager import JobManager
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from sendqueue.domain.errors import Conflict, SchedulerError
from sendqueue.domain.models import utc
from sendqueue.ports import Schedule

__all__ = [
    "FIRE_TASK",
    "JOB_COLUMNS",
    "PERIODIC_QUEUE",
    "PROMOTE_TASK",
    "RECONCILE_TASK",
    "RECOVER_TASK",
    "FireJob",
    "Jobs",
    "job_args",
    "priority",
]

FIRE_TASK = "sendqueue.fire"
RECONCILE_TASK = "sendqueue.reconcile"
RECOVER_TASK = "sendqueue.recover_stalled"
PROMOTE_TASK = "sendqueue.promote"
#: The queue of the periodic tasks; schedules live in queues named after their group.
PERIODIC_QUEUE = "sendqueue.periodic"

_PRIORITY_EPOCH = datetime(2020, 1, 1, tzinfo=UTC)
_INT4 = 2**31 - 1

#: The columns of procrastinate_jobs (as ``j``) that :meth:`FireJob.from_row` reads.
JOB_COLUMNS = (
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
#: Name locks are transaction-scoped advisory locks on one of this many buckets (a hash of
#: the name), so a batch holds at most this many locks whatever its size: PostgreSQL's shared
#: lock table holds max_locks_per_transaction x max_connections (6,400 by default), which one
#: lock per name would exhaust with a dozen batches of 500 at once. Names of one bucket
#: serialise their (short) transactions; nothing else is shared.
NAME_LOCK_BUCKETS = 64
#: The first key of the two-key advisory locks on name buckets ("sq" + 3; the two-key space
#: is apart from the one-key locks of the store and the migrations).
NAME_LOCK_SPACE = 0x73710003


def _bucket_of(text_sql: str) -> str:
    """SQL for the lock bucket of the name ``text_sql`` (an expression)."""
    return f"(hashtextextended({text_sql}, 0) & {NAME_LOCK_BUCKETS - 1})::int"


_NAMES_BUCKET = _bucket_of("'sendqueue.schedule:' || n")
_LIVE = "(j.status = 'todo' OR (j.status = 'doing' AND NOT j.abort_requested))"


def priority(due: datetime) -> int:
    """The job priority of a schedule due at ``due``: earlier due, higher priority."""
    seconds = int((due - _PRIORITY_EPOCH).total_seconds())
    return max(-_INT4, min(_INT4, -seconds))


def job_args(schedule: Schedule) -> dict[str, Any]:
    """The arguments of a schedule's job (and of its parked row)."""
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


def _job(schedule: Schedule) -> procrastinate_jobs.Job:
    return procrastinate_jobs.Job(
        queue=schedule.group,
        lock=None,
        queueing_lock=schedule.name,
        task_name=FIRE_TASK,
        task_kwargs=job_args(schedule),
        scheduled_at=schedule.due_at,
        priority=priority(schedule.due_at),
    )


@dataclass(frozen=True)
class FireJob:
    """The columns of a ``sendqueue.fire`` job this adapter reads."""

    id: int
    queue: str
    task_name: str
    args: Mapping[str, Any]
    scheduled_at: datetime | None
    attempts: int
    abort_requested: bool = False

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> FireJob:
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
    def from_procrastinate(cls, job: procrastinate_jobs.Job) -> FireJob:
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
            due_at=utc(due) if due is not None else datetime.fromisoformat(args["created_at"]),
            max_retries=int(args["max_retries"]),
            attempts=self.attempts,
            created_at=datetime.fromisoformat(args["created_at"]),
        )


class Jobs:
    """The schedules' jobs and parked rows, on a pool of synchronous connections.

    ``pool_size`` bounds the pool; schedules due more than ``horizon`` seconds after the
    ``now`` given to :meth:`place` are parked. :meth:`tx` hands out one transaction; the
    methods taking a connection run in the caller's transaction.
    """

    def __init__(
        self, conninfo: str, *, pool_size: int, connect_timeout: float, horizon: float
    ) -> None:
        self.horizon = horizon
        self._pool: psycopg_pool.ConnectionPool[psycopg.Connection[Any]] = (
            psycopg_pool.ConnectionPool(
                conninfo,
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

    def close(self) -> None:
        with contextlib.suppress(psycopg.Error):
            self._pool.close()

    # ----------------------------------------------------------------- plumbing
    @contextlib.contextmanager
    def tx(self, action: str) -> Iterator[psycopg.Connection[Any]]:
        """One transaction on a pooled connection; backend errors become SchedulerError."""
        try:
            with self._pool.connection() as conn:
                yield conn
        except (psycopg.Error, procrastinate_errors.ConnectorException) as exc:
            # PoolTimeout is a psycopg.OperationalError: a saturated or unreachable server.
            raise SchedulerError(f"procrastinate scheduler: {action} failed: {exc}") from exc

    @staticmethod
    def rows(
        conn: psycopg.Connection[Any], query: str, params: Mapping[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(query, params)
            return cur.fetchall()

    @staticmethod
    def lock_name(conn: psycopg.Connection[Any], name: str) -> None:
        """Serialise create/delete/redrive/promote of one name until the transaction ends (on
        the name's bucket: see :data:`NAME_LOCK_BUCKETS`)."""
        # Raw SQL: procrastinate's locks are job columns, not a lock a writer can wait on.
        conn.execute(
            f"SELECT pg_advisory_xact_lock({NAME_LOCK_SPACE}, {_bucket_of('%s')})",
            ("sendqueue.schedule:" + name,),
        )

    @staticmethod
    def lock_names(conn: psycopg.Connection[Any], names: list[str]) -> None:
        """:meth:`lock_name` for each of ``names`` in one statement: their buckets, each once,
        in ascending order (every taker of several uses this), so no lock cycle can form."""
        # Raw SQL, as lock_name. Arrays go in binary (%b): psycopg's text array dumper quotes
        # each element in Python.
        conn.execute(
            f"SELECT count(pg_advisory_xact_lock({NAME_LOCK_SPACE}, b)) FROM (SELECT DISTINCT "
            f"{_NAMES_BUCKET} AS b FROM unnest(%b::text[]) AS n ORDER BY b) AS s",
            (sorted(set(names)),),
        )

    # ----------------------------------------------------------------- reads
    def existing(self, conn: psycopg.Connection[Any], name: str) -> Schedule | None:
        """The schedule named ``name``: a live job, or a parked schedule."""
        # Raw SQL: JobManager.list_jobs takes no connection (so it cannot run under the name
        # lock), filters one status at a time and does not use the live-name index.
        rows = self.rows(
            conn,
            f"SELECT {JOB_COLUMNS} FROM procrastinate_jobs j WHERE j.queueing_lock = %(name)s "
            f"AND j.status IN ('todo', 'doing') AND j.task_name = %(task)s AND {_LIVE} "
            "ORDER BY j.id DESC LIMIT 1",
            {"name": name, "task": FIRE_TASK},
        )
        if rows:
            return FireJob.from_row(rows[0]).schedule()
        rows = self.rows(
            conn,
            f"SELECT {_PARKED_COLUMNS} FROM sendqueue_parked_schedules p WHERE p.name = %(name)s",
            {"name": name},
        )
        return FireJob.from_row(rows[0]).schedule() if rows else None

    def existing_many(self, conn: psycopg.Connection[Any], names: list[str]) -> dict[str, Schedule]:
        """:meth:`existing` for many names in one statement: the schedules found, by name."""
        # Raw SQL, as existing(); the jobs come last so that a live job wins over a parked row.
        rows = self.rows(
            conn,
            f"(SELECT p.name AS name, 0 AS place, {_PARKED_COLUMNS} "
            "FROM sendqueue_parked_schedules p WHERE p.name = ANY(%(names)b)) "
            f"UNION ALL (SELECT DISTINCT ON (j.queueing_lock) j.queueing_lock, 1, {JOB_COLUMNS} "
            "FROM procrastinate_jobs j WHERE j.queueing_lock = ANY(%(names)b) "
            f"AND j.status IN ('todo', 'doing') AND j.task_name = %(task)s AND {_LIVE} "
            "ORDER BY j.queueing_lock, j.id DESC) ORDER BY place",
            {"names": names, "task": FIRE_TASK},
        )
        return {row["name"]: FireJob.from_row(row).schedule() for row in rows}

    def list_group(self, group: str, after: str | None, limit: int) -> list[Schedule]:
        """One page of the schedules of ``group`` (jobs and parked), by name."""
        with self.tx("list") as conn:
            # Raw SQL: list_jobs has no paging, no limit and no name order, and one statement
            # (one snapshot) over both places sees a schedule promoted meanwhile once.
            rows = self.rows(
                conn,
                f'(SELECT {JOB_COLUMNS}, j.queueing_lock COLLATE "C" AS sort_name '
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
        return [FireJob.from_row(row).schedule() for row in rows]

    # ----------------------------------------------------------------- writes
    def place(self, conn: psycopg.Connection[Any], schedule: Schedule, now: datetime) -> None:
        """A job when due within the horizon of ``now``, otherwise a parked schedule."""
        if schedule.due_at <= now + timedelta(seconds=self.horizon):
            self.defer(conn, [schedule])
            return
        conn.execute(
            "INSERT INTO sendqueue_parked_schedules (name, grp, due_at, args) "
            "VALUES (%s, %s, %s, %s)",
            (schedule.name, schedule.group, schedule.due_at, Jsonb(job_args(schedule))),
        )

    def place_many(
        self, conn: psycopg.Connection[Any], schedules: list[Schedule], now: datetime
    ) -> None:
        """:meth:`place` for many schedules: one batch defer for those due within the horizon
        of ``now``, one multi-row insert for the parked ones."""
        until = now + timedelta(seconds=self.horizon)
        due = [s for s in schedules if s.due_at <= until]
        parked = [s for s in schedules if s.due_at > until]
        if due:
            self.defer(conn, due)
        if parked:
            # Raw SQL: the parked rows are this adapter's table. One statement over arrays.
            conn.execute(
                "INSERT INTO sendqueue_parked_schedules (name, grp, due_at, args) "
                "SELECT * FROM unnest(%b::text[], %b::text[], %b::timestamptz[], %b::jsonb[])",
                (
                    [s.name for s in parked],
                    [s.group for s in parked],
                    [s.due_at for s in parked],
                    [Jsonb(job_args(s)) for s in parked],
                ),
            )

    def defer(self, conn: psycopg.Connection[Any], schedules: list[Schedule]) -> None:
        """Defer the jobs of ``schedules`` in the caller's transaction (one statement)."""
        try:
            self._manager.batch_defer_jobs([_job(s) for s in schedules], connection=conn)
        except procrastinate_errors.AlreadyEnqueued as exc:
            # a batch names up to a chunk of schedules: the first few are enough for a log line
            names = ", ".join(repr(s.name) for s in schedules[:3])
            more = f" (and {len(schedules) - 3} more in the batch)" if len(schedules) > 3 else ""
            raise Conflict(f"schedule {names}{more} is waiting already") from exc

    def promote(self, now: datetime, *, batch: int = 500) -> int:
        """Defer the parked schedules due within the horizon of ``now``; returns how many."""
        until = now + timedelta(seconds=self.horizon)
        moved = 0
        while True:
            with self.tx("promote parked schedules") as conn:
                names = [
                    row["name"]
                    for row in self.rows(
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
                self.lock_names(conn, names)
                rows = self.rows(
                    conn,
                    "DELETE FROM sendqueue_parked_schedules p WHERE p.name = ANY(%(names)s) "
                    f"AND p.due_at <= %(until)s RETURNING {_PARKED_COLUMNS}",
                    {"names": names, "until": until},
                )
                if rows:
                    self.defer(conn, [FireJob.from_row(row).schedule() for row in rows])
                moved += len(rows)

    def delete(self, conn: psycopg.Connection[Any], name: str) -> None:
        """Remove the schedule ``name`` (the caller holds its name lock)."""
        conn.execute("DELETE FROM sendqueue_parked_schedules WHERE name = %s", (name,))
        # Raw SQL: list_jobs takes no connection, so it cannot see under the name lock.
        rows = self.rows(
            conn,
            "SELECT j.id FROM procrastinate_jobs j WHERE j.queueing_lock = %(name)s "
            f"AND j.status IN ('todo', 'doing') AND j.task_name = %(task)s AND {_LIVE}",
            {"name": name, "task": FIRE_TASK},
        )
        for row in rows:
            # A waiting job is deleted; a running one gets an abort request, which this
            # adapter reads as "deleted" when the invocation ends.
            self._manager.cancel_job_by_id(row["id"], abort=True, delete_job=True, connection=conn)

    def delete_failed(self, conn: psycopg.Connection[Any], job_id: int) -> None:
        """Delete the failed job ``job_id`` (a redriven dead letter's), if it is still there."""
        # Raw SQL: procrastinate deletes final jobs only by age (delete_old_jobs).
        conn.execute(
            "DELETE FROM procrastinate_jobs WHERE id = %s AND status = 'failed'", (job_id,)
        )

    # Procrastinate's own queries through its connector: JobManager's finish and retry are
    # async and take no connection, and these must run in the caller's transaction.
    def finish(
        self, conn: psycopg.Connection[Any], job_id: int, status: str, *, delete: bool
    ) -> None:
        self._connector.execute_query_all_with_connection(
            conn, query=sql.queries["finish_job"], job_id=job_id, status=status, delete_job=delete
        )

    def retry(self, conn: psycopg.Connection[Any], job_id: int, at: datetime) -> None:
        self._connector.execute_query_all_with_connection(
            conn,
            query=sql.queries["retry_job"],
            job_id=job_id,
            retry_at=at,
            new_priority=priority(at),
            new_queue_name=None,
            new_lock=None,
        )

    # JobManager registers workers only from its async side; fire_due is synchronous.
    def register_worker(self) -> int:
        with self.tx("fire due schedules") as conn:
            row = self._connector.execute_query_one_with_connection(
                conn, query=sql.queries["register_worker"]
            )
        return int(row["worker_id"])

    def unregister_worker(self, worker_id: int) -> None:
        with self.tx("unregister") as conn:
            self._connector.execute_query_all_with_connection(
                conn, query=sql.queries["unregister_worker"], worker_id=worker_id
            )

    # ------------------------------------------------------------------------- the fire loop
    # The statements of :mod:`~sendqueue.adapters.procrastinate.firing`, each one round trip
    # on the fire loop's own connection. Raw SQL: procrastinate's fetch takes one job per call
    # and compares with the database's now(); its finish takes one job and raises for a job
    # that is no longer ours, which would fail a whole batch.
    def settle_and_claim(
        self,
        conn: psycopg.Connection[Any],
        worker_id: int,
        *,
        finished: list[int],
        until: datetime,
        limit: int,
    ) -> tuple[list[FireJob], datetime | None]:
        """Delete ``finished`` (succeeded or deleted jobs still ``doing`` for ``worker_id``),
        claim up to ``limit`` fire jobs due by ``until`` in due order (``FOR UPDATE SKIP
        LOCKED``: workers never wait for each other), in one statement. Returns the claimed
        jobs and the due time of the next waiting one after ``until`` (None: none waits)."""
        rows = self.rows(
            conn,
            "WITH finished AS (DELETE FROM procrastinate_jobs WHERE id = ANY(%(finished)s) "
            "AND status = 'doing' AND worker_id = %(worker)s), "
            "due AS (SELECT id FROM procrastinate_jobs WHERE status = 'todo' "
            "AND scheduled_at <= %(until)s AND task_name = %(task)s "
            "ORDER BY scheduled_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED), "
            "claimed AS (UPDATE procrastinate_jobs j SET status = 'doing', "
            "worker_id = %(worker)s FROM due WHERE j.id = due.id RETURNING j.*) "
            f"SELECT n.next_due, {JOB_COLUMNS} FROM (SELECT min(scheduled_at) AS next_due "
            "FROM procrastinate_jobs WHERE status = 'todo' AND task_name = %(task)s "
            "AND scheduled_at > %(until)s) n LEFT JOIN claimed j ON true",
            {
                "finished": finished,
                "worker": worker_id,
                "until": until,
                "task": FIRE_TASK,
                "limit": limit,
            },
        )
        claimed = [FireJob.from_row(row) for row in rows if row["id"] is not None]
        return claimed, rows[0]["next_due"] if rows else None

    def release(self, conn: psycopg.Connection[Any], worker_id: int, ids: list[int]) -> None:
        """Give back claimed jobs that did not fire: waiting again, no attempt counted (a job
        deleted meanwhile, abort requested, is deleted instead)."""
        conn.execute(
            "WITH gone AS (DELETE FROM procrastinate_jobs WHERE id = ANY(%(ids)s) "
            "AND status = 'doing' AND worker_id = %(worker)s AND abort_requested) "
            "UPDATE procrastinate_jobs SET status = 'todo', worker_id = NULL "
            "WHERE id = ANY(%(ids)s) AND status = 'doing' AND worker_id = %(worker)s "
            "AND NOT abort_requested",
            {"ids": ids, "worker": worker_id},
        )

    def heartbeat(self, conn: psycopg.Connection[Any], worker_id: int) -> None:
        self._connector.execute_query_all_with_connection(
            conn, query=sql.queries["update_heartbeat"], worker_id=worker_id
        )
