"""The SQL stores' :class:`~sendqueue.ports.changes.ChangeSignal`: readers of the change log are
woken on commit instead of polling it.

- **SQLite** (:func:`sqlite_signal`): the store calls :meth:`Wakers.changed` after each write
  it commits, so streams of this process wake at once (every store object on one file shares
  one signal). Commits of other processes (the worker's) are seen by a thread that reads
  ``PRAGMA data_version`` on a connection of its own every ``watch_interval`` while anyone
  listens: that pragma reads only the WAL index header (no table, no lock kept), so checking
  it a hundred times a second costs far less than reading the change log that often.
- **PostgreSQL** (:class:`PgListener`): a trigger on ``change_log`` runs ``NOTIFY
  sendqueue_changes`` in the inserting transaction (migration 0011), which the server delivers
  on commit. One connection per store (one per process) listens while anyone subscribes and
  fans each notification out to every subscriber. When it drops, it reconnects with backoff;
  once listening again it wakes every subscriber, who read from their position and so catch
  up on what committed while nobody listened.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["CHANNEL", "PgListener", "SqliteWatch", "Wakers", "sqlite_signal"]

log = logging.getLogger(__name__)

#: The NOTIFY channel of the change log (migration 0011).
CHANNEL = "sendqueue_changes"


class Wakers:
    """The subscribers of one signal. ``on_first``/``on_last`` start and stop what listens
    (called under the subscribers' lock, so starts and stops never interleave)."""

    settles_late = False

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wakers: dict[int, Callable[[], None]] = {}
        self._next = 0

    def subscribe(self, wake: Callable[[], None]) -> Callable[[], None]:
        with self._lock:
            key, self._next = self._next, self._next + 1
            self._wakers[key] = wake
            if len(self._wakers) == 1:
                self.on_first()

        def unsubscribe() -> None:
            with self._lock:
                if self._wakers.pop(key, None) is not None and not self._wakers:
                    self.on_last()

        return unsubscribe

    def changed(self) -> None:
        """Wake every subscriber (a waker that raises is logged, never raised to a writer)."""
        with self._lock:
            wakers = list(self._wakers.values())
        for wake in wakers:
            try:
                wake()
            except Exception:
                log.exception("change signal: a subscriber's wake failed")

    @property
    def listened(self) -> bool:
        return bool(self._wakers)

    def on_first(self) -> None:
        """The first subscriber came (nothing to start by default)."""

    def on_last(self) -> None:
        """The last subscriber left."""


class SqliteWatch(Wakers):
    """One SQLite file's signal: :meth:`changed` from this process's writers, and a thread
    watching ``PRAGMA data_version`` for other processes' commits (see the module docstring)."""

    def __init__(self, path: str | None, watch_interval: float) -> None:
        super().__init__()
        self.path = path
        self.watch_interval = watch_interval
        self._stop: threading.Event | None = None

    def on_first(self) -> None:
        if self.path is None:
            return  # an in-memory database: no other process can write to it
        self._stop = stop = threading.Event()
        thread = threading.Thread(
            target=self._watch, args=(stop,), name="sendqueue-sqlite-watch", daemon=True
        )
        thread.start()

    def on_last(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._stop = None

    def _watch(self, stop: threading.Event) -> None:
        assert self.path is not None
        db: sqlite3.Connection | None = None
        seen: int | None = None
        while not stop.wait(self.watch_interval):
            try:
                if db is None:
                    db = sqlite3.connect(self.path, timeout=1.0, isolation_level=None)
                version = db.execute("PRAGMA data_version").fetchone()[0]
            except sqlite3.Error as exc:  # the reader's own read reports a failing store
                log.debug("change signal: reading data_version of %s failed: %s", self.path, exc)
                if db is not None:
                    db.close()
                db, seen = None, None
                self.changed()
                continue
            if seen is not None and version != seen:
                self.changed()
            seen = version
        if db is not None:
            db.close()


_sqlite_signals: weakref.WeakValueDictionary[str, SqliteWatch] = weakref.WeakValueDictionary()
_sqlite_lock = threading.Lock()


def sqlite_signal(path: str | None, watch_interval: float = 0.01) -> SqliteWatch:
    """The signal of the SQLite file at ``path``, shared by every store of this process on it
    (``None``, an in-memory database: a signal of its own)."""
    if path is None:
        return SqliteWatch(None, watch_interval)
    with _sqlite_lock:
        found = _sqlite_signals.get(path)
        if found is None:
            found = _sqlite_signals[path] = SqliteWatch(path, watch_interval)
        return found


class PgListener(Wakers):
    """The PostgreSQL signal: one ``LISTEN`` connection, opened by ``connect`` (a psycopg
    connection), while anyone subscribes. See the module docstring."""

    settles_late = True  # an entry shows once older transactions end (migration 0004)

    def __init__(self, connect: Callable[[], Any], *, max_backoff: float = 5.0) -> None:
        super().__init__()
        self._connect = connect
        self.max_backoff = max_backoff
        self._stop: threading.Event | None = None
        self.connections = 0
        """How many listening connections were opened (reconnections count)."""
        self.backend_pid: int | None = None
        """The server process of the listening connection, while one is open."""

    def on_first(self) -> None:
        self._stop = stop = threading.Event()
        thread = threading.Thread(
            target=self._run, args=(stop,), name="sendqueue-pg-listen", daemon=True
        )
        thread.start()

    def on_last(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._stop = None

    def close(self) -> None:
        """Stop listening (the store closes); later subscribers start it again."""
        with self._lock:
            self.on_last()

    def _run(self, stop: threading.Event) -> None:
        backoff = 0.05
        while not stop.is_set():
            opened = self.connections
            try:
                self._listen(stop)
            except Exception as exc:  # the connection dropped, or could not be opened
                log.warning("change signal: listening for changes failed: %s", exc)
            self.backend_pid = None
            # A connection that listened for a while drops: retry soon; one that never opens,
            # less and less often.
            backoff = 0.05 if self.connections > opened else min(backoff * 2, self.max_backoff)
            if stop.wait(backoff):
                return

    def _listen(self, stop: threading.Event) -> None:
        conn = self._connect()
        try:
            conn.autocommit = True
            conn.execute(f"LISTEN {CHANNEL}")
            self.connections += 1
            self.backend_pid = conn.info.backend_pid
            # Commits made while nobody listened sent no notification that reaches us.
            self.changed()
            while not stop.is_set():
                for _ in conn.notifies(timeout=0.5):
                    self.changed()
        finally:
            conn.close()
