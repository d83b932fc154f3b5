"""Checkpoints of a SQLite file's write-ahead log after bulk writes, on a thread of their own:
:class:`WalCheckpoints`.

In WAL mode a commit appends pages to the log, and the commit that finds the log at
``wal_autocheckpoint`` pages (10,000 here, about 40 MB) copies them back into the database
file and waits for two fsyncs before it returns: about 65 ms, on the thread that committed.
During provisioning that is the writer's thread, three times per 100,000 emails. Here a bulk
write's commit (a provisioning chunk's tasks, a batch of schedules) wakes a thread that runs
a PASSIVE checkpoint, at most one per :data:`FOLD_INTERVAL_SECONDS`: it copies what the log
holds without waiting for readers or writers, so a run's commits seldom find the log full,
and one that does finds little left to copy. Other commits (a send's, a webhook delivery's)
leave the log to the automatic checkpoint as before: a checkpoint every fraction of a second
under their steady stream of small writes would cost more fsyncs than it saves (an earlier
attempt slowed the webhook drain, docs/performance-history.md). Measured: docs/performance.md,
section 2.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from urllib.parse import quote

__all__ = ["FOLD_INTERVAL_SECONDS", "WalCheckpoints"]

log = logging.getLogger(__name__)

#: At most one checkpoint per this many seconds: often enough that a provisioning run's
#: writes (a thousand tasks every few tens of milliseconds, about 40 MB a second) seldom reach
#: the automatic checkpoint, and at most ten fsyncs a second.
FOLD_INTERVAL_SECONDS = 0.2


class WalCheckpoints:
    """Checkpoints of the database file at ``path`` after this process's bulk writes, on a
    thread started at the first one and stopped by :meth:`close` (a later one starts
    another). Nothing here raises into a write that committed: a thread that cannot start
    or open the file leaves the log to the automatic checkpoint, and says so in the log."""

    def __init__(self, path: str, *, interval: float = FOLD_INTERVAL_SECONDS) -> None:
        self._path = path
        self._interval = interval
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._due = threading.Event()
        self._stop = threading.Event()

    def committed(self) -> None:
        """Note a bulk write's commit: a checkpoint follows within the interval."""
        if self._thread is None:
            try:
                self._start()
            except RuntimeError as exc:  # "can't start new thread"
                log.warning("SQLite file %s: no checkpoint thread (%s)", self._path, exc)
                return
        self._due.set()

    def close(self) -> None:
        """Stop the thread and wait for it (a checkpoint under way finishes first)."""
        with self._lock:
            thread, self._thread = self._thread, None
            stop, self._stop = self._stop, threading.Event()
            due, self._due = self._due, threading.Event()
        stop.set()
        due.set()
        if thread is not None:
            thread.join()

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            thread = threading.Thread(
                target=self._run,
                args=(self._due, self._stop),
                name="sqlite-checkpoints",
                daemon=True,
            )
            thread.start()  # kept only once started: close() joins it
            self._thread = thread

    def _run(self, due: threading.Event, stop: threading.Event) -> None:
        try:
            # mode=rw: a file removed since it was opened is not made anew (an empty one
            # beside the old file's log would take that log for its own).
            db = sqlite3.connect(f"file:{quote(self._path)}?mode=rw", uri=True)
        except sqlite3.Error as exc:
            log.warning("SQLite file %s: no checkpoint thread (%s)", self._path, exc)
            return
        try:
            while due.wait() and not stop.is_set():
                due.clear()
                try:
                    # PASSIVE: never waits, so a reader or another process's checkpoint only
                    # leaves part of the log for the next one.
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error as exc:
                    log.warning("SQLite file %s: checkpoint failed (%s)", self._path, exc)
                if stop.wait(self._interval):
                    return
        finally:
            db.close()
