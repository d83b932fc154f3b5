"""The embedded dispatcher: the loop that fires due schedules, and its fire threads."""

from __future__ import annotations

import contextlib
import logging
import queue
import sqlite3
import threading
import time

from sendqueue.adapters.embedded.leases import LeaseBook
from sendqueue.adapters.embedded.store import to_us
from sendqueue.domain.errors import SchedulerError
from sendqueue.domain.wording import plural
from sendqueue.ports import Schedule, Target

__all__ = ["Dispatcher"]

log = logging.getLogger("sendqueue.scheduler")

#: What the dispatcher hands a fire thread: the schedule, its :class:`_Slot`, and whether it
#: was claimed before its due time (see ``lookahead``).
_Job = tuple[Schedule, "_Slot", bool]


class _Slot:
    """A claimed schedule's progress: ``started`` once a fire thread took it (set before that
    thread checks ``halt``, so a job the drain finds unstarted is never invoked), ``ended``
    once its invocation ended or was skipped."""

    __slots__ = ("ended", "started")

    def __init__(self) -> None:
        self.started = threading.Event()
        self.ended = threading.Event()


class Dispatcher(LeaseBook):
    """The Dispatcher port of the embedded scheduler: the loop that fires due schedules."""

    concurrency: int
    shutdown_timeout: float
    _running: bool

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
        in_flight: dict[str, _Slot] = {}  # claimed, not yet ended
        jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        halt = threading.Event()  # set once this loop ends, whether stopped or failed
        for n in range(self.concurrency):
            threading.Thread(
                target=self._fire_loop,
                args=(jobs, target, owner, halt),
                name=f"sendqueue-fire-{n}",
                daemon=True,  # a target hung past shutdown_timeout must not keep the process
            ).start()
        renew_every = self.lease_seconds / 3
        next_renew = time.monotonic() + renew_every
        error_pause = 0.5
        try:
            while not stop.is_set():
                seq = self._seq()
                for name in [n for n, slot in in_flight.items() if slot.ended.is_set()]:
                    del in_flight[name]
                timeout = self.max_sleep
                try:
                    if in_flight and time.monotonic() >= next_renew:
                        self._renew(owner)
                        next_renew = time.monotonic() + renew_every
                    # Up to one queued job per fire thread besides the running ones, claimed
                    # in batches once the queue is down to one job per thread: one write on
                    # the file per ``concurrency`` sends, and no thread idles while one is due.
                    free = 2 * self.concurrency - len(in_flight)
                    if free >= self.concurrency:
                        now = self.clock.now()
                        claimed = self._claim(owner, now, limit=free, ahead=self.lookahead)
                        if stop.is_set():
                            self._release(owner, {s.name for s in claimed})
                            break
                        for schedule in claimed:
                            slot = in_flight[schedule.name] = _Slot()
                            jobs.put((schedule, slot, schedule.due_at > now))
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
            halt.set()
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
        halt: threading.Event,
    ) -> None:
        """One of the dispatcher's fire threads: invoke what it hands over, until told to end.
        Nothing is started once ``halt`` is set (the dispatcher's loop ended): the drain
        releases the jobs no thread had taken.

        A schedule claimed ahead of its due time (``lookahead``) is waited for here, so the
        claim's transaction is not between the due time and the invocation; it is invoked
        only once due, only if ``halt`` is still unset, and only if it is still ours: a
        schedule deleted or replaced after the claim but before its due time does not fire, as
        if it had not been claimed. ``slot.ended`` is set (and the dispatcher notified) once
        the invocation has ended (or was skipped): the dispatcher then counts it as free.
        """
        reader: sqlite3.Connection | None = None
        try:
            while (job := jobs.get()) is not None:
                schedule, slot, ahead = job
                slot.started.set()
                try:
                    if halt.is_set():
                        continue  # claimed, not started: released with the others
                    if ahead:
                        if not self._wait_until_due(schedule, halt):
                            continue
                        if reader is None:
                            reader = self._reader()
                        if not self._still_ours(reader, schedule, owner):
                            continue
                    self._invoke(schedule, target, owner, defer_delete=True)
                finally:
                    slot.ended.set()
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
                (schedule.name, owner, schedule.client_token, to_us(schedule.due_at)),
            ).fetchone()
        except sqlite3.Error as exc:
            log.warning("schedule %s: cannot re-check it before firing: %s", schedule.name, exc)
            return True
        if row is None:
            log.info("schedule %s was deleted or replaced after being claimed", schedule.name)
        return row is not None

    def _drain(self, owner: str, in_flight: dict[str, _Slot]) -> None:
        """Let running targets finish (bounded), then release what we still hold: a job still
        queued (no fire thread took it) is released too, and skipped if a thread takes it."""
        deadline = time.monotonic() + self.shutdown_timeout
        renew_every = self.lease_seconds / 3
        next_renew = time.monotonic() + renew_every
        while True:
            seq = self._seq()
            running = {
                n
                for n, slot in in_flight.items()
                if slot.started.is_set() and not slot.ended.is_set()
            }
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
                "dispatcher stopped with %s still running: %s",
                plural(len(running), "invocation"),
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
