"""The PostgreSQL store's fast-path connections: psycopg connections in autocommit mode,
opened by the engine and kept between calls, at most ``idle_max`` of them idle.

Not ``psycopg_pool.ConnectionPool``, whose failures callers would see
(docs/decisions/0003-postgres-fast-path-pool.md): it opens connections in background
workers, so a database that refuses connections makes a caller wait for the pool's timeout
instead of failing at once; it bounds the connections in use (callers queue) where this bounds
only the idle ones; a retry after the server ended every session can draw another dead idle
connection; and a closed pool cannot reopen.
tests/integration/test_pg_store_connections.py pins each of these.

No pre-ping: a connection the server dropped is noticed by the first statement on it. Reads
are then retried once on a new connection; writes only when the session had certainly ended
before they committed (:data:`~sendqueue.adapters.sql.errors.PG_SESSION_ENDED`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import suppress
from typing import Any, TypeVar

from sqlalchemy.engine import Engine

from sendqueue.adapters.sql.errors import PG_ERRORS, PG_SESSION_ENDED

__all__ = ["FastPathPool"]

_T = TypeVar("_T")


class FastPathPool:
    """Driver connections of the engine's database for single-statement calls."""

    def __init__(self, engine: Engine, idle_max: int) -> None:
        self._engine = engine
        self._lock = threading.Lock()
        self._idle: list[Any] = []  # not in use, most recently used last
        self._idle_max = idle_max
        self._generation = 0  # bumped by close(): connections of an older one are closed

    def open(self) -> Any:
        """A new connection from the engine (its connect timeout and pre-ping, so a database
        that is down fails at once), detached from its pool: autocommit, time zone UTC."""
        raw = self._engine.raw_connection()
        try:
            db: Any = raw.driver_connection
            db.rollback()  # the pool's pre-ping left a transaction open
            db.autocommit = True
            # Times come back as datetime.UTC, as UtcDateTime gives them, with no conversion.
            db.execute("SET TIME ZONE 'UTC'")
        except BaseException:
            raw.invalidate()
            raise
        raw.detach()
        return db

    def checkout(self) -> tuple[int, Any]:
        """An idle connection (the most recently used), or a new one; with the generation it
        belongs to. Give it back with :meth:`checkin`."""
        with self._lock:
            generation = self._generation
            if self._idle:
                return generation, self._idle.pop()
        return generation, self.open()

    def checkin(self, generation: int, db: Any) -> None:
        """Keep ``db`` for the next call, unless it broke, :meth:`close` ran since it was
        checked out, or ``idle_max`` are kept already (a web server's forty threads must not
        each keep one open): then close it."""
        with self._lock:
            if (
                generation == self._generation
                and not db.closed
                and not db.broken
                and len(self._idle) < self._idle_max
            ):
                self._idle.append(db)
                return
        with suppress(*PG_ERRORS):
            db.close()

    def idle(self) -> list[Any]:
        """The idle connections (a copy), for diagnostics."""
        with self._lock:
            return list(self._idle)

    def close(self) -> None:
        """Close the idle connections, and those in use when they come back."""
        with self._lock:
            self._generation += 1
            idle, self._idle = self._idle, []
        for db in idle:
            with suppress(*PG_ERRORS):
                db.close()

    def run(self, run: Callable[[Any], _T], *, write: bool = False) -> _T:
        """``run(connection)``, once more on a new connection when the first turns out to be
        dead (for a write: only if it certainly did not commit)."""
        generation, db = self.checkout()
        try:
            return run(db)
        except PG_ERRORS as exc:
            if not db.closed and not db.broken:
                raise  # the statement failed, not the connection
            if write and not isinstance(exc, PG_SESSION_ENDED):
                raise
        finally:
            self.checkin(generation, db)
        db = self.open()
        try:
            return run(db)
        finally:
            self.checkin(generation, db)
