"""The Dispatcher side of the procrastinate execution layer: the fire loop and the periodic tasks.

- ``sendqueue.fire`` jobs run in the fire loop (:mod:`~sendqueue.adapters.procrastinate.firing`:
  claimed in batches ahead of their due instant, fired on ``concurrency`` threads, deleted in
  batches; why: docs/decisions/0002-procrastinate-fire-loop.md). A successful job is deleted.
  A failed one is retried ``max_retries`` times (a per-schedule argument) with the shared
  exponential, jittered backoff (:func:`~sendqueue.adapters.scheduler_rules.retry_delay`) through
  procrastinate's retry function; the last failure is written to ``sendqueue_dead_letters``,
  the job ends ``failed`` in procrastinate, and the alarm is raised. A schedule deleted while
  its invocation ran (abort requested) is neither retried nor dead-lettered.
- The periodic tasks run on procrastinate's own worker, on the queue ``sendqueue.periodic``
  only: ``sendqueue.promote`` (every ``horizon / 5`` seconds) defers parked schedules due
  within the horizon; ``sendqueue.reconcile`` (every ``reconcile_interval`` seconds, rounded to
  a cron step, once per tick across all workers) invokes the target with
  ``{"kind": "reconcile"}``; ``sendqueue.recover_stalled`` (de-duplicated across workers like
  every procrastinate periodic task) finds ``doing`` jobs whose worker has been silent for
  ``stalled_after`` seconds (or that have run longer than ``invocation_timeout``) and fires
  them again at once, counting the lost run as a failed attempt; one out of attempts goes to
  the dead letters. Both the fire loop and procrastinate's worker register a worker row and
  send a heartbeat every ``stalled_after / 3`` seconds. Delivery is at-least-once: the send
  worker's claim (Pending -> Running) and the reconciler's stale policy keep a second run from
  sending twice.

Timing: the fire loop sleeps until the next due time (read with each claim), wakes on
LISTEN/NOTIFY for new jobs, and looks again at least every ``poll_interval`` (0.5 s by
default); it fires each job at its due instant by the adapter's clock. procrastinate's worker
polls the periodic queue every ``poll_interval``, and its periodic deferrer uses the database
server's ``now()``: keep the clocks in sync (NTP).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

import psycopg
from procrastinate import App, PsycopgConnector
from psycopg.types.json import Jsonb

from sendqueue.adapters import scheduler_rules as rules
from sendqueue.adapters.procrastinate.firing import FireLoop
from sendqueue.adapters.procrastinate.jobs import (
    FIRE_TASK,
    JOB_COLUMNS,
    PERIODIC_QUEUE,
    PROMOTE_TASK,
    RECONCILE_TASK,
    RECOVER_TASK,
    FireJob,
    Jobs,
)
from sendqueue.domain.errors import SchedulerError
from sendqueue.domain.models import DeadLetter
from sendqueue.domain.wording import plural
from sendqueue.ports import Alarm, Clock, Schedule, Target

__all__ = ["Worker", "cron_every"]

log = logging.getLogger("sendqueue.scheduler.procrastinate")

_WATCH_INTERVAL = 0.1  # how quickly a set ``stop`` event is noticed
#: Connections of procrastinate's worker for the periodic tasks: its fetch and finish, its
#: heartbeat, its deferrer (the tasks themselves use the scheduler's pool and the store's).
_PERIODIC_CONNECTIONS = 3


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


@dataclass(frozen=True)
class _Outcome:
    """What an invocation leaves for procrastinate to write: ``done`` and ``gone`` delete the
    job, ``retry`` puts it back at ``retry_at``, ``buried`` marks it failed."""

    kind: Literal["done", "gone", "retry", "buried"]
    retry_at: datetime | None = None
    letter: DeadLetter | None = None


class Worker:
    """Runs the schedules' jobs against a target: the worker app, or :meth:`fire_due`.

    Built by :class:`~sendqueue.adapters.procrastinate.scheduler.ProcrastinateScheduler`,
    which documents the options. While it runs, the fire loop opens 2 connections of its own
    (claims, deletes and heartbeats; LISTEN) and procrastinate's worker for the periodic tasks
    at most 3; everything else (failures, retries, dead letters, promotion, recovery) goes
    through ``jobs``.
    """

    def __init__(
        self,
        jobs: Jobs,
        *,
        conninfo: str,
        clock: Clock,
        alarm: Alarm,
        concurrency: int,
        retry_backoff: float,
        max_backoff: float,
        poll_interval: float,
        stalled_after: float,
        invocation_timeout: float,
        reconcile_interval: float | None,
        recover_interval: float | None,
        connect_timeout: float,
        shutdown_timeout: float,
        seed: int | None,
    ) -> None:
        self.jobs = jobs
        self.clock = clock
        self.alarm = alarm
        self.concurrency = concurrency
        self.retry_backoff = retry_backoff
        self.max_backoff = max_backoff
        self.poll_interval = poll_interval
        self.stalled_after = stalled_after
        self.invocation_timeout = invocation_timeout
        self.reconcile_interval = reconcile_interval
        self.recover_interval = recover_interval or max(1.0, stalled_after / 2)
        self.shutdown_timeout = shutdown_timeout
        self._conninfo = conninfo
        self._connect_timeout = connect_timeout
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._running = False

    def promote(self, now: datetime | None = None) -> int:
        return self.jobs.promote(now or self.clock.now())

    # ----------------------------------------------------------------- invocations
    def _invoke(self, job: FireJob, target: Target) -> _Outcome:
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

    def _after_failure(self, job: FireJob, schedule: Schedule, exc: Exception) -> _Outcome:
        now = self.clock.now()
        error = rules.error_text(exc)
        with self.jobs.tx("record a failure") as conn:
            # Raw SQL: procrastinate has no way to lock a job row while the decision is taken.
            rows = self.jobs.rows(
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
        rows = self.jobs.rows(
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
            "schedule %s moved to the dead letters after %s: %s",
            schedule.name,
            plural(attempts, "attempt"),
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

    def _run_fire_job(self, job: FireJob, target: Target) -> bool:
        """The fire loop's body for one claimed job: a failure is recorded here (retry, or dead
        letter and alarm); returns True when the job is to be deleted (done, or deleted)."""
        try:
            outcome = self._invoke(job, target)
        except Exception as exc:  # our own bookkeeping failed, not the target: fire again soon
            log.error("schedule job %d: recording a failure failed: %s", job.id, exc)
            retry_at = self.clock.now() + timedelta(seconds=self.retry_backoff)
            outcome = _Outcome("retry", retry_at=retry_at)
        if outcome.kind in ("done", "gone"):
            return True
        self._apply(job, outcome)
        return False

    def fire_due(self, target: Target) -> int:
        """Invoke every schedule due at ``clock.now()``, once, in due order, on this thread
        (see :meth:`ProcrastinateScheduler.fire_due`). Returns how many invocations were made."""
        now = self.clock.now()
        self.promote(now)
        worker_id = self.jobs.register_worker()
        try:
            with self.jobs.tx("claim due schedules") as conn:
                # Raw SQL: procrastinate's fetch compares with the database's now(), not with
                # this adapter's clock; this claim sets the columns that fetch sets.
                rows = self.jobs.rows(
                    conn,
                    "WITH due AS (SELECT id FROM procrastinate_jobs WHERE task_name = %(task)s "
                    "AND status = 'todo' AND scheduled_at <= %(now)s FOR UPDATE SKIP LOCKED) "
                    "UPDATE procrastinate_jobs j SET status = 'doing', worker_id = %(worker)s "
                    f"FROM due WHERE j.id = due.id RETURNING {JOB_COLUMNS}",
                    {"task": FIRE_TASK, "now": now, "worker": worker_id},
                )
            claimed = sorted(
                (FireJob.from_row(row) for row in rows),
                key=lambda j: (j.scheduled_at or now, j.id),
            )
            fired = 0
            try:
                for job in claimed:
                    fired += 1
                    self._apply(job, self._invoke(job, target))
            finally:
                if fired < len(claimed):
                    with self.jobs.tx("release unfired schedules") as conn:
                        # Raw SQL: procrastinate's retry would count an attempt; this undoes
                        # the claim above.
                        conn.execute(
                            "UPDATE procrastinate_jobs SET status = 'todo', worker_id = NULL "
                            "WHERE id = ANY(%s) AND status = 'doing'",
                            ([j.id for j in claimed[fired:]],),
                        )
        finally:
            self.jobs.unregister_worker(worker_id)
        return fired

    def _apply(self, job: FireJob, outcome: _Outcome) -> None:
        try:
            with self.jobs.tx("record an invocation") as conn:
                if outcome.kind == "retry":
                    assert outcome.retry_at is not None
                    self.jobs.retry(conn, job.id, outcome.retry_at)
                else:
                    status = "failed" if outcome.kind == "buried" else "succeeded"
                    self.jobs.finish(conn, job.id, status, delete=status == "succeeded")
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
        letters: list[DeadLetter | None] = []
        with self.jobs.tx("recover stalled jobs") as conn:
            # Raw SQL: JobManager.get_stalled_jobs is async, takes no connection, locks no rows,
            # and checks either heartbeats or run time (the latter deprecated), not both.
            rows = self.jobs.rows(
                conn,
                f"SELECT {JOB_COLUMNS}, j.worker_id FROM procrastinate_jobs j "
                "LEFT JOIN procrastinate_workers w ON w.id = j.worker_id "
                "WHERE j.status = 'doing' AND (w.id IS NULL "
                "OR w.last_heartbeat < now() - make_interval(secs => %(stalled)s) "
                "OR (SELECT max(e.at) FROM procrastinate_events e WHERE e.job_id = j.id "
                "AND e.type = 'started') < now() - make_interval(secs => %(timeout)s)) "
                "FOR UPDATE OF j SKIP LOCKED",
                {"stalled": self.stalled_after, "timeout": self.invocation_timeout},
            )
            for row in rows:
                job = FireJob.from_row(row)
                if job.task_name != FIRE_TASK:
                    self.jobs.retry(conn, job.id, now)
                    continue
                if job.abort_requested:
                    self.jobs.finish(conn, job.id, "succeeded", delete=True)
                    continue
                schedule = job.schedule()
                attempts = job.attempts + 1
                if attempts > schedule.max_retries:
                    error = (
                        f"Stalled: worker {row['worker_id']} stopped sending heartbeats, or the "
                        f"invocation ran past {self.invocation_timeout:g} s (did it die?)"
                    )
                    letters.append(self._bury(conn, job.id, schedule, attempts, error, now))
                    self.jobs.finish(conn, job.id, "failed", delete=False)
                else:
                    log.warning(
                        "schedule %s: its worker stopped (attempt %d of %d); firing it again",
                        schedule.name,
                        attempts,
                        schedule.max_retries + 1,
                    )
                    self.jobs.retry(conn, job.id, now)
        for letter in letters:
            self._raise_alarm(letter)
        return len(rows)

    # ----------------------------------------------------------------- the worker app
    def run(self, target: Target, stop: threading.Event) -> None:
        """Run the fire loop and a procrastinate worker for the periodic tasks in this thread
        until ``stop`` is set (Dispatcher port; see :meth:`ProcrastinateScheduler.run`)."""
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
                log.error("dispatcher: the worker failed (%s); restart in %.1f s", why, pause)
                stop.wait(pause)
                pause = min(pause * 2, 30.0)
        finally:
            with self._lock:
                self._running = False

    def app(self, target: Target) -> App:
        """The procrastinate app of a worker: the periodic tasks (the fire jobs run in the
        fire loop, :mod:`~sendqueue.adapters.procrastinate.firing`)."""
        horizon = self.jobs.horizon
        app = App(
            connector=PsycopgConnector(
                conninfo=self._conninfo,
                min_size=1,
                max_size=_PERIODIC_CONNECTIONS,
                timeout=self._connect_timeout,
                name="sendqueue-worker",
                kwargs={"connect_timeout": int(self._connect_timeout)},
            ),
            periodic_defaults={
                "max_delay": max(self.reconcile_interval or 0.0, self.recover_interval, horizon)
            },
        )

        def recover(timestamp: int) -> None:
            try:
                recovered = self.recover_stalled()
            except SchedulerError as exc:
                log.error("recovering stalled jobs failed: %s", exc)
                return
            if recovered:
                log.warning("recovered %s", plural(recovered, "stalled job"))

        recover_task = app.task(name=RECOVER_TASK, queue=PERIODIC_QUEUE)(recover)
        app.periodic(cron=cron_every(self.recover_interval), periodic_id="recover")(recover_task)

        def promote(timestamp: int) -> None:
            try:
                self.promote()
            except SchedulerError as exc:  # the next tick tries again, well before due
                log.error("promoting parked schedules failed: %s", exc)

        promote_task = app.task(name=PROMOTE_TASK, queue=PERIODIC_QUEUE)(promote)
        app.periodic(cron=cron_every(horizon / 5), periodic_id="promote")(promote_task)

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

    def fire_loop(self, target: Target) -> FireLoop:
        """The loop that claims and fires the due ``sendqueue.fire`` jobs of this process."""
        return FireLoop(
            self.jobs,
            lambda job: self._run_fire_job(job, target),
            conninfo=self._conninfo,
            clock=self.clock,
            concurrency=self.concurrency,
            poll_interval=self.poll_interval,
            heartbeat_interval=max(0.5, self.stalled_after / 3),
            connect_timeout=self._connect_timeout,
            shutdown_timeout=self.shutdown_timeout,
        )

    async def _serve(self, target: Target, stop: threading.Event) -> None:
        """The fire loop (on a thread) and procrastinate's worker on the periodic queue; when
        either ends or ``stop`` is set, both stop gracefully and what failed is raised."""
        app = self.app(target)
        loop = self.fire_loop(target)
        loop_stop = threading.Event()
        async with app.open_async():
            periodic = asyncio.create_task(
                app.run_worker_async(
                    name="sendqueue-periodic",
                    queues=[PERIODIC_QUEUE],
                    concurrency=len(app.periodic_registry.periodic_tasks),
                    fetch_job_polling_interval=self.poll_interval,
                    # The periodic tasks are deferred due now by every worker's deferrer: the
                    # poll finds them; no LISTEN connection needed. They ignore aborts.
                    listen_notify=False,
                    abort_job_polling_interval=60.0,
                    delete_jobs="successful",
                    install_signal_handlers=False,
                    update_heartbeat_interval=max(0.5, self.stalled_after / 3),
                    stalled_worker_timeout=self.stalled_after,
                    shutdown_graceful_timeout=self.shutdown_timeout,
                )
            )
            firing = asyncio.create_task(asyncio.to_thread(loop.run, loop_stop))
            try:
                while not stop.is_set() and not periodic.done() and not firing.done():
                    await asyncio.wait({periodic, firing}, timeout=_WATCH_INTERVAL)
            finally:
                loop_stop.set()
                # Cancelling run_worker_async is procrastinate's graceful stop: nothing new is
                # fetched, running jobs get shutdown_graceful_timeout to finish.
                if not periodic.done():
                    periodic.cancel()
                await asyncio.wait({periodic, firing})
            for task in (firing, periodic):
                if not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
