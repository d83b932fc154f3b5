"""Checkpoints of a SQLite file's write-ahead log after bulk writes, on a thread of their own:
:class:`WalCheckpoints`.

In WAL mode a commit appends pages to the log, and the commit that finds the log at
``wal_autocheckpoint`` pages (10,000 here, about 40 MB) copies them back into the database
file and waits for two fsyncs before it returns: about 65 ms, on the thread that committed.
During provisioning that is the writer's thread, three times per 100,000 emails. Here bulk
writes (a provisioning chunk's tasks, a batch of schedules) count the rows they add, and
every :data:`FOLD_ROWS` of them wake a thread that runs a PASSIVE checkpoint: it copies what
the log holds without waiting for readers or writers, so a run's commits seldom find the log
full, and one that does finds little left to copy. Other commits (a send's, a webhook
delivery's, a few follow-ups') leave the log to the automatic checkpoint as before: a
checkpoint after each of their small writes would cost more fsyncs than it saves (an earlier
attempt that folded every 16 MB slowed the webhook drain, docs/performance-history.md).
Measured: docs/performance.md, section 2.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from urllib.parse import quote

__all__ = ["FOLD_ROWS", "WalCheckpoints"]

log = logging.getLogger(__name__)

#: Rows of bulk writes per checkpoint: a provisioning run's five chunks of a thousand (about
#: 1,500 pages of log with senders, against the automatic checkpoint's 10,000).
FOLD_ROWS = 5_000


class WalCheckpoints:
    """Checkpoints of the database file at ``path`` after this process's bulk writes, on a
    thread started at the first one and stopped by :meth:`close` (a later one starts
    another). Nothing here raises into a write that committed: a thread that cannot start
    or open the file leaves the log to the automatic checkpoint, and says so in the log."""

    def __init__(self, path: str, *, fold_rows: int | None = None) -> None:
        # The path as it is now: the thread opens it later, maybe from another directory.
        self._path = os.path.realpath(path)
        self._fold_rows = FOLD_ROWS if fold_rows is None else fold_rows
        self._lock = threading.Lock()
        self._rows = 0  # written since the last checkpoint was asked for
        self._thread: threading.Thread | None = None
        self._due = threading.Event()
        self._stop = threading.Event()

    def written(self, rows: int) -> None:
        """Note a bulk write's commit of ``rows`` rows: every ``fold_rows`` of them, a
        checkpoint follows."""
        with self._lock:
            self._rows += rows
            if self._rows < self._fold_rows:
                return
            self._rows = 0
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
        finally:
            db.close()
