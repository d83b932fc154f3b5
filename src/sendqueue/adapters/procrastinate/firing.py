"""The fire loop of a worker process: ``sendqueue.fire`` jobs claimed in batches, ahead of time.

Not procrastinate's own worker (docs/decisions/0002-procrastinate-fire-loop.md): it fetches
one job per round trip from one asyncio task, whose thread shares the GIL with the sending
threads, and finishes each job in a transaction of its own, so a process could fire no faster
than one fetch's latency allows. So:

- **One dispatcher thread** on a connection of its own. One statement per round
  (:meth:`~.jobs.Jobs.settle_and_claim`) deletes the jobs that succeeded since the last round,
  claims jobs due within ``lookahead``, in due order, under ``FOR UPDATE SKIP LOCKED``
  (workers never wait for each other; the cost follows the index of waiting jobs by due time,
  not their number), and reads the due time of the next waiting job. A claimed job waits in
  the process (the held jobs) for its exact due instant.
- **Claim-ahead depth**: a round claims enough for the idle fire threads plus the jobs the
  threads will start within ``claim_ahead`` seconds (from the mean time a job has taken here),
  at least 1 and at most ``2 x concurrency`` jobs ahead, and a backlog is claimed again once
  half of those are started. So a fire thread rarely waits for a round, yet no process holds
  more than it can start soon: a job held here is a job another worker cannot take.
- **``concurrency`` fire threads** run the target. When one ends a job it takes the next due
  held job itself, without waiting for the dispatcher to wake and hand it over. A failure is
  decided and recorded there (retry with backoff, dead letter and alarm); a success is
  only noted, and the dispatcher deletes it in its next round.
- **A listener thread** (LISTEN on procrastinate's ``procrastinate_any_queue_v1`` channel)
  wakes the dispatcher when a job is deferred, and notes abort requests: a job deleted after
  it was claimed ahead, before its due instant, does not fire.
- **Sleep** until the first of: the next due time (in hand, or waiting in the database, minus
  ``lookahead``), a finished send, a notification, ``poll_interval`` (a schedule deferred
  through a path that does not notify is still found), the next heartbeat.
- **Liveness**: a worker row registered with procrastinate's ``register_worker`` and kept
  alive with its ``update_heartbeat`` every ``stalled_after / 3`` s, so ``recover_stalled``
  fires again the jobs of a killed process, as it does for procrastinate's workers.
- **Stop**: nothing more is claimed; claimed jobs that did not start are given back (waiting
  again, no attempt counted); running ones get ``shutdown_timeout`` to finish; the worker row
  is removed. A backend failure ends the loop the same way and raises; the caller starts a new
  one after a pause (:meth:`~.worker.Worker.run`).

Due instants are compared with the adapter's clock (as :meth:`~.worker.Worker.fire_due` does),
not the database's ``now()``: keep the clocks in sync (NTP).
"""

from __future__ import annotations

import contextlib
import heapq
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

import psycopg

from sendqueue.adapters.procrastinate.jobs import FireJob, Jobs
from sendqueue.ports import Clock

__all__ = ["FireLoop"]

log = logging.getLogger("sendqueue.scheduler.procrastinate")

#: procrastinate's channel for every queue: job_inserted and abort_job_requested notifications.
_CHANNEL = "procrastinate_any_queue_v1"
#: How long a listener's wait lasts before it checks whether to stop.
_LISTEN_SLICE = 0.25


class FireLoop:
    """Claims due fire jobs in batches and runs ``run_job`` on them (module docstring).

    ``run_job`` runs the target for one claimed job and records a failure itself; it returns
    True when the job is to be deleted (it succeeded, or its schedule was deleted meanwhile).
    One loop holds two connections of its own (the dispatcher's and the listener's).
    """

    def __init__(
        self,
        jobs: Jobs,
        run_job: Callable[[FireJob], bool],
        *,
        conninfo: str,
        clock: Clock,
        concurrency: int,
        poll_interval: float,
        heartbeat_interval: float,
        connect_timeout: float,
        shutdown_timeout: float,
        lookahead: float = 0.05,
        claim_ahead: float = 0.1,
    ) -> None:
        self.jobs = jobs
        self.run_job = run_job
        self.clock = clock
        self.concurrency = concurrency
        self.claim_ahead = claim_ahead
        self.poll_interval = poll_interval
        self.heartbeat_interval = heartbeat_interval
        self.shutdown_timeout = shutdown_timeout
        self.lookahead = timedelta(seconds=lookahead)
        self._conninfo = conninfo
        self._connect_timeout = connect_timeout
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._running = 0
        self._held: list[tuple[datetime, int, FireJob]] = []  # claimed, not started: by due
        self._job_seconds: float | None = None  # moving mean of a job's time on a fire thread
        self._stop = threading.Event()
        self._finished: list[int] = []
        self._inserted = False  # a job was deferred since the last claim
        self._aborted: set[int] = set()
        self._listen_error: BaseException | None = None
        self._pool: ThreadPoolExecutor | None = None

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(
            self._conninfo, autocommit=True, connect_timeout=int(self._connect_timeout)
        )

    # ----------------------------------------------------------------- threads
    def _listen(self, conn: psycopg.Connection[Any], done: threading.Event) -> None:
        try:
            while not done.is_set():
                for note in conn.notifies(timeout=_LISTEN_SLICE):
                    payload = json.loads(note.payload)
                    with self._lock:
                        if payload.get("type") == "abort_job_requested":
                            self._aborted.add(int(payload["job_id"]))
                        else:
                            self._inserted = True
                    self._wake.set()
        except Exception as exc:
            if not done.is_set():
                self._listen_error = exc
                self._wake.set()

    def _fire(self, first: FireJob) -> None:
        """Run ``first``, then each next due held job, until none is due (or the loop stops)."""
        job: FireJob | None = first
        while job is not None:
            delete = False
            ended = False  # normally: a BaseException (SystemExit...) ends this thread's turn
            started = time.monotonic()
            try:
                delete = self.run_job(job)
                ended = True
            except Exception:  # run_job records failures; this is a bug: the job is recovered
                log.exception("schedule job %d: the invocation failed unexpectedly", job.id)
                ended = True
            finally:
                took = time.monotonic() - started
                with self._lock:
                    mean = self._job_seconds
                    self._job_seconds = took if mean is None else mean + (took - mean) / 8
                    if delete:
                        self._finished.append(job.id)
                    job = self._take_due() if ended and not self._stop.is_set() else None
                    if job is None:
                        self._running -= 1
                self._wake.set()

    def _take_due(self) -> FireJob | None:
        """The first held job due now, popped (the caller holds the lock and a free thread);
        a job deleted after it was claimed is dropped on the way."""
        now = self.clock.now()
        while self._held and self._held[0][0] <= now:
            _, _, job = heapq.heappop(self._held)
            if job.id in self._aborted:  # deleted after it was claimed: not fired
                self._aborted.discard(job.id)
                self._finished.append(job.id)
                continue
            return job
        return None

    def _ahead(self) -> int:
        """How many claimed jobs to hold beyond the running ones: what the fire threads start
        within ``claim_ahead`` seconds at the mean job time, between 1 and 2 x concurrency
        (``concurrency`` until a job has been timed)."""
        with self._lock:
            mean = self._job_seconds
        if mean is None:
            return self.concurrency
        starts = self.concurrency * self.claim_ahead / max(mean, 1e-6)
        return max(1, min(2 * self.concurrency, math.ceil(starts)))

    def _take_finished(self) -> list[int]:
        with self._lock:
            finished, self._finished = self._finished, []
            return finished

    # ----------------------------------------------------------------- the loop
    def run(self, stop: threading.Event) -> None:
        """Fire due jobs until ``stop`` is set; raises (after cleaning up what it can) when
        the database fails."""
        self._stop = stop
        conn = self._connect()
        listen_done = threading.Event()
        listener_conn: psycopg.Connection[Any] | None = None
        listener: threading.Thread | None = None
        self._pool = pool = ThreadPoolExecutor(
            self.concurrency, thread_name_prefix="sendqueue-fire"
        )
        worker_id: int | None = None
        try:
            listener_conn = self._connect()
            listener_conn.execute(f"LISTEN {_CHANNEL}")
            listener = threading.Thread(
                target=self._listen,
                args=(listener_conn, listen_done),
                name="sendqueue-fire-listen",
                daemon=True,
            )
            listener.start()
            worker_id = self.jobs.register_worker()
            self._loop(stop, conn, worker_id)
        finally:
            listen_done.set()
            self._shut_down(conn, worker_id, pool)
            if listener is not None:
                listener.join(_LISTEN_SLICE * 4)
            for c in (conn, listener_conn):
                if c is not None:
                    with contextlib.suppress(psycopg.Error):
                        c.close()

    def _loop(self, stop: threading.Event, conn: psycopg.Connection[Any], worker_id: int) -> None:
        next_due: datetime | None = None  # of the first waiting job not in hand
        backlog = True  # the last claim was full: more may be due
        poll_at = 0.0
        heartbeat_at = time.monotonic() + self.heartbeat_interval
        while not stop.is_set():
            self._wake.clear()
            if self._listen_error is not None:
                raise self._listen_error
            ahead = self._ahead()
            with self._lock:
                running, inserted, self._inserted = self._running, self._inserted, False
                held = len(self._held)
            now = self.clock.now()
            # Room for the idle threads and the claim-ahead depth. A backlog is claimed again
            # once half the depth is started (batches, not a claim per send, and a round ends
            # before the threads run out); otherwise when a waiting job comes due, on a
            # notification, or at the poll.
            room = self.concurrency - running + ahead - held
            due_soon = next_due is not None and next_due <= now + self.lookahead
            finished = self._take_finished()
            try:
                if room > 0 and (
                    (backlog and held <= ahead // 2)
                    or inserted
                    or due_soon
                    or time.monotonic() >= poll_at
                ):
                    claimed, next_due = self.jobs.settle_and_claim(
                        conn, worker_id, finished=finished, until=now + self.lookahead, limit=room
                    )
                    finished = []
                    backlog = len(claimed) == room
                    poll_at = time.monotonic() + self.poll_interval
                    with self._lock:
                        for job in claimed:
                            heapq.heappush(self._held, (job.scheduled_at or now, job.id, job))
                elif finished and (running == 0 or len(finished) >= self.concurrency):
                    self.jobs.settle_and_claim(
                        conn, worker_id, finished=finished, until=now, limit=0
                    )
                    finished = []
            finally:
                if finished:  # not settled (this round, or it failed): the next one or the stop
                    with self._lock:
                        self._finished[:0] = finished
            if time.monotonic() >= heartbeat_at:
                self.jobs.heartbeat(conn, worker_id)
                heartbeat_at = time.monotonic() + self.heartbeat_interval
            self._start_due()
            self._sleep(next_due, backlog, ahead, poll_at, heartbeat_at)

    def _start_due(self) -> None:
        """Hand due held jobs to idle fire threads (busy ones take the next themselves)."""
        while True:
            with self._lock:
                if self._running >= self.concurrency:
                    break
                job = self._take_due()
                if job is None:
                    break
                self._running += 1
            assert self._pool is not None
            self._pool.submit(self._fire, job)
        with self._lock:  # abort requests matter only for jobs in hand
            self._aborted &= {job.id for _, _, job in self._held}

    def _sleep(
        self,
        next_due: datetime | None,
        backlog: bool,
        ahead: int,
        poll_at: float,
        heartbeat_at: float,
    ) -> None:
        mono = time.monotonic()
        wait = min(poll_at, heartbeat_at) - mono
        now = self.clock.now()
        with self._lock:
            running, finished, held = self._running, bool(self._finished), len(self._held)
            first = self._held[0][0] if self._held else None
        if first is not None and running < self.concurrency:
            wait = min(wait, (first - now).total_seconds())
        room = self.concurrency - running + ahead - held
        if room > 0 and next_due is not None:
            wait = min(wait, (next_due - self.lookahead - now).total_seconds())
        if room > 0 and backlog and held <= ahead // 2:
            wait = 0.0
        if finished and running == 0:
            wait = 0.0
        if wait > 0:
            self._wake.wait(wait)

    # ----------------------------------------------------------------- stop
    def _shut_down(
        self, conn: psycopg.Connection[Any], worker_id: int | None, pool: ThreadPoolExecutor
    ) -> None:
        """Give back the jobs in hand, let the running ones finish, settle, unregister."""
        with self._lock:  # the fire threads take no held job once stop is set
            unstarted = [job.id for _, _, job in self._held]
            self._held.clear()
        if worker_id is not None and unstarted:
            with contextlib.suppress(psycopg.Error):
                self.jobs.release(conn, worker_id, unstarted)
        deadline = time.monotonic() + self.shutdown_timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self._running == 0:
                    break
            self._wake.wait(0.05)
            self._wake.clear()
        pool.shutdown(wait=False)
        finished = self._take_finished()
        if worker_id is None:
            return
        try:
            if finished:
                self.jobs.settle_and_claim(
                    conn, worker_id, finished=finished, until=self.clock.now(), limit=0
                )
            # Jobs still running past the timeout lose their worker: recover_stalled fires
            # them again, as for a killed process.
            self.jobs.unregister_worker(worker_id)
        except Exception as exc:  # the database is gone: the heartbeat lapses instead
            log.warning("fire loop: could not settle and unregister worker %d: %s", worker_id, exc)
