"""The procrastinate execution layer: one-time schedules as procrastinate jobs on PostgreSQL.

:class:`ProcrastinateScheduler` is the :class:`~sendqueue.ports.Scheduler` and the
:class:`~sendqueue.ports.Dispatcher` of a fleet: any number of worker processes, on any number
of machines, share one PostgreSQL database (the task store's).
``SENDQUEUE_EXECUTION=procrastinate`` selects it. The package's modules:

- :mod:`~sendqueue.adapters.procrastinate.schema`: procrastinate's schema and this adapter's
  tables (:func:`upgrade_schema`);
- :mod:`~sendqueue.adapters.procrastinate.jobs`: how a schedule maps onto a job (or a parked
  row, when due beyond the horizon), and the statements on procrastinate's tables;
- :mod:`~sendqueue.adapters.procrastinate.worker`: the worker app (firing, retries, dead
  letters, stalled jobs, the periodic reconciler).

``create`` checks for a live schedule of the name under an advisory lock on it, so the same
name and token are idempotent and another token is a Conflict; ``create_many`` does the same
for a batch in one transaction (provisioning's bulk write). ``delete`` cancels a waiting job
(deleted outright) and asks a running one to abort, which marks it deleted: whatever it then
returns, it is neither retried nor dead-lettered, and a schedule created anew under the same
name meanwhile survives it. Dead letters live in ``sendqueue_dead_letters``, which keeps what
procrastinate does not (the error text, the time zone, the time of failure); ``redrive`` defers
a new job due now and deletes the letter and the failed job. Backend failures raise
:class:`~sendqueue.domain.errors.SchedulerError`.
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sendqueue.adapters import scheduler_rules as rules
from sendqueue.adapters.alarm import LoggingAlarm
from sendqueue.adapters.clock import SystemClock
from sendqueue.adapters.procrastinate.jobs import Jobs
from sendqueue.adapters.procrastinate.schema import conninfo_from_url, upgrade_schema
from sendqueue.adapters.procrastinate.worker import Worker
from sendqueue.domain.errors import Conflict, NotFound, SchedulerError
from sendqueue.domain.models import DeadLetter, new_token, utc
from sendqueue.ports import Alarm, Clock, DueArgs, Schedule, Target

__all__ = ["ProcrastinateScheduler"]


class ProcrastinateScheduler:
    """Scheduler and Dispatcher on procrastinate (see the module docstring).

    ``url`` is the PostgreSQL database (``postgresql+psycopg://...``, the task store's). With
    ``upgrade`` (the default) procrastinate's schema and this adapter's tables are installed or
    upgraded on open. ``pool_size`` bounds the connections of the synchronous side (create,
    delete, get, list: at most ``provision_concurrency`` calls run at once); the dispatcher opens
    5 more while it runs (:class:`~.worker.Worker`). ``reconcile_interval`` None registers no
    reconciler task; ``recover_interval`` defaults to ``stalled_after / 2``.
    Schedules due more than ``horizon`` seconds from now are parked
    (:mod:`~sendqueue.adapters.procrastinate.jobs`).
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
        conninfo = conninfo_from_url(url)
        if upgrade:
            upgrade_schema(url)
        self._jobs = Jobs(
            conninfo, pool_size=pool_size, connect_timeout=connect_timeout, horizon=horizon
        )
        self._worker = Worker(
            self._jobs,
            conninfo=conninfo,
            clock=self.clock,
            alarm=self.alarm,
            concurrency=concurrency,
            retry_backoff=retry_backoff,
            max_backoff=max_backoff,
            poll_interval=poll_interval,
            stalled_after=stalled_after,
            invocation_timeout=invocation_timeout,
            reconcile_interval=reconcile_interval,
            recover_interval=recover_interval,
            connect_timeout=connect_timeout,
            shutdown_timeout=shutdown_timeout,
            seed=seed,
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
        with self._jobs.tx("create") as conn:
            self._jobs.lock_name(conn, name)
            found = self._jobs.existing(conn, name)
            if found is not None:
                if found.client_token == client_token:
                    return found
                raise Conflict(f"schedule {name!r} exists with another client token")
            self._jobs.place(conn, schedule, self.clock.now())
        return schedule

    def create_many(self, items: Sequence[DueArgs]) -> builtins.list[Conflict | None]:
        """:meth:`create` for many schedules in one transaction (:class:`~sendqueue.ports.
        BulkScheduler`; each item gives the instant the schedule is due, not its wall time):
        one result per item, in order: None where the schedule now exists as
        asked (made here, or there already with the same token), the Conflict (returned) where
        the name is held with another token.

        A repeated name within the batch behaves as two calls. InvalidField and SchedulerError
        raise, and nothing is written; a clash that procrastinate finds only for the batch as a
        whole (its queueing lock) is a SchedulerError, the caller then writes item by item.
        Four statements per batch: the name locks, one lookup of the existing names, a batch
        defer, a multi-row insert of the parked ones.
        """
        now = self.clock.now()
        schedules = rules.build_due_schedules(items, created_at=now)
        if not schedules:
            return []
        names = [s.name for s in schedules]
        out: builtins.list[Conflict | None] = []
        with self._jobs.tx("create schedules") as conn:
            self._jobs.lock_names(conn, names)
            found = self._jobs.existing_many(conn, names)
            fresh: builtins.list[Schedule] = []
            for schedule in schedules:
                held = found.get(schedule.name)
                if held is None:
                    found[schedule.name] = schedule
                    fresh.append(schedule)
                    out.append(None)
                elif held.client_token == schedule.client_token:
                    out.append(None)
                else:
                    out.append(
                        Conflict(f"schedule {schedule.name!r} exists with another client token")
                    )
            try:
                self._jobs.place_many(conn, fresh, self.clock.now())
            except Conflict as exc:
                # procrastinate refused the batch defer (a waiting job holds one of the names'
                # queueing locks) without saying which item: the batch fails as a whole.
                raise SchedulerError(
                    f"procrastinate scheduler: create schedules failed: {exc}"
                ) from exc
        return out

    def delete(self, name: str) -> None:
        rules.check_name(name)
        with self._jobs.tx("delete") as conn:
            self._jobs.lock_name(conn, name)
            self._jobs.delete(conn, name)

    def get(self, name: str) -> Schedule | None:
        rules.check_name(name)
        with self._jobs.tx("get") as conn:
            return self._jobs.existing(conn, name)

    def list(self, group: str, *, after: str | None = None, limit: int = 1000) -> list[Schedule]:
        rules.check_group(group)
        rules.check_limit(limit)
        return self._jobs.list_group(group, after, limit)

    def dead_letters(self, *, limit: int = 1000) -> builtins.list[DeadLetter]:
        rules.check_limit(limit)
        return self._letters("ORDER BY seq LIMIT %(limit)s", {"limit": limit})

    def dead_letter(self, dead_letter_id: str) -> DeadLetter | None:
        found = self._letters("WHERE id = %(id)s", {"id": dead_letter_id})
        return found[0] if found else None

    def _letters(self, where: str, params: dict[str, Any]) -> builtins.list[DeadLetter]:
        with self._jobs.tx("read dead letters") as conn:
            rows = self._jobs.rows(
                conn,
                "SELECT id, schedule_name, grp, payload, error, attempts, failed_at "
                f"FROM sendqueue_dead_letters {where}",
                params,
            )
        return [
            DeadLetter(
                id=row["id"],
                schedule_name=row["schedule_name"],
                group=row["grp"],
                payload=dict(row["payload"]),
                error=row["error"],
                attempts=row["attempts"],
                failed_at=utc(row["failed_at"]),
            )
            for row in rows
        ]

    def redrive(self, dead_letter_id: str) -> Schedule:
        now = self.clock.now()
        with self._jobs.tx("redrive") as conn:
            rows = self._jobs.rows(
                conn,
                "SELECT * FROM sendqueue_dead_letters WHERE id = %(id)s FOR UPDATE",
                {"id": dead_letter_id},
            )
            if not rows:
                raise NotFound("dead letter", dead_letter_id)
            letter = rows[0]
            name = letter["schedule_name"]
            self._jobs.lock_name(conn, name)
            existing = self._jobs.existing(conn, name)
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
                self._jobs.defer(conn, [schedule])
            conn.execute("DELETE FROM sendqueue_dead_letters WHERE id = %s", (dead_letter_id,))
            if letter["job_id"] is not None:
                self._jobs.delete_failed(conn, letter["job_id"])
        return schedule

    def promote(self, now: datetime | None = None, *, batch: int = 500) -> int:
        """Defer the parked schedules due within the horizon of ``now`` (default: the clock's)
        as procrastinate jobs. Returns how many. The periodic task ``sendqueue.promote`` runs it
        every ``horizon / 5`` seconds."""
        return self._jobs.promote(now or self.clock.now(), batch=batch)

    def close(self) -> None:
        self._jobs.close()

    def __enter__(self) -> ProcrastinateScheduler:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ----------------------------------------------------------------- Dispatcher
    def fire_due(self, target: Target) -> int:
        """Invoke every schedule due at ``clock.now()``, once, in due order, on this thread.

        The same decisions (retry, dead letter, alarm, deleted-while-running) as the worker,
        without a worker: for tests on a fake clock. The claim compares with this adapter's
        clock, not the database's ``now()``, so it cannot use procrastinate's fetch function;
        it sets the columns that function sets, and the outcome is written with procrastinate's
        finish and retry functions. Returns how many invocations were made.
        """
        return self._worker.fire_due(target)

    def recover_stalled(self) -> int:
        """Fire again the jobs of dead workers (or running past ``invocation_timeout``);
        returns how many (:meth:`Worker.recover_stalled`)."""
        return self._worker.recover_stalled()

    def run(self, target: Target, stop: threading.Event) -> None:
        """Run the fire loop and procrastinate's worker for the periodic tasks in this thread
        until ``stop`` is set (Dispatcher port).

        Each invocation of ``target`` runs on a thread of the fire loop, at most
        ``concurrency`` at once (:mod:`~sendqueue.adapters.procrastinate.firing`). When either
        fails (database unreachable), both are started again after a growing pause; running
        jobs whose outcome could not be written are recovered as stalled ones.
        """
        self._worker.run(target, stop)
