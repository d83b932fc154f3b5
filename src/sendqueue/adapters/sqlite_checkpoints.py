"""The SQLite task store's checkpoints, on a thread of their own: :class:`WalCheckpoints`.

In WAL mode a commit appends pages to the log, and the commit that finds the log at
``wal_autocheckpoint`` pages copies them back into the database file and waits for two fsyncs
before it returns: about 65 ms at 10,000 pages, on the thread that committed (a provisioning
run's or a worker's). Here each commit of this process wakes a thread that runs a PASSIVE
checkpoint, at most one per :data:`FOLD_INTERVAL_SECONDS`: it copies what the log holds
without waiting for readers or writers, so the log rarely reaches the automatic checkpoint's
size, and a commit that still reaches it finds little left to copy. The automatic checkpoint
stays on as the backstop (a process without this thread, or a log it cannot keep up with).
Measured: docs/performance.md, section 2.
"""

from __future__ import annotations

import logging
import sqlite3
import threading

__all__ = ["FOLD_INTERVAL_SECONDS", "WalCheckpoints"]

log = logging.getLogger(__name__)

#: At most one checkpoint per this many seconds: often enough that a provisioning run's
#: writes (a thousand tasks every few tens of milliseconds) seldom reach the automatic
#: checkpoint, seldom enough that a busy log costs a few fsyncs a second.
FOLD_INTERVAL_SECONDS = 0.2


class WalCheckpoints:
    """Checkpoints of the database file at ``path`` after this process's commits, on a thread
    started at the first commit and stopped by :meth:`close` (a later commit starts another)."""

    def __init__(self, path: str, *, interval: float = FOLD_INTERVAL_SECONDS) -> None:
        self._path = path
        self._interval = interval
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._due = threading.Event()
        self._stop = threading.Event()

    def committed(self) -> None:
        """Note a commit: a checkpoint follows within the interval."""
        if self._thread is None:
            self._start()
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
            self._thread = threading.Thread(
                target=self._run,
                args=(self._due, self._stop),
                name="sqlite-checkpoints",
                daemon=True,
            )
            self._thread.start()

    def _run(self, due: threading.Event, stop: threading.Event) -> None:
        try:
            db = sqlite3.connect(self._path, isolation_level=None)
        except sqlite3.Error as exc:
            log.warning("task store %s: no checkpoint thread (%s)", self._path, exc)
            return
        try:
            while due.wait() and not stop.is_set():
                due.clear()
                try:
                    # PASSIVE: never waits, so a reader or another process's checkpoint only
                    # leaves part of the log for the next one.
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error as exc:
                    log.warning("task store %s: checkpoint failed (%s)", self._path, exc)
                if stop.wait(self._interval):
                    return
        finally:
            db.close()
