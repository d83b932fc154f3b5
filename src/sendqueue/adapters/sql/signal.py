"""The SQL stores' :class:`~sendqueue.ports.changes.ChangeSignal`: readers of the change log are
woken on commit instead of polling it.

- **SQLite** (:func:`sqlite_signal`): the store calls :meth:`Wakers.changed` after each write
  it commits, so streams of this process wake at once (every store object on one file shares
  one signal). Commits of other processes (the worker's) are seen by a thread that reads
  ``PRAGMA data_version`` on a connection of its own every ``watch_interval`` while anyone
  listens: that pragma reads only the WAL index header (no table, no lock kept), so checking
  it a hundred times a second costs far less than reading the change log that often.
- **PostgreSQL** (:class:`PgNotifier`, :class:`PgListener`): after each write it commits, a
  store pokes its process's notifier, which sends ``NOTIFY sendqueue_changes`` in a
  transaction of its own, one at a time (pokes meanwhile fold into the next). Not in the
  writing transaction, nor from a trigger: a transaction that notifies holds a cluster-wide
  lock through its commit, which serialised the writers (8 writers: 229 transactions per
  second instead of 895). One connection per store (one per process) listens while anyone
  subscribes and fans each notification out to every subscriber. When it drops, it reconnects
  with backoff; once listening again it wakes every subscriber, who read from their position
  and so catch up on what committed while nobody listened.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

__all__ = [
    "CHANNEL",
    "PgListener",
    "PgNotifier",
    "SqliteWatch",
    "Wakers",
    "pg_notifier",
    "release_pg_notifier",
    "sqlite_signal",
]

log = logging.getLogger(__name__)

#: The NOTIFY channel of the change log.
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
            if len(self._wakers) == 1 or not self.running:
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

    @property
    def running(self) -> bool:
        """Whether what listens runs (True by default: nothing to start)."""
        return True

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
            # The first read after a (re)connect has nothing to compare with: a commit made
            # before it (since the reader last read) is caught by one wake now.
            if seen is None or version != seen:
                self.changed()
            seen = version
        if db is not None:
            db.close()


_sqlite_signals: weakref.WeakValueDictionary[str, SqliteWatch] = weakref.WeakValueDictionary()
_registry_lock = threading.Lock()


def sqlite_signal(path: str | None, watch_interval: float = 0.01) -> SqliteWatch:
    """The signal of the SQLite file at ``path``, shared by every store of this process on it
    (``None``, an in-memory database: a signal of its own)."""
    if path is None:
        return SqliteWatch(None, watch_interval)
    with _registry_lock:
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

    @property
    def running(self) -> bool:
        return self._stop is not None

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


class PgNotifier:
    """Sends ``NOTIFY sendqueue_changes`` after this process's writes, from a thread of its own
    on a connection of its own (``connect``), shared by the process's stores on one database
    (:func:`pg_notifier`): one notification at a time, at most one per ``min_gap`` seconds,
    the pokes meanwhile folded into the next."""

    def __init__(self, connect: Callable[[], Any], min_gap: float = 0.005) -> None:
        self._connect = connect
        self.min_gap = min_gap
        self._cond = threading.Condition()
        self._poked = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self.users = 0
        self.sent = 0
        """Notifications sent (for tests and diagnostics)."""

    def poke(self) -> None:
        """A write committed: notify soon. Never blocks on the database, never raises."""
        with self._cond:
            if self._closed:
                return
            self._poked = True
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="sendqueue-pg-notify", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def close(self, timeout: float = 5.0) -> None:
        """Send what was poked for, then stop; later pokes are ignored."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        db: Any = None
        try:
            while True:
                with self._cond:
                    while not self._poked and not self._closed:
                        self._cond.wait()
                    if not self._poked:
                        return  # closed, nothing left to send
                    self._poked = False
                try:
                    if db is None:
                        db = self._connect()
                    db.execute(f"SELECT pg_notify('{CHANNEL}', '')")
                    self.sent += 1
                except Exception as exc:  # readers still poll now and then: nothing is lost
                    log.warning("change signal: NOTIFY failed: %s", exc)
                    if db is not None:
                        db.close()
                    db = None
                time.sleep(self.min_gap)
        finally:
            if db is not None:
                db.close()


_pg_notifiers: dict[str, PgNotifier] = {}


def pg_notifier(key: str, connect: Callable[[], Any]) -> PgNotifier:
    """The notifier of the database ``key`` (its URL), shared by this process's stores on it;
    each store gives it back with :func:`release_pg_notifier` when it closes."""
    with _registry_lock:
        found = _pg_notifiers.get(key)
        if found is None:
            found = _pg_notifiers[key] = PgNotifier(connect)
        found.users += 1
        return found


def release_pg_notifier(notifier: PgNotifier) -> None:
    """One store of the database closes: the last one stops the notifier (after it sent what
    it was poked for)."""
    with _registry_lock:
        notifier.users -= 1
        if notifier.users > 0:
            return
        for key, found in list(_pg_notifiers.items()):
            if found is notifier:
                del _pg_notifiers[key]
    notifier.close()
