"""Folds a SQLite file's write-ahead log back into the database on a thread of its own.

A commit that takes the log past ``wal_autocheckpoint`` folds it itself before it returns:
it copies tens of MB and syncs two files (80-100 ms at 40 MB on the development machines),
and the writer, a provisioning chunk or a send, waits. :class:`WalFolder` runs the same
passive checkpoint from a thread and connection of its own once the log passes
``fold_bytes``, so writers go on while it copies; SQLite lets a passive checkpoint run beside
readers and writers. The connections keep their ``wal_autocheckpoint`` as the backstop: a
process whose folder is not running (a fork) or falls behind still folds at commit.

The thread starts on the first commit that finds the log past ``fold_bytes``: a file that
stays small never gets one.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time

__all__ = ["FOLD_BYTES", "WalFolder"]

log = logging.getLogger(__name__)

#: Log size at which the folder folds: well below the backstop (the connections'
#: ``wal_autocheckpoint`` of 10,000 pages, about 40 MB), so commits rarely fold themselves.
FOLD_BYTES = 16 * 1024 * 1024

#: A log still past ``fold_bytes`` right after a fold (no writer has restarted it yet) is
#: folded again once it grew by a quarter of ``fold_bytes``, or after this many seconds.
_REFOLD_SECONDS = 1.0


class WalFolder:
    """Passive checkpoints of the SQLite file at ``path`` off the writers' path.

    Writers call :meth:`committed` after each commit (a ``stat`` of the log, about a
    microsecond); :meth:`close` stops the thread, and a later commit starts it again.
    """

    def __init__(self, path: str, *, fold_bytes: int = FOLD_BYTES) -> None:
        self._path = path
        self._log_path = path + "-wal"
        self._fold_bytes = fold_bytes
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._stopping = False
        #: Folds run so far (a passive checkpoint each), for tests and curious operators.
        self.folds = 0

    def committed(self) -> None:
        """A writer committed: wake the folder when the log has passed ``fold_bytes``."""
        try:
            size = os.stat(self._log_path).st_size
        except OSError:
            return  # no log (yet): nothing to fold
        if size < self._fold_bytes:
            return
        with self._lock:
            if self._stopping:
                return
            thread = self._thread
            if thread is None or self._pid != os.getpid() or not thread.is_alive():
                self._start()
        self._wake.set()

    def close(self) -> None:
        """Stop the thread (waiting for a fold under way); a later commit starts it anew."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._stopping = True
        self._wake.set()
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout=10)
        with self._lock:
            self._stopping = False

    def _start(self) -> None:
        self._wake.clear()
        self._pid = os.getpid()
        self._thread = threading.Thread(
            target=self._run, name=f"wal-folder-{os.path.basename(self._path)}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        me = threading.current_thread()
        try:
            db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            log.warning("WAL folder for %s not started: %s", self._path, exc)
            return
        folded_size, folded_at = 0, 0.0
        try:
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._thread is not me:
                    return  # closed, or replaced by a newer thread
                try:
                    size = os.stat(self._log_path).st_size
                except OSError:
                    continue
                grown = size - folded_size >= self._fold_bytes // 4
                if size < self._fold_bytes or not (
                    grown or time.monotonic() - folded_at >= _REFOLD_SECONDS
                ):
                    continue
                try:
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error as exc:
                    # Harmless: the commits' own autocheckpoint folds instead.
                    log.debug("WAL fold of %s skipped: %s", self._path, exc)
                    continue
                folded_size, folded_at = size, time.monotonic()
                self.folds += 1
        finally:
            db.close()
